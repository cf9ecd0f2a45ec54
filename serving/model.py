"""``LolcatsForCausalLM`` for vLLM: vLLM's own model of the export's base architecture with the
converted layers' attention replaced by :class:`serving.attention.LolcatsServingAttention`.

vLLM's causal LM of the base architecture (:data:`serving.spec.SERVED_FAMILIES`, by the config's
``model_type``) is built as vLLM builds it for the base model: its decoder layers, norms, MLPs,
embedding scale and logits as they are. The attention module of each layer the spec converted is
then replaced by a ``LolcatsServingAttention``, which adopts its projections, q/k norms, rotary
embedding and score scale (as the workbench's ``LolcatsAttention`` adopts a transformers layer's).

The export's weights load as they are: the base model's under vLLM's usual names (q, k, v fused
into ``qkv_proj``), the conversion's (``feature_map_q``, ``feature_map_k``, ``mix``, the history
decay or exponents) under the names ``LolcatsAttention`` gives them. Layers the spec keeps softmax
(``softmax_layers``; with ``keep_sliding_layers``, the model's own sliding-window layers, such as
Gemma 3's local ones) keep vLLM's own attention and key/value cache: the model is then a hybrid of
attention and state layers, which vLLM runs with prefix caching on by default; every state is
copied whole between prefix-cache blocks (``get_temporal_copy_spec``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.mamba.mamba_utils import get_temporal_copy_spec
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid, SupportsMambaPrefixCaching
from vllm.model_executor.models.utils import AutoWeightsLoader
from vllm.sequence import IntermediateTensors

from core.attention.layer import LolcatsAttention
from serving.attention import LolcatsServingAttention, config_state_layout, page_layout
from serving.spec import SERVED_FAMILIES, serving_plan


def base_model_class(model_type: str) -> type[nn.Module]:
    """vLLM's causal LM for the base architecture ``model_type`` (one of :data:`SERVED_FAMILIES`)."""
    module, name = SERVED_FAMILIES[model_type]
    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)


def _config_layout(vllm_config: VllmConfig):
    """The paged state of a converted layer of the model ``vllm_config`` describes."""
    config = vllm_config.model_config.hf_config
    options = serving_plan(config).layer_options(LolcatsAttention)
    return page_layout(config_state_layout(config, options, vllm_config.model_config.dtype))


class LolcatsForCausalLM(nn.Module, HasInnerState, IsHybrid, SupportsMambaPrefixCaching):
    """A LoLCATs export of a served base architecture (all layers converted, or a hybrid): the
    decoder (``model``), ``lm_head`` and ``logits_processor`` of vLLM's causal LM for that
    architecture, under the same names, its converted layers' attention replaced."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        plan = serving_plan(config)
        options = plan.layer_options(LolcatsAttention)
        base = base_model_class(config.model_type)(vllm_config=vllm_config, prefix=prefix)
        self.model, self.lm_head, self.logits_processor = base.model, base.lm_head, base.logits_processor
        for i, layer in enumerate(self.model.layers):
            if plan.is_converted(i):
                layer.self_attn = LolcatsServingAttention(layer.self_attn, config, options)
        self.lolcats_layers = [layer.self_attn for layer in self.model.layers
                               if isinstance(layer.self_attn, LolcatsServingAttention)]

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The export's tensors by name; the decoder maps q, k, v (and the MLP's gate and up) onto
        its fused projections."""
        return AutoWeightsLoader(self).load_weights(weights)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig) -> tuple[tuple[int, ...], ...]:
        """The state page's tensor shapes, before the model is built (vLLM sizes hybrid pages first)."""
        return tuple(shape for _, shape, _ in _config_layout(vllm_config))

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig) -> tuple[torch.dtype, ...]:
        return tuple(dtype for _, _, dtype in _config_layout(vllm_config))

    def get_mamba_state_copy_funcs(self, mamba_types):
        """Every paged state tensor copied whole (prefix caching in vLLM's ``align`` mode)."""
        states = len(self.lolcats_layers[0].get_state_shape())
        return {mamba_type: (get_temporal_copy_spec,) * states for mamba_type in mamba_types}
