"""The Triton chunked kernels (forward and backward) checked against the float64 naive reference and
the PyTorch chunked form, shared by the interpreter / CUDA kernel tests and the compiled-CUDA tests."""

import torch

from kernels.hybrid.chunk_torch import hybrid_attention_torch
from kernels.hybrid.chunk_triton import hybrid_attention_triton
from kernels.hybrid.naive import naive_hybrid_attention
from kernels.hybrid.window import WindowRule
from tests.kernels.utils import GRAD_NAMES, assert_close, forward_backward


def check_chunk_triton(kind, w, tensors, mask, *, ratio, grad_ratio, against_torch=True, atol=1e-6, decay=None, sinks=0,
                       **kernel_kwargs):
    """Output and all six gradients (seven with a ``decay``, log gamma [H]) vs the float64 naive
    reference (real queries) and vs chunk_torch, for the window rule (kind, w, sinks)."""
    torch.manual_seed(0)
    q = tensors[0]
    dy = torch.randn(q.shape, dtype=torch.float32) * mask.cpu()[:, None, :, None]
    rule = WindowRule(kind, w, sinks)
    y, grads = forward_backward(hybrid_attention_triton, tensors, mask, dy.to(q.device), decay, rule=rule, **kernel_kwargs)
    assert y.dtype == q.dtype and y.device == q.device
    cpu64 = [t.detach().cpu().double() for t in tensors]
    decay64 = None if decay is None else decay.detach().cpu().double()
    y_ref, g_ref = forward_backward(naive_hybrid_attention, cpu64, mask.cpu(), dy.double(), decay64, rule=rule)
    m = mask.cpu().bool()[:, None, :, None]
    assert_close("o", torch.where(m, y_ref, 0.0), torch.where(m, y.cpu().double(), 0.0), ratio)
    for name, ref, got in zip(GRAD_NAMES, g_ref, grads):
        assert_close(name, ref, got, grad_ratio, atol)
    if against_torch:
        y_t, g_t = forward_backward(hybrid_attention_torch, tensors, mask, dy.to(q.device), decay, rule=rule)
        assert_close("o vs chunk_torch", y_t, y, ratio)
        for name, ref, got in zip(GRAD_NAMES, g_t, grads):
            assert_close(f"{name} vs chunk_torch", ref, got, grad_ratio, atol)
