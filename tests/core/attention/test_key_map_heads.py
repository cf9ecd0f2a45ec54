"""The key feature map per key/value head (``attention.key_map_heads: kv``): every query head of a
group reads one state S, z (and one decay rate) of its key/value head, G times fewer state bytes;
decoding equals the parallel forward (4096 tokens, chunked prefill, every architecture), and runs or
exports written before the option read as the paper's maps per query head."""

import pytest
import torch
from transformers import DynamicCache

import core
from core.attention.cache import hybrid_cache_layer
from core.config import AttentionSpec, stored_attention
from core.eval.window_baseline import state_bytes
from tests.core.attention.test_surgery import converted, left_padded_batch, positions, rel_err


def decode(model, ids, mask, prefix: int, chunks=()):
    """Logits of a prefill of ``prefix`` tokens (then ``chunks``, each a carried parallel chunk), then
    one token at a time to the end; and the cache."""
    pos = positions(mask)
    cache = DynamicCache(config=model.config)
    cuts = [0, prefix, *chunks]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        out.append(model(input_ids=ids[:, a:b], attention_mask=mask[:, :b], position_ids=pos[:, a:b],
                         past_key_values=cache, use_cache=True).logits)
    for t in range(cuts[-1], ids.shape[1]):
        out.append(model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=pos[:, t:t + 1],
                         past_key_values=cache, use_cache=True).logits)
    return torch.cat(out, dim=1), cache


@pytest.mark.parametrize("history_gate", ["none", "query"])  # the gate: tests/core/attention/test_history_gate.py
@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
@torch.no_grad()
def test_decoding_4096_tokens_equals_the_parallel_forward(kind, history_gate):
    model = converted("llama", kind, window=16, sinks=4, key_map_heads="kv", history_gate=history_gate)
    ids, mask = left_padded_batch([4096, 4001], 4096)
    full = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    stepped, cache = decode(model, ids, mask, prefix=3500)
    real = mask.bool()
    assert rel_err(stepped[real], full[real]) < 1e-4
    assert rel_err(stepped[:, -100:][real[:, -100:]], full[:, -100:][real[:, -100:]]) < 1e-4  # the far end alone
    state = hybrid_cache_layer(cache, 0).state
    assert state.S.shape[1] == state.z.shape[1] == 2  # one per key/value head, not per query head (4)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("kind, sinks", [("linear", 0), ("sliding_window", 2), ("terraced", 4)])
@torch.no_grad()
def test_chunked_prefill_and_decode_equal_the_full_forward(arch, kind, sinks):
    model = converted(arch, kind, window=8, sinks=sinks, key_map_heads="kv", softmax_layers=(1,))
    ids, mask = left_padded_batch([90, 61, 12], 90)
    full = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    stepped, _ = decode(model, ids, mask, prefix=33, chunks=(40, 70))
    real = mask.bool()
    assert rel_err(stepped[real], full[real]) < 1e-5


@torch.no_grad()
def test_one_map_and_one_decay_rate_per_key_value_head_and_the_state_bytes():
    per_query = core.lolcats_modules(converted(key_map_heads="query"))[0]
    per_kv = core.lolcats_modules(converted(key_map_heads="kv"))[0]
    assert per_kv.feature_map_k.weight.shape[0] == per_kv.history_decay.shape[0] == 2
    assert per_kv.feature_map_q.weight.shape[0] == per_kv.mix.shape[0] == 4  # query maps and window weights per query head
    assert per_query.feature_map_k.weight.shape[0] == per_query.history_decay.shape[0] == 4
    F, d = per_kv.feature_map_q.output_dim, per_kv.head_dim
    saved = state_bytes(per_query, 4)["state_bytes"] - state_bytes(per_kv, 4)["state_bytes"]
    assert saved == 4 * (4 - 2) * F * (d + 1)  # S and z of two heads fewer, in float32


def test_the_setting():
    assert AttentionSpec().key_map_heads in ("query", "kv")
    with pytest.raises(ValueError, match="key_map_heads"):
        AttentionSpec(key_map_heads="group")
    assert stored_attention({"kind": "terraced"}).key_map_heads == "query"  # runs written before the field
