"""How vLLM's engine is configured for an export, before the model is built.

Prefix caching is turned off for an export with every layer converted: with no attention layer,
vLLM 0.32 hashes prompts in 16-token blocks but keeps a state only per state block, and a
prompt that matched a cached 16-token block was continued from a state that was not the one
after those tokens (measured: log-probabilities off by up to 0.17 on the tiny test export). A
hybrid keeps vLLM's default (prefix caching in its ``align`` mode, hits at whole state blocks,
exact). Without softmax layers there is no key/value cache to save either.
"""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.model_executor.models.config import HybridAttentionMambaModelConfig

from serving.spec import serving_plan

logger = init_logger(__name__)


class LolcatsModelConfig(HybridAttentionMambaModelConfig):
    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        plan = serving_plan(vllm_config.model_config.hf_config)
        if not plan.hybrid and vllm_config.cache_config.enable_prefix_caching:
            logger.info("prefix caching is off for a LoLCATs export with every layer converted (docs/serving.md)")
            vllm_config.cache_config.enable_prefix_caching = False
        super().verify_and_update_config(vllm_config)
