"""Prefill in chunks from a carried state: equal to the parallel form over the whole prompt, to the
naive oracle and to the state a whole prefill leaves (float32, random inputs, padded rows)."""

import pytest
import torch

from core.attention import HedgehogFeatureMap
from kernels.hybrid.carry import prefill_chunk
from kernels.hybrid.chunk_torch import hybrid_attention_torch
from kernels.hybrid.naive import naive_hybrid_attention, positions
from kernels.hybrid.recurrent_torch import decode_step_torch, prefill_state
from kernels.hybrid.window import KINDS, WindowRule
from tests.kernels.hybrid.decoding import feature_keys, sample_decay
from tests.kernels.hybrid.test_recurrent_torch import assert_same_sinks
from tests.kernels.utils import assert_close

B, H, HKV, D, FEAT = 3, 4, 2, 16, 8


def inputs(L: int, mid_padding: bool, kv_maps: bool = False, own_keys: bool = False):
    """Random q, k, v, features and a mask: row 0 unpadded, row 1 left-padded by 3, row 2 by 19
    (its first token comes in a later chunk); with ``mid_padding`` row 1 also skips some tokens;
    with ``kv_maps`` the key feature map per key/value head (a state per key/value head); with
    ``own_keys`` phi_k reads other keys than the softmax, from each key and its position."""
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    Hs = HKV if kv_maps else H
    fq, fk = HedgehogFeatureMap(H, D, FEAT, init="random"), HedgehogFeatureMap(Hs, D, FEAT, init="random")
    read = feature_keys if own_keys else (lambda keys, pos: keys)
    key_features = lambda keys, pos: fk(read(keys, pos).repeat_interleave(Hs // HKV, dim=1))  # noqa: E731
    q = torch.randn(B, H, L, D, generator=g)
    k, v = torch.randn(B, HKV, L, D, generator=g), torch.randn(B, HKV, L, D, generator=g)
    mix = torch.randn(H, generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, :19] = False
    if mid_padding:
        mask[1, 8::9] = False
    with torch.no_grad():
        qf, kf = fq(q), key_features(k, positions(mask))
    return q, k, v, qf, kf, mix, mask, key_features


def chunked(kind, w, chunks, q, k, v, qf, kf, mix, mask, key_features, sinks=0, decay=None):
    """Outputs of a prefill of the first chunk, then the rest chunk by chunk from the carried state
    (token by token where the chunk form does not apply); the final state; how many chunks fell back.
    ``kf``: the keys' features, ``key_features(keys, positions)`` those of the carried ring."""
    scale, n = D**-0.5, chunks[0]
    rule = WindowRule(kind, w, sinks)
    ys = [hybrid_attention_torch(q[:, :, :n], k[:, :, :n], v[:, :, :n], qf[:, :, :n], kf[:, :, :n], mix, rule, mask[:, :n],
                                 scale, decay=decay)]
    state = prefill_state(rule, k[:, :, :n], v[:, :, :n], kf[:, :, :n], mask[:, :n], decay)
    fallbacks = 0
    for c in chunks[1:]:
        part = [t[:, :, n : n + c] for t in (q, k, v, qf, kf)]
        out = prefill_chunk(state, rule, *part, mix, mask[:, n : n + c], key_features, scale, decay)
        if out is None:
            fallbacks += 1
            for i in range(c):
                y, state = decode_step_torch(state, rule, *(t[:, :, i : i + 1] for t in part[:4]), mix,
                                             mask[:, n + i], key_features, scale, decay)
                ys.append(y)
        else:
            y, state = out
            ys.append(y)
        n += c
    return torch.cat(ys, dim=2), state, fallbacks


@pytest.mark.parametrize("kind, sinks, decay, own_keys, kv_maps", [(kind, 0, False, False, False) for kind in KINDS]
                         + [("sliding_window", 2, False, False, False), ("terraced", 3, False, False, False)]
                         + [(kind, 2 * (kind != "linear"), True, False, False) for kind in KINDS]
                         + [(kind, 2 * (kind != "linear"), True, True, False) for kind in KINDS]
                         + [(kind, 2 * (kind != "linear"), True, True, True) for kind in KINDS])
@pytest.mark.parametrize("w, chunks", [(4, [6, 5, 8, 1, 13, 4]), (8, [16, 16, 5]), (4, [1, 2, 30])],
                         ids=["w4-uneven", "w8", "w4-short-first"])
@pytest.mark.parametrize("mid_padding", [False, True], ids=["left-padded", "mid-padded"])
@torch.no_grad()
def test_chunked_prefill_equals_the_parallel_form_the_oracle_and_a_whole_prefill(kind, sinks, decay, own_keys, kv_maps,
                                                                                 w, chunks, mid_padding):
    """``own_keys``: phi_k reads other keys than the softmax (keys before RoPE), computed from each
    cached key and its position; ``kv_maps``: the key feature map, the state and the decay rates per
    key/value head."""
    L = sum(chunks)
    q, k, v, qf, kf, mix, mask, key_features = inputs(L, mid_padding, kv_maps, own_keys)
    decay = sample_decay(HKV if kv_maps else H).cpu() if decay else None
    y, state, fallbacks = chunked(kind, w, chunks, q, k, v, qf, kf, mix, mask, key_features, sinks, decay)
    if not mid_padding:  # left padding never needs the token-by-token fallback
        assert fallbacks == 0
    real = mask[:, None, :, None]
    whole = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule(kind, w, sinks), mask, D**-0.5, decay=decay)
    G = H // kf.shape[1]  # the oracle reads each query head's features and rate explicitly
    oracle = naive_hybrid_attention(q, k, v, qf, kf.repeat_interleave(G, dim=1), mix, WindowRule(kind, w, sinks), mask,
                                    D**-0.5, decay=None if decay is None else decay.repeat_interleave(G))
    assert_close("chunked vs parallel", torch.where(real, whole, 0.0), torch.where(real, y, 0.0), 1e-5)
    assert_close("chunked vs naive", torch.where(real, oracle, 0.0), torch.where(real, y, 0.0), 1e-5)

    full = prefill_state(WindowRule(kind, w, sinks), k, v, kf, mask, decay)
    assert state.seen == full.seen == L and state.S.shape[1] == (HKV if kv_maps else H)
    assert_close("S", full.S, state.S, 1e-5)
    assert_close("z", full.z, state.z, 1e-5)
    assert torch.equal(full.first, state.first) and torch.equal(full.win_valid, state.win_valid)
    valid = full.win_valid
    assert torch.equal(full.win_pos[valid], state.win_pos[valid])
    for name in ("win_k", "win_v"):
        assert torch.equal(getattr(full, name)[valid[:, None].expand(-1, HKV, -1)],
                           getattr(state, name)[valid[:, None].expand(-1, HKV, -1)]), name
    assert_same_sinks(full, state, sinks)


@torch.no_grad()
def test_a_padding_token_at_a_terraced_tile_start_falls_back_to_token_steps():
    q, k, v, qf, kf, mix, mask, key_features = inputs(24, mid_padding=False)
    mask[0, 8] = False  # row 0: position 8, a tile start of w = 4, is padding
    # after 14 tokens (last position 13) the window starts at 4 * (13 // 4 - 1) = 8, so the ring's
    # first real key is at 9, not a tile start: the next chunk goes token by token
    y, _, fallbacks = chunked("terraced", 4, [14, 10], q, k, v, qf, kf, mix, mask, key_features)
    assert fallbacks == 1
    _, _, fallbacks = chunked("terraced", 4, [10, 14], q, k, v, qf, kf, mix, mask, key_features)
    assert fallbacks == 0  # after 10 tokens the window starts at 4: aligned
    whole = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule("terraced", 4), mask, D**-0.5)
    real = mask[:, None, :, None]
    assert_close("chunked vs parallel", torch.where(real, whole, 0.0), torch.where(real, y, 0.0), 1e-5)


@torch.no_grad()
def test_a_rule_with_other_sink_tokens_than_the_state_is_refused():
    q, k, v, qf, kf, mix, mask, key_features = inputs(12, mid_padding=False)
    state = prefill_state(WindowRule("terraced", 4, 2), k[:, :, :8], v[:, :, :8], kf[:, :, :8], mask[:, :8])
    part = [t[:, :, 8:] for t in (q, k, v, qf, kf)]
    with pytest.raises(ValueError, match="the state holds 2 sink tokens and the rule 0"):
        prefill_chunk(state, WindowRule("terraced", 4), *part, mix, mask[:, 8:], key_features, D**-0.5)
