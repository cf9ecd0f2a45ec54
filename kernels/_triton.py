"""The one place the Triton kernels import ``triton``, with a clear message when it cannot.

A missing or broken Triton install raises :class:`TritonUnavailableError` (an ``ImportError``)
naming the cause and the fix when a Triton module is imported, instead of failing later inside a
run. ``INTERPRETER`` records whether the kernels were defined under Triton's CPU interpreter
(``TRITON_INTERPRET=1`` must be set before ``triton`` is first imported in the process).
"""

from __future__ import annotations


class TritonUnavailableError(ImportError):
    """Triton is not installed or cannot be imported."""


_FIX = (
    "Install a Triton build matching your torch (CUDA wheels of torch ship with it: "
    "`pip install triton`), or use the PyTorch form with LOLCATS_KERNELS=torch."
)

try:
    import triton
    import triton.language as tl
except Exception as exc:  # ImportError, or a broken install failing while it initialises
    raise TritonUnavailableError(f"the LoLCATs Triton kernels need the `triton` package, which failed to import ({exc!r}). {_FIX}") from exc

try:
    INTERPRETER: bool = bool(triton.knobs.runtime.interpret)
except AttributeError:  # older Triton without knobs
    import os

    INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") == "1"

__all__ = ["INTERPRETER", "TritonUnavailableError", "tl", "triton"]
