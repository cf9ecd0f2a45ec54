"""The tiny test model: a 2-layer randomly initialised Llama (seeded) with the bundled tokenizer,
for conversions that finish in seconds.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from core.models.gguf import bundled_tokenizer
from core.models.sources import TINY_MODEL
from core.workspace import models_dir, workspace_root

TINY_CONFIG = {  # LlamaConfig fields; the vocabulary and special tokens come from the bundled tokenizer
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def tiny_model_config() -> dict[str, Any]:
    """The tiny model's ``config.json`` fields known before it is built (no tokenizer, no torch)."""
    return {"model_type": "llama", **TINY_CONFIG}


def tiny_model_dir(workspace: str | os.PathLike | None = None) -> Path:
    """The tiny model's HF folder in the workspace, built and saved on first use."""
    target = models_dir(workspace_root(workspace)) / TINY_MODEL
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = bundled_tokenizer(workspace)
    config = LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        **TINY_CONFIG,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    tmp = target.parent / f".{TINY_MODEL}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target
