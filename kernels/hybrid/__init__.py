"""Hybrid (sliding-window / terraced / linear) attention: PyTorch form, later Triton kernels."""

from kernels.hybrid.torch_chunked import KINDS, hybrid_attention_torch

__all__ = ["KINDS", "hybrid_attention_torch"]
