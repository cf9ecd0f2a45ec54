"""Benchmark runs on tiny random models, shared by the core tests and the chart tests."""

from __future__ import annotations

import pytest
import torch

from core.bench import BenchConfig, convert_teacher, run_benchmark
from core.progress import RecordingProgress
from tests.tiny_models import tiny_model

SMALL = {
    "batch_sizes": [1, 3],
    "prompt_lengths": [16, 40],
    "gen_lengths": [3],
    "attention": {"window_size": 8},
    "warmup": False,
}

OOM_ERRORS = pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes"),
        MemoryError(),
    ],
    ids=["torch-oom", "cpu-allocator", "memory-error"],
)
OOM_PHASES = pytest.mark.parametrize("phase", ["prefill", "decode"])


def small_result() -> dict:
    """The SMALL sweep plus an extra point, two repeats; ``_progress`` holds the recorded progress."""
    progress = RecordingProgress()
    config = BenchConfig(**SMALL, extra_points=[[2, 24, 4]], repeats=2)
    out = run_benchmark(config, progress, teacher=tiny_model("llama"))
    out["_progress"] = progress
    return out


def capacity_result() -> dict:
    """A capacity run of a tiny model under a generous budget, batches 1 to 8 (the search's ceiling)."""
    config = BenchConfig(prompt_lengths=[24], memory_budget="1GiB", max_batch=8, capacity_steps=2, warmup=False,
                         attention={"window_size": 8})
    return run_benchmark(config, teacher=tiny_model("llama"))


def result_with_oom(monkeypatch, error: BaseException, phase: str) -> tuple[dict, RecordingProgress, list[tuple]]:
    """The SMALL sweep where the student raises ``error`` in the ``phase`` of the batch-3 point.

    Returns the result, the recorded progress and the input shapes the student was called with."""
    teacher = tiny_model("llama")
    config = BenchConfig(**SMALL)
    student = convert_teacher(teacher, config)
    real_forward = student.forward
    calls = []

    def forward(*args, **kwargs):
        ids = kwargs["input_ids"]
        calls.append(tuple(ids.shape))
        if ids.shape[0] == 3 and (ids.shape[1] > 1) == (phase == "prefill"):  # the batch-3 point fails
            raise error
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(student, "forward", forward)
    progress = RecordingProgress()
    out = run_benchmark(config, progress, teacher=teacher, student=student)
    return out, progress, calls
