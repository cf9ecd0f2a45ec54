"""Feature maps that read q and k before RoPE (``attention.feature_positions: none``): the student
then depends on relative positions only (its softmax window is RoPE's q.k, its history carries no
position), so shifting every position id by a constant leaves its outputs unchanged, as it leaves
the teacher's; decoding 4096 tokens, chunked prefill and row pieces equal the parallel forward."""

import pytest
import torch
from transformers import DynamicCache

import core
from core.attention.layer import LolcatsAttention
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


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
@torch.no_grad()
def test_decoding_4096_tokens_equals_the_parallel_forward(kind):
    model = converted("llama", kind, window=16, sinks=4, history_norm="decay", feature_positions="none")
    ids, mask = left_padded_batch([4096, 4001], 4096)
    pos = positions(mask)
    full = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    cache = DynamicCache(config=model.config)
    prefix = 3500  # a prompt, then the last 596 tokens one at a time
    steps = [model(input_ids=ids[:, :prefix], attention_mask=mask[:, :prefix], position_ids=pos[:, :prefix],
                   past_key_values=cache, use_cache=True).logits]
    for t in range(prefix, ids.shape[1]):
        steps.append(model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=pos[:, t:t + 1],
                           past_key_values=cache, use_cache=True).logits)
    real = mask.bool()
    assert rel_err(torch.cat(steps, dim=1)[real], full[real]) < 1e-4


@pytest.mark.parametrize("kind, sinks", [("sliding_window", 3), ("terraced", 0), ("terraced", 4)])
@torch.no_grad()
def test_chunked_prefill_and_row_pieces(kind, sinks, monkeypatch):
    model = converted("llama", kind, window=8, sinks=sinks, history_norm="decay", feature_positions="none")
    ids, mask = left_padded_batch([90, 61, 12], 90)
    pos = positions(mask)
    full = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    cache, logits = DynamicCache(config=model.config), []
    for a, b in ((0, 33), (33, 40), (40, 90)):
        logits.append(model(input_ids=ids[:, a:b], attention_mask=mask[:, :b], position_ids=pos[:, a:b],
                            past_key_values=cache, use_cache=True).logits)
    real = mask.bool()
    assert rel_err(torch.cat(logits, dim=1)[real], full[real]) < 1e-5
    monkeypatch.setattr(LolcatsAttention, "row_pieces", lambda self, q: [slice(i, i + 1) for i in range(q.shape[0])])
    assert rel_err(model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[real], full[real]) < 1e-6


def test_the_setting():
    assert AttentionSpec().feature_positions == "none"
    with pytest.raises(ValueError, match="feature_positions"):
        AttentionSpec(feature_positions="relative")
    assert stored_attention({"kind": "terraced"}).feature_positions == "rotary"  # runs written before the field
    model = converted("llama", "terraced", window=8, feature_positions="none")
    assert all(m.feature_positions == "none" for m in core.lolcats_modules(model).values())
