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

from core.lazy import lazy_exports

_EXPORTS = {
    ".config": ["BenchConfig", "MODELS", "SWEEPS"],
    ".memory": ["GIB", "CudaPeak", "RssHwmPeak", "RssSampledPeak", "cache_bytes", "free_memory", "peak_tracker", "weight_bytes"],
    ".measure": ["Request", "Run", "measure_point", "new_cache", "random_input_ids", "summarise"],
    ".student": ["convert_teacher", "load_converted_student"],
    ".sweep": ["SCHEMA", "compare", "find_point", "run_benchmark", "write_result"],
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
