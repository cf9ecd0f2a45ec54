"""core.eval.metrics called directly: perplexity, teacher_context and passkey."""

import copy
import math
import re

import pytest
import torch
import torch.nn.functional as F

from core.attention.surgery import linearize, lolcats_modules
from core.config import AttentionSpec, EvalSpec, Stage2Spec
from core.eval import metrics
from core.eval.metrics import passkey, passkey_prompt, perplexity, teacher_context
from core.train.finetune_lora import wrap_for_stage2
from core.train.lora import base_model
from tests.tiny_models import byte_level_tokenizer, tiny_model

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


def read_key(prompt: str) -> int:
    return int(re.search(r"The pass key is (\d+)\.", prompt).group(1))


@pytest.fixture
def answers(monkeypatch):
    """Replace generation by a reader: ``answers["reader"](prompt)`` is the model's answer."""
    calls = []
    box = {"reader": lambda prompt: f" {read_key(prompt)}.", "calls": calls}

    def fake_generate(model, tokenizer, prompt, max_new_tokens):
        calls.append(prompt)
        return box["reader"](prompt)

    monkeypatch.setattr(metrics, "generate_text", fake_generate)
    return box


SPEC = EvalSpec(passkey_lengths=[80, 160], passkey_depths=[0.0, 0.5, 1.0], passkey_trials=3)


def test_passkey_counts_answers_that_contain_the_key(answers):
    tokenizer = byte_level_tokenizer()
    results = passkey(None, tokenizer, SPEC, seed=3)
    assert [(r.length, r.depth) for r in results] == [(n, d) for n in (80, 160) for d in (0.0, 0.5, 1.0)]
    assert [r.accuracy for r in results] == [1.0] * 6
    assert len(answers["calls"]) == 6 * 3 and len({read_key(p) for p in answers["calls"]}) == 18  # a new key each trial

    answers["reader"] = lambda prompt: f" {read_key(prompt) + 1}"  # a near miss is a miss
    assert [r.accuracy for r in passkey(None, tokenizer, SPEC, seed=3)] == [0.0] * 6

    asked = len(answers["calls"])
    # the first of each cell's three trials is answered wrongly
    answers["reader"] = lambda prompt: "no idea" if (len(answers["calls"]) - asked) % 3 == 1 else str(read_key(prompt))
    assert [r.accuracy for r in passkey(None, tokenizer, SPEC, seed=3)] == pytest.approx([2 / 3] * 6)


def test_passkey_keys_follow_the_seed(answers):
    tokenizer = byte_level_tokenizer()
    passkey(None, tokenizer, SPEC, seed=3)
    passkey(None, tokenizer, SPEC, seed=3)
    passkey(None, tokenizer, SPEC, seed=4)
    keys = [read_key(p) for p in answers["calls"]]
    assert keys[:18] == keys[18:36] and keys[36:] != keys[:18]


@pytest.mark.parametrize("length", [1000, 2000])
def test_passkey_prompt_length_and_needle_depth(length):
    tokenizer = byte_level_tokenizer()
    per_filler = len(tokenizer(metrics.FILLER, add_special_tokens=False)["input_ids"])
    positions = []
    for depth in (0.0, 0.5, 1.0):
        prompt = passkey_prompt(tokenizer, length, depth, 54321)
        n_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert length - 2 * per_filler <= n_tokens <= length + 2
        assert prompt.endswith(metrics.QUESTION) and read_key(prompt) == 54321
        positions.append(prompt.index("The pass key is 54321") / len(prompt))
    assert positions[0] < 0.4 and positions[2] > 0.6 and positions[0] < positions[1] < positions[2]
