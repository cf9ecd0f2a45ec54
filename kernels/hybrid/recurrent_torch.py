"""Recurrent (token-by-token) form of hybrid attention in PyTorch, and the state a prefill leaves.

State of one layer for B rows (:class:`HybridState`): ``S [B, H_s, F, d]`` = sum phi_k(k_j) v_j^T
and ``z [B, H_s, F]`` = sum phi_k(k_j) (float32) over the keys that left the window, per head of
the key feature map: H_s = H query heads, or H_kv key/value heads read by their G query heads
(``kernels.hybrid.heads``);
the window cache, a ring of K = window_capacity(kind, w) raw keys and values per KV head
``[B, H_kv, K, d]`` with each slot's position and validity ``[B, K]`` (``kernels.hybrid.ring``);
``first [B]``, each row's first real token (-1 while it has none), and ``seen``, the tokens so far.
With s sink tokens, also the sink keys and values ``[B, H_kv, s, d]`` (positions 0..s-1 of each
row) and which of them a row has seen ``[B, s]``; they never enter S, z. The ring holds each key
once, as the softmax reads it: the features of the keys it folds come from the caller's
``key_features(keys, positions)``, which may read other keys than the softmax (the keys before
RoPE, ``attention.feature_positions: none``: it rotates them back), and ``key_offset`` ``[B]``, the
caller's per-row offset from a key's position to its own position label (the RoPE position id),
travels with the rows for it; the op never reads it.

Invariant after a token at position p: S, z hold exactly the real keys with s <= position
< window_start(p) and the cache the real keys at or above it. So :func:`prefill_state` after the
parallel form and :func:`decode_step_torch` token by token build the same state and outputs:

    y = (phi_q(q)^T S + g sum_{j in cache} exp(s_j - c) v_j) / (phi_q(q)^T z + g sum_{j in cache} exp(s_j - c))

where the cache's keys are the ring's and, once they have left it, the sink keys. With a decay
(log gamma ``[H]``), S and z hold each key weighted by gamma^(window_start(p) - 1 - p_j) instead
(``kernels.hybrid.decay``): every step first carries them by the window's advance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from kernels.hybrid.chunk_torch import augment_values
from kernels.hybrid.compiled import maybe_compile
from kernels.hybrid.decay import advance, carry, fold_ages
from kernels.hybrid.heads import read_state
from kernels.hybrid.ring import any_columns, leaving, leaving_columns, place_token, token_position, writable, write_slot
from kernels.hybrid.window import WindowRule, window_start

# phi_k of cached keys: (keys [B, H_kv, K, d] as the softmax reads them, their positions [B, K]) -> [B, H_s, K, F]
KeyFeatures = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class HybridState:
    S: torch.Tensor  # [B, H_s, F, d] float32 (H_s: the key feature map's heads, H or H_kv)
    z: torch.Tensor  # [B, H_s, F] float32
    win_k: torch.Tensor  # [B, H_kv, K, d]
    win_v: torch.Tensor  # [B, H_kv, K, d]
    win_pos: torch.Tensor  # [B, K] long
    win_valid: torch.Tensor  # [B, K] bool
    first: torch.Tensor  # [B] long, -1 = no real token yet
    seen: int
    sink_k: torch.Tensor | None = None  # [B, H_kv, s, d]: keys at positions 0..s-1 (None: no sinks)
    sink_v: torch.Tensor | None = None  # [B, H_kv, s, d]
    sink_valid: torch.Tensor | None = None  # [B, s] bool: the row has seen that position
    key_offset: torch.Tensor | None = None  # [B] long: the caller's label offset for its key_features (never read here)

    @property
    def sinks(self) -> int:
        return 0 if self.sink_k is None else self.sink_k.shape[2]

    def stepped(self, S, z, first) -> "HybridState":
        """The state after a decode step: new S, z and ``first``, the same (updated in place) ring and sinks."""
        return dataclasses.replace(self, S=S, z=z, first=first, seen=self.seen + 1)

    def select(self, index: torch.Tensor) -> "HybridState":
        """Rows ``index`` of the batch (beam reorder, batch selection, repeat)."""
        rows = {f.name: getattr(self, f.name) for f in dataclasses.fields(HybridState) if f.name != "seen"}
        return HybridState(seen=self.seen, **{name: None if t is None else t[index] for name, t in rows.items()})

    @staticmethod
    def concat(states: list["HybridState"]) -> "HybridState":
        """The states of consecutive row ranges of one batch (same tokens seen) as one state."""
        if len(states) == 1:
            return states[0]
        fields = [f.name for f in dataclasses.fields(HybridState) if f.name != "seen"]
        parts = {name: [getattr(st, name) for st in states] for name in fields}
        return HybridState(seen=states[0].seen, **{name: None if ts[0] is None else torch.cat(ts) for name, ts in parts.items()})


def store_sinks(sink, k, v, pos, mask):
    """The sink cache ``(keys, values, valid)`` after C new tokens (k, v ``[B, H_kv, C, d]``,
    positions ``pos`` and mask ``[B, C]``): each real token at a position < s stored in that slot."""
    sink_k, sink_v, sink_valid = sink
    B, Hkv, C, d = k.shape
    s = sink_valid.shape[1]
    match = (pos[:, :, None] == torch.arange(s, device=pos.device)) & mask[:, :, None]  # [B, C, s]
    found = match.any(1)
    gather = match.long().argmax(1)[:, None, :, None].expand(B, Hkv, s, d)
    put = found[:, None, :, None]
    return torch.where(put, k.gather(2, gather), sink_k), torch.where(put, v.gather(2, gather), sink_v), sink_valid | found


def visible_sinks(sink_valid: torch.Tensor, kind: str, w: int, pos: torch.Tensor) -> torch.Tensor:
    """``[..., s]`` bool: the sink keys a query at ``pos`` ``[...]`` reads from the sink cache
    (``sink_valid`` ``[..., s]``): seen and below its window (those inside it are still in the ring)."""
    below = torch.arange(sink_valid.shape[-1], device=pos.device) < window_start(kind, w, pos)[..., None]
    return sink_valid & below


def fold_keys(S, z, k_feat, v, weight):
    """Add weight_j * phi_k(k_j) v_j^T to S and weight_j * phi_k(k_j) to z.

    k_feat [B, H_s, K, F], v [B, H_kv, K, d], weight [B, K] (0/1), [B, H_s, K] (per head: decay
    weights) or None (every key with weight 1), for a state per head of the key feature map (H_s =
    H or H_kv). One product per state head with the augmented values [v_j, 1] gives both; phi_k
    enters transposed, as a view, and each of the H_s / H_kv state heads of a KV head takes its own
    product, so neither operand is copied.
    One key (K = 1, a sliding window's decode step) is an outer product, taken by broadcasting."""
    B, H, K, Fd = k_feat.shape
    Hkv, d = v.shape[1], v.shape[-1]
    kf = k_feat.float()
    if weight is not None and weight.dim() == 3:
        kf = kf * weight[..., None].to(kf.dtype)
    elif weight is not None and not bool(weight.all()):
        kf = kf * weight[:, None, :, None].to(kf.dtype)
    kf = kf.view(B, Hkv, H // Hkv, K, Fd)
    if K == 1:  # S + phi_k(k)^T v: [B, H_kv, G, F, 1] times [B, H_kv, 1, 1, d], added in one pass
        S = torch.addcmul(S.reshape(B, Hkv, H // Hkv, Fd, d), kf.transpose(-1, -2), v.float()[:, :, None])
        return S.view(B, H, Fd, d), z + kf.reshape(B, H, Fd)
    va = augment_values(v.float())  # [B, Hkv, K, d + 1]
    Sz = torch.stack([torch.matmul(kf[:, :, g].transpose(-1, -2), va) for g in range(H // Hkv)], dim=2)
    Sz = Sz.view(B, H, Fd, d + 1)
    return S + Sz[..., :d], z + Sz[..., d]


def prefill_state(rule: WindowRule, k, v, k_feat, mask, decay=None) -> HybridState:
    """The state after a parallel forward over a whole prompt (empty state before).

    rule: the window rule (kind, w, s sink tokens); k, v: [B, H_kv, L, d]; k_feat: [B, H_s, L, F]
    (H_s = H or H_kv, the state's heads); mask: [B, L] bool (1 = token); decay: None or log gamma
    [H_s]."""
    kind, w, sinks = rule.kind, rule.window_size, rule.sinks
    B, Hkv, L, d = k.shape
    H, Fd = k_feat.shape[1], k_feat.shape[-1]
    idx = torch.arange(L, device=k.device)
    has = mask.any(-1)
    first = torch.where(has, (mask.long().cumsum(-1) == 0).sum(-1), torch.full_like(has, -1, dtype=torch.long))
    pos = idx[None, :] - first[:, None]  # [B, L]
    last = (L - 1) - first  # [B] the last token's position
    lb = window_start(kind, w, last)
    inside = mask & (pos >= lb[:, None])  # the window's keys, in the ring
    fold = mask & ~inside & (pos >= sinks)
    S = torch.zeros(B, H, Fd, d, device=k.device, dtype=torch.float32)
    z = torch.zeros(B, H, Fd, device=k.device, dtype=torch.float32)
    cols = fold.any(0).nonzero().flatten()
    if cols.numel():  # the span of folded keys: all but the window's, unless rows are padded
        a, b = int(cols[0]), int(cols[-1]) + 1
        S, z = fold_keys(S, z, k_feat[:, :, a:b], v[:, :, a:b], fold_ages(decay, kind, w, last, pos[:, a:b], fold[:, a:b]))
    K = rule.capacity
    win_k, win_v = k.new_zeros(B, Hkv, K, d), v.new_zeros(B, Hkv, K, d)
    win_pos = torch.zeros(B, K, dtype=torch.long, device=k.device)
    win_valid = torch.zeros(B, K, dtype=torch.bool, device=k.device)
    if K:
        last = torch.arange(max(L - K, 0), L, device=k.device)  # the prompt's last K tokens, into slots j % K
        slots = last % K
        win_k[:, :, slots], win_v[:, :, slots] = k[:, :, last], v[:, :, last]
        win_pos[:, slots], win_valid[:, slots] = pos[:, last], inside[:, last]
    sink = (None,) * 3
    if sinks:  # the keys at positions 0..s-1, into an empty sink cache
        empty = k.new_zeros(B, Hkv, sinks, d), v.new_zeros(B, Hkv, sinks, d), mask.new_zeros(B, sinks)
        sink = store_sinks(empty, k, v, pos, mask)
    return HybridState(S, z, win_k, win_v, win_pos, win_valid, first, L, *sink)


def decode_step_torch(
    state: HybridState, rule: WindowRule, q, k, v, q_feat, mix, valid, key_features: KeyFeatures, scale: float,
    decay=None,
) -> tuple[torch.Tensor, HybridState]:
    """Process one token for every row; returns y [B, H, 1, d] and the new state (which shares the
    window cache, updated in place, with ``state``).

    rule: the window rule the state was built with (its sink tokens are the state's), q [B, H, 1, d],
    k and v [B, H_kv, 1, d], q_feat [B, H, 1, F], mix [H] logits, valid [B] bool (False for a
    padding token), key_features: (keys [B, H_kv, C, d], positions [B, C]) -> [B, H_s, C, F] (phi_k
    per state head, applied only to the keys folded into the state), scale: the score scale, decay:
    None or log gamma [H_s]."""
    if aligned_step(state, rule, valid):
        return decode_step_aligned(state, rule, q, k, v, q_feat, mix, key_features, scale, decay)
    kind, w = rule.kind, rule.window_size
    first, pos = token_position(state, valid)
    S, z = advance(state.S, state.z, decay, kind, w, pos - 1, pos)
    if kind == "linear":  # no window: the key goes straight into the state
        S, z = fold_keys(S, z, key_features(k, pos[:, None]), v, valid[:, None])
    else:  # fold the keys that leave the window (sink keys leave it unfolded), then write the new one into its slot
        fold = leaving(kind, w, state, pos)
        cols = leaving_columns(kind, state, fold)
        if any_columns(cols):  # folded before place_token overwrites the slot
            S, z = fold_keys(S, z, key_features(state.win_k[:, :, cols], state.win_pos[:, cols]), state.win_v[:, :, cols],
                             fold_weight(state, fold, cols, kind, w, pos, decay))
        place_token(state, k, v, pos, valid, fold)
    sink, ring, sinks = step_window(state, kind, w, k, v, pos, valid)

    if kind == "linear":
        y = compiled_readout(q_feat, q, S, z, None, None, None, mix, scale)
    else:
        y = compiled_readout(q_feat, q, S, z, *all_valid(ring), mix, scale, *all_valid(sinks or ()))
    return y, dataclasses.replace(state.stepped(S, z, first), **sink_fields(sink))


def aligned_step(state: HybridState, rule: WindowRule, valid: torch.Tensor) -> bool:
    """Whether every row of this step stands at the same point of a full sliding window, so that
    :func:`decode_step_aligned` can take it without per-row positions: each row real from its first
    token (``first`` 0, so the token's position is ``seen`` in every row) and this token real in
    every row, the ring's keys all valid, and the sink cache complete with all its keys below the
    window. The flags are read on CPU only (:func:`all_set_on_cpu`); elsewhere the answer is False."""
    if rule.kind != "sliding_window" or window_start(rule.kind, rule.window_size, state.seen) < state.sinks:
        return False
    return (all_set_on_cpu(valid) and all_set_on_cpu(state.win_valid) and not bool(state.first.any())
            and (not state.sinks or sinks_complete(state)))


def decode_step_aligned(
    state: HybridState, rule: WindowRule, q, k, v, q_feat, mix, key_features: KeyFeatures, scale: float, decay=None,
) -> tuple[torch.Tensor, HybridState]:
    """:func:`decode_step_torch` for a step :func:`aligned_step` admits, with the same result. The
    token is at position n = ``seen`` in every row, so the window moves by one for all rows: S, z
    are carried by gamma^1; the key that leaves it is the one at position n - w, in slot n % w of
    every row (a view of the ring), and enters S, z with age weight gamma^0 = 1 unless it is a sink
    key; the new token takes its slot; every ring and sink key is read unmasked."""
    n, w = state.seen, rule.window_size
    slot = n % w
    S, z = state.S, state.z
    if decay is not None:  # the window moved by one position in every row
        S, z = carry(S, z, decay.float().exp())
    if n - w >= state.sinks:
        cols = slice(slot, slot + 1)
        S, z = fold_keys(S, z, key_features(state.win_k[:, :, cols], state.win_pos[:, cols]), state.win_v[:, :, cols], None)
    writable(state)
    write_slot(state, slot, k, v, n)
    sinks = (state.sink_k, state.sink_v, None) if state.sinks else ()
    y = compiled_readout(q_feat, q, S, z, state.win_k, state.win_v, None, mix, scale, *sinks)
    return y, state.stepped(S, z, state.first)


def sink_fields(sink) -> dict:
    """The sink cache ``(keys, values, valid)`` (or Nones) as :class:`HybridState` fields."""
    return dict(zip(("sink_k", "sink_v", "sink_valid"), sink))


def fold_weight(state: HybridState, fold: torch.Tensor, cols: slice | torch.Tensor, kind: str, w: int, pos: torch.Tensor,
                decay=None) -> torch.Tensor:
    """The weight of the leaving keys in slots ``cols`` as they enter S, z after a token at ``pos``:
    [B, C] 0/1, 1 for those of ``fold`` (:func:`kernels.hybrid.ring.leaving`) that are not sink
    tokens; with a decay (log gamma [H]) [B, H, C], times their age weights
    (:func:`kernels.hybrid.decay.fold_ages`)."""
    weight = fold[:, cols]
    weight = weight & (state.win_pos[:, cols] >= state.sinks) if state.sinks else weight
    return fold_ages(decay, kind, w, pos, state.win_pos[:, cols], weight)


def step_window(state: HybridState, kind: str, w: int, k, v, pos, valid):
    """The softmax keys of a decode step after :func:`kernels.hybrid.ring.place_token`:
    ``(sink cache, ring, sinks)``. ``ring`` is the ring's ``(keys, values, valid)``; ``sinks`` is
    None without sink tokens, else the cached sinks below the window of ``pos`` as ``(keys, values,
    visible)`` (``[B, H_kv, s, d]``, ``[B, s]``), after the new token was stored in the sink cache
    when it is a real token at a position < s. The two are read side by side, not concatenated
    (:func:`readout`; :func:`joined` for a kernel that takes one key tensor)."""
    ring = (state.win_k, state.win_v, state.win_valid)
    if not state.sinks:
        return (None, None, None), ring, None
    sink = (state.sink_k, state.sink_v, state.sink_valid)
    if not sinks_complete(state):
        sink = store_sinks(sink, k, v, pos[:, None], valid[:, None])
    return sink, ring, (sink[0], sink[1], visible_sinks(sink[2], kind, w, pos))


def all_set_on_cpu(flags: torch.Tensor) -> bool:
    """Whether ``flags`` (bool) are all set, asked on CPU only, where reading a flag back costs
    nothing; on a GPU the answer would wait for the device, so it is False there and the caller
    does the work that is a no-op when they are set."""
    return flags.device.type == "cpu" and bool(flags.all())


def sinks_complete(state: HybridState) -> bool:
    """Whether every row has stored all its sink keys, so that no later token is one (positions only
    grow; :func:`all_set_on_cpu`: on a GPU the store runs and leaves the cache as it is)."""
    return state.seen >= state.sinks and all_set_on_cpu(state.sink_valid)


def all_valid(keys: tuple) -> tuple:
    """``(keys, values, valid)`` with ``valid`` None when every key is valid (the readout then masks
    nothing; :func:`all_set_on_cpu`); ``()`` stays ``()``."""
    if keys and all_set_on_cpu(keys[2]):
        return keys[0], keys[1], None
    return keys


def joined(ring, sinks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`step_window`'s ring and sinks as one ``(keys [B, H_kv, K + s, d], values, valid [B, K + s])``."""
    if sinks is None:
        return ring
    return (torch.cat([ring[0], sinks[0]], dim=2), torch.cat([ring[1], sinks[1]], dim=2),
            torch.cat([ring[2], sinks[2]], dim=1))


def readout(q_feat, q, S, z, win_k, win_v, win_valid, mix, scale: float, sink_k=None, sink_v=None,
            sink_visible=None) -> torch.Tensor:
    """y [B, H, 1, d] of one token from the updated state and its softmax keys: the window ring
    (``win_k`` None: linear) and, with sink tokens, the visible sinks, each ``(keys [B, H_kv, K, d],
    values, valid [B, K] or None: all valid)`` and read where they lie (no copy into one tensor):

        y = (phi_q(q)^T S + g sum_{j in cache} exp(s_j - c) v_j) / (phi_q(q)^T z + g sum_{j in cache} exp(s_j - c))

    with c the largest score over the whole cache (ring and sinks)."""
    B, H, _, d = q.shape
    num, den = read_state(q_feat, S, z)
    num, den = num[:, :, 0], den[:, :, 0]  # [B, H, d], [B, H]
    if win_k is not None:
        Hkv = win_k.shape[1]
        G = H // Hkv
        qg = q.float().view(B, Hkv, G, d) * scale
        parts = [(win_k, win_v, win_valid)] + ([] if sink_k is None else [(sink_k, sink_v, sink_visible)])
        scores = [torch.matmul(qg, keys.float().transpose(-1, -2)) for keys, _, _ in parts]  # [B, Hkv, G, K] each
        scores = [s if ok is None else s.masked_fill(~ok[:, None, None, :], float("-inf")) for s, (_, _, ok) in zip(scores, parts)]
        c = scores[0].amax(-1, keepdim=True)
        for s in scores[1:]:
            c = torch.maximum(c, s.amax(-1, keepdim=True))
        if any(ok is not None for _, _, ok in parts):  # a row may have no key left: c is -inf there, its softmax part 0
            c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
        c = c - torch.nn.functional.logsigmoid(mix.float()).view(1, Hkv, G, 1)  # exp(s - c) g = exp(s - (c - log g))
        for s, (_, values, _) in zip(scores, parts):
            p = (s - c).exp_()
            num = num + torch.matmul(p, values.float()).view(B, H, d)
            den = den + p.sum(-1).view(B, H)
    y = num / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    return y[:, :, None].to(q.dtype)


compiled_readout = maybe_compile(readout)  # what a decode step runs: compiled when LOLCATS_COMPILE=1
