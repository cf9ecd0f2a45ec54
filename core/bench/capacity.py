"""Capacity under a memory budget: the largest batch each model decodes within it, and its throughput there.

For a context length L and each of teacher and student, batches are tried doubling from 1 until
one does not fit, then bisected between the largest that fits and the smallest that does not (to
``max(1, largest / 32)``). A batch fits when its measured decode peak (weights + cache or state
held + the step's temporaries, :mod:`core.bench.memory`) is within the budget. The decode
throughput at the largest batch that fits is the model's capacity throughput (the paper's Fig. 8).

Decode only, from a synthetic cache: prefilling ``L x B`` tokens at the batches this reaches would
take hours on a CPU, and a decode step's cost does not depend on the cached values, so the cache
(teacher: keys and values of L tokens per layer; student: each converted layer's recurrent state
after L tokens, with the window ring of the same positions) is built directly with random values
(:func:`synthetic_cache`); then ``steps`` decode steps are timed (median).

A trial never crashes the run: an out-of-memory error is recorded as ``oom``; a batch whose peak,
extrapolated linearly from the batches measured so far, exceeds the budget by more than
:data:`PREDICTION_MARGIN` is recorded as ``over_budget_predicted`` without allocating it, and one
whose predicted growth exceeds the host's available memory as ``host_memory`` (on CPU; neither fits).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer

from core.attention.cache import HybridCacheLayer
from core.attention.layer import LolcatsAttention
from core.attention.surgery import decoder_layers
from core.bench.config import parse_size
from core.bench.measure import Request
from core.bench.memory import CudaPeak, cache_bytes, free_memory
from core.io import is_oom
from kernels.hybrid.recurrent_torch import HybridState
from kernels.hybrid.window import window_capacity, window_start

PREDICTION_MARGIN = 1.05  # a predicted peak above budget x this is not allocated
METHOD = ("decode steps from a synthetic cache / recurrent state of the context's shape (random values, "
          "built directly, no prefill): decode cost does not depend on the cached values")
def synthetic_cache(model: nn.Module, batch: int, length: int, seed: int = 0) -> Cache:
    """The cache ``model`` holds after ``length`` tokens of ``batch`` rows, with random values.

    Converted layers (student mode) get a :class:`HybridCacheLayer` whose state has the shapes and
    window positions of a real one (rows start at position 0; the ring holds the last tokens, valid
    where still inside the window); softmax layers get ``length`` random keys and values."""
    g = torch.Generator().manual_seed(seed)
    params = next(model.parameters())
    device, dtype = params.device, params.dtype
    text = model.config.get_text_config(decoder=True)
    drawn: dict[tuple, torch.Tensor] = {}

    def rand(shape, positive=False, kind=None) -> torch.Tensor:
        """Random values the first time a shape is asked for, then copies of them (the values do not
        matter, the memory does, and a copy is much faster than drawing random numbers)."""
        key = (tuple(shape), positive, kind)
        if key in drawn:
            return drawn[key].clone()
        draw = torch.rand if positive else torch.randn
        drawn[key] = draw(shape, generator=g, dtype=kind or dtype).to(device)
        return drawn[key]

    layers = []
    for layer in decoder_layers(model):
        attn = layer.self_attn
        if isinstance(attn, LolcatsAttention) and attn.mode == "student":
            Hs, Hkv, d = attn.state_heads, attn.num_kv_heads, attn.head_dim
            Fd = attn.feature_map_q.output_dim
            K = window_capacity(attn.kind, attn.window_size)
            tokens = torch.arange(max(length - K, 0), length, device=device)
            win_pos = torch.zeros(batch, K, dtype=torch.long, device=device)
            win_valid = torch.zeros(batch, K, dtype=torch.bool, device=device)
            if K:
                win_pos[:, tokens % K] = tokens
                win_valid[:, tokens % K] = tokens >= window_start(attn.kind, attn.window_size, length - 1)
            s = attn.sink_tokens
            sinks = (rand((batch, Hkv, s, d)), rand((batch, Hkv, s, d)),
                     torch.ones(batch, s, dtype=torch.bool, device=device)) if s else ()
            state = HybridState(
                rand((batch, Hs, Fd, d), kind=torch.float32), rand((batch, Hs, Fd), True, torch.float32) + 1.0,
                rand((batch, Hkv, K, d)), rand((batch, Hkv, K, d)), win_pos, win_valid,
                torch.zeros(batch, dtype=torch.long, device=device), length, *sinks,
                key_offset=torch.zeros(batch, dtype=torch.long, device=device),
            )
            layers.append(HybridCacheLayer(state))
        else:
            Hkv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
            kv = DynamicLayer()
            kv.keys, kv.values = rand((batch, Hkv, length, attn.head_dim)), rand((batch, Hkv, length, attn.head_dim))
            kv.dtype, kv.device, kv.is_initialized = dtype, device, True
            layers.append(kv)
    return Cache(layers=layers)


def _available_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


def measure_batch(model: nn.Module, batch: int, length: int, steps: int, tracker, weights: int, seed: int) -> dict[str, Any]:
    """Decode ``steps`` tokens of ``batch`` rows from a synthetic ``length``-token cache: the trial's
    ``status`` (``ok`` or ``oom``), median step time, decode tokens/s, peak and cache bytes."""
    device = next(model.parameters()).device
    request: Request | None = None
    error = None
    try:
        request = Request(model, tracker, device)
        request.cache = synthetic_cache(model, batch, length, seed)
        request.token = torch.randint(0, model.config.get_text_config(decoder=True).vocab_size, (batch, 1),
                                      generator=torch.Generator().manual_seed(seed)).to(device)
        request.run.cache_bytes = cache_bytes(request.cache)
        for _ in range(steps):
            request.step()
    except Exception as exc:  # only memory errors are recorded
        if not is_oom(exc):
            raise
        error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
    if error is not None:  # outside the handler: the traceback no longer pins the cache
        request = None
        free_memory(device)
        return {"batch_size": batch, "status": "oom", "error": error}
    run = request.run
    del request
    free_memory(device)
    tpot = statistics.median(run.decode_steps_s)
    return {
        "batch_size": batch, "status": "ok", "time_per_output_token_s": tpot, "decode_tokens_per_second": batch / tpot,
        "peak_memory_bytes": weights + run.decode_peak, "cache_bytes": run.cache_bytes,
        "decode_step_times_s": run.decode_steps_s,
    }


def _predicted_peak(trials: list[dict], batch: int) -> float | None:
    """Peak at ``batch`` extrapolated linearly through the two largest measured batches (None before two)."""
    ok = sorted((t for t in trials if t["status"] in ("ok", "over_budget")), key=lambda t: t["batch_size"])
    if len(ok) < 2:
        return None
    (b1, p1), (b2, p2) = ((t["batch_size"], t["peak_memory_bytes"]) for t in ok[-2:])
    per_row = max((p2 - p1) / (b2 - b1), 0.0)
    return p2 + per_row * (batch - b2)


def find_capacity(model: nn.Module, length: int, budget: int, *, steps: int, tracker, weights: int, seed: int,
                  max_batch: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The largest batch whose measured decode peak fits ``budget`` at context ``length`` (doubling,
    then bisecting); every trial is kept in ``trials``. ``largest_batch`` is 0 when batch 1 does not fit."""
    trials: list[dict] = []
    base = weights
    on_host = not isinstance(tracker, CudaPeak)  # else the growth is in the device's memory, which the budget bounds

    def fits(batch: int) -> bool:
        predicted = _predicted_peak(trials, batch)
        available = _available_bytes() if on_host else None
        if predicted is not None and predicted > budget * PREDICTION_MARGIN:
            trial = {"batch_size": batch, "status": "over_budget_predicted", "predicted_peak_bytes": predicted}
        elif predicted is not None and available is not None and predicted - base > available:
            trial = {"batch_size": batch, "status": "host_memory", "predicted_peak_bytes": predicted,
                     "available_bytes": available}
        else:
            trial = measure_batch(model, batch, length, steps, tracker, weights, seed)
            if trial["status"] == "ok" and trial["peak_memory_bytes"] > budget:
                trial["status"] = "over_budget"
        trials.append(trial)
        log(_describe(length, trial))
        return trial["status"] == "ok"

    lo, hi, batch = 0, None, 1
    while hi is None and batch <= max_batch:
        if fits(batch):
            lo, batch = batch, batch * 2
        else:
            hi = batch
    while hi is not None and hi - lo > max(1, lo // 32):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    best = next((t for t in trials if t["status"] == "ok" and t["batch_size"] == lo), None)
    return {
        "largest_batch": lo,
        "decode_tokens_per_second": best["decode_tokens_per_second"] if best else None,
        "time_per_output_token_s": best["time_per_output_token_s"] if best else None,
        "peak_memory_bytes": best["peak_memory_bytes"] if best else None,
        "reached_max_batch": hi is None,
        "trials": trials,
    }


def run_capacity(models: dict[str, nn.Module], lengths: list[int], budget_text: str, *, steps: int, tracker,
                 weights: dict[str, int], seed: int, max_batch: int, log: Callable[[str], None]) -> dict[str, Any]:
    """:func:`find_capacity` for every model at every context length; the result's ``capacity`` section."""
    budget = parse_size(budget_text)
    contexts = []
    for length in lengths:
        found = {}
        for name, model in models.items():
            log(f"capacity of the {name} at context {length} under {budget_text}")
            started = time.perf_counter()
            found[name] = find_capacity(model, length, budget, steps=steps, tracker=tracker, weights=weights[name],
                                        seed=seed, max_batch=max_batch, log=lambda m, n=name: log(f"{n} {m}"))
            found[name]["search_s"] = time.perf_counter() - started
        entry: dict[str, Any] = {"prompt_length": length, "models": found}
        t, s = found.get("teacher", {}), found.get("student", {})
        if t.get("decode_tokens_per_second") and s.get("decode_tokens_per_second"):
            entry["decode_speedup"] = s["decode_tokens_per_second"] / t["decode_tokens_per_second"]
            entry["batch_ratio"] = s["largest_batch"] / t["largest_batch"]
        contexts.append(entry)
    return {"memory_budget": budget_text, "memory_budget_bytes": budget, "decode_steps": steps, "method": METHOD,
            "contexts": contexts}


def _describe(length: int, trial: dict) -> str:
    head = f"B={trial['batch_size']} L={length}: {trial['status']}"
    if "peak_memory_bytes" in trial:
        return (f"{head}, {trial['decode_tokens_per_second']:.1f} tok/s "
                f"({trial['time_per_output_token_s'] * 1000:.0f} ms/step), peak {trial['peak_memory_bytes'] / 2**30:.2f} GiB")
    if "predicted_peak_bytes" in trial:
        return f"{head} (predicted peak {trial['predicted_peak_bytes'] / 2**30:.2f} GiB, not allocated)"
    return f"{head} ({trial.get('error', '')})"
