"""How a decoder family applies rotary position embeddings (RoPE), resolved once per layer in surgery.

Every supported family rotates q and k with ``apply_rotary_pos_emb`` (the rotate-half form) by the
cos, sin its model-level rotary module gives for the position ids; Gemma 3 keeps one rotary module
with a table per layer type (local and global layers differ). :func:`layer_rotary` binds a layer to
its table: ``Rotary(x, position_ids) -> (cos, sin)`` at any positions, so a converted layer can
rotate a cached key back (:func:`unrotate`) and block-wise training can rotate any layer's inputs.

The inverse of the rotation (cos, sin may carry a common scale a, RoPE's attention scaling):
with x' = x cos + rotate_half(x) sin, x = (x' cos - rotate_half(x') sin) / (cos^2 + sin^2), exact for
any angle (cos^2 + sin^2 = a^2 > 0).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half


class Rotary:
    """cos, sin of one decoder layer's rotary embedding at any position ids (a plain object, not a
    submodule: the model owns the rotary module, which moves and copies with it)."""

    def __init__(self, module: nn.Module, layer_type: str | None = None):
        self.module, self.layer_type = module, layer_type

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[B, L, d]`` for ``position_ids`` ``[B, L]`` in the dtype of ``x``."""
        if self.layer_type is None:
            return self.module(x, position_ids)
        return self.module(x, position_ids, self.layer_type)


def layer_rotary(model: nn.Module, layer_idx: int) -> Rotary:
    """The rotary embedding decoder layer ``layer_idx`` of ``model`` (a supported family) uses."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    module = decoder.rotary_emb
    if "layer_type" in inspect.signature(module.forward).parameters:  # one table per layer type (Gemma 3)
        return Rotary(module, model.config.get_text_config(decoder=True).layer_types[layer_idx])
    return Rotary(module)


def unrotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, H, L, d]`` rotated back by the (cos, sin) ``[B, L, d]`` that rotated it (module docstring)."""
    cos, sin = cos[:, None], sin[:, None]
    return (x * cos - rotate_half(x) * sin) / (cos * cos + sin * sin)


__all__ = ["Rotary", "layer_rotary", "unrotate"]
