"""Shared helpers of the kernel tests: inputs and a labelled relative-RMS check."""

import torch

from core.attention import build_feature_map


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float, atol: float = 0.0) -> None:
    """RMS(out - ref) <= ratio * RMS(ref) + atol, with both numbers in the message."""
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    ref, out = ref.detach().double().cpu(), out.detach().double().cpu()
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    err = (out - ref).pow(2).mean().sqrt().item()
    base = ref.pow(2).mean().sqrt().item()
    assert err <= ratio * base + atol, f"{name}: relative RMS error {err / max(base, 1e-300):.3e} > {ratio:.1e} (RMS error {err:.3e}, RMS of reference {base:.3e})"


def make_inputs(B, H, Hkv, L, d, f, *, feature_map="hedgehog", pads=(), seed=42, dtype=torch.float32, feat_dtype=None, device="cpu"):
    """q [B, H, L, d], k and v [B, Hkv, L, d], learned-map features [B, H, L, F], mix [H], mask [B, L].

    ``pads[b]`` left-padding tokens in row b (a row may be all padding)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, d, generator=g)
    k = torch.randn(B, Hkv, L, d, generator=g)
    v = torch.randn(B, Hkv, L, d, generator=g)
    torch.manual_seed(seed)
    fq = build_feature_map(feature_map, H, d, f, init="random")
    fk = build_feature_map(feature_map, H, d, f, init="random")
    with torch.no_grad():
        qf, kf = fq(q), fk(k.repeat_interleave(H // Hkv, dim=1))
    mix = torch.randn(H, generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
    q, k, v = (t.to(dtype) for t in (q, k, v))
    qf, kf = (t.to(feat_dtype or dtype) for t in (qf, kf))
    return tuple(t.to(device) for t in (q, k, v, qf, kf, mix, mask))


def forward_backward(fn, tensors, mask, dy, **kwargs):
    """Output and gradients of (q, k, v, q_feat, k_feat, mix) for the cotangent dy (None -> zeros)."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    y = fn(*leaves, attention_mask=mask, **kwargs)
    (y.float() * dy.to(y.device)).sum().backward()
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]
    return y.detach(), grads


GRAD_NAMES = ("dq", "dk", "dv", "dq_feat", "dk_feat", "dmix")
