"""Functional LoLCATs attention: the kernels package's op, re-exported for the attention layers.

:func:`hybrid_attention` is :func:`kernels.dispatch.hybrid_attention`, which documents the op
(equation, shapes, defaults), checks its inputs and picks the Triton kernels or the PyTorch form;
the window rule it takes, :class:`WindowRule` (kind, window, sink tokens), validates itself
(``kernels/hybrid/window.py``).
"""

from __future__ import annotations

from kernels.dispatch import hybrid_attention
from kernels.hybrid.window import KINDS, WindowRule, check_kind

__all__ = ["KINDS", "WindowRule", "check_kind", "hybrid_attention"]
