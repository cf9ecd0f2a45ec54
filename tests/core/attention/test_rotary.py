"""Rotary embeddings resolved per layer (core.attention.rotary), and the decode state that keeps
each window key once: a key leaving the window is rotated back before phi_k reads it, so decoding
equals the parallel forward with the feature maps on keys before RoPE, under either convention of
position ids (the tokens' indices, or counted from each row's first real token)."""

import pytest
import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import core
from core.attention.rotary import layer_rotary, unrotate
from core.eval.window_baseline import state_bytes
from kernels.hybrid.recurrent_torch import HybridState
from tests.core.attention.test_surgery import converted, left_padded_batch, rel_err
from tests.tiny_models import tiny_model


@pytest.mark.parametrize("arch, overrides", [
    ("llama", {}),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 256}}),  # cos, sin scaled by its attention factor
    ("gemma3", {}),
], ids=["llama", "llama-yarn", "gemma3"])
def test_unrotate_inverts_the_layers_rotation(arch, overrides):
    model = tiny_model(arch, **overrides)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 2, 50, 16, generator=g)
    pos = torch.randint(0, 1000, (2, 50), generator=g)
    tables = set()
    for i in range(model.config.num_hidden_layers):
        cos, sin = layer_rotary(model, i)(k, pos)
        tables.add(round(float(cos.sum()), 3))
        _, rotated = apply_rotary_pos_emb(k, k, cos, sin)
        assert rel_err(rotated, k) > 1e-2  # it rotates
        assert rel_err(unrotate(rotated, cos, sin), k) < 1e-6
    assert len(tables) == (2 if arch == "gemma3" else 1)  # Gemma 3: local and global layers have their own table


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("kind, sinks", [("sliding_window", 2), ("terraced", 4), ("linear", 0)])
@torch.no_grad()
def test_decoding_with_the_default_position_ids_equals_the_parallel_forward(arch, kind, sinks):
    """No position ids passed: transformers rotates by the tokens' indices, padding included, so
    each row's ids run ahead of its window positions by its padding (the state's key offset)."""
    model = converted(arch, kind, window=8, sinks=sinks, feature_positions="none")
    ids, mask = left_padded_batch([140, 97, 30], 140)
    full = model(input_ids=ids, attention_mask=mask).logits
    cache = DynamicCache(config=model.config)
    steps = [model(input_ids=ids[:, :50], attention_mask=mask[:, :50], past_key_values=cache, use_cache=True).logits,
             model(input_ids=ids[:, 50:90], attention_mask=mask[:, :90], past_key_values=cache, use_cache=True).logits]
    for t in range(90, 140):
        steps.append(model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache,
                           use_cache=True).logits)
    real = mask.bool()
    assert rel_err(torch.cat(steps, dim=1)[real], full[real]) < 1e-5
    assert torch.equal(cache.layers[0].state.key_offset, torch.tensor([0, 43, 110]))  # each row's padding


def test_the_state_keeps_each_window_key_once():
    before, rotary = (core.lolcats_modules(converted(feature_positions=fp))[0] for fp in ("none", "rotary"))
    assert state_bytes(before, 4) == state_bytes(rotary, 4)  # keys before RoPE cost nothing more
    assert "win_kin" not in HybridState.__dataclass_fields__
