"""Tiny model folders for the core.models tests."""

import json
import shutil

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.tiny_models import byte_level_tokenizer

SUPPORTED = "llama, mistral, qwen2, qwen3"


def tiny_llama_config(**overrides):
    kwargs = dict(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def save_tiny_llama(folder, seed=0):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config()).eval()
    model.save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    return model


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
