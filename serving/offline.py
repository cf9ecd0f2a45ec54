"""Greedy generation from an export through vLLM's offline engine, as JSON: what the serving tests
compare with the workbench's own model, and a quick check that an export serves.

    .venv-serving/bin/python -m serving.offline JOB.json OUT.json

``JOB.json``: ``{"model": export folder, "prompts": [[token ids], ...], "max_tokens": n,
"engine": {vLLM engine arguments}, "rounds": k}``; the prompts are submitted together (one batch,
scheduled as vLLM likes) ``rounds`` times, one round after another (a later round meets the slots
and the prefix cache an earlier one left). ``OUT.json``: per round, per prompt, the generated
token ids, each one's log-probability, the prompt tokens' log-probabilities (from the second; first
round only) and how many prompt tokens came from the prefix cache.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ENGINE_DEFAULTS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 4,
                   "seed": 0, "kv_cache_memory_bytes": 2**30}  # 1 GiB of cache (on CPU, vLLM's default is 4)


def start_engine(job: dict):
    """vLLM's offline engine on ``job["model"]`` with :data:`ENGINE_DEFAULTS` updated by
    ``job["engine"]`` (on CPU, ``VLLM_CPU_KVCACHE_SPACE``, when set, overrides the cache size)."""
    from vllm import LLM

    return LLM(model=job["model"], **{**ENGINE_DEFAULTS, **job.get("engine", {})})


def generate(job: dict) -> dict:
    """Run ``job`` (module docstring) and return the results."""
    from vllm import SamplingParams, TokensPrompt

    llm = start_engine(job)
    rounds = []
    for i in range(job.get("rounds", 1)):
        # prompt log-probabilities in the first round only: vLLM reads no prefix cache for a request that asks for them
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], logprobs=0,
                                prompt_logprobs=0 if i == 0 and job.get("prompt_logprobs", True) else None,
                                ignore_eos=True)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]], params)
        rounds.append([_result(out) for out in outputs])
    return {"rounds": rounds}


def _result(out) -> dict:
    """One request's tokens and log-probabilities (only the chosen tokens')."""
    completion = out.outputs[0]
    tokens = list(completion.token_ids)
    logprobs = [step[token].logprob for step, token in zip(completion.logprobs, tokens)]
    prompt_logprobs = [step[token].logprob for step, token in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])] \
        if out.prompt_logprobs else []
    return {"tokens": tokens, "logprobs": logprobs, "prompt_logprobs": prompt_logprobs,
            "cached_tokens": out.num_cached_tokens or 0}


def run_job(argv: list[str], run, module: str) -> int:
    """The command line of a job module: read ``JOB.json``, ``run`` it, write ``OUT.json``."""
    if len(argv) != 2:
        print(f"usage: python -m {module} JOB.json OUT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(run(job)))
    return 0


if __name__ == "__main__":  # vLLM spawns workers that re-import the main module: run only here
    sys.exit(run_job(sys.argv[1:], generate, "serving.offline"))
