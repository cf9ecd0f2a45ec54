"""Throughput and memory benchmark: the teacher (softmax attention) against its LoLCATs student.

``run_benchmark(BenchConfig(...), progress)`` loads a model, builds the student from it and sweeps
over batch size, prompt length and generation length; ``figures(result)`` turns the result into
Plotly figures. The result is a JSON-serialisable dict (``write_result`` saves it).

Teacher and student are measured in the same run and interleaved, so that whatever else runs on
the machine slows both alike: at each point both prefill back to back (which goes first alternates
from point to point and between repeats), then their decode steps alternate one by one (the order
flipping every step). Times are medians (over the decode steps, and over repeats).

On a CPU shared with other work, use ``threads=1``: with several intra-op threads every parallel
op waits for all of them, and a sibling thread that the scheduler has taken off its core costs a
whole time slice (about 6 ms) per op, so timings then count ops instead of work (a decode step of
a few hundred small ops goes from ~0.1 s to several seconds). One thread is only time-sliced.

* The **teacher** is the original model with Hugging Face's SDPA attention and its ``DynamicCache``
  (a key/value cache growing with the context).
* The **student** is a converted copy (``copy.deepcopy`` then :func:`core.linearize`) with randomly
  initialised feature maps: speed and memory do not depend on training. With
  ``student_checkpoint`` set, :func:`load_converted_student` provides the student instead.
* Prefill: one forward over ``B x L`` random token ids with an empty cache and ``logits_to_keep=1``
  (the ``[B, L, vocab]`` logits would dominate memory and are not needed to generate), then a
  greedy argmax. Its time is the time to first token (TTFT).
* Decode: ``G - 1`` single-token forward calls with the cache (``model(...)`` directly, not
  ``generate``, so no sampling or stopping logic is timed), a greedy argmax after each. The median
  step time is the time per output token (TPOT).

Metric names follow vLLM's benchmark (``requests_per_second``, ``tokens_per_second``,
``elapsed_time``, ``num_requests``, ``total_num_tokens``), plus ``prefill_tokens_per_second``,
``decode_tokens_per_second``, ``time_to_first_token_s``, ``time_per_output_token_s`` and the
memory figures below. One request is one batch row: ``L`` prompt tokens in, ``G`` tokens out, the
first one from the prefill; ``elapsed_time = TTFT + (G - 1) * TPOT``.

Memory. On CUDA the growth of ``torch.cuda.max_memory_allocated`` during a phase is used. On CPU
torch has no allocator statistics (and ``tracemalloc`` does not see tensors), so the process's
resident set is used: before each phase the garbage collector runs and ``malloc_trim(0)`` hands
freed heap pages back to the kernel (otherwise memory freed earlier would be reused invisibly), the
RSS is read, and the kernel's peak-RSS counter (``VmHWM``) is reset by writing ``5`` to
``/proc/self/clear_refs``; after the phase ``VmHWM`` minus that RSS is the exact peak growth, with
no sampling gaps and no cost while the phase runs. Where the counter cannot be reset (not Linux) a
thread samples the RSS every millisecond instead. Reported, all including the model's own weights
(and nothing else held by the process, such as the interpreter or the other model), i.e. what
``max_memory_allocated`` would show on a device holding only this model:

* ``prefill_peak_memory_bytes``: weights + peak growth during the prefill (activations and the
  cache being built);
* ``decode_peak_memory_bytes``: weights + the cache held going into a decode step + that step's peak
  growth, the largest over the steps;
* ``peak_memory_bytes``: the larger of the two;
* ``prefill_cache_bytes`` / ``cache_bytes``: exact bytes the cache keeps alive after the prefill /
  after the last step (tensor storages, so a view that pins a larger tensor counts all of it).

Out of memory (``torch.OutOfMemoryError``, a ``RuntimeError`` saying "out of memory" or "can't
allocate memory", ``MemoryError``) while measuring a model at a point is recorded as that point
with ``status: "oom"``; the other model and the rest of the sweep continue.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import gc
import math
import os
import platform
import re
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.io import atomic_write_json, is_oom
from core.progress import NullProgress, ProgressCallback, StopRequested
from core.attention.surgery import linearize, set_mode
from core.config import BUNDLED_MODEL, AttentionSpec, ConfigError, build_spec

SCHEMA = "lolcats-bench/1"
MODELS = ("teacher", "student")
SWEEPS = ("axes", "grid")
GIB = 1024**3


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    """What to benchmark and over which points.

    Points are ``(batch_size, prompt_length, gen_length)``. ``sweep="axes"`` varies one factor at a
    time around the base point: every ``batch_sizes`` value at the base prompt and generation
    length, every ``prompt_lengths`` value at the base batch size and generation length, every
    ``gen_lengths`` value at the base batch size and prompt length. ``sweep="grid"`` measures the
    full product. ``extra_points`` are added in both modes. A base value left ``None`` is the first
    value of its list.
    """

    model: str = BUNDLED_MODEL  # any source core.models.load_model accepts
    dtype: str = "float32"
    device: str = "auto"
    workspace: str | None = None
    student_checkpoint: str | None = None  # a converted checkpoint to benchmark instead of a fresh conversion
    linearize: dict[str, Any] = field(default_factory=dict)  # AttentionSpec fields for the fresh conversion
    models: list[str] = field(default_factory=lambda: list(MODELS))
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    prompt_lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096])
    gen_lengths: list[int] = field(default_factory=lambda: [8])
    sweep: str = "axes"
    base_batch_size: int | None = None
    base_prompt_length: int | None = None
    base_gen_length: int | None = None
    extra_points: list[list[int]] = field(default_factory=list)
    repeats: int = 1  # every point is measured this many times per model; medians are reported
    threads: int | None = None  # torch intra-op threads during the sweep; None keeps torch's setting
    warmup: bool = True  # one short untimed prefill + decode per model before the sweep
    seed: int = 0

    def __post_init__(self):
        for name in ("batch_sizes", "prompt_lengths", "gen_lengths"):
            values = [int(v) for v in getattr(self, name)]
            if not values:
                raise ConfigError(f"{name} must list at least one value")
            setattr(self, name, values)
        for name in ("batch_sizes", "prompt_lengths"):
            bad = [v for v in getattr(self, name) if v < 1]
            if bad:
                raise ConfigError(f"{name} must be >= 1, got {bad}")
        bad = [g for g in self.gen_lengths if g < 2]
        if bad:
            raise ConfigError(
                f"gen_lengths must be >= 2 (the first token comes from the prefill, decode is timed from the "
                f"second on), got {bad}"
            )
        self.extra_points = [[int(x) for x in p] for p in self.extra_points]
        for p in self.extra_points:
            if len(p) != 3 or p[0] < 1 or p[1] < 1 or p[2] < 2:
                raise ConfigError(f"extra_points entries must be [batch_size >= 1, prompt_length >= 1, gen_length >= 2], got {p}")
        if self.sweep not in SWEEPS:
            raise ConfigError(f"unknown sweep {self.sweep!r}; valid: {', '.join(SWEEPS)}")
        unknown = [m for m in self.models if m not in MODELS]
        if unknown or not self.models:
            raise ConfigError(f"models must be a non-empty subset of {', '.join(MODELS)}, got {self.models}")
        self.models = [m for m in MODELS if m in self.models]
        if int(self.repeats) < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        self.repeats = int(self.repeats)
        if self.threads is not None:
            if int(self.threads) < 1:
                raise ConfigError(f"threads must be >= 1 (or None for torch's default), got {self.threads}")
            self.threads = int(self.threads)
        self.linearize_config()  # validates the fields

    def linearize_config(self) -> AttentionSpec:
        """The conversion used for a fresh student: random feature maps unless told otherwise."""
        return build_spec(AttentionSpec, {"feature_init": "random", **self.linearize}, "linearize")

    def points(self) -> list[tuple[int, int, int]]:
        """The points to measure, in order, without duplicates."""
        if self.sweep == "grid":
            pts = [(b, l, g) for b in self.batch_sizes for l in self.prompt_lengths for g in self.gen_lengths]
        else:
            b0 = self.base_batch_size or self.batch_sizes[0]
            l0 = self.base_prompt_length or self.prompt_lengths[0]
            g0 = self.base_gen_length or self.gen_lengths[0]
            pts = [(b, l0, g0) for b in self.batch_sizes]
            pts += [(b0, l, g0) for l in self.prompt_lengths]
            pts += [(b0, l0, g) for g in self.gen_lengths]
        pts += [tuple(p) for p in self.extra_points]
        return list(dict.fromkeys(pts))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BenchConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown BenchConfig fields: {', '.join(sorted(unknown))}")
        return cls(**data)


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


def build_student(teacher: nn.Module, config: BenchConfig) -> nn.Module:
    """The student measured against ``teacher``: a converted copy, or a converted checkpoint."""
    if config.student_checkpoint:
        return load_converted_student(teacher, config.student_checkpoint, config)
    student = copy.deepcopy(teacher)
    torch.manual_seed(config.seed)  # the random feature-map init
    linearize(student, config.linearize_config())
    set_mode(student, "student")
    return student.eval()


def load_converted_student(teacher: nn.Module, checkpoint: str | os.PathLike, config: BenchConfig) -> nn.Module:
    """The student of a converted run folder or exported model (:func:`core.pipeline.runs.load_converted`),
    on the teacher's device. ``config.model`` should name the same base model as the run.

    Speed and memory do not depend on the trained values, so a fresh conversion with the same
    settings measures the same; this benchmarks a run's exact conversion (and its LoRA wrapping)."""
    from core.pipeline.runs import load_converted

    device = next(teacher.parameters()).device
    student, _, _ = load_converted(checkpoint, device=str(device), workspace=config.workspace)
    student.to(device)
    set_mode(student, "student")
    return student.eval()


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


def new_cache(model: nn.Module):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


# ----------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------


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


def peak_tracker(device: torch.device):
    if device.type == "cuda":
        return CudaPeak(device)
    if RssHwmPeak.available():
        return RssHwmPeak()
    return RssSampledPeak()


# ----------------------------------------------------------------------------------------------
# Measuring one point
# ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    """Raw numbers of one model at one point (one repeat)."""

    prefill_s: float = 0.0
    prefill_peak: int = 0  # bytes above the weights: prefill growth
    prefill_cache_bytes: int = 0
    decode_steps_s: list[float] = field(default_factory=list)
    decode_peak: int = 0  # bytes above the weights: cache held + the largest step growth
    cache_bytes: int = 0


class Request:
    """One model's batch in flight: prefilled once, then decoded one token at a time."""

    def __init__(self, model: nn.Module, tracker, device: torch.device):
        self.model, self.tracker, self.device = model, tracker, device
        self.cache = new_cache(model)
        self.token: torch.Tensor | None = None
        self.run = Run()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> None:
        self.tracker.begin()
        t0 = time.perf_counter()
        out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.token = out.logits[:, -1].argmax(-1, keepdim=True)
        self._sync()
        self.run.prefill_s = time.perf_counter() - t0
        self.run.prefill_peak = max(0, self.tracker.growth())
        del out
        self.run.prefill_cache_bytes = self.run.cache_bytes = cache_bytes(self.cache)

    @torch.inference_mode()
    def step(self) -> None:
        held = self.run.cache_bytes
        self.tracker.begin()
        t0 = time.perf_counter()
        out = self.model(input_ids=self.token, past_key_values=self.cache, use_cache=True)
        self.token = out.logits[:, -1].argmax(-1, keepdim=True)
        self._sync()
        self.run.decode_steps_s.append(time.perf_counter() - t0)
        self.run.decode_peak = max(self.run.decode_peak, held + max(0, self.tracker.growth()))
        del out
        self.run.cache_bytes = cache_bytes(self.cache)


def measure_point(
    models: dict[str, nn.Module], input_ids: torch.Tensor, gen_length: int, tracker, order: list[str]
) -> dict[str, Run | str]:
    """Measure every model at one point, interleaved: prefills in ``order``, then decode steps
    alternating between the models (the order flipping every step), so that what else runs on the
    machine slows them alike. Returns a :class:`Run` per model, or the message of its
    out-of-memory error."""
    device = input_ids.device
    requests: dict[str, Request] = {}
    failed: dict[str, str] = {}

    def attempt(name: str, action) -> None:
        message = None
        try:
            action()
        except Exception as exc:  # only memory errors are swallowed
            if not is_oom(exc):
                raise
            message = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        if message is not None:  # outside the handler: the traceback no longer pins the request
            failed[name] = message
            requests.pop(name, None)
            _free_memory(device)

    for name in order:
        requests[name] = Request(models[name], tracker, device)
        attempt(name, lambda request=requests[name]: request.prefill(input_ids))
    for i in range(gen_length - 1):
        for name in order if i % 2 else list(reversed(order)):
            if name in requests:
                attempt(name, requests[name].step)
    out: dict[str, Run | str] = {name: r.run for name, r in requests.items()}
    out.update(failed)
    return out


def _input_ids(vocab_size: int, batch: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=g).to(device)


def summarise(runs: list[Run], batch: int, prompt: int, gen: int, weights: int) -> dict[str, Any]:
    """vLLM-style metrics of one model at one point from its repeated runs (medians; peaks: max)."""
    ttft = statistics.median(r.prefill_s for r in runs)
    steps = [s for r in runs for s in r.decode_steps_s]
    tpot = statistics.median(steps)
    elapsed = ttft + (gen - 1) * tpot
    prefill_peak = weights + max(r.prefill_peak for r in runs)
    decode_peak = weights + max(r.decode_peak for r in runs)
    return {
        "num_requests": batch,
        "total_num_tokens": batch * (prompt + gen),
        "elapsed_time": elapsed,
        "requests_per_second": batch / elapsed,
        "tokens_per_second": batch * (prompt + gen) / elapsed,
        "output_tokens_per_second": batch * gen / elapsed,
        "prefill_tokens_per_second": batch * prompt / ttft,
        "decode_tokens_per_second": batch / tpot,
        "time_to_first_token_s": ttft,
        "time_per_output_token_s": tpot,
        "peak_memory_bytes": max(prefill_peak, decode_peak),
        "prefill_peak_memory_bytes": prefill_peak,
        "decode_peak_memory_bytes": decode_peak,
        "prefill_cache_bytes": max(r.prefill_cache_bytes for r in runs),
        "cache_bytes": max(r.cache_bytes for r in runs),
        "weight_bytes": weights,
        "prefill_times_s": [r.prefill_s for r in runs],
        "decode_step_times_s": steps,
    }


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


def compare(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Student / teacher ratios at every point where both were measured."""
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
    return rows


# ----------------------------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------------------------


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        _malloc_trim()


def run_benchmark(
    config: BenchConfig,
    progress: ProgressCallback | None = None,
    *,
    teacher: nn.Module | None = None,
    student: nn.Module | None = None,
) -> dict[str, Any]:
    """Run the sweep of ``config`` and return the result (JSON-serialisable, see the module docstring).

    ``teacher`` / ``student`` may be passed already loaded (notebooks, tests); otherwise the teacher
    is loaded with :func:`core.models.load_model` and the student built with :func:`build_student`.
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
        student = build_student(teacher, config)
    models = {"teacher": teacher, "student": student}
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
        if config.warmup:
            warm = _input_ids(vocab, 1, min(64, min(config.prompt_lengths)), config.seed, device)
            measure_point(models, warm, 3, tracker, list(models))
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
                    ids = _input_ids(vocab, b, l, config.seed + i, device)
                    measured = measure_point(todo, ids, g, tracker, [n for n in order if n in todo])
                    del ids
                    _free_memory(device)
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
                        progress.on_step("bench", step, total, {"oom": 1.0})
                    else:
                        metrics = summarise(runs[key], b, l, g, weights[name])
                        progress.on_step("bench", step, total, {
                            k: float(metrics[k]) for k in (
                                "prefill_tokens_per_second", "decode_tokens_per_second", "time_to_first_token_s",
                                "peak_memory_bytes", "decode_peak_memory_bytes",
                            )
                        })
                    progress.on_log(_describe(name, point, metrics))
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
            "linearize": getattr(models["student"], "lolcats_config", config.linearize_config()).model_dump(),
        }
    return {
        "schema": SCHEMA,
        "config": config.to_dict(),
        "environment": environment,
        "model": {
            "source": config.model,
            "teacher_attention": getattr(teacher.config, "_attn_implementation", None),
            "num_parameters": sum(p.numel() for p in teacher.parameters()),
            "weight_bytes": weights,
            "student": student_info,
        },
        "points": results,
        "comparisons": compare(results),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started,
    }


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


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------

COLORS = {"teacher": "#1f77b4", "student": "#d62728"}
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]


def _groups(points: list[dict], x: str) -> dict[tuple, list[dict]]:
    """Points grouped by the two factors other than ``x``; groups where ``x`` takes several values
    come first (all groups are kept so that a single-point result still plots)."""
    others = [k for k in ("batch_size", "prompt_length", "gen_length") if k != x]
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault(tuple(p[k] for k in others), []).append(p)
    varied = {k: v for k, v in groups.items() if len({p[x] for p in v}) > 1}
    return varied or groups


def _label(x: str, key: tuple) -> str:
    names = {"batch_size": "B", "prompt_length": "L", "gen_length": "G"}
    others = [k for k in ("batch_size", "prompt_length", "gen_length") if k != x]
    return " ".join(f"{names[k]}={v}" for k, v in zip(others, key))


def _figure(result: dict, x: str, panels: list[tuple[str, str, float]], title: str, log_y: bool):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    xlabel = {"batch_size": "batch size", "prompt_length": "context length (prompt tokens)"}[x]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels])
    groups = _groups(result["points"], x)
    ooms = []
    for gi, (key, pts) in enumerate(sorted(groups.items())):
        for model in MODELS:
            rows = sorted((p for p in pts if p["model"] == model), key=lambda p: p[x])
            ooms += [f"{model} {_label(x, key)} {x.split('_')[0]}={p[x]}" for p in rows if p["status"] == "oom"]
            ok = [p for p in rows if p["status"] == "ok"]
            if not ok:
                continue
            for col, (metric, _, scale) in enumerate(panels, start=1):
                fig.add_trace(
                    go.Scatter(
                        x=[p[x] for p in ok],
                        y=[p[metric] / scale for p in ok],
                        mode="lines+markers",
                        name=f"{model} ({_label(x, key)})",
                        legendgroup=f"{model}-{key}",
                        showlegend=col == 1,
                        line={"color": COLORS[model], "dash": DASHES[gi % len(DASHES)]},
                    ),
                    row=1, col=col,
                )
    fig.update_xaxes(title_text=xlabel, type="log", dtick=math.log10(2))
    if log_y:
        fig.update_yaxes(type="log")
    for col, (_, ylabel, _) in enumerate(panels, start=1):
        fig.update_yaxes(title_text=ylabel, row=1, col=col)
    text = title + (f"<br><sup>out of memory: {', '.join(ooms)}</sup>" if ooms else "")
    fig.update_layout(title_text=text, template="plotly_white", legend_title_text="model (fixed factors)")
    return fig


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """Plotly figures of a benchmark result: throughput and peak memory against batch size and
    against context length, teacher vs student. Keys: ``throughput_vs_batch``,
    ``throughput_vs_context``, ``memory_vs_batch``, ``memory_vs_context``."""
    throughput = [
        ("prefill_tokens_per_second", "prefill tokens/s", 1.0),
        ("decode_tokens_per_second", "decode tokens/s", 1.0),
    ]
    memory = [
        ("peak_memory_bytes", "peak memory, prefill + decode (GiB)", GIB),
        ("decode_peak_memory_bytes", "peak memory while decoding (GiB)", GIB),
    ]
    return {
        "throughput_vs_batch": _figure(result, "batch_size", throughput, "Throughput vs batch size", True),
        "throughput_vs_context": _figure(result, "prompt_length", throughput, "Throughput vs context length", True),
        "memory_vs_batch": _figure(result, "batch_size", memory, "Peak memory vs batch size", False),
        "memory_vs_context": _figure(result, "prompt_length", memory, "Peak memory vs context length", False),
    }
