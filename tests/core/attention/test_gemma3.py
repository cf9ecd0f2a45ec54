"""Gemma 3 conversion on a tiny random Gemma 3 (q/k norms, query_pre_attn_scalar scaling, its own
sliding-window layers with their own RoPE base), float32, random weights and left padding."""

import copy

import pytest
import torch

import core
from tests.core.attention.test_surgery import left_padded_batch, positions, rel_err
from tests.tiny_models import tiny_model


@torch.no_grad()
def test_teacher_mode_is_the_original_model():
    """Inputs longer than Gemma's own window (24): its sliding layers keep their window in teacher mode."""
    original = tiny_model("gemma3", seed=1)
    model = core.linearize(copy.deepcopy(original), core.AttentionSpec(window_size=8, feature_dim=8))
    core.set_mode(model, "teacher")
    ids, mask = left_padded_batch([60, 41], 60, seed=2)
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions(mask))
    real = mask.bool()
    assert rel_err(model(**kwargs).logits[real], original(**kwargs).logits[real]) <= 1e-6
    core.set_mode(model, "student")
    assert rel_err(model(**kwargs).logits[real], original(**kwargs).logits[real]) > 1e-3  # the student differs


@torch.no_grad()
def test_window_covering_input_reproduces_original_with_gemma_scaling():
    """A LoLCATs window wider than the input is softmax attention: equal to Gemma 3 (its own window
    widened too) only with the normed q/k, the per-layer RoPE and the scale query_pre_attn_scalar**-0.5."""
    original = tiny_model("gemma3", seed=4, sliding_window=1024)
    model = core.linearize(copy.deepcopy(original), core.AttentionSpec(kind="sliding_window", window_size=128))
    modules = core.lolcats_modules(model)
    assert sorted(modules) == [0, 1, 2]  # Gemma's local and global layers are all converted
    assert all(m.scaling == pytest.approx(24**-0.5) for m in modules.values())
    ids, mask = left_padded_batch([100, 64], 100, seed=5)
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions(mask))
    real = mask.bool()
    assert rel_err(model(**kwargs).logits[real], original(**kwargs).logits[real]) <= 1e-5
    for m in modules.values():  # with the head_dim**-0.5 of Llama the outputs part
        m.scaling = 16**-0.5
    assert rel_err(model(**kwargs).logits[real], original(**kwargs).logits[real]) > 1e-3
