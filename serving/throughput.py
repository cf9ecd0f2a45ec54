"""Generation throughput of one model in vLLM's offline engine at several numbers of concurrent
requests, as JSON: the engine half of ``benchmarks/serving_throughput.py``.

    .venv-serving/bin/python -m serving.throughput JOB.json OUT.json

``JOB.json``: ``{"model": folder, "prompt_len": L, "max_tokens": G, "requests": [N, ...],
"engine": {vLLM engine arguments}, "seed": s}``. For each N, N prompts of L random token ids (a BOS
first) are submitted together and each generates G tokens (greedy, end of sequence ignored); the
engine runs as many at once as its cache holds (``max_num_seqs`` is the largest N, ``max_model_len``
is L + G) and queues the rest. One request runs first, unmeasured (first-call allocation).

``OUT.json``: ``capacity``, how many requests of L + G tokens the engine's cache holds (vLLM's own
figure), the engine's cache size in bytes and blocks, and per N: the wall time, generated tokens per second, the most
requests that were running at one time (from vLLM's per-request timestamps: scheduled to last
token), preemptions, and the median time to first token.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from serving.offline import run_job, start_engine


def random_prompts(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    """Prompts of random token ids of the given lengths, a BOS (id 1) first."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, vocab) for _ in range(n - 1)] for n in lengths]


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals ``(start, end)`` that hold one instant (an end before a start at a tie)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda event: (event[0], event[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def measure(job: dict) -> dict:
    """Run ``job`` (module docstring) and return the results."""
    from vllm import SamplingParams, TokensPrompt

    length, gen, counts = job["prompt_len"], job["max_tokens"], sorted(job["requests"])
    engine = {"max_model_len": length + gen, "max_num_seqs": counts[-1], "disable_log_stats": False,
              **job.get("engine", {})}
    started = time.perf_counter()
    llm = start_engine({**job, "engine": engine})
    startup_s = time.perf_counter() - started
    vocab = llm.llm_engine.model_config.get_vocab_size()
    params = SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True)

    def run(prompts: list[list[int]]) -> tuple[float, list]:
        started = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
        return time.perf_counter() - started, outputs

    run(random_prompts([length], vocab, job.get("seed", 0) + 10_000))  # warm-up
    points = []
    for i, count in enumerate(counts):
        wall, outputs = run(random_prompts([length] * count, vocab, job.get("seed", 0) + i))
        stats = [out.metrics for out in outputs]
        generated = sum(len(out.outputs[0].token_ids) for out in outputs)
        points.append({
            "requests": count, "wall_s": wall, "generated_tokens": generated, "tokens_per_s": generated / wall,
            "peak_in_flight": peak_overlap([(s.scheduled_ts, s.last_token_ts) for s in stats]),
            "preemptions": sum(s.num_preemptions for s in stats),
            "median_ttft_s": statistics.median(s.first_token_latency for s in stats),
        })
        print(f"{job['model']}: {count} requests, {points[-1]['tokens_per_s']:.1f} tokens/s, "
              f"at most {points[-1]['peak_in_flight']} at once", file=sys.stderr, flush=True)
    cache = llm.llm_engine.vllm_config.cache_config
    return {"capacity": cache.kv_cache_max_concurrency, "cache_bytes": cache.kv_cache_memory_bytes,
            "cache_blocks": cache.num_gpu_blocks,
            "block_size": cache.block_size, "startup_s": startup_s, "engine": engine, "points": points}


if __name__ == "__main__":  # vLLM spawns workers that re-import the main module: run only here
    sys.exit(run_job(sys.argv[1:], measure, "serving.throughput"))
