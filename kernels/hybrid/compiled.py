"""The decode step's readout compiled with ``torch.compile`` (inductor), with an eager fallback.

One decode step runs the readout of :func:`kernels.hybrid.recurrent_torch.readout` per layer:
about twenty small ops whose Python and dispatch overhead, not their arithmetic, dominate at small
batches. Compiled, they become one generated kernel per (shapes, dtypes) signature; the shapes of
the state and of the window ring are static during a generation, so one graph is built per batch
size and reused by every step and every layer (``dynamic=False``; the window weights and the
scale are inputs, not constants).

``LOLCATS_COMPILE`` chooses: ``0`` (the default) runs eagerly, ``1`` compiles. When compilation is
unavailable or fails (no compiler, an unsupported platform, an error while tracing or at run
time), a warning is logged once and the eager readout is used from then on; outputs are the same
either way (``tests/kernels/hybrid/test_compiled.py``).
"""

from __future__ import annotations

import logging
import os

import torch

ENV_VAR = "LOLCATS_COMPILE"
log = logging.getLogger(__name__)

_compiled = None  # the compiled readout, built on first use
_failure: str | None = None  # why compilation is off for this process (None while it works)


def enabled() -> bool:
    """Whether the readout is compiled: ``LOLCATS_COMPILE=1`` and no failure so far."""
    return os.environ.get(ENV_VAR, "0").strip() == "1" and _failure is None


def failure() -> str | None:
    """Why compilation was given up in this process (None if it was not)."""
    return _failure


def _eager(*args):
    from kernels.hybrid.recurrent_torch import readout as eager

    return eager(*args)


def readout(q_feat, q, S, z, win_k, win_v, win_valid, mix, scale: float) -> torch.Tensor:
    """:func:`kernels.hybrid.recurrent_torch.readout`, compiled when :func:`enabled`."""
    global _compiled, _failure
    args = (q_feat, q, S, z, win_k, win_v, win_valid, mix, scale)
    if not enabled():
        return _eager(*args)
    try:
        if _compiled is None:
            from kernels.hybrid.recurrent_torch import readout as eager

            _compiled = torch.compile(eager, dynamic=False, fullgraph=True)
        return _compiled(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of the compiler falls back
        _failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        log.warning("torch.compile of the decode readout failed (%s); using the eager readout", _failure)
        return _eager(*args)
