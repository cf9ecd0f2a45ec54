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

from functools import partial

from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.mamba.mamba_utils import get_temporal_copy_spec
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid, SupportsMambaPrefixCaching
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.utils import extract_layer_index

from core.attention.layer import LolcatsAttention
from serving.attention import LolcatsServingAttention
from serving.spec import serving_plan


class LolcatsForCausalLM(LlamaForCausalLM, HasInnerState, IsHybrid, SupportsMambaPrefixCaching):
    """A LoLCATs export of a Llama-architecture model (all layers converted, or a hybrid)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        plan = serving_plan(vllm_config.model_config.hf_config)
        converted = partial(LolcatsServingAttention, options=plan.layer_options(LolcatsAttention))

        def decoder_layer(vllm_config: VllmConfig, prefix: str) -> nn.Module:
            attention = converted if plan.is_converted(extract_layer_index(prefix)) else LlamaAttention
            return LlamaDecoderLayer(vllm_config=vllm_config, prefix=prefix, attn_layer_type=attention)

        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=decoder_layer)
        self.lolcats_layers = [layer.self_attn for layer in self.model.layers
                               if isinstance(layer.self_attn, LolcatsServingAttention)]

    def get_mamba_state_copy_funcs(self, mamba_types):
        """Every paged state tensor copied whole (prefix caching in vLLM's ``align`` mode)."""
        states = len(self.lolcats_layers[0].state_layout())
        return {mamba_type: (get_temporal_copy_spec,) * states for mamba_type in mamba_types}
