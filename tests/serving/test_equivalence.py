"""An export served by vLLM gives the workbench's own model's greedy tokens and log-probabilities
(float32, within 1e-4) for every request of a batch of mixed lengths, prefilled in chunks of 16
tokens, with state slots reused by later requests, and, for a hybrid, from a prefix-cache hit, for
each attention option an export carries and each served base architecture.

The reference (:func:`tests.serving.reference.reference_logprobs`) is the export loaded by
``load_converted`` running the parallel form over the whole sequence; vLLM runs the prompt in
chunks from a carried state and then one decode step per token.
"""

from __future__ import annotations

import pytest

from tests.serving.conftest import run_offline, tiny_export, token_prompts
from tests.serving.reference import reference_logprobs

pytestmark = pytest.mark.serving

TOL = 1e-4  # float32; measured differences are about 1e-6
LENGTHS = [1, 5, 17, 40, 130]  # window 16: inside the window, past it, past the terraced ring, many tiles
MAX_TOKENS = 12
ENGINE = {"max_num_batched_tokens": 16, "max_num_seqs": 3}  # chunked prefill; 5 requests through 3 slots

OPTIONS = {  # every attention option an export carries, over three Llama exports, and a Gemma 3 hybrid
    "terraced-hedgehog-decay-unrotated": {},  # the tiny-test preset: kind terraced, history_norm decay, features before RoPE
    "sliding-t2r-sinks-power-rotary-hybrid": {"kind": "sliding_window", "feature_map": "t2r", "sink_tokens": 2,
                                              "history_norm": "power", "feature_positions": "rotary",
                                              "softmax_layers": [0]},
    "linear-hedgehog-paper": {"kind": "linear", "history_norm": "none", "feature_positions": "rotary"},
    # the cpu-demo recipe's options, every layer converted: a sliding window of 14 keys with 4 sinks
    # (18 flag bytes: the page is padded to a multiple of 8 bytes) and key feature maps per KV head,
    # with the history gate
    "sliding-hedgehog-sinks-kv-maps-gate": {"kind": "sliding_window", "window_size": 14, "sink_tokens": 4,
                                            "key_map_heads": "kv", "history_gate": "query"},
    # a Gemma 3 export (conftest.MODEL_CONFIG; the others are Llama's): its local and global layers
    # converted, each rotating with its own RoPE base, its last local layer vLLM's softmax over 24 keys
    "gemma3-local-global-hybrid": {"model_type": "gemma3_text", "softmax_layers": [2]},
}


def assert_same(prompts, rounds, score, label):
    for i, results in enumerate(rounds):
        for prompt, got in zip(prompts, results):
            where = f"{label}, round {i + 1}, prompt of {len(prompt)} tokens"
            greedy, logprobs, prompt_logprobs = score(prompt, got["tokens"])
            assert got["tokens"] == greedy, where
            assert max(abs(a - b) for a, b in zip(logprobs, got["logprobs"])) < TOL, where
            if i == 0 and len(prompt) > 1:  # the first round asks for the prompt's log-probabilities
                assert max(abs(a - b) for a, b in zip(prompt_logprobs, got["prompt_logprobs"])) < TOL, where


@pytest.mark.parametrize("label", list(OPTIONS))
def test_vllm_serves_the_export_as_the_workbench_runs_it(label, python, serving_workspace, tmp_path):
    folder = tiny_export(serving_workspace, label, **OPTIONS[label])
    prompts = token_prompts(LENGTHS)
    job = {"model": str(folder), "prompts": prompts, "max_tokens": MAX_TOKENS, "engine": ENGINE, "rounds": 2}
    out = run_offline(python, job, tmp_path)
    assert_same(prompts, out["rounds"], reference_logprobs(folder), label)
    # the second round's requests start in slots the first round's left: nothing of theirs leaks in
    assert [r["tokens"] for r in out["rounds"][1]] == [r["tokens"] for r in out["rounds"][0]]
    cached = [r["cached_tokens"] for r in out["rounds"][1]]
    if OPTIONS[label].get("softmax_layers"):  # a hybrid: the second round read the long prompt's first block from the prefix cache
        assert cached[-1] >= 128, cached
    else:  # every layer converted: no prefix caching (serving.engine_config)
        assert cached == [0] * len(prompts)


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "qwen3"])
def test_vllm_serves_the_other_architectures(model_type, python, serving_workspace, tmp_path):
    """Mistral, Qwen2 (biases on q, k, v) and Qwen3 (each head's q and k normalised) on vLLM's own
    model of each, as hybrids: the converted layer and vLLM's softmax layer both load the export's
    projections (and norms)."""
    folder = tiny_export(serving_workspace, model_type, model_type, softmax_layers=[1])
    prompts = token_prompts(LENGTHS[:4], seed=2)
    job = {"model": str(folder), "prompts": prompts, "max_tokens": MAX_TOKENS, "engine": ENGINE}
    out = run_offline(python, job, tmp_path)
    assert_same(prompts, out["rounds"], reference_logprobs(folder), model_type)


def test_bfloat16_serves_the_same_greedy_tokens(python, serving_workspace, tmp_path):
    """In bfloat16 (S and z stay float32) the served tokens are the float32 model's; log-probabilities
    move by the weights' rounding (measured: up to 4.3e-3 on this export)."""
    folder = tiny_export(serving_workspace, "bfloat16")
    prompts = token_prompts(LENGTHS, seed=3)
    job = {"model": str(folder), "prompts": prompts, "max_tokens": MAX_TOKENS, "engine": {**ENGINE, "dtype": "bfloat16"}}
    score = reference_logprobs(folder)  # float32
    for prompt, got in zip(prompts, run_offline(python, job, tmp_path)["rounds"][0]):
        greedy, logprobs, _ = score(prompt, got["tokens"])
        assert got["tokens"] == greedy, f"prompt of {len(prompt)} tokens"
        assert max(abs(a - b) for a, b in zip(logprobs, got["logprobs"])) < 2e-2
