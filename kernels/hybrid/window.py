"""The attention kinds and the window rule: which keys a query sees through softmax (torch-free).

Positions count from each row's first real token. After a token at position p the state holds
the real keys with position < window_start(p) and the window cache those at or above it:
window_start(p) = p + 1 (linear), p - w + 1 (sliding window), w * (floor(p / w) - 1) (terraced).

Sink tokens (``sinks`` = s > 0, not with linear attention): the keys at positions < s stay in the
softmax part for every later query, inside or outside the window, and never enter the linear
history; they hold the attention mass that pretrained models park on the first tokens (the
"attention sink"), which a linear term reproduces badly. So for a query at p, key j is softmax
when window_start(p) <= p_j <= p or p_j < min(s, p + 1), and history when s <= p_j < window_start(p).

:class:`WindowRule` holds the three numbers that say it (kind, w, s), validated once; every form of
the op (``kernels.dispatch``, ``chunk_torch``, ``chunk_triton``, ``naive``, the decode step and the
carried chunk) takes one.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("linear", "sliding_window", "terraced")  # the attention kinds every layer, config and kernel accepts


def check_kind(kind: str) -> str:
    """``kind`` validated: one of :data:`KINDS`."""
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    return kind


def window_capacity(kind: str, w: int) -> int:
    """Window-cache slots (0 for linear attention: every key goes straight into the state)."""
    return {"linear": 0, "sliding_window": w, "terraced": 2 * w}[kind]


def check_sinks(kind: str, sinks: int) -> int:
    """``sinks`` validated for ``kind``: an integer >= 0, and 0 for linear attention (no softmax part)."""
    if int(sinks) != sinks or sinks < 0:
        raise ValueError(f"sink tokens must be an integer >= 0, got {sinks!r}")
    if sinks and kind == "linear":
        raise ValueError("sink tokens need a softmax part: use kind sliding_window or terraced, or 0 sink tokens")
    return int(sinks)


def window_start(kind: str, w: int, pos):
    """First position still inside the window of a query at ``pos`` (an int or an integer tensor)."""
    if kind == "linear":
        return pos + 1
    if kind == "sliding_window":
        return pos - w + 1
    return w * (pos // w - 1)


@dataclass(frozen=True)
class WindowRule:
    """Which keys a query sees through softmax and which through the linear history (module docstring).

    Validated on construction (``ValueError`` naming the bad value); frozen, so one rule can be
    shared by every call of a layer.
    """

    kind: str  # linear, sliding_window or terraced
    window_size: int = 64  # w: the window (sliding) or tile (terraced) length; unused by linear
    sinks: int = 0  # s: the first s keys stay softmax keys for every later query (0 with linear)

    def __post_init__(self):
        check_kind(self.kind)
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        if int(self.window_size) != self.window_size:
            raise ValueError(f"window_size must be an integer, got {self.window_size!r}")
        object.__setattr__(self, "window_size", int(self.window_size))  # numpy or torch integers as int
        object.__setattr__(self, "sinks", check_sinks(self.kind, self.sinks))

    @property
    def capacity(self) -> int:
        """Window-cache slots of the recurrent state (:func:`window_capacity`)."""
        return window_capacity(self.kind, self.window_size)
