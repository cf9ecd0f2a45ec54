"""Tiny randomly initialised decoders of each supported architecture, and a tiny tokenizer, built in the tests."""

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from core.data import ALPACA_PROMPT_NO_INPUT, ALPACA_PROMPT_WITH_INPUT

COMMON = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)

CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON, head_dim=16),
    "mistral": lambda: MistralConfig(**COMMON, head_dim=16, sliding_window=None),
    "qwen2": lambda: Qwen2Config(**COMMON),
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=16),
    # Gemma 3: q/k norms, scaling query_pre_attn_scalar**-0.5 (not head_dim**-0.5), its own
    # sliding-window layers (window 24, shorter than the test inputs) with their own RoPE base.
    "gemma3": lambda: Gemma3TextConfig(
        **COMMON, head_dim=16, query_pre_attn_scalar=24, sliding_window=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    ),
}


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    config = CONFIGS[arch]()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if arch == "gemma3":  # its RMS norms start at weight 0 (scale 1 + w): make them matter
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1 and "norm" in name:
                    p.normal_(0.0, 0.3)
    return model.float().eval()


def byte_level_tokenizer():
    """A tiny byte-level BPE tokenizer (every string round-trips), trained in well under a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [ALPACA_PROMPT_WITH_INPUT, ALPACA_PROMPT_NO_INPUT, "The answer is 42. How many eggs does she sell?"]
    tok.train_from_iterator(corpus * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
