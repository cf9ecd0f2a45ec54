"""Shared helpers of the kernel tests: a labelled relative-RMS check, forward + backward runs, and a
converted tiny decoder."""

import torch

import core
from tests.tiny_models import tiny_model

N_LAYERS = 3  # the tiny model's decoder layers, all converted by converted_tiny


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float, atol: float = 0.0) -> None:
    """RMS(out - ref) <= ratio * RMS(ref) + atol, with both numbers in the message."""
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    ref, out = ref.detach().double().cpu(), out.detach().double().cpu()
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    err = (out - ref).pow(2).mean().sqrt().item()
    base = ref.pow(2).mean().sqrt().item()
    assert err <= ratio * base + atol, f"{name}: relative RMS error {err / max(base, 1e-300):.3e} > {ratio:.1e} (RMS error {err:.3e}, RMS of reference {base:.3e})"


def forward_backward(fn, tensors, mask, dy, decay=None, **kwargs):
    """Output and gradients of (q, k, v, q_feat, k_feat, mix) for the cotangent dy (None -> zeros),
    and of log gamma when a ``decay`` is given (passed as ``decay=``)."""
    leaves = [t.detach().clone().requires_grad_() for t in (*tensors, *([] if decay is None else [decay]))]
    if decay is not None:
        kwargs["decay"] = leaves[-1]
    y = fn(*leaves[: len(tensors)], attention_mask=mask, **kwargs)
    (y.float() * dy.to(y.device)).sum().backward()
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]
    return y.detach(), grads


GRAD_NAMES = ("dq", "dk", "dv", "dq_feat", "dk_feat", "dmix", "ddecay")


def converted_tiny(kind: str, device: str | torch.device) -> torch.nn.Module:
    """The tiny random Llama with every layer converted to ``kind`` (window 8, random Hedgehog
    features, random window mix, a decaying history that fades within the tiny inputs), the same
    weights on any ``device``."""
    torch.manual_seed(0)
    model = core.linearize(
        tiny_model("llama", seed=0),
        core.AttentionSpec(kind=kind, window_size=8, feature_dim=8, feature_init="random", init_history_decay=0.8),
    )
    with torch.no_grad():
        for m in core.lolcats_modules(model).values():
            m.mix.copy_(torch.randn_like(m.mix))
    return model.to(device)
