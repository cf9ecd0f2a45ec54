"""Window bookkeeping shared by the recurrent decode step (PyTorch and Triton).

Positions count from each row's first real token. After a token at position p the state holds
the real keys with position < window_start(p) and the window cache those at or above it:
window_start(p) = p + 1 (linear), p - w + 1 (sliding window), w * (floor(p / w) - 1) (terraced).
"""

from __future__ import annotations

import torch


def window_capacity(kind: str, w: int) -> int:
    """Window-cache columns kept between steps."""
    return {"linear": 0, "sliding_window": w, "terraced": 2 * w}[kind]


def window_start(kind: str, w: int, pos: torch.Tensor) -> torch.Tensor:
    """First position still inside the window of a query at ``pos``."""
    if kind == "linear":
        return pos + 1
    if kind == "sliding_window":
        return pos - w + 1
    return w * (torch.div(pos, w, rounding_mode="floor") - 1)


def append_token(state, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor):
    """Positions of one new token per row and the window cache with it appended.

    Returns ``(first, pos, win_k, win_v, win_pos, win_valid)``: ``first`` [B] (set for rows whose
    first real token this is), ``pos`` [B] (-1 while a row has no real token), and the cache
    tensors one column longer."""
    n = state.seen
    first = torch.where((state.first < 0) & valid, torch.full_like(state.first, n), state.first)
    pos = torch.where(first >= 0, n - first, torch.full_like(first, -1))
    win_k = torch.cat([state.win_k, k], dim=2)
    win_v = torch.cat([state.win_v, v], dim=2)
    win_pos = torch.cat([state.win_pos, pos[:, None]], dim=1)
    win_valid = torch.cat([state.win_valid, valid[:, None]], dim=1)
    return first, pos, win_k, win_v, win_pos, win_valid
