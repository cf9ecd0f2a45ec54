"""``LolcatsForCausalLM`` for vLLM: the base architecture's model with the converted layers'
attention replaced by :class:`serving.attention.LolcatsServingAttention`.

The export's weights load as they are: the base model's under vLLM's usual names (q, k, v fused
into ``qkv_proj``), the conversion's (``feature_map_q``, ``feature_map_k``, ``mix``, the history
decay or exponents) under the names ``LolcatsAttention`` gives them. Layers listed in the spec's
``softmax_layers`` keep vLLM's own attention and key/value cache: the model is then a hybrid of
attention and state layers, which vLLM runs with prefix caching on by default; every state is
copied whole between prefix-cache blocks (``get_temporal_copy_spec``).
"""

from __future__ import annotations

import copy
from functools import partial

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.mamba.mamba_utils import get_temporal_copy_spec
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid, SupportsMambaPrefixCaching
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.utils import extract_layer_index

from core.attention.layer import LolcatsAttention
from serving.attention import LolcatsServingAttention, config_state_layout, paged
from serving.spec import serving_plan


def llama_config(config):
    """``config`` as vLLM's Llama decoder layer reads it: Qwen2 is a Llama with biases on q, k and v
    (and none on o), which that layer takes from ``qkv_bias``."""
    if config.model_type != "qwen2":
        return config
    config = copy.copy(config)
    config.qkv_bias = True
    return config


def _config_layout(vllm_config: VllmConfig):
    """The paged state of a converted layer of the model ``vllm_config`` describes."""
    config = vllm_config.model_config.hf_config
    options = serving_plan(config).layer_options(LolcatsAttention)
    return paged(config_state_layout(config, options, vllm_config.model_config.dtype))


class LolcatsForCausalLM(LlamaForCausalLM, HasInnerState, IsHybrid, SupportsMambaPrefixCaching):
    """A LoLCATs export of a Llama, Mistral or Qwen2 model (all layers converted, or a hybrid): the
    three share vLLM's Llama decoder."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        plan = serving_plan(vllm_config.model_config.hf_config)
        converted = partial(LolcatsServingAttention, options=plan.layer_options(LolcatsAttention))

        config = llama_config(vllm_config.model_config.hf_config)

        def decoder_layer(vllm_config: VllmConfig, prefix: str) -> nn.Module:
            attention = converted if plan.is_converted(extract_layer_index(prefix)) else LlamaAttention
            return LlamaDecoderLayer(vllm_config=vllm_config, prefix=prefix, config=config, attn_layer_type=attention)

        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=decoder_layer)
        self.lolcats_layers = [layer.self_attn for layer in self.model.layers
                               if isinstance(layer.self_attn, LolcatsServingAttention)]

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
