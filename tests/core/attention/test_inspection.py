import torch

import core
from core.attention.inspection import attention_maps
from tests.core.attention.test_surgery import converted
from tests.tiny_models import tiny_model


@torch.no_grad()
def test_student_map_reproduces_layer_output_and_rows_sum_to_one():
    model = converted("qwen3", "terraced", window=8, softmax_layers=(2,))
    ids = torch.randint(3, 100, (40,), generator=torch.Generator().manual_seed(0))
    maps = attention_maps(model, ids, layer_idx=1)
    H, L = 4, 40
    assert maps.converted and maps.teacher.shape == maps.student.shape == (H, L, L)
    for m in (maps.teacher, maps.student):
        assert torch.allclose(m.sum(-1), torch.ones(H, L), atol=1e-5)
        assert torch.all(m.triu(1) == 0)  # causal
    # student weights applied to v give the layer's hybrid attention output
    attn = core.lolcats_modules(model)[1]
    captured = {}
    h = attn.register_forward_pre_hook(lambda mod, a, kw: captured.update(kw), with_kwargs=True)
    model(input_ids=ids[None])
    h.remove()
    q, k, v, q_in, k_in = attn.project(captured["hidden_states"], captured["position_embeddings"])
    y, _ = attn.prefill(q, k, v, None, False, q_in, k_in)  # the layer's own attention (its history decays)
    y_map = maps.student[None] @ v.repeat_interleave(2, dim=1)
    assert ((y - y_map).norm() / y.norm()).item() < 1e-5
    # teacher map recomputed from the same q, k: causal softmax, grouped keys repeated
    scores = (q @ k.repeat_interleave(2, dim=1).transpose(-1, -2))[0] * attn.scaling
    teacher = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    torch.testing.assert_close(maps.teacher, teacher, rtol=0, atol=1e-6)
    torch.testing.assert_close(maps.difference, (maps.student - teacher).abs(), rtol=0, atol=1e-6)
    assert maps.difference.max() > 1e-3  # a converted layer: the maps really differ


@torch.no_grad()
def test_softmax_layer_maps_match_original_model_attention():
    model = converted("llama", "sliding_window", window=8, softmax_layers=(0, 1, 2))  # hidden states as original
    ids = torch.randint(3, 100, (12,), generator=torch.Generator().manual_seed(1))
    maps = attention_maps(model, ids, layer_idx=2)
    assert not maps.converted and torch.equal(maps.teacher, maps.student)
    original = tiny_model("llama", seed=0)
    original.config._attn_implementation = "eager"
    ref = original(input_ids=ids[None], output_attentions=True).attentions[2][0]
    assert torch.allclose(maps.teacher, ref, atol=1e-5)
