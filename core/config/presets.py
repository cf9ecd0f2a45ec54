"""Named conversion presets: partial configs merged over the recipe defaults of the schema.

Plain data (torch-free), so the job system and the UI can list them without loading torch.
"""

from core.config.constants import GEMMA3_MODEL, TINY_MODEL
from core.config.tree import deep_merge

# The bundled model on 2 CPU cores in 14 to 16 minutes, its long-context evaluation included
# (benchmarks/cpu_demo.py, benchmarks/results/cpu-demo-timing.json: 834 s alone; the same recipe
# took 963 s on a slower day of the same machine). Measured on it
# (benchmarks/results/recipe-cpu.md, long-context-cpu.md): 4 sink tokens kept softmax (SmolLM2
# parks up to 64 % of a late layer's attention on the first token), the library's long-context
# defaults (feature maps on q, k before RoPE, a decaying history) and 512-token blocks, longer
# than the history's span; one-block attention-transfer updates, then LoRA distilled from the
# teacher (KL) at a higher lr.
_CPU_DEMO: dict = {
    "attention": {"sink_tokens": 4},
    "data": {"seq_len": 512, "val_examples": 64, "max_examples": 1000},
    "stage1": {"steps": 240, "grad_accum": 1, "eval_every": 40, "eval_blocks": 4},
    "stage2": {"steps": 48, "grad_accum": 1, "lr": 3e-3, "loss": "kl", "eval_every": 16, "eval_blocks": 4},
    "eval": {"ppl_blocks": 8, "mse_blocks": 2, "samples": 2, "max_new_tokens": 24,
             "long_context": {"sequences": 2, "passkey_lengths": [1024, 4096], "passkey_depths": [0.5],
                              "passkey_trials": 2}},
}

PRESETS: dict[str, dict] = {
    # The paper's Llama 3 8B recipe (needs a GPU with about 40 GB and the hub), with what the CPU
    # measurements support (docs/long-context.md): 4 sink tokens and the library's long-context
    # defaults (position-free feature maps, a decaying history) on the paper's 1024-token blocks;
    # evaluated up to 8192 tokens.
    "paper-8b": {
        "model": {"source": "meta-llama/Meta-Llama-3-8B", "dtype": "bfloat16"},
        "data": {"source": "yahma/alpaca-cleaned", "seq_len": 1024},
        "attention": {"sink_tokens": 4},
    },
    # A sliding window of 183 keys and a small history (Hedgehog f = 8, key feature maps per
    # key/value head): 299,712 state bytes per layer, below the memory-matched sliding window (191
    # keys in the same bytes) at 1024, 2048 and 4096 tokens on the bundled held-out text and at
    # every length on prose, where a window of 126 with f = 64 (299,520 bytes) was above it at
    # every length; halving f from 64 to 8 and giving the bytes to the window helped at each step
    # (benchmarks/results/frontier-cpu.md, docs/long-context.md). The window's query blocks are
    # cut by 61, a divisor of 183 (kernels.hybrid.chunk_torch.window_tile).
    # Its own window is a point of the frontier beside the memory-matched one.
    "cpu-demo": deep_merge(_CPU_DEMO, {
        "attention": {"kind": "sliding_window", "window_size": 183, "feature_dim": 8, "key_map_heads": "kv"},
        "eval": {"long_context": {"frontier_windows": [32, 512]}},
    }),
    # Gemma 3 270M (bundled, offline) on 2 CPU cores: cpu-demo's data and evaluation with shorter
    # stages and answer-token LoRA (its 262k-token vocabulary makes every LM-head pass costly, a
    # teacher pass for distillation too); its own local sliding-window layers stay softmax and its
    # 3 global layers are converted, with 4 sink tokens (docs/models.md has the numbers).
    "cpu-demo-gemma3": deep_merge(_CPU_DEMO, {
        "model": {"source": GEMMA3_MODEL},
        "data": {"seq_len": 256},
        # 4 sink tokens: Gemma's BOS is an attention sink (long-context-cpu.md, gemma3-sinks4)
        "attention": {"keep_sliding_layers": True, "sink_tokens": 4},
        "stage1": {"steps": 30, "grad_accum": 2, "eval_every": 10},
        "stage2": {"steps": 16, "grad_accum": 2, "lr": 1e-3, "loss": "xent", "eval_every": 8},
        # its 262k-token vocabulary makes a 4096-token pass slow on CPU: a shorter long-context check,
        # and a passkey grid of short prompts (4 models x 2 keys: about a minute on 2 cores)
        "eval": {"long_context": {"lengths": [256, 1024, 2048], "sequences": 1, "passkey_lengths": [128, 256],
                                  "passkey_trials": 1}},
    }),
    # Seconds: a tiny random model with the bundled tokenizer; for tests and smoke checks.
    "tiny-test": {
        "model": {"source": TINY_MODEL},
        "attention": {"feature_dim": 8, "window_size": 16},
        "data": {"seq_len": 64, "val_examples": 8, "max_examples": 64},
        "stage1": {"steps": 4, "grad_accum": 1, "eval_every": 2, "eval_blocks": 2},
        "stage2": {"steps": 4, "grad_accum": 1, "lr": 1e-3, "eval_every": 2, "eval_blocks": 2},
        "eval": {"ppl_blocks": 2, "mse_blocks": 1, "samples": 1, "max_new_tokens": 8,
                 "long_context": {"lengths": [64, 256], "sequences": 1, "passkey_lengths": [128],
                                  "passkey_depths": [0.5], "passkey_trials": 1}},
    },
}

PRESET_DESCRIPTIONS: dict[str, str] = {  # one line each, for CLI help, the job list and the Launch page
    "paper-8b": "the paper's Llama 3 8B recipe with 4 sink tokens (GPU and hub access needed)",
    "cpu-demo": "the bundled SmolLM2-135M on CPU in 14 to 16 minutes, evaluated up to 4096 tokens",
    "cpu-demo-gemma3": "the bundled Gemma 3 270M on CPU (its 3 global layers converted, 4 sink tokens)",
    "tiny-test": "a 2-layer random Llama with the bundled tokenizer: seconds",
}
