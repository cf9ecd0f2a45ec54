"""The variants of the linear history term (``attention.history_norm``), one small object each.

A variant owns at most one per-head parameter of the converted layer (learned in stage 1, kept
on the layer under its name, so checkpoints and exports name it as they always have) and says
what it changes in the op: a scale of each query's features, or a decay of the history.

* ``none`` (the paper's): no parameter; the history term as the equation writes it.
* ``power``: ``history_power`` ``[H]``, alpha_h = sigmoid(history_power_h): query n's history
  term scaled by r_h(n) = N(n)^(-alpha_h), N(n) = max(window_start(p_n) - s, 1) its history
  positions (:meth:`PowerHistory.query_scale`).
* ``decay``: ``history_decay`` ``[H_s]`` (per state head: a decay decays the state the heads
  share, ``kernels.hybrid.heads``), gamma_h = sigmoid(history_decay_h): history key j of query n
  weighted by gamma_h^(its age past the window's edge) (:meth:`DecayHistory.log_decay`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

HISTORY_NORMS = ("none", "power", "decay")


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


class History:
    """The paper's history term (``history_norm: none``): no parameter, no scale, no decay."""

    name = "none"
    parameter: str | None = None  # the layer attribute of its per-head logits
    scales_queries = False  # whether query_scale gives a factor (the layer then computes N(n))

    def make_parameter(self, num_heads: int, state_heads: int, device) -> nn.Parameter | None:
        """The layer's new parameter (None: the variant has none)."""
        return None

    def query_scale(self, layer: nn.Module, history_positions: torch.Tensor) -> torch.Tensor:
        """``[B, H, L, 1]`` factor of phi_q(q_n) for history positions N(n) ``[B, L]`` (variants
        with ``scales_queries`` only)."""
        raise NotImplementedError(f"history_norm {self.name} does not scale the queries")

    def log_decay(self, layer: nn.Module) -> torch.Tensor | None:
        """log gamma ``[H_s]`` of a decaying history (None: no decay)."""
        return None

    def parameters(self, layer: nn.Module) -> list[nn.Parameter]:
        return [] if self.parameter is None else [getattr(layer, self.parameter)]


class PowerHistory(History):
    """history_norm ``power``: r_h(n) = N(n)^(-alpha_h), alpha_h = sigmoid(history_power_h) from ``init``."""

    name, parameter, scales_queries = "power", "history_power", True

    def __init__(self, init: float):
        self.init = init

    def make_parameter(self, num_heads, state_heads, device):
        return nn.Parameter(torch.full((num_heads,), _logit(self.init), device=device))

    def query_scale(self, layer, history_positions):
        alpha = torch.sigmoid(layer.history_power.float())
        return torch.exp(-alpha[None, :, None, None] * history_positions.float().log()[:, None, :, None])


class DecayHistory(History):
    """history_norm ``decay``: gamma_h = sigmoid(history_decay_h) from ``init``, one per state head."""

    name, parameter = "decay", "history_decay"

    def __init__(self, init: float):
        self.init = init

    def make_parameter(self, num_heads, state_heads, device):
        return nn.Parameter(torch.full((state_heads,), _logit(self.init), device=device))

    def log_decay(self, layer):
        return torch.nn.functional.logsigmoid(layer.history_decay)


def build_history(name: str, init_history_power: float, init_history_decay: float) -> History:
    """The variant called ``name`` (one of :data:`HISTORY_NORMS`) with its initial value."""
    if name not in HISTORY_NORMS:
        raise ValueError(f"unknown history_norm {name!r}; valid: {', '.join(HISTORY_NORMS)}")
    return {"none": History, "power": lambda: PowerHistory(init_history_power),
            "decay": lambda: DecayHistory(init_history_decay)}[name]()


__all__ = ["HISTORY_NORMS", "DecayHistory", "History", "PowerHistory", "build_history"]
