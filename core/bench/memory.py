"""Memory of one model during one phase (a prefill or a decode step), and the bytes it holds.

On CUDA the growth of ``torch.cuda.max_memory_allocated`` during a phase is used. On CPU torch has
no allocator statistics (and ``tracemalloc`` does not see tensors), so the process's resident set
is used: before each phase the garbage collector runs and ``malloc_trim(0)`` hands freed heap pages
back to the kernel (otherwise memory freed earlier would be reused invisibly), the RSS is read,
and the kernel's peak-RSS counter (``VmHWM``) is reset by writing ``5`` to
``/proc/self/clear_refs``; after the phase ``VmHWM`` minus that RSS is the exact peak growth, with
no sampling gaps and no cost while the phase runs. Where the counter cannot be reset (not Linux) a
thread samples the RSS every millisecond instead.

Every tracker has ``begin()`` (before the phase), ``growth()`` (bytes above the baseline since
``begin``), ``close()`` and a ``method`` name recorded in the result.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import re
import threading
import time
from typing import Any

import torch
from torch import nn

GIB = 1024**3


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (tied tensors counted once)."""
    seen: dict[int, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
    return sum(seen.values())


def cache_bytes(cache: Any) -> int:
    """Bytes a transformers cache keeps alive: the storages of its tensors (key/value tensors or
    recurrent states). Storages, not shapes: a small view into a large tensor pins all of it."""
    seen: dict[int, int] = {}

    def visit(obj: Any, depth: int) -> None:
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.nbytes():
                seen[storage.data_ptr()] = storage.nbytes()
        elif depth < 3 and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for f in dataclasses.fields(obj):
                visit(getattr(obj, f.name), depth + 1)
        elif depth < 3 and isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item, depth + 1)
        elif depth < 2 and hasattr(obj, "__dict__") and not isinstance(obj, type):
            for value in vars(obj).values():
                visit(value, depth + 1)

    for layer in getattr(cache, "layers", []):
        visit(layer, 0)
    return sum(seen.values())


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _proc_status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        match = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.MULTILINE)
    if match is None:
        raise OSError(f"/proc/self/status has no {key}")
    return int(match.group(1)) * 1024


class CudaPeak:
    """Growth of ``torch.cuda.max_memory_allocated`` over the allocation at ``begin()``."""

    method = "cuda_max_memory_allocated"

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline = 0

    def begin(self) -> None:
        gc.collect()
        torch.cuda.synchronize(self.device)
        self.baseline = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def growth(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - self.baseline

    def close(self) -> None:
        pass


class RssHwmPeak:
    """Growth of the peak RSS (the kernel's high-water mark ``VmHWM``, reset by writing ``5`` to
    ``/proc/self/clear_refs``) over the RSS at ``begin()``, after handing freed heap pages back."""

    method = "rss_peak_vmhwm"

    def __init__(self):
        self.baseline = 0

    @staticmethod
    def available() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            _proc_status_bytes("VmHWM")
            return True
        except OSError:
            return False

    def begin(self) -> None:
        gc.collect()
        _malloc_trim()
        self.baseline = _proc_status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def growth(self) -> int:
        return _proc_status_bytes("VmHWM") - self.baseline

    def close(self) -> None:
        pass


class RssSampledPeak:
    """Growth of the RSS sampled by a background thread every ``interval`` seconds (portable
    fallback; peaks shorter than the interval can be missed)."""

    method = "rss_sampled_1ms"

    def __init__(self, interval: float = 0.001):
        import psutil

        self.process = psutil.Process()
        self.interval = interval
        self.baseline = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self.process.memory_info().rss
            with self._lock:
                self.peak = max(self.peak, rss)
            time.sleep(self.interval)

    def begin(self) -> None:
        gc.collect()
        _malloc_trim()
        rss = self.process.memory_info().rss
        with self._lock:
            self.baseline = self.peak = rss

    def growth(self) -> int:
        rss = self.process.memory_info().rss
        with self._lock:
            return max(self.peak, rss) - self.baseline

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


def peak_tracker(device: torch.device) -> CudaPeak | RssHwmPeak | RssSampledPeak:
    """The most exact tracker available for ``device``."""
    if device.type == "cuda":
        return CudaPeak(device)
    if RssHwmPeak.available():
        return RssHwmPeak()
    return RssSampledPeak()


def free_memory(device: torch.device) -> None:
    """Collect garbage and hand cached memory back (CUDA cache, or freed heap pages on CPU)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        _malloc_trim()
