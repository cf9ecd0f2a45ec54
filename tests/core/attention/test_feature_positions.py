"""Feature maps that read q and k before RoPE (``attention.feature_positions: none``): the student
then depends on relative positions only (its softmax window is RoPE's q.k, its history carries no
position), so shifting every position id by a constant leaves its outputs unchanged, as it leaves
the teacher's. Decoding 4096 tokens, chunked prefill and row pieces with the default position-free
features: test_history_norm.py (its decay cases)."""

import pytest
import torch

import core
from core.config import AttentionSpec, stored_attention
from tests.core.attention.test_surgery import converted, left_padded_batch, positions, rel_err


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@torch.no_grad()
def test_shifting_every_position_leaves_the_student_unchanged(arch):
    model = converted(arch, "terraced", window=8, sinks=2, history_norm="decay", feature_positions="none")
    rotary = converted(arch, "terraced", window=8, sinks=2, history_norm="decay", feature_positions="rotary")
    ids, mask = left_padded_batch([80, 57], 80)
    pos = positions(mask)

    def logits(m, shift):
        return m(input_ids=ids, attention_mask=mask, position_ids=pos + shift).logits[mask.bool()]

    assert rel_err(logits(model, 3000), logits(model, 0)) < 1e-5  # float32 RoPE of large positions: ~2e-7
    assert rel_err(logits(rotary, 3000), logits(rotary, 0)) > 1e-4  # features of rotated q, k see absolute positions


def test_the_setting():
    assert AttentionSpec().feature_positions == "none"
    with pytest.raises(ValueError, match="feature_positions"):
        AttentionSpec(feature_positions="relative")
    assert stored_attention({"kind": "terraced"}).feature_positions == "rotary"  # runs written before the field
    model = converted("llama", "terraced", window=8, feature_positions="none")
    assert all(m.feature_positions == "none" for m in core.lolcats_modules(model).values())


@pytest.mark.parametrize("norm", ["power", "decay"])
@torch.no_grad()
def test_without_a_mask_prefill_and_decoding_match_the_masked_forward(norm):
    """No attention mask and no position ids (every token real, ids from 0): the positions and key
    offsets the layer derives without a mask give the masked forward's logits, and decoding token by
    token after a prompt gives the parallel forward's (keys leaving the window rotated back at their
    own position ids)."""
    from transformers import DynamicCache

    model = converted("llama", "sliding_window", window=8, sinks=2, history_norm=norm, key_map_heads="kv")
    ids, _ = left_padded_batch([60, 60], 60)
    full = model(input_ids=ids).logits
    assert rel_err(full, model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits) < 1e-6
    cache = DynamicCache(config=model.config)
    steps = [model(input_ids=ids[:, :21], past_key_values=cache, use_cache=True).logits]
    steps += [model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(21, 60)]
    assert rel_err(torch.cat(steps, dim=1), full) < 1e-5


@pytest.mark.parametrize("position_ids", [None, "shared", "per_row"])
def test_key_offsets_without_a_mask_equal_those_of_a_mask_of_real_tokens(position_ids):
    """The key offsets found without a mask (every new token real) equal those the masked formula
    gives for a mask of ones: from a prompt's start and after a state whose rows started at token 0,
    at token 3, or have no real token yet (``first`` -1), with position ids absent (the tokens'
    indices), shared by the rows ([1, L]) or per row."""
    from types import SimpleNamespace

    layer = next(iter(core.lolcats_modules(converted("llama", "sliding_window", window=8, feature_positions="none")).values()))
    B, L, seen = 3, 2, 5
    ids = {None: None, "shared": torch.tensor([[seen, seen + 1]]), "per_row": torch.tensor([[9, 10], [7, 8], [5, 6]])}
    for state in (None, SimpleNamespace(seen=seen, first=torch.tensor([0, 3, -1]), key_offset=torch.tensor([0, 3, 0]))):
        pos = ids[position_ids]
        if state is None and pos is not None:
            pos = pos - seen  # a prompt's ids start near 0
        fast = layer.key_offsets(None, state, pos, B, L, "cpu")
        masked = layer.key_offsets(torch.ones(B, L, dtype=torch.bool), state, pos, B, L, "cpu")
        assert fast.shape == (B,) and torch.equal(fast, masked), (state, position_ids)
