"""The benchmark sweep: the teacher (softmax attention) against its LoLCATs student, point by point.

``run_benchmark(BenchConfig(...), progress)`` loads a model, builds the student from it and sweeps
over batch size, prompt length and generation length. The result is a JSON-serialisable dict
(``write_result`` saves it; ``app.charts.benchmark_figures`` draws it).

Teacher and student are measured in the same run and interleaved, so that whatever else runs on
the machine slows both alike: at each point both prefill back to back (which goes first alternates
from point to point and between repeats), then their decode steps alternate one by one (the order
flipping every step). Times are medians (over the decode steps, and over repeats). With
``warmup`` (the default), every point first runs once untimed at its own shape (prefill and one
decode step, :data:`WARMUP_GEN`), so that first-run costs at that shape (kernels compiled or
specialised for it, ``LOLCATS_COMPILE``'s graph per batch size) stay out of its timings; the
result's ``timing`` section says how many runs were timed after how many warm-up runs.

On a CPU shared with other work, use ``threads=1``: with several intra-op threads every parallel
op waits for all of them, and a sibling thread that the scheduler has taken off its core costs a
whole time slice (about 6 ms) per op, so timings then count ops instead of work. One thread is
only time-sliced.

* The **teacher** is the original model with Hugging Face's SDPA attention and its ``DynamicCache``
  (a key/value cache growing with the context).
* The **student** is a converted copy with randomly initialised feature maps, or the student of
  ``student_checkpoint`` (:mod:`core.bench.student`). It prefills in chunks of ``prefill_chunk``
  tokens from its carried state (constant in size), so its prefill temporaries are bounded by the
  chunk; the teacher and the floor prefill the whole prompt at once, as transformers does.
* The **floor** is the teacher with an attention that returns zeros and a cache that stores
  nothing (:mod:`core.bench.floor`, sharing the teacher's weights): the speed any attention
  replacement is bounded by. ``comparisons`` give student / teacher and student / floor.

Out of memory (:func:`core.io.is_oom`) while measuring a model at a point is recorded as that
point with ``status: "oom"``; the other model and the rest of the sweep continue.

With ``memory_budget`` set the run is a capacity run (:mod:`core.bench.capacity`): no sweep
points, and a ``capacity`` section with the largest batch of teacher and student within the
budget at every prompt length and their decode throughput there.
"""

from __future__ import annotations

import gc
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.bench.capacity import run_capacity
from core.bench.config import CAPACITY_MODELS, BenchConfig, attention_fields
from core.bench.floor import AttentionFreeFloor
from core.bench.measure import Run, measure_point, random_input_ids, summarise
from core.bench.memory import GIB, free_memory, peak_tracker, weight_bytes
from core.bench.student import convert_teacher
from core.io import atomic_write_json
from core.progress import NullProgress, ProgressCallback, StopRequested
from core.run_folder import BENCH

SCHEMA = "lolcats-bench/1"
WARMUP_GEN = 2  # generation length of the untimed run of a point: the prefill and one decode step


def run_benchmark(
    config: BenchConfig,
    progress: ProgressCallback | None = None,
    *,
    teacher: nn.Module | None = None,
    student: nn.Module | None = None,
) -> dict[str, Any]:
    """Run the sweep of ``config`` and return the result (JSON-serialisable, see the module docstring).

    ``teacher`` / ``student`` may be passed already loaded (notebooks, tests); otherwise the teacher
    is loaded with :func:`core.models.load_model` and the student built with :func:`core.bench.student.convert_teacher`.
    Progress: one ``on_step("bench", ...)`` and one ``on_log`` line per model per point per repeat;
    ``should_stop()`` is polled before every point and raises :class:`StopRequested`.
    """
    progress = progress or NullProgress()
    started = time.time()
    if teacher is None:
        from core.models import load_model

        progress.on_log(f"loading {config.model} ({config.dtype}, device {config.device})")
        teacher, _ = load_model(config.model, config.dtype, config.device, config.workspace)
    teacher.eval()
    if getattr(teacher.config, "_attn_implementation", None) != "sdpa" and hasattr(teacher, "set_attn_implementation"):
        teacher.set_attn_implementation("sdpa")
    device = next(teacher.parameters()).device
    if student is None and "student" in config.models:
        progress.on_log("building the student (copy + linearize)")
        student = convert_teacher(teacher, config)
    models = {"teacher": teacher, "student": student, "floor": AttentionFreeFloor(teacher) if "floor" in config.models else None}
    models = {name: models[name] for name in config.models}
    weights = {name: weight_bytes(m) for name, m in models.items()}
    text_config = teacher.config.get_text_config(decoder=True)
    vocab = text_config.vocab_size
    limit = getattr(text_config, "max_position_embeddings", None)
    points = config.points()
    if limit and any(l + g > limit for _, l, g in points):
        progress.on_log(
            f"note: some points run past the model's {limit} positions; RoPE extrapolates, which does not "
            "change speed or memory, but the generated tokens are meaningless there"
        )

    threads_before = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    tracker = peak_tracker(device)
    stall_start, clock_start = _cpu_stall_seconds(), time.perf_counter()
    gc.collect()
    gc.freeze()  # objects alive now stay alive: later collections only scan what the sweep creates
    runs: dict[tuple[str, tuple[int, int, int]], list[Run]] = {}
    oom: dict[tuple[str, tuple[int, int, int]], str] = {}
    try:
        environment = _environment(device, tracker)
        total = len(points) * len(models) * config.repeats
        step = 0
        for r in range(config.repeats):
            for i, point in enumerate(points):
                if progress.should_stop():
                    raise StopRequested("benchmark stopped on request")
                b, l, g = point
                order = list(models) if (i + r) % 2 == 0 else list(reversed(models))
                todo = {name: models[name] for name in order if (name, point) not in oom}  # no retry after OOM
                if todo:
                    ids = random_input_ids(vocab, b, l, config.seed + i, device)
                    measured = _measure(todo, ids, g, tracker, [n for n in order if n in todo],
                                        {"student": config.prefill_chunk} if config.prefill_chunk else None,
                                        warm=config.warmup and r == 0)
                    del ids
                    free_memory(device)
                    for name, value in measured.items():
                        if isinstance(value, str):
                            oom[(name, point)] = value
                            runs.pop((name, point), None)
                        else:
                            runs.setdefault((name, point), []).append(value)
                for name in order:
                    step += 1
                    key = (name, point)
                    if key in oom:
                        metrics = {"status": "oom", "error": oom[key]}
                        progress.on_step(BENCH, step, total, {"oom": 1.0})
                    else:
                        metrics = summarise(runs[key], b, l, g, weights[name])
                        progress.on_step(BENCH, step, total, {
                            k: float(metrics[k]) for k in (
                                "prefill_tokens_per_second", "decode_tokens_per_second", "time_to_first_token_s",
                                "peak_memory_bytes", "decode_peak_memory_bytes",
                            )
                        })
                    progress.on_log(_describe(name, point, metrics))
        capacity = None
        if config.memory_budget is not None:
            searched = {name: models[name] for name in CAPACITY_MODELS if name in models}
            if config.warmup:  # trials start from synthetic caches: one short untimed run of each model first
                warm = random_input_ids(vocab, 1, min(64, min(config.prompt_lengths)), config.seed, device)
                measure_point(searched, warm, WARMUP_GEN, tracker, list(searched))
            capacity = run_capacity(
                searched, config.prompt_lengths, config.memory_budget, steps=config.capacity_steps, tracker=tracker,
                weights=weights, seed=config.seed, max_batch=config.max_batch, log=progress.on_log,
            )
    finally:
        tracker.close()
        gc.unfreeze()
        torch.set_num_threads(threads_before)

    results = []
    for point in points:
        b, l, g = point
        for name in models:
            row: dict[str, Any] = {"model": name, "batch_size": b, "prompt_length": l, "gen_length": g}
            if (name, point) in oom:
                row.update(status="oom", error=oom[(name, point)])
            else:
                row["status"] = "ok"
                row.update(summarise(runs[(name, point)], b, l, g, weights[name]))
            results.append(row)
    if hasattr(os, "getloadavg"):
        environment["load_average_end"] = list(os.getloadavg())
    stall_end = _cpu_stall_seconds()
    if stall_start is not None and stall_end is not None:
        # share of the sweep's wall time during which some task (ours or another) waited for a CPU:
        # near 0 on an idle machine; high values mean the timings are contended
        environment["cpu_pressure"] = (stall_end - stall_start) / max(time.perf_counter() - clock_start, 1e-9)
    student_info: dict[str, Any] = {}
    if "student" in models:
        student_info = {
            "source": config.student_checkpoint or "fresh conversion, random feature maps",
            "attention": attention_fields(getattr(models["student"], "attention_spec", config.attention_spec())),
        }
    return {
        "schema": SCHEMA,
        "config": config.model_dump(),
        "environment": environment,
        "model": {
            "source": config.model,
            "teacher_attention": getattr(teacher.config, "_attn_implementation", None),
            "num_parameters": sum(p.numel() for p in teacher.parameters()),
            "weight_bytes": weights,
            "student": student_info,
        },
        "points": results,
        "timing": {"warmup_runs": int(config.warmup), "warmup_decode_steps": WARMUP_GEN - 1,
                   "repeats": config.repeats},
        "comparisons": compare(results),
        **({"capacity": capacity} if capacity is not None else {}),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started,
    }


def _measure(models: dict[str, nn.Module], input_ids: torch.Tensor, gen_length: int, tracker, order: list[str],
             chunks: dict[str, int] | None, warm: bool) -> dict[str, Run | str]:
    """:func:`measure_point` of ``models`` at one point, after one untimed run of that point (the
    prefill and one decode step) when ``warm``; a model out of memory in the untimed run is not
    timed (its message stands for the point). Memory is handed back between the two runs."""
    device = input_ids.device
    failed: dict[str, str] = {}
    if warm:
        untimed = measure_point(models, input_ids, WARMUP_GEN, tracker, order, chunks)
        failed = {name: value for name, value in untimed.items() if isinstance(value, str)}
        free_memory(device)
    timed = [name for name in order if name not in failed]
    measured = measure_point({name: models[name] for name in timed}, input_ids, gen_length, tracker, timed, chunks)
    return {**measured, **failed}


def write_result(result: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``result`` as JSON (atomically: a temporary file renamed into place)."""
    return atomic_write_json(path, result)


def find_point(result: dict[str, Any], model: str, batch_size: int, prompt_length: int, gen_length: int | None = None):
    """The result row of ``model`` at a point (any generation length when ``gen_length`` is None)."""
    for p in result["points"]:
        if (p["model"], p["batch_size"], p["prompt_length"]) == (model, batch_size, prompt_length) and (
            gen_length is None or p["gen_length"] == gen_length
        ):
            return p
    return None


def compare(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Student / teacher ratios at every point where both were measured and, where the floor was
    measured too, student / floor and floor / teacher (the limit of any attention replacement),
    and the bytes a student decode step reads over the floor's (weights plus cache)."""
    by_key: dict[tuple, dict[str, dict]] = {}
    for p in points:
        by_key.setdefault((p["batch_size"], p["prompt_length"], p["gen_length"]), {})[p["model"]] = p
    rows = []
    for (b, l, g), pair in by_key.items():
        t, s = pair.get("teacher"), pair.get("student")
        if not t or not s or t["status"] != "ok" or s["status"] != "ok":
            continue
        rows.append({
            "batch_size": b,
            "prompt_length": l,
            "gen_length": g,
            "decode_speedup": s["decode_tokens_per_second"] / t["decode_tokens_per_second"],
            "prefill_speedup": s["prefill_tokens_per_second"] / t["prefill_tokens_per_second"],
            "time_to_first_token_speedup": t["time_to_first_token_s"] / s["time_to_first_token_s"],
            "tokens_per_second_speedup": s["tokens_per_second"] / t["tokens_per_second"],
            "peak_memory_ratio": s["peak_memory_bytes"] / t["peak_memory_bytes"],
            "decode_peak_memory_ratio": s["decode_peak_memory_bytes"] / t["decode_peak_memory_bytes"],
            "cache_bytes_ratio": s["cache_bytes"] / t["cache_bytes"],
        })
        f = pair.get("floor")
        if f and f["status"] == "ok":
            rows[-1].update({
                "prefill_vs_floor": s["prefill_tokens_per_second"] / f["prefill_tokens_per_second"],
                "decode_vs_floor": s["decode_tokens_per_second"] / f["decode_tokens_per_second"],
                "decode_step_over_floor": s["time_per_output_token_s"] / f["time_per_output_token_s"],
                # a decode step reads every weight and the whole cache: where it is bound by memory
                # bandwidth, its time over the floor's is at least this ratio of bytes
                "decode_bytes_over_floor": (s["weight_bytes"] + s["cache_bytes"]) / (f["weight_bytes"] + f["cache_bytes"]),
                "floor_prefill_speedup": f["prefill_tokens_per_second"] / t["prefill_tokens_per_second"],
                "floor_decode_speedup": f["decode_tokens_per_second"] / t["decode_tokens_per_second"],
            })
    return rows


def _environment(device: torch.device, tracker) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "memory_method": tracker.method,
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    else:
        env["device_name"] = _cpu_name()
        env["cpu_count"] = os.cpu_count()
    if hasattr(os, "getloadavg"):
        env["load_average_start"] = list(os.getloadavg())
    return env


def _cpu_stall_seconds() -> float | None:
    """Seconds some runnable task waited for a CPU since boot (Linux pressure stall information)."""
    try:
        with open("/proc/pressure/cpu") as f:
            match = re.search(r"^some .*total=(\d+)", f.read(), re.MULTILINE)
        return int(match.group(1)) / 1e6 if match else None
    except OSError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _describe(name: str, point: tuple[int, int, int], metrics: dict[str, Any]) -> str:
    b, l, g = point
    if metrics.get("status") == "oom":
        return f"{name} B={b} L={l} G={g}: out of memory ({metrics.get('error', '')})"
    return (
        f"{name} B={b} L={l} G={g}: prefill {metrics['prefill_tokens_per_second']:.0f} tok/s "
        f"(TTFT {metrics['time_to_first_token_s']:.2f} s), decode {metrics['decode_tokens_per_second']:.1f} tok/s "
        f"({metrics['time_per_output_token_s'] * 1000:.0f} ms/step), peak {_gib(metrics['peak_memory_bytes'])} "
        f"(decode {_gib(metrics['decode_peak_memory_bytes'])})"
    )
