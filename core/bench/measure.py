"""One point of the benchmark: each model prefills a batch once, then decodes token by token.

* Prefill: one forward over ``B x L`` token ids with an empty cache and ``logits_to_keep=1`` (the
  ``[B, L, vocab]`` logits would dominate memory and are not needed to generate), then a greedy
  argmax; or, for a model given a prefill chunk, one forward per chunk continuing from the cache
  (the student's state is carried, so its temporaries are bounded by the chunk). Its time is the
  time to first token (TTFT).
* Decode: ``G - 1`` single-token forward calls with the cache (``model(...)`` directly, not
  ``generate``, so no sampling or stopping logic is timed), a greedy argmax after each. The median
  step time is the time per output token (TPOT).

Metric names follow vLLM's benchmark (``requests_per_second``, ``tokens_per_second``,
``elapsed_time``, ``num_requests``, ``total_num_tokens``), plus ``prefill_tokens_per_second``,
``decode_tokens_per_second``, ``time_to_first_token_s``, ``time_per_output_token_s`` and the
memory figures. One request is one batch row: ``L`` prompt tokens in, ``G`` tokens out, the first
one from the prefill; ``elapsed_time = TTFT + (G - 1) * TPOT``. Memory figures include the
model's weights (and nothing else the process holds), i.e. what ``max_memory_allocated`` would
show on a device holding only this model:

* ``prefill_peak_memory_bytes``: weights + peak growth during the prefill;
* ``decode_peak_memory_bytes``: weights + the cache held going into a decode step + that step's
  peak growth, the largest over the steps;
* ``peak_memory_bytes``: the larger of the two;
* ``prefill_cache_bytes`` / ``cache_bytes``: bytes the cache keeps alive after the prefill / after
  the last step (:func:`core.bench.memory.cache_bytes`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from core.bench.memory import cache_bytes, free_memory
from core.io import is_oom


def new_cache(model: nn.Module):
    """An empty cache for ``model``: its own ``new_cache()`` when it has one (the attention-free
    floor), else a ``DynamicCache`` (converted layers swap their slot for a hybrid cache layer)."""
    from transformers import DynamicCache

    if hasattr(model, "new_cache"):
        return model.new_cache()
    return DynamicCache(config=model.config)


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
    def prefill(self, input_ids: torch.Tensor, chunk: int | None = None) -> None:
        """One forward over the prompt, or one per ``chunk`` tokens, each continuing from the cache."""
        self.tracker.begin()
        t0 = time.perf_counter()
        L = input_ids.shape[1]
        for start in range(0, L, chunk or L):
            out = self.model(input_ids=input_ids[:, start : start + (chunk or L)], past_key_values=self.cache,
                             use_cache=True, logits_to_keep=1)
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
    models: dict[str, nn.Module], input_ids: torch.Tensor, gen_length: int, tracker, order: list[str],
    chunks: dict[str, int] | None = None,
) -> dict[str, Run | str]:
    """Measure every model at one point, interleaved: prefills in ``order``, then decode steps
    alternating between the models (the order flipping every step), so that what else runs on the
    machine slows them alike. ``chunks``: the prefill chunk of a model (absent: the whole prompt at
    once). Returns a :class:`Run` per model, or the message of its out-of-memory error."""
    chunks = chunks or {}
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
            free_memory(device)

    for name in order:
        requests[name] = Request(models[name], tracker, device)
        attempt(name, lambda request=requests[name], chunk=chunks.get(name): request.prefill(input_ids, chunk))
    for i in range(gen_length - 1):
        for name in order if i % 2 else list(reversed(order)):
            if name in requests:
                attempt(name, requests[name].step)
    out: dict[str, Run | str] = {name: r.run for name, r in requests.items()}
    out.update(failed)
    return out


def random_input_ids(vocab_size: int, batch: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    """``[batch, length]`` token ids drawn uniformly from the vocabulary (seeded, on ``device``)."""
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
