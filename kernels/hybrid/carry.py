"""Prefill from a carried state: a chunk of C new tokens through the parallel form, in PyTorch.

A long prompt fed in chunks keeps every temporary bounded by the chunk and the window instead of
the prompt. Given the state after ``seen`` tokens (:class:`HybridState`) and the chunk's q, k, v
and features, the chunk's keys are preceded by the window ring in sequence order (the last K
tokens: ``X = [ring; chunk]``, ``K + C`` keys, mask = ring validity, then the chunk's mask) and
the parallel form runs over X. Every key the state already holds is history for every query of
the chunk (its positions are below the window of the chunk's first query), so

    y_n = (terms_X(n)[:d] + phi_q(q_n)^T S) / (terms_X(n)[d] + phi_q(q_n)^T z)

with terms_X the numerator and denominator of the parallel form over X
(:func:`kernels.hybrid.chunk_torch.hybrid_terms_torch`). Positions in X count from its first real
key; for the sliding window and linear attention any shift of positions gives the same windows.
For the terraced window, tiles start at multiples of w, and X's first real key is the oldest
ring key still in the window, at position w (p // w - 1): a tile start, so positions in X are
positions of the sequence shifted by a multiple of w. The one exception, a padding token at that
tile start (padding in the middle of a row), is detected and :func:`prefill_chunk` returns None,
and the caller steps through the chunk token by token.

The new state folds X's real keys below the window of the chunk's last token into S, z and keeps
the last K tokens of X as the ring, exactly what token-by-token decoding leaves (docs/kernels.md).
Sink tokens (positions < s) are never folded: the chunk's own are stored in the sink cache first,
and every query reads the cached ones below its window as extra softmax keys.

With a decay (log gamma ``[H]``, ``kernels.hybrid.decay``), the parallel form over X weighs X's
history keys itself; the carried S, z (ages counted from the window of the token before the
chunk, at position p0) are read by query n times gamma^(window_start(p_n) - window_start(p0)), and
the new state carries them by the advance to the chunk's last token before folding.
"""

from __future__ import annotations

import torch

from kernels.hybrid.chunk_torch import hybrid_terms_torch, normalise
from kernels.hybrid.decay import advance, fold_ages
from kernels.hybrid.heads import query_heads, read_state
from kernels.hybrid.recurrent_torch import HybridState, KeyFeatures, fold_keys, store_sinks, visible_sinks
from kernels.hybrid.window import WindowRule, window_start


def _first_tokens(state: HybridState, mask: torch.Tensor) -> torch.Tensor:
    """[B] sequence index of each row's first real token after the chunk (-1 while it has none)."""
    in_chunk = torch.where(mask.any(-1), state.seen + mask.long().argmax(-1), torch.full_like(state.first, -1))
    return torch.where(state.first >= 0, state.first, in_chunk)


def prefill_chunk(
    state: HybridState, rule: WindowRule, q, k, v, q_feat, k_feat, mix, mask, key_features: KeyFeatures, scale: float,
    decay=None,
) -> tuple[torch.Tensor, HybridState] | None:
    """Outputs ``[B, H, C, d]`` of a chunk of C tokens and the state after it; None when the chunk
    form does not apply (see the module docstring) and the caller steps token by token.

    rule: the window rule the state was built with (:class:`kernels.hybrid.window.WindowRule`),
    q ``[B, H, C, d]``, k and v ``[B, H_kv, C, d]``, q_feat ``[B, H, C, F]``, k_feat ``[B, H_s, C, F]``
    (H_s: the state's heads, H or H_kv), mix ``[H]``, mask ``[B, C]`` bool, key_features: (the ring's
    keys ``[B, H_kv, K, d]``, their positions ``[B, K]``) -> ``[B, H_s, K, F]``, decay: None or log
    gamma ``[H_s]``. ``state`` is not modified."""
    if state.sinks != rule.sinks:
        raise ValueError(f"the state holds {state.sinks} sink tokens and the rule {rule.sinks}; "
                         "carry a state with the rule it was built with")
    kind, w = rule.kind, rule.window_size
    B, H, C, d = q.shape
    K = state.win_k.shape[2]
    seen = state.seen
    index = torch.arange(seen - K, seen + C, device=q.device)  # sequence index of every key of X
    slots = index[:K] % K if K else index[:0]
    ring_valid = state.win_valid[:, slots] & (index[:K] >= 0)
    kx = torch.cat([state.win_k[:, :, slots], k], dim=2)
    vx = torch.cat([state.win_v[:, :, slots], v], dim=2)
    maskx = torch.cat([ring_valid, mask], dim=1)
    first = _first_tokens(state, mask)
    if kind == "terraced":
        has = maskx.any(-1)
        start = index[maskx.long().argmax(-1)] - first  # position of X's first real key
        if bool((has & (start % w != 0)).any()):
            return None
    ring_feat = key_features(state.win_k[:, :, slots], state.win_pos[:, slots]) if K else None
    kfx = torch.cat([ring_feat.to(k_feat.dtype), k_feat], dim=2) if K else k_feat
    qx = torch.cat([q.new_zeros(B, H, K, d), q], dim=2)  # the ring's queries are computed and dropped
    qfx = torch.cat([q_feat.new_zeros(B, H, K, q_feat.shape[-1]), q_feat], dim=2)
    pos = torch.where(first[:, None] >= 0, index[None, :] - first[:, None], torch.full_like(maskx, -1, dtype=torch.long))
    sinks, sink = state.sinks, (state.sink_k, state.sink_v, state.sink_valid)
    sink_keys = None
    if sinks:
        sink = store_sinks(sink, k, v, pos[:, K:], mask)
        kfx = kfx * (pos >= sinks)[:, None, :, None].to(kfx.dtype)  # sink keys never enter the history
        sink_keys = (sink[0], sink[1], visible_sinks(sink[2][:, None, :], kind, w, pos))
    t = hybrid_terms_torch(qx, kx, vx, qfx, kfx, mix, rule, maskx, scale, sink_keys=sink_keys, decay=decay)[:, :, K:]
    qf = q_feat.float()
    before = torch.where(first >= 0, seen - 1 - first, torch.full_like(first, -1))  # the token before the chunk
    if decay is not None:  # the carried sums, aged to each query's window
        steps = (window_start(kind, w, pos[:, K:]) - window_start(kind, w, before)[:, None]).clamp(min=0)
        qf = qf * torch.exp(query_heads(decay, H, dim=0).float()[None, :, None, None] * steps[:, None, :, None].float())
    num, den = read_state(qf, state.S, state.z)
    t[..., :d] += num
    t[..., d] += den
    y = normalise(t).to(q.dtype)

    last = torch.where(first >= 0, seen + C - 1 - first, torch.full_like(first, -1))
    inside = maskx & (pos >= window_start(kind, w, last)[:, None])  # the new ring's real keys
    fold = maskx & ~inside & (pos >= sinks)
    S, z = advance(state.S, state.z, decay, kind, w, before, last)
    cols = fold.any(0).nonzero().flatten()
    if cols.numel():
        a, b = int(cols[0]), int(cols[-1]) + 1
        S, z = fold_keys(S, z, kfx[:, :, a:b], vx[:, :, a:b], fold_ages(decay, kind, w, last, pos[:, a:b], fold[:, a:b]))
    keep = slice(C, C + K)  # the last K keys of X form the new ring, in slots index % K
    new_slots = index[keep] % K if K else slots
    win_k, win_v = torch.empty_like(state.win_k), torch.empty_like(state.win_v)
    win_pos, win_valid = torch.empty_like(state.win_pos), torch.empty_like(state.win_valid)
    win_k[:, :, new_slots], win_v[:, :, new_slots] = kx[:, :, keep], vx[:, :, keep]
    win_pos[:, new_slots], win_valid[:, new_slots] = pos[:, keep], inside[:, keep]
    return y, HybridState(S, z, win_k, win_v, win_pos, win_valid, first, seen + C, *sink, key_offset=state.key_offset)

