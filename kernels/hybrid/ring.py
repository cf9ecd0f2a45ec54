"""Window cache of the recurrent decode step (PyTorch and Triton), as a ring written in place.

The window cache is a ring of K = window_capacity(kind, w) slots: the token with sequence index j
(padding included) lives in slot j % K. Every key still inside the window is one of the last K
tokens, so the slot a new token takes holds a key that has left the window, at the latest in
this step (it is folded into the state before the slot is overwritten). Decoding thus writes one
column in place instead of copying the cache to append to it.
"""

from __future__ import annotations

import torch

from kernels.hybrid.window import window_start


def token_position(state, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, pos)`` for token number ``state.seen``: ``first`` [B] (set for rows whose first real
    token this is) and its position ``pos`` [B] (-1 while a row has no real token)."""
    n = state.seen
    first = torch.where((state.first < 0) & valid, torch.full_like(state.first, n), state.first)
    pos = torch.where(first >= 0, n - first, torch.full_like(first, -1))
    return first, pos


def leaving(kind: str, w: int, state, pos: torch.Tensor) -> torch.Tensor:
    """[B, K] bool: cached keys below the window of a query at ``pos`` (folded in this step)."""
    return state.win_valid & (state.win_pos < window_start(kind, w, pos)[:, None])


def leaving_columns(kind: str, state, fold: torch.Tensor) -> slice | torch.Tensor:
    """Slots that may hold leaving keys. Sliding window: only the slot the new token takes (the
    key w tokens back), as a slice (reading the ring through it makes views, not copies, and waits
    for nothing); terraced: a whole tile at a tile boundary, found with one ``nonzero``."""
    if kind == "sliding_window":
        slot = state.seen % fold.shape[1]
        return slice(slot, slot + 1)
    return fold.any(0).nonzero().flatten()


def any_columns(cols: slice | torch.Tensor) -> bool:
    """Whether :func:`leaving_columns` found a slot to read."""
    return isinstance(cols, slice) or cols.numel() > 0


def place_token(state, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor,
                fold: torch.Tensor) -> None:
    """Clear the leaving keys' validity and write the new token (k, v ``[B, H_kv, 1, d]``) into slot
    ``seen % K`` of the window cache, in place."""
    writable(state)
    slot = state.seen % state.win_k.shape[2]
    state.win_valid &= ~fold
    write_slot(state, slot, k, v, pos)
    state.win_valid[:, slot] = valid


def writable(state) -> None:
    """Give ``state`` a window cache of its own when the one it holds was written under
    ``inference_mode`` and is about to be written outside it (an inference tensor is read-only there)."""
    if state.win_k.is_inference() and not torch.is_inference_mode_enabled():
        state.win_k, state.win_v = state.win_k.clone(), state.win_v.clone()
        state.win_pos, state.win_valid = state.win_pos.clone(), state.win_valid.clone()


def write_slot(state, slot: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor | int) -> None:
    """Keys and values ``[B, H_kv, 1, d]`` at positions ``pos`` (``[B]`` or one for every row) into
    ring slot ``slot``, in place; the slot's validity is the caller's."""
    state.win_k[:, :, slot] = k[:, :, 0]
    state.win_v[:, :, slot] = v[:, :, 0]
    state.win_pos[:, slot] = pos
