"""The history gate (``attention.history_gate``): how much of the linear history each query reads.

* ``none`` (the paper's): every query reads the history with the head's one mixing factor.
* ``query``: query n of head h scales its history term, numerator and denominator alike, by

      r_h(q_n) = 2 sigmoid(u_h . q_n / sqrt(d) + b_h),   u_h in R^d, b_h learned per head,

  q_n the query the feature maps read (``feature_positions``). A query whose answer sits in the
  window can turn the history's diffuse mass down, one that needs the history can turn it up; the
  window's share is unchanged. u = 0 and b = 0 at the start give r = 1: the gated layer starts as
  the ungated one. r depends on the query alone, so it multiplies phi_q(q_n) before the attention
  op, and every form of the op (chunked, Triton, recurrent decode, carried chunk) computes the
  same thing with no state of its own. A linear layer has no window to weigh its history against:
  the factor cancels in phi^T S / phi^T z, and the schema stores its gate as ``none``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HISTORY_GATES = ("none", "query")


class QueryGate(nn.Module):
    """r_h(q) = 2 sigmoid(u_h . q / sqrt(d) + b_h): ``weight`` u ``[H, d]``, ``bias`` b ``[H]``."""

    def __init__(self, num_heads: int, head_dim: int, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_heads, head_dim, device=device))
        self.bias = nn.Parameter(torch.zeros(num_heads, device=device))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """``[B, H, L, 1]`` factor of phi_q(q_n) for queries ``q [B, H, L, d]``."""
        logit = torch.einsum("bhld,hd->bhl", q.float(), self.weight.float()) / math.sqrt(q.shape[-1])
        return 2 * torch.sigmoid(logit + self.bias.float()[None, :, None])[..., None]


def build_history_gate(name: str, num_heads: int, head_dim: int, device=None) -> QueryGate | None:
    """The gate called ``name`` (one of :data:`HISTORY_GATES`); None for ``none``."""
    if name not in HISTORY_GATES:
        raise ValueError(f"unknown history_gate {name!r}; valid: {', '.join(HISTORY_GATES)}")
    return QueryGate(num_heads, head_dim, device) if name == "query" else None


__all__ = ["HISTORY_GATES", "QueryGate", "build_history_gate"]
