"""Teacher vs student attention matrices of one layer for a short prompt (heatmap views)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.attention.layer import LolcatsAttention
from core.attention.surgery import decoder_layers
from kernels.hybrid.naive import hybrid_attention_matrix, softmax_attention_matrix

MAX_TOKENS = 512  # the matrices are L x L per head


@dataclass
class AttentionMaps:
    teacher: torch.Tensor  # [H, L, L] softmax weights of the original layer
    student: torch.Tensor  # [H, L, L] effective LoLCATs weights (equal to teacher for softmax layers)
    converted: bool  # False when the layer was kept as softmax

    @property
    def difference(self) -> torch.Tensor:
        return (self.student - self.teacher).abs()


@torch.no_grad()
def attention_maps(model: nn.Module, input_ids: torch.Tensor, layer_idx: int) -> AttentionMaps:
    """Run ``model`` on one prompt ``input_ids`` ([L] or [1, L]) and return layer ``layer_idx``'s maps."""
    ids = input_ids.view(1, -1)
    if ids.shape[1] > MAX_TOKENS:
        raise ValueError(f"prompt has {ids.shape[1]} tokens; attention maps are limited to {MAX_TOKENS}")
    layers = decoder_layers(model)
    if not 0 <= layer_idx < len(layers):
        raise ValueError(f"layer {layer_idx} out of range: the model has {len(layers)} layers (0..{len(layers) - 1})")
    attn = layers[layer_idx].self_attn
    captured = {}

    def grab(module, args, kwargs):
        captured["hidden"] = kwargs.get("hidden_states", args[0] if args else None)
        captured["pos"] = kwargs["position_embeddings"]

    handle = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        model(input_ids=ids.to(next(model.parameters()).device), use_cache=False)
    finally:
        handle.remove()
    if isinstance(attn, LolcatsAttention):
        q, k, _, q_in, k_in = attn.project(captured["hidden"], captured["pos"])
        qf, kf = attn.features(q_in, k_in)
        teacher = softmax_attention_matrix(q, k, attn.scaling)
        student = hybrid_attention_matrix(q, k, qf, kf, attn.mix, attn.kind, attn.window_size, attn.scaling,
                                           sinks=attn.sink_tokens, decay=attn.log_decay())
        return AttentionMaps(teacher[0].cpu(), student[0].cpu(), True)
    q, k = _softmax_qk(attn, captured["hidden"], captured["pos"])
    teacher = softmax_attention_matrix(q, k, attn.scaling)[0].cpu()
    return AttentionMaps(teacher, teacher.clone(), False)


def _softmax_qk(attn: nn.Module, hidden, position_embeddings):
    """q, k of an unconverted layer, computed the same way as a converted one."""
    return LolcatsAttention.project(attn, hidden, position_embeddings)[:2]
