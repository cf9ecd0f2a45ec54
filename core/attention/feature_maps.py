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


class HedgehogFeatureMap(nn.Module):
    """Per-head Hedgehog map; ``feature_dim`` is f, the output has F = 2f features."""

    def __init__(self, num_heads: int, head_dim: int, feature_dim: int, init: str = "identity", eps: float = 1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, feature_dim))
        self.eps = eps
        _init_weight(self.weight, init)

    @property
    def output_dim(self) -> int:
        return 2 * self.weight.shape[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float()
        # [x W_h, -x W_h]: [B, H, L, 2f]; a broadcast matmul writes it contiguous (einsum's output is a
        # permuted view that the softmax would copy)
        u = torch.matmul(x.float(), torch.cat([w, -w], dim=-1))
        phi = torch.softmax(u.unflatten(-1, (2, -1)), dim=-1).flatten(-2)  # each half its own softmax
        return phi.clamp(min=self.eps) if phi.requires_grad else phi.clamp_(min=self.eps)


class T2RFeatureMap(nn.Module):
    """Per-head T2R map relu(x W_h + b_h); ``feature_dim`` is F."""

    def __init__(self, num_heads: int, head_dim: int, feature_dim: int, init: str = "identity"):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, feature_dim))
        self.bias = nn.Parameter(torch.zeros(num_heads))  # one scalar per head, as in the recipe
        _init_weight(self.weight, init)

    @property
    def output_dim(self) -> int:
        return self.weight.shape[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = torch.matmul(x.float(), self.weight.float())
        return torch.relu(u + self.bias.float().view(1, -1, 1, 1))


def build_feature_map(name: str, num_heads: int, head_dim: int, feature_dim: int, init: str = "identity") -> nn.Module:
    if feature_dim < 1:
        raise ValueError(f"feature_dim must be >= 1, got {feature_dim}")
    if name == "hedgehog":
        return HedgehogFeatureMap(num_heads, head_dim, feature_dim, init)
    if name == "t2r":
        return T2RFeatureMap(num_heads, head_dim, feature_dim, init)
    raise ValueError(f"unknown feature map {name!r}; valid feature maps: {', '.join(FEATURE_MAPS)}")
