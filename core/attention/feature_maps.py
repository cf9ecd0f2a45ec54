"""Learned feature maps phi for LoLCATs linear attention, one set of weights per head.

* Hedgehog: phi(x) = clamp([softmax(x W_h), softmax(-x W_h)], min=eps), W_h in R^{d x f}, F = 2f;
  each softmax runs over its own f features.
* T2R:      phi(x) = relu(x W_h + b_h), W_h in R^{d x F}, b_h one scalar per head.

Input ``[B, H, L, d]``, output ``[B, H, L, F]``, no 1/sqrt(d) inside phi. ``init="identity"``
(the recipe default) sets W_h to the first f columns of the identity (zero-padded when f > d);
``init="random"`` uses a scaled normal. The maps are computed in float32.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from core.config.constants import FEATURE_INITS, FEATURE_MAPS
from kernels.hybrid.blocks import blocks, recorded


def _init_weight(weight: torch.Tensor, init: str) -> None:
    H, d, f = weight.shape
    with torch.no_grad():
        if init == "identity":
            weight.zero_()
            n = min(d, f)
            weight[:, torch.arange(n), torch.arange(n)] = 1.0
        elif init == "random":
            weight.normal_(0.0, 1.0 / math.sqrt(d))
        else:
            raise ValueError(f"unknown feature map init {init!r}; valid: {', '.join(FEATURE_INITS)}")


def _head_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x ``[B, H, L, d]`` times the per-head ``w [H, d, F]``: ``[B, H, L, F]``, a head-major view
    when B > 1. One batched product over heads on ``[H, B L, d]``: a broadcast matmul would copy
    ``w`` once per batch row, which costs more than the product itself when L is 1 (decoding)."""
    B, H, L, d = x.shape
    u = torch.bmm(x.transpose(0, 1).reshape(H, B * L, d), w)
    return u.view(H, B, L, -1).transpose(0, 1)


class _PerHeadMap(nn.Module):
    """A feature map phi(x W_h) with one weight per head: :meth:`_weight` gives the ``[H, d, F]``
    product weight, :meth:`_phi` the map of the product ``[..., F]``.

    Inference on CPU runs the map over pieces of rows and tokens that fit in cache
    (``kernels.hybrid.blocks``) into one output; autograd takes the whole tensor."""

    output_dim: int

    def _weight(self) -> torch.Tensor:
        raise NotImplementedError

    def _phi(self, u: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self._weight()
        if recorded(x, w):
            # [B, H, L, F]; a broadcast matmul writes it contiguous (einsum's output is a permuted view)
            return self._phi(torch.matmul(x.float(), w))
        B, H, L, d = x.shape
        pieces = blocks(B, L, 4 * H * (self.output_dim + d)) if x.device.type == "cpu" else []
        if len(pieces) <= 1:
            return self._phi(_head_matmul(x.float(), w))
        out = torch.empty(B, H, L, self.output_dim, device=x.device)
        for rows, tokens in pieces:
            out[rows, :, tokens] = self._phi(_head_matmul(x[rows, :, tokens].float(), w))
        return out


class HedgehogFeatureMap(_PerHeadMap):
    """Per-head Hedgehog map; ``feature_dim`` is f, the output has F = 2f features."""

    def __init__(self, num_heads: int, head_dim: int, feature_dim: int, init: str = "identity", eps: float = 1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, feature_dim))
        self.eps = eps
        _init_weight(self.weight, init)

    @property
    def output_dim(self) -> int:
        return 2 * self.weight.shape[-1]

    def _weight(self) -> torch.Tensor:
        w = self.weight.float()
        return torch.cat([w, -w], dim=-1)  # [x W_h, -x W_h]: [..., 2f]

    def _phi(self, u: torch.Tensor) -> torch.Tensor:
        phi = torch.softmax(u.unflatten(-1, (2, -1)), dim=-1).flatten(-2)  # each half its own softmax
        return phi.clamp(min=self.eps) if phi.requires_grad else phi.clamp_(min=self.eps)


class T2RFeatureMap(_PerHeadMap):
    """Per-head T2R map relu(x W_h + b_h); ``feature_dim`` is F."""

    def __init__(self, num_heads: int, head_dim: int, feature_dim: int, init: str = "identity"):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, feature_dim))
        self.bias = nn.Parameter(torch.zeros(num_heads))  # one scalar per head, as in the recipe
        _init_weight(self.weight, init)

    @property
    def output_dim(self) -> int:
        return self.weight.shape[-1]

    def _weight(self) -> torch.Tensor:
        return self.weight.float()

    def _phi(self, u: torch.Tensor) -> torch.Tensor:
        return torch.relu(u + self.bias.float().view(1, -1, 1, 1))


def build_feature_map(name: str, num_heads: int, head_dim: int, feature_dim: int, init: str = "identity") -> nn.Module:
    if feature_dim < 1:
        raise ValueError(f"feature_dim must be >= 1, got {feature_dim}")
    if name == "hedgehog":
        return HedgehogFeatureMap(num_heads, head_dim, feature_dim, init)
    if name == "t2r":
        return T2RFeatureMap(num_heads, head_dim, feature_dim, init)
    raise ValueError(f"unknown feature map {name!r}; valid feature maps: {', '.join(FEATURE_MAPS)}")
