"""core.eval.metrics called directly: perplexity and teacher_context."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from core.attention.surgery import linearize, lolcats_modules
from core.config import AttentionSpec, Stage2Spec
from core.eval.metrics import perplexity, teacher_context
from core.train.finetune_lora import wrap_for_stage2
from core.train.lora import base_model
from tests.tiny_models import tiny_model

IDS = torch.randint(3, 101, (3, 24), generator=torch.Generator().manual_seed(0))


def logits_of(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def test_perplexity_is_exp_of_the_mean_label_token_nll():
    model = tiny_model()
    labels = IDS.clone()
    labels[0, :10] = -100  # an instruction prompt: not scored
    logits = logits_of(model)
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100,
                          reduction="none")
    scored = labels[:, 1:].flatten() != -100
    blocks = {"input_ids": IDS, "labels": labels}
    assert perplexity(model, blocks) == pytest.approx(math.exp(nll[scored].mean().item()), rel=1e-5)
    first_two = nll.view(3, -1)[:2].flatten()[scored.view(3, -1)[:2].flatten()]
    assert perplexity(model, blocks, n_blocks=2) == pytest.approx(math.exp(first_two.mean().item()), rel=1e-5)
    every = F.cross_entropy(logits[:, :-1].flatten(0, 1), IDS[:, 1:].flatten())  # no labels: every next token
    assert perplexity(model, {"input_ids": IDS}) == pytest.approx(math.exp(every.item()), rel=1e-5)


def test_perplexity_of_no_blocks_is_refused():
    with pytest.raises(ValueError, match="no evaluation blocks"):
        perplexity(tiny_model(), {"input_ids": IDS[:0]})


@pytest.fixture
def converted_with_lora():
    """A tiny model, its unconverted copy, and the converted model with LoRA adapters that change its outputs."""
    original = tiny_model()
    model = linearize(copy.deepcopy(original), AttentionSpec(kind="terraced", feature_dim=8, window_size=8))
    model = wrap_for_stage2(model, Stage2Spec(rank=4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return original, model


def modes(model) -> set[str]:
    return {m.mode for m in lolcats_modules(base_model(model)).values()}


def test_teacher_context_is_the_unconverted_model_without_lora(converted_with_lora):
    original, model = converted_with_lora
    student = logits_of(model)
    teacher = logits_of(original)
    assert (student - teacher).abs().max() > 1e-2
    with teacher_context(model):
        assert modes(model) == {"teacher"} and len(lolcats_modules(base_model(model))) == 3
        torch.testing.assert_close(logits_of(model), teacher, rtol=1e-5, atol=1e-5)
    assert modes(model) == {"student"}
    torch.testing.assert_close(logits_of(model), student, rtol=0, atol=0)


def test_teacher_context_restores_the_student_after_an_exception(converted_with_lora):
    _, model = converted_with_lora
    student = logits_of(model)
    with pytest.raises(RuntimeError, match="inside"), teacher_context(model):
        raise RuntimeError("inside")
    assert modes(model) == {"student"}
    torch.testing.assert_close(logits_of(model), student, rtol=0, atol=0)  # LoRA enabled again
