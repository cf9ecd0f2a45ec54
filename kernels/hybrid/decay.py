"""The decaying history: per-head weights gamma_h^age of the linear part's keys.

With a decay (``attention.history_norm: decay``), history key j of a query at position p_n enters
the linear part with weight

    gamma_h^(window_start(p_n) - 1 - p_j),    0 < gamma_h <= 1 (passed as log gamma_h <= 0, ``[H]``),

its age counted from the window's edge: a key that has just left the window has age 0 whatever
the window kind, and the history's mass stays bounded by about 1 / (1 - gamma_h) keys however long
the input, so its statistics at any length are those of the training blocks once they are longer
than that. The recurrent state keeps the same sums: S, z hold sum_j gamma^(window_start(p) - 1 - p_j)
phi_k(k_j) [v_j, 1] after a token at p, so the next token multiplies them by gamma^(the window's
advance) before folding the keys that leave the window (:func:`advance`, :func:`fold_ages`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.hybrid.window import window_start


class TileAges(NamedTuple):
    """Decay weights of the tiled form (``kernels.hybrid.chunk_torch.history_terms``), for tiles of
    length T, nt tiles per row, B rows, H heads: ``key`` [n, T, 1] gamma^(T - 1 - r) of a key at
    offset r (its age at its tile's end), ``carry`` [H, nt, nt] gamma^(T (i - u)) for u <= i (the
    prefix of tile u seen from tile i's end), ``query`` [n, T, 1] gamma^(r + 1) and ``pair``
    [n, T, T] gamma^(r - r') for r' <= r (0 above the diagonal); n = B H nt, head-major like the tiles."""

    key: torch.Tensor
    carry: torch.Tensor
    query: torch.Tensor
    pair: torch.Tensor


def tile_ages(decay: torch.Tensor, tile: int, nt: int, B: int) -> TileAges:
    """:class:`TileAges` for ``decay`` = log gamma ``[H]``."""
    lg = decay.float()
    H = lg.shape[0]
    r = torch.arange(tile, device=lg.device, dtype=torch.float32)
    i = torch.arange(nt, device=lg.device, dtype=torch.float32)

    def per_tile(x: torch.Tensor) -> torch.Tensor:  # [H, T, X] -> [B H nt, T, X]
        return x[None, :, None].expand(B, H, nt, *x.shape[1:]).reshape(B * H * nt, *x.shape[1:])

    lower = (i[:, None] >= i[None, :]).float()
    carry = torch.exp(lg[:, None, None] * (tile * (i[:, None] - i[None, :])).clamp(min=0)) * lower
    tril = (r[:, None] >= r[None, :]).float()
    pair = torch.exp(lg[:, None, None] * (r[:, None] - r[None, :]).clamp(min=0)) * tril
    key = torch.exp(lg[:, None] * (tile - 1 - r))[..., None]
    query = torch.exp(lg[:, None] * (r + 1))[..., None]
    return TileAges(per_tile(key), carry, per_tile(query), per_tile(pair))


def history_weights(decay: torch.Tensor | None, kind: str, w: int, query_pos: torch.Tensor, key_pos: torch.Tensor):
    """gamma_h^(window_start(p_n) - 1 - p_j): ``[B, H, Lq, Lk]`` for positions ``[B, Lq]`` and
    ``[B, Lk]`` (float64; 1 without a decay). Entries off the history are not meaningful (mask them)."""
    if decay is None:
        return torch.ones((), dtype=torch.float64, device=query_pos.device)
    age = (window_start(kind, w, query_pos)[:, :, None] - 1 - key_pos[:, None, :]).clamp(min=0).double()
    return torch.exp(decay.double()[None, :, None, None] * age[:, None])


def advance(S: torch.Tensor, z: torch.Tensor, decay: torch.Tensor | None, kind: str, w: int, before: torch.Tensor,
            after: torch.Tensor):
    """S ``[B, H, F, d]``, z ``[B, H, F]`` carried from a token at position ``before`` to one at
    ``after`` (``[B]``; -1: no real token yet): multiplied by gamma^(window_start(after) -
    window_start(before)), the window's advance (S, z are 0 while a row has no real token)."""
    if decay is None:
        return S, z
    steps = (window_start(kind, w, after) - window_start(kind, w, before)).clamp(min=0).float()
    return carry(S, z, torch.exp(decay.float()[None, :] * steps[:, None]))  # factor [B, H]


def carry(S: torch.Tensor, z: torch.Tensor, factor: torch.Tensor):
    """S ``[B, H, F, d]``, z ``[B, H, F]`` times the per-head factor gamma^steps, ``[B, H]`` (per row)
    or ``[H]`` (every row carried alike)."""
    return S * factor[..., None, None], z * factor[..., None]


def fold_ages(decay: torch.Tensor | None, kind: str, w: int, pos: torch.Tensor, key_pos: torch.Tensor,
              weight: torch.Tensor) -> torch.Tensor:
    """The weights of keys at ``key_pos`` ``[B, K]`` folded into the state after a token at ``pos``
    ``[B]``: ``weight`` ``[B, K]`` (0/1) times gamma^(window_start(pos) - 1 - key_pos), ``[B, H, K]``
    (``weight`` itself without a decay)."""
    if decay is None:
        return weight
    age = (window_start(kind, w, pos)[:, None] - 1 - key_pos).clamp(min=0).float()
    return weight[:, None].float() * torch.exp(decay.float()[None, :, None] * age[:, None])
