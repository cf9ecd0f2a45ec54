"""Kernel tests run the Triton kernels on CUDA when there is a device, else through Triton's CPU
interpreter (small shapes: the interpreter executes every program in Python).

The interpreter needs ``TRITON_INTERPRET=1`` in the environment before ``triton`` is first
imported: Triton's own library functions (``tl.max``, ...) are defined at import time for either
the compiler or the interpreter. In a whole-suite run other folders are collected first and their
imports (transformers -> torch._dynamo) already import ``triton``; in that case the Python modules
of ``triton`` (not its compiled extension) and any already imported kernel modules are dropped from
``sys.modules`` here, so the imports of the test modules below define everything for the
interpreter. This does not change other folders' results: the kernel dispatch never picks Triton
for CPU tensors unless ``LOLCATS_KERNELS=triton`` is set, and nothing else uses Triton on CPU. The
variable is restored when the session ends.

``torch.empty`` / ``torch.empty_like`` fill floating tensors with NaN during these tests, so an
output element a kernel forgets to write shows up as NaN.
"""

import os
import sys
from collections import Counter

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_PREVIOUS = os.environ.get("TRITON_INTERPRET")


def _interpreting_triton_loaded() -> bool:
    import triton.language.standard as std
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(std.max, InterpretedFunction)


def _enable_interpreter() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules and not _interpreting_triton_loaded():
        for name in list(sys.modules):
            if (name == "triton" or name.startswith("triton.")) and not name.startswith("triton._C"):
                del sys.modules[name]
        for name in ("kernels._triton", "kernels.hybrid.chunk_triton", "kernels.hybrid.recurrent_triton"):
            sys.modules.pop(name, None)
        hybrid = sys.modules.get("kernels.hybrid")
        for attr in ("chunk_triton", "recurrent_triton"):
            if hybrid is not None and hasattr(hybrid, attr):
                delattr(hybrid, attr)
        assert _interpreting_triton_loaded()


if DEVICE == "cpu":
    _enable_interpreter()


@pytest.fixture(scope="session", autouse=True)
def _restore_interpret_variable():
    yield
    if DEVICE == "cpu":
        if _PREVIOUS is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = _PREVIOUS


@pytest.fixture(autouse=True)
def _nan_filled_empty(monkeypatch):
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t):
        return t.fill_(float("nan")) if t.is_floating_point() and t.numel() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(empty_like(*a, **k)))


@pytest.fixture
def backend_calls(monkeypatch) -> Counter:
    """Calls of each backend's sequence and decode functions, by function name (a silent fallback
    to the other backend shows in the counts)."""
    from kernels import dispatch
    from kernels.hybrid import recurrent_torch

    chunk_triton, recurrent_triton = dispatch.load_triton()
    calls: Counter = Counter()
    for module, name in ((dispatch, "hybrid_attention_torch"), (chunk_triton, "hybrid_attention_triton"),
                         (recurrent_torch, "decode_step_torch"), (recurrent_triton, "decode_step_triton")):
        real = getattr(module, name)

        def recorded(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
    return calls
