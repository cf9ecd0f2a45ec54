"""Gemma 3 conversion on a tiny random Gemma 3 (q/k norms, query_pre_attn_scalar scaling, its own
sliding-window layers with their own RoPE base), float32, random weights and left padding."""

import copy

import pytest
import torch
from transformers import DynamicCache

import core
from core.config import ConfigError
from tests.core.attention.test_surgery import left_padded_batch, positions, rel_err
from tests.tiny_models import tiny_model


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


@torch.no_grad()
def test_keep_sliding_layers_converts_only_the_global_ones():
    """Gemma's local layers kept softmax (their cache is bounded by its window already); the global
    layer converted; cached decoding still equals the full forward past Gemma's window."""
    model = core.linearize(tiny_model("gemma3", seed=6), core.AttentionSpec(window_size=8, feature_dim=8, keep_sliding_layers=True))
    assert sorted(core.lolcats_modules(model)) == [2]
    ids, mask = left_padded_batch([70, 52], 70, seed=7)
    full = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    cache = DynamicCache(config=model.config)
    steps = [model(input_ids=ids[:, :30], attention_mask=mask[:, :30], position_ids=positions(mask)[:, :30],
                   past_key_values=cache, use_cache=True).logits]
    for t in range(30, 70):
        steps.append(model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1],
                           position_ids=positions(mask)[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    real = mask.bool()
    assert rel_err(torch.cat(steps, dim=1)[real], full[real]) <= 1e-4


def test_keep_sliding_layers_refuses_a_model_with_no_global_layer():
    model = tiny_model("mistral", seed=0, sliding_window=16)  # every Mistral layer slides
    with pytest.raises(ConfigError, match="keep_sliding_layers keeps every layer of this model softmax"):
        core.linearize(model, core.AttentionSpec(keep_sliding_layers=True))
