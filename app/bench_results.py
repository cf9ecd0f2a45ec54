"""Reading bench job reports defensively (any field may be missing or renamed).

A report is the JSON a ``bench`` job writes: ``points`` = one row per model and point with
``model`` (teacher / student), ``batch_size``, ``prompt_length`` (the context length),
``gen_length``, ``tokens_per_second``, ``decode_tokens_per_second``, ``prefill_tokens_per_second``,
``peak_memory_bytes`` and ``status`` (``ok`` / ``oom``). :func:`normalise` maps every row to those
names (accepting common alternatives) and drops what cannot be read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from app.charts.benchmark import benchmark_figures

# the committed measurement of teacher and student served by vLLM (benchmarks/serving_throughput.py)
SERVED_RESULT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "serving-throughput-cpu.json"
METRICS = ("tokens_per_second", "decode_tokens_per_second", "prefill_tokens_per_second", "peak_memory_bytes",
           "time_to_first_token_s")
_ALIASES = {
    "model": ("model", "variant", "name", "which"),
    "batch_size": ("batch_size", "batch", "bs"),
    "context_length": ("prompt_length", "context_length", "context", "seq_len", "prompt_len", "input_length"),
    "gen_length": ("gen_length", "output_length", "max_new_tokens", "gen_len"),
}


def _first(row: dict, names: tuple[str, ...]) -> Any:
    for n in names:
        if row.get(n) is not None:
            return row[n]
    return None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def raw_points(report: Any) -> list:
    if not isinstance(report, dict):
        return []
    pts = report.get("points")
    if pts is None and isinstance(report.get("result"), dict):
        pts = report["result"].get("points")
    return pts if isinstance(pts, list) else []


def normalise(report: Any) -> list[dict[str, Any]]:
    """The report's points with uniform keys; rows without a model, batch size or context are dropped."""
    out = []
    for row in raw_points(report):
        if not isinstance(row, dict):
            continue
        model = _first(row, _ALIASES["model"])
        model = str(model).strip().lower() if model is not None else None
        batch = _int(_first(row, _ALIASES["batch_size"]))
        context = _int(_first(row, _ALIASES["context_length"]))
        if model is None or batch is None or context is None:
            continue
        status = str(row.get("status") or "ok").strip().lower()
        point = {"model": model, "batch_size": batch, "context_length": context,
                 "gen_length": _int(_first(row, _ALIASES["gen_length"])),
                 "status": "oom" if "oom" in status or "memory" in status else status,
                 "error": row.get("error")}
        for metric in METRICS:
            point[metric] = _number(row.get(metric))
        if point["status"] == "ok" and all(point[m] is None for m in METRICS):
            point["status"] = "no data"
        out.append(point)
    return out


def native_figures(report: Any) -> dict[str, Any] | None:
    """:func:`app.charts.benchmark_figures` of the report when it has the ``core.bench`` schema, else None."""
    try:
        figs = benchmark_figures(report)
    except Exception:  # noqa: BLE001 - a report of another shape
        return None
    return figs if isinstance(figs, dict) and figs else None


def timing_note(report: Any) -> str | None:
    """What a ``core.bench`` report's times are, from its ``timing`` section (None for a report
    without one: another tool's, or one written before the section existed)."""
    timing = report.get("timing") if isinstance(report, dict) else None
    if not isinstance(timing, dict):
        return None
    repeats, warm = _int(timing.get("repeats")) or 1, _int(timing.get("warmup_runs")) or 0
    steps = _int(timing.get("warmup_decode_steps")) or 0
    timed = "once" if repeats == 1 else f"{repeats} times (medians shown)"
    before = (f"after {warm} untimed warm-up run{_s(warm)} of the same point (its prefill and {steps} decode "
              f"step{_s(steps)})" if warm else "with no warm-up run, so its first run may include start-up costs "
              "such as kernel compilation")
    return (f"Each point is timed {timed}, {before}. Prefill and decode are timed separately: prefill tokens/s from "
            "the time to the first token, decode tokens/s from the median decode step. Peak memory is the largest "
            "over the timed runs.")


BUSY_PRESSURE = 0.2  # share of the run's wall time during which some task waited for a CPU


def contention_warning(report: Any) -> str | None:
    """A warning when the machine was busy while the benchmark ran, from its ``environment``: a load
    average (at the start or the end) above the cores, or CPU pressure above :data:`BUSY_PRESSURE`;
    None on a quiet machine or a report that recorded neither."""
    env = report.get("environment") if isinstance(report, dict) else None
    if not isinstance(env, dict):
        return None
    cores = _int(env.get("cpu_count"))
    loads = [v[0] for v in (env.get("load_average_start"), env.get("load_average_end"))
             if isinstance(v, list) and v and isinstance(v[0], (int, float))]
    pressure = env.get("cpu_pressure")
    busy_load = bool(cores and loads and max(loads) > cores)
    busy_cpu = isinstance(pressure, (int, float)) and pressure > BUSY_PRESSURE
    if not (busy_load or busy_cpu):
        return None
    said = [f"load {max(loads):.1f} on {cores} cores" if busy_load else "",
            f"other tasks waited for a CPU {pressure:.0%} of the time" if busy_cpu else ""]
    return (f"The machine was busy while this benchmark ran ({'; '.join(s for s in said if s)}): the points measure "
            "the contention as much as the models, and differences of tens of percent can be noise. Run it again "
            "on a quiet machine, with repeats.")


def _s(n: int) -> str:
    """The plural ending of a count: ``s`` unless ``n`` is 1."""
    return "" if n == 1 else "s"


def served_result() -> dict[str, Any] | None:
    """The served-engine measurement (:data:`SERVED_RESULT`) when it is there and holds points, else None."""
    try:
        result = json.loads(SERVED_RESULT.read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and result.get("points") else None
