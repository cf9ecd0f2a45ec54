"""Throughput and memory benchmark of a teacher and its LoLCATs student.

    from core.bench import BenchConfig, run_benchmark, write_result
    result = run_benchmark(BenchConfig(batch_sizes=[1, 8], prompt_lengths=[1024, 4096]))

Modules: :mod:`~core.bench.config` (what to measure), :mod:`~core.bench.memory` (peak trackers,
weight and cache bytes), :mod:`~core.bench.measure` (one point: prefill, decode steps, metrics),
:mod:`~core.bench.student` (the student of a teacher), :mod:`~core.bench.sweep` (the sweep and
its result). Names are imported on first use (PEP 562), so reading :class:`BenchConfig` does not
load the measuring code.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BenchConfig": "config",
    "MODELS": "config",
    "SWEEPS": "config",
    "GIB": "memory",
    "CudaPeak": "memory",
    "RssHwmPeak": "memory",
    "RssSampledPeak": "memory",
    "cache_bytes": "memory",
    "free_memory": "memory",
    "peak_tracker": "memory",
    "weight_bytes": "memory",
    "Request": "measure",
    "Run": "measure",
    "measure_point": "measure",
    "new_cache": "measure",
    "random_input_ids": "measure",
    "summarise": "measure",
    "convert_teacher": "student",
    "load_converted_student": "student",
    "SCHEMA": "sweep",
    "compare": "sweep",
    "find_point": "sweep",
    "run_benchmark": "sweep",
    "write_result": "sweep",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'core.bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"core.bench.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
