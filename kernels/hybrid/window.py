"""The attention kinds and the window rule: which keys a query sees through softmax (torch-free).

Positions count from each row's first real token. After a token at position p the state holds
the real keys with position < window_start(p) and the window cache those at or above it:
window_start(p) = p + 1 (linear), p - w + 1 (sliding window), w * (floor(p / w) - 1) (terraced).
"""

from __future__ import annotations

KINDS = ("linear", "sliding_window", "terraced")  # the attention kinds every layer, config and kernel accepts


def window_capacity(kind: str, w: int) -> int:
    """Window-cache slots (0 for linear attention: every key goes straight into the state)."""
    return {"linear": 0, "sliding_window": w, "terraced": 2 * w}[kind]


def window_start(kind: str, w: int, pos):
    """First position still inside the window of a query at ``pos`` (an int or an integer tensor)."""
    if kind == "linear":
        return pos + 1
    if kind == "sliding_window":
        return pos - w + 1
    return w * (pos // w - 1)
