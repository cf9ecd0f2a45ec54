"""What linearizing each layer costs: the scores ``softmax_layers: auto`` ranks layers by.

Both are measured on held-out blocks (the validation split, never the perplexity text) with the
converted layers' current feature maps, one score per converted layer, higher = worse to linearize:

* ``mse``: the layer's attention-output error under teacher forcing, normalised by the variance
  of the teacher's output, so layers with large and small activations compare:

      score_i = sum ||y_student_i - y_teacher_i||^2 / sum ||y_teacher_i - mean(y_teacher_i)||^2

  (sums over real tokens, heads and head dims). One forward per block.
* ``kl``: the next-token KL divergence from the teacher when only layer i is linear and every
  other layer computes softmax attention:

      score_i = mean_tokens KL(p_teacher || p_{only i linear})

  It sees what the error does downstream (through the MLPs, the residual stream and the LM head),
  at the cost of one forward per converted layer and block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.attention.layer import teacher_attention
from core.attention.surgery import lolcats_modules
from core.train.finetune_lora import token_kl
from core.train.lora import base_model
from core.train.teacher_forcing import teacher_forcing

Batch = dict[str, torch.Tensor]


def _rows(blocks: Batch, n_blocks: int, device: torch.device):
    """The first ``n_blocks`` blocks one at a time: (input_ids [1, L], attention_mask [1, L] or None)."""
    n = min(n_blocks, blocks["input_ids"].shape[0])
    if n == 0:
        raise ValueError("no blocks to score layers on")
    mask = blocks.get("attention_mask")
    for i in range(n):
        yield blocks["input_ids"][i : i + 1].to(device), None if mask is None else mask[i : i + 1].to(device)


def _masked_sum(values: torch.Tensor, mask: torch.Tensor | None) -> tuple[float, float]:
    """(sum over real tokens, number of real tokens) of per-token ``values`` [B, L]."""
    if mask is None:
        return float(values.sum()), float(values.numel())
    m = mask.to(values.dtype)
    return float((values * m).sum()), float(m.sum())


def _converted(model: nn.Module) -> tuple[nn.Module, dict[int, nn.Module], torch.device]:
    """The model without its LoRA wrapper, its converted layers by index, and its device."""
    inner = base_model(model)
    return inner, lolcats_modules(inner), next(inner.parameters()).device


@torch.no_grad()
def mse_scores(model: nn.Module, blocks: Batch, n_blocks: int) -> dict[int, float]:
    """Normalised attention-output MSE of every converted layer (see the module docstring)."""
    inner, modules, device = _converted(model)
    err = dict.fromkeys(modules, 0.0)
    spread = dict.fromkeys(modules, 0.0)
    with teacher_forcing(modules) as record:
        for ids, mask in _rows(blocks, n_blocks, device):
            inner.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False)
            for i in modules:
                student, teacher = (t.float() for t in record.pairs.pop(i))  # [B, H, L, d]
                centred = teacher - teacher.mean(dim=(1, 2, 3), keepdim=True)
                err[i] += _masked_sum((student - teacher).pow(2).sum(dim=(1, 3)), mask)[0]
                spread[i] += _masked_sum(centred.pow(2).sum(dim=(1, 3)), mask)[0]
    return {i: err[i] / max(spread[i], 1e-30) for i in modules}


def _next_token_logprobs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return F.log_softmax(logits.float(), dim=-1)


@torch.no_grad()
def kl_scores(model: nn.Module, blocks: Batch, n_blocks: int) -> dict[int, float]:
    """Next-token KL to the teacher with only one converted layer linear (see the module docstring)."""
    inner, modules, device = _converted(model)
    total = dict.fromkeys(modules, 0.0)
    count = 0.0
    for ids, mask in _rows(blocks, n_blocks, device):
        with teacher_attention(modules.values()):
            teacher = _next_token_logprobs(inner, ids, mask)
        for i in modules:
            with teacher_attention(m for j, m in modules.items() if j != i):  # only layer i linear
                student = _next_token_logprobs(inner, ids, mask)
            total[i] += _masked_sum(token_kl(teacher, student), mask)[0]
        count += _masked_sum(torch.ones(ids.shape, device=device), mask)[1]
    return {i: total[i] / max(count, 1.0) for i in modules}


SCORES = {"kl": kl_scores, "mse": mse_scores}


def layer_scores(model: nn.Module, blocks: Batch, n_blocks: int, score: str) -> dict[int, float]:
    """``score`` ("kl" or "mse") of every converted layer of ``model`` on the first ``n_blocks`` blocks."""
    return SCORES[score](model, blocks, n_blocks)


def worst_layers(scores: dict[int, float], budget: int) -> list[int]:
    """The ``budget`` layers with the highest scores (ties: the lower index), sorted by index."""
    ranked = sorted(scores, key=lambda i: (-scores[i], i))
    return sorted(ranked[:budget])


__all__ = ["mse_scores", "kl_scores", "layer_scores", "worst_layers", "SCORES"]
