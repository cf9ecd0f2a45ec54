"""Layer scores for ``softmax_layers: auto`` on a tiny random decoder: a layer made exact scores
zero, a layer made deliberately bad scores highest and is the one chosen."""

import pytest
import torch

import core
from core.config import ConfigError
from core.attention.surgery import restore_softmax, softmax_layer_indices
from core.eval.layer_scores import kl_scores, layer_scores, mse_scores, worst_layers
from core.eval.metrics import perplexity, teacher_context
from tests.tiny_models import tiny_model

LENGTH = 40


def blocks(n=2, length=LENGTH, seed=0, padded=False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 101, (n, length), generator=g)
    out = {"input_ids": ids}
    if padded:
        mask = torch.ones(n, length, dtype=torch.long)
        mask[0, : length // 4] = 0  # left padding in the first block
        out["attention_mask"] = mask
    return out


def graded_model(bad: int, exact: int, layers: int = 4):
    """Every layer converted; layer ``exact`` with a window covering the whole input (softmax exactly),
    layer ``bad`` with sharp softmax attention (its queries scaled up) and a linear attention with
    constant features, i.e. the causal mean of the values; the rest in between."""
    model = tiny_model("llama", num_hidden_layers=layers)
    with torch.no_grad():
        model.model.layers[bad].self_attn.q_proj.weight.mul_(40.0)
    torch.manual_seed(1)
    core.linearize(model, core.AttentionSpec(kind="terraced", window_size=8, feature_dim=8, feature_init="random",
                                             history_norm="none"))  # the paper's history: errors graded as built
    modules = core.lolcats_modules(model)
    modules[exact].window_size = 4 * LENGTH
    modules[bad].kind = "linear"
    with torch.no_grad():
        for p in (*modules[bad].feature_map_q.parameters(), *modules[bad].feature_map_k.parameters()):
            p.zero_()
    return model


@pytest.mark.parametrize("score", ["mse", "kl"])
@pytest.mark.parametrize("padded", [False, True])
def test_bad_layer_scores_highest_and_exact_layer_zero(score, padded):
    model = graded_model(bad=2, exact=1)
    scores = layer_scores(model, blocks(padded=padded), 2, score)
    assert sorted(scores) == [0, 1, 2, 3]
    assert abs(scores[1]) < 1e-6, scores  # the window covers everything: the student is the teacher
    assert scores[2] == max(scores.values()) and scores[2] > 3 * max(scores[0], scores[3]), scores
    assert all(v >= -1e-7 for v in scores.values())
    assert worst_layers(scores, 1) == [2]
    assert core.lolcats_modules(model)[0].mode == "student"  # modes are left as found


def test_kl_is_the_divergence_with_only_that_layer_linear():
    model = graded_model(bad=0, exact=3)
    data = blocks(n=1)
    scores = kl_scores(model, data, 1)
    with torch.no_grad(), teacher_context(model):
        teacher = torch.log_softmax(model(**data).logits.float(), -1)
    others = [m for i, m in core.lolcats_modules(model).items() if i != 0]
    with torch.no_grad(), core.teacher_attention(others):  # every converted layer but 0 in teacher mode
        student = torch.log_softmax(model(**data).logits.float(), -1)
    expected = torch.nn.functional.kl_div(student[0], teacher[0], log_target=True, reduction="batchmean").item()
    assert scores[0] == pytest.approx(expected, rel=1e-5)


def test_mse_is_normalised_by_the_teacher_output_variance():
    """Scaling v (hence both outputs) by 10 leaves the normalised score unchanged."""
    model = graded_model(bad=2, exact=1)
    data = blocks()
    before = mse_scores(model, data, 2)
    with torch.no_grad():
        core.lolcats_modules(model)[2].v_proj.weight.mul_(10.0)
    after = mse_scores(model, data, 2)
    assert after[2] == pytest.approx(before[2], rel=1e-4)


def test_worst_layers_breaks_ties_by_index_and_sorts():
    assert worst_layers({0: 0.5, 1: 2.0, 2: 0.5, 3: 1.0}, 3) == [0, 1, 3]
    assert worst_layers({0: 1.0, 1: 2.0}, 0) == []


def test_restore_softmax_brings_back_the_original_attention():
    model = graded_model(bad=2, exact=1)
    data = blocks(n=1)
    with torch.no_grad(), teacher_context(model):
        teacher = model(**data).logits
    restore_softmax(model, [0, 2])
    assert softmax_layer_indices(model) == [0, 2]
    assert model.attention_spec.softmax_layers == [0, 2] and model.attention_spec.softmax_budget is None
    assert not any("layers.2.self_attn.feature_map" in k for k in model.state_dict())
    with torch.no_grad(), core.teacher_attention(core.lolcats_modules(model).values()):  # the remaining converted layers
        assert torch.allclose(model(**data).logits, teacher, atol=1e-5)
    with pytest.raises(ConfigError, match=r"layers \[2\] are not converted"):
        restore_softmax(model, [2])


def test_a_restored_model_still_decodes_like_its_parallel_forward():
    model = graded_model(bad=2, exact=1)
    restore_softmax(model, [2])
    data = blocks(n=1, length=24)
    with torch.no_grad():
        full = model(**data).logits
        cache = None
        steps = []
        for t in range(24):
            out = model(input_ids=data["input_ids"][:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits)
    stepped = torch.cat(steps, dim=1)
    assert ((stepped - full).norm() / full.norm()).item() < 1e-4
    assert perplexity(model, data) > 0
