"""Functions compiled with ``torch.compile`` (inductor) on request, with an eager fallback.

:func:`maybe_compile` wraps a function of tensors and Python scalars. The decode step's readout
(:func:`kernels.hybrid.recurrent_torch.readout`) is one: about twenty small ops per layer whose
Python and dispatch overhead, not their arithmetic, dominate at small batches. Compiled, they
become one generated kernel per (shapes, dtypes) signature; the shapes of the state and of the
window ring are static during a generation, so one graph is built per batch size and reused by
every step and every layer (``dynamic=False``; the window weights and the scale are inputs, not
constants).

``LOLCATS_COMPILE`` chooses: ``0`` (the default) runs eagerly, ``1`` compiles. When compilation is
unavailable or fails (no compiler, an unsupported platform, an error while tracing or at run
time), a warning is logged once and every wrapped function runs eagerly from then on; outputs are
the same either way (``tests/kernels/hybrid/test_compiled.py``). This module imports nothing from
the project, so any kernel module can use it.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Callable

import torch

ENV_VAR = "LOLCATS_COMPILE"
log = logging.getLogger(__name__)

_failure: str | None = None  # why compilation is off for this process (None while it works)


def enabled() -> bool:
    """Whether wrapped functions are compiled: ``LOLCATS_COMPILE=1`` and no failure so far."""
    return os.environ.get(ENV_VAR, "0").strip() == "1" and _failure is None


def failure() -> str | None:
    """Why compilation was given up in this process (None if it was not)."""
    return _failure


def _reason(exc: Exception) -> str:
    """``exc`` as one short line: its type and the first line of its message."""
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message.splitlines()[0][:300] if message else ''}"


def maybe_compile(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` (positional arguments only), compiled with ``torch.compile(dynamic=False,
    fullgraph=True)`` on its first call while :func:`enabled` and reused by later calls; ``fn``
    itself while compilation is off. A failure to compile or to run the compiled graph switches
    compilation off for the process (:func:`failure` says why), logs one warning and returns ``fn``'s
    result for that call."""
    graph = None

    @functools.wraps(fn)
    def run(*args):
        global _failure
        nonlocal graph
        if not enabled():
            return fn(*args)
        try:
            if graph is None:
                graph = torch.compile(fn, dynamic=False, fullgraph=True)
            return graph(*args)
        except Exception as exc:  # noqa: BLE001 - any failure of the compiler falls back
            _failure = _reason(exc)
            log.warning("torch.compile of %s failed (%s); running it eagerly", fn.__qualname__, _failure)
            return fn(*args)

    return run
