"""The serving tests: exports of tiny conversions, run through vLLM in the serving environment
(``.venv-serving``, ``scripts/setup-serving.sh``) and compared with the workbench's own model.

Without the serving environment the tests that need it are skipped, unless
``LOLCATS_SERVING_TESTS=1`` (CI sets it after building the environment): then they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from core.export.folder import export
from core.models.gguf import bundled_tokenizer
from core.models.tiny import TINY_CONFIG
from serving.launch import ROOT, ServingEnvError, serving_python
from serving.throughput import random_prompts
from tests.tiny_runs import convert_tiny

REQUIRED_ENV = "LOLCATS_SERVING_TESTS"
ENGINE_TIMEOUT_S = 900  # one engine start and a few generations; minutes on two busy cores


@pytest.fixture(scope="session")
def python() -> Path:
    """The serving interpreter (see the module docstring for when its absence skips)."""
    try:
        return serving_python()
    except ServingEnvError as exc:
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def serving_workspace(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serving-ws")


HEAD_DIM = 32  # the tiny model's 16 is below the head sizes vLLM's CPU attention supports (32 and up)
MODEL_CONFIG = {  # per model_type, on top of TINY_CONFIG
    # vLLM's Qwen2 reads no head_dim: its head dim is hidden_size / num_attention_heads, as in every Qwen2
    "qwen2": {"hidden_size": TINY_CONFIG["num_attention_heads"] * HEAD_DIM},
    # Gemma 3: a local, a global and a local layer (RoPE bases 1e4 and 1e6), the local ones' window
    # (24) shorter than the longer prompts; its query scale is query_pre_attn_scalar**-0.5 = 1/16
    "gemma3_text": {"num_hidden_layers": 3, "sliding_window": 24,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
}
QK_NORM_TYPES = ("qwen3", "gemma3_text")  # their attention normalises each head's q and k before RoPE


def tiny_model(workspace: Path, model_type: str = "llama") -> Path:
    """The tiny test model (:mod:`core.models.tiny`) as a ``model_type`` model (a served base
    architecture, :data:`MODEL_CONFIG`) with head dim 32, seeded, as a local folder: vLLM's CPU
    attention runs a softmax layer of it. With q/k norms, every RMS norm's weight is moved off its
    initial value (ones, or Gemma's zeros of its 1 + w scale) so that the norms' weights matter."""
    folder = workspace / "models" / f"tiny-{model_type}-d{HEAD_DIM}"
    if not (folder / "config.json").is_file():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        tokenizer = bundled_tokenizer(workspace)
        config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                      eos_token_id=tokenizer.eos_token_id,
                                      **{**TINY_CONFIG, "head_dim": HEAD_DIM, **MODEL_CONFIG.get(model_type, {})})
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config)
            if model_type in QK_NORM_TYPES:
                with torch.no_grad():
                    for name, weight in model.named_parameters():
                        if "norm" in name:
                            weight.add_(torch.randn_like(weight), alpha=0.3)
            model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


def tiny_export(workspace: Path, name: str, model_type: str = "llama", **attention) -> Path:
    """An export of a tiny-test conversion of :func:`tiny_model` whose attention spec is updated by
    ``attention``."""
    run, _ = convert_tiny(workspace, name, model={"source": str(tiny_model(workspace, model_type))},
                          attention=attention)
    return export(run, workspace / "exports" / name, workspace=workspace)


def token_prompts(lengths: list[int], seed: int = 0, vocab: int = 49152) -> list[list[int]]:
    """Prompts of random token ids (a BOS first) of the given lengths."""
    return random_prompts(lengths, vocab, seed)


def run_offline(python: Path, job: dict, tmp_path: Path, module: str = "serving.offline") -> dict:
    """``job`` through ``module`` (``serving.offline``, ``serving.throughput``) in the serving
    environment: its results. The job's engine arguments size the cache (no ``VLLM_CPU_KVCACHE_SPACE``)."""
    job_file, out_file = tmp_path / "job.json", tmp_path / "out.json"
    job_file.write_text(json.dumps(job))
    env = {name: value for name, value in os.environ.items() if name != "VLLM_CPU_KVCACHE_SPACE"}
    done = subprocess.run([str(python), "-m", module, str(job_file), str(out_file)], cwd=ROOT,
                          env={**env, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")},
                          capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
    assert done.returncode == 0, f"{module} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(out_file.read_text())
