"""Recurrent (token-by-token) form of hybrid attention in PyTorch, and the state a prefill leaves.

State of one layer for B rows (:class:`HybridState`): ``S [B, H, F, d]`` = sum phi_k(k_j) v_j^T
and ``z [B, H, F]`` = sum phi_k(k_j) (float32, per query head) over the keys that left the window;
the window cache, a ring of K = window_capacity(kind, w) raw keys and values per KV head
``[B, H_kv, K, d]`` with each slot's position and validity ``[B, K]`` (``kernels.hybrid.ring``);
``first [B]``, each row's first real token (-1 while it has none), and ``seen``, the tokens so far.

Invariant after a token at position p: S, z hold exactly the real keys with position
< window_start(p) and the cache the real keys at or above it. So :func:`prefill_state` after the
parallel form and :func:`decode_step_torch` token by token build the same state and outputs:

    y = (phi_q(q)^T S + g sum_{j in cache} exp(s_j - c) v_j) / (phi_q(q)^T z + g sum_{j in cache} exp(s_j - c))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kernels.hybrid import compiled
from kernels.hybrid.chunk_torch import augment_values
from kernels.hybrid.ring import leaving, leaving_columns, place_token, token_position
from kernels.hybrid.window import window_capacity, window_start

KeyFeatures = Callable[[torch.Tensor], torch.Tensor]  # raw keys [B, H_kv, K, d] -> [B, H, K, F]


@dataclass
class HybridState:
    S: torch.Tensor  # [B, H, F, d] float32
    z: torch.Tensor  # [B, H, F] float32
    win_k: torch.Tensor  # [B, H_kv, K, d]
    win_v: torch.Tensor  # [B, H_kv, K, d]
    win_pos: torch.Tensor  # [B, K] long
    win_valid: torch.Tensor  # [B, K] bool
    first: torch.Tensor  # [B] long, -1 = no real token yet
    seen: int

    def select(self, index: torch.Tensor) -> "HybridState":
        """Rows ``index`` of the batch (beam reorder, batch selection, repeat)."""
        return HybridState(
            self.S[index], self.z[index], self.win_k[index], self.win_v[index],
            self.win_pos[index], self.win_valid[index], self.first[index], self.seen,
        )


def fold_keys(S, z, k_feat, v, weight):
    """Add weight_j * phi_k(k_j) v_j^T to S and weight_j * phi_k(k_j) to z.

    k_feat [B, H, K, F], v [B, H_kv, K, d], weight [B, K] (0/1). One product per query head with
    the augmented values [v_j, 1] gives both; phi_k enters transposed, as a view, and each of the
    G query heads of a KV head takes its own product, so neither operand is copied."""
    B, H, K, Fd = k_feat.shape
    Hkv, d = v.shape[1], v.shape[-1]
    kf = k_feat.float()
    if not bool(weight.all()):
        kf = kf * weight[:, None, :, None].to(kf.dtype)
    kf = kf.view(B, Hkv, H // Hkv, K, Fd)
    va = augment_values(v.float())  # [B, Hkv, K, d + 1]
    Sz = torch.stack([torch.matmul(kf[:, :, g].transpose(-1, -2), va) for g in range(H // Hkv)], dim=2)
    Sz = Sz.view(B, H, Fd, d + 1)
    return S + Sz[..., :d], z + Sz[..., d]


def prefill_state(kind, w, k, v, k_feat, mask) -> HybridState:
    """The state after a parallel forward over a whole prompt (empty state before).

    k, v: [B, H_kv, L, d]; k_feat: [B, H, L, F]; mask: [B, L] bool (1 = token)."""
    B, Hkv, L, d = k.shape
    H, Fd = k_feat.shape[1], k_feat.shape[-1]
    idx = torch.arange(L, device=k.device)
    has = mask.any(-1)
    first = torch.where(has, (mask.long().cumsum(-1) == 0).sum(-1), torch.full_like(has, -1, dtype=torch.long))
    pos = idx[None, :] - first[:, None]  # [B, L]
    lb = window_start(kind, w, (L - 1) - first)  # [B]
    fold = mask & (pos < lb[:, None])
    S = torch.zeros(B, H, Fd, d, device=k.device, dtype=torch.float32)
    z = torch.zeros(B, H, Fd, device=k.device, dtype=torch.float32)
    cols = fold.any(0).nonzero().flatten()
    if cols.numel():  # the span of folded keys: all but the window's, unless rows are padded
        a, b = int(cols[0]), int(cols[-1]) + 1
        S, z = fold_keys(S, z, k_feat[:, :, a:b], v[:, :, a:b], fold[:, a:b])
    K = window_capacity(kind, w)
    win_k, win_v = k.new_zeros(B, Hkv, K, d), v.new_zeros(B, Hkv, K, d)
    win_pos = torch.zeros(B, K, dtype=torch.long, device=k.device)
    win_valid = torch.zeros(B, K, dtype=torch.bool, device=k.device)
    if K:
        last = torch.arange(max(L - K, 0), L, device=k.device)  # the prompt's last K tokens, into slots j % K
        slots = last % K
        win_k[:, :, slots], win_v[:, :, slots] = k[:, :, last], v[:, :, last]
        win_pos[:, slots], win_valid[:, slots] = pos[:, last], (mask & ~fold)[:, last]
    return HybridState(S, z, win_k, win_v, win_pos, win_valid, first, L)


def decode_step_torch(
    state: HybridState, kind: str, w: int, q, k, v, q_feat, mix, valid, key_features: KeyFeatures, scale: float,
) -> tuple[torch.Tensor, HybridState]:
    """Process one token for every row; returns y [B, H, 1, d] and the new state (which shares the
    window cache, updated in place, with ``state``).

    q [B, H, 1, d], k and v [B, H_kv, 1, d], q_feat [B, H, 1, F], mix [H] logits, valid [B] bool
    (False for a padding token), key_features: raw keys [B, H_kv, C, d] -> [B, H, C, F] (phi_k per
    query head, applied only to the keys folded into the state), scale: the score scale."""
    first, pos = token_position(state, valid)
    S, z = state.S, state.z
    if kind == "linear":  # no window: the key goes straight into the state
        S, z = fold_keys(S, z, key_features(k), v, valid[:, None])
    else:  # fold the keys that leave the window, then write the new one into its slot
        fold = leaving(kind, w, state, pos)
        cols = leaving_columns(kind, state, fold)
        if cols.numel():
            S, z = fold_keys(S, z, key_features(state.win_k[:, :, cols]), state.win_v[:, :, cols], fold[:, cols])
        place_token(state, k, v, pos, valid, fold)
    win_k, win_v, win_valid = state.win_k, state.win_v, state.win_valid

    windowed = kind != "linear"
    y = compiled.readout(q_feat, q, S, z, win_k if windowed else None, win_v if windowed else None, win_valid, mix, scale)
    new_state = HybridState(S, z, win_k, win_v, state.win_pos, win_valid, first, state.seen + 1)
    return y, new_state


def readout(q_feat, q, S, z, win_k, win_v, win_valid, mix, scale: float) -> torch.Tensor:
    """y [B, H, 1, d] of one token from the updated state and window cache (``win_k`` None: linear):

        y = (phi_q(q)^T S + g sum_{j in cache} exp(s_j - c) v_j) / (phi_q(q)^T z + g sum_{j in cache} exp(s_j - c))
    """
    B, H, _, d = q.shape
    qf = q_feat.float()  # [B, H, 1, F]
    num = torch.matmul(qf, S)[:, :, 0]  # [B, H, d]
    den = torch.matmul(qf, z[..., None])[:, :, 0, 0]  # [B, H]
    if win_k is not None:
        Hkv = win_k.shape[1]
        G = H // Hkv
        qg = q.float().view(B, Hkv, G, d) * scale
        s = torch.matmul(qg, win_k.float().transpose(-1, -2))  # [B, Hkv, G, K]
        s = s.masked_fill(~win_valid[:, None, None, :], float("-inf"))
        c = s.amax(-1, keepdim=True)
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
        p = torch.exp(s - c) * torch.sigmoid(mix.float()).view(1, Hkv, G, 1)
        num = num + torch.matmul(p, win_v.float()).view(B, H, d)
        den = den + p.sum(-1).view(B, H)
    y = num / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    return y[:, :, None].to(q.dtype)
