"""The vLLM plugin: registers ``LolcatsForCausalLM`` (entry point ``vllm.general_plugins``, in
pyproject.toml), so vLLM serves an export folder as it is.

vLLM calls :func:`register` in every process it starts (the front end, the engine core, each
worker), before it reads a model's config; it is cheap and idempotent. The model class is registered by
its qualified name and loaded when vLLM builds it.
"""

from __future__ import annotations

from serving.spec import ARCHITECTURE


def register() -> None:
    """Register the architecture and its config hook with vLLM (idempotent)."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from serving.engine_config import LolcatsModelConfig

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, f"serving.model:{ARCHITECTURE}")
    # the state layers' page size and prefix-cache mode are set up as for vLLM's own hybrids (an
    # export with every layer converted would otherwise fail an assertion in vLLM's mamba layer)
    MODELS_CONFIG_MAP.setdefault(ARCHITECTURE, LolcatsModelConfig)
