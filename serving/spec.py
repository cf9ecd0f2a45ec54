"""What serving reads from an export: its attention spec and which decoder layers it converted.

An export's ``config.json`` names the architecture ``LolcatsForCausalLM`` and carries ``lolcats``,
the attention spec the workbench converted with (:func:`core.export.folder.write_modeling_code`).
This module validates both with the project's own schema and says which layers keep softmax
attention, the way :func:`core.attention.surgery.linearize` decides it. It imports neither vLLM
nor transformers, so the ``lolcats serve`` command checks a folder before it starts an engine.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from core.config import AttentionSpec, format_validation_error, stored_attention

ARCHITECTURE = "LolcatsForCausalLM"  # core.export.modeling.MODEL_CLASS, the architecture an export names
# base model_type -> vLLM's causal LM that serving.model builds for it (module of vllm.model_executor.models, class)
SERVED_FAMILIES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gemma3_text": ("gemma3", "Gemma3ForCausalLM"),  # an export of Gemma 3's text model
}
SERVED_MODEL_TYPES = tuple(SERVED_FAMILIES)


class ExportError(ValueError):
    """The folder is not an export the plugin can serve; the message names the cause and the fix."""


def read_export_config(folder: str | os.PathLike) -> dict:
    """``config.json`` of an export folder, checked to be a LoLCATs export of a served architecture."""
    path = Path(folder)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ExportError(f"{path} has no config.json: point to a folder written by `lolcats export RUN OUT`")
    config = json.loads(config_file.read_text())
    check_export_config(config, str(path))
    return config


def check_export_config(config: dict, where: str) -> None:
    """Raise :class:`ExportError` unless ``config`` (an export's ``config.json`` as a dict) is a
    LoLCATs export of a served base architecture with a valid attention spec."""
    if ARCHITECTURE not in (config.get("architectures") or []) or "lolcats" not in config:
        raise ExportError(f"{where} is not a LoLCATs export (config.json lacks architectures "
                          f"[{ARCHITECTURE!r}] and a 'lolcats' attention spec): export a converted run "
                          "with `lolcats export RUN OUT` and serve that folder")
    model_type = config.get("model_type")
    if model_type not in SERVED_MODEL_TYPES:
        raise ExportError(f"{where}: serving supports base architectures {', '.join(SERVED_MODEL_TYPES)}, "
                          f"not {model_type!r}; load the export with transformers instead "
                          "(`lolcats chat` or AutoModelForCausalLM with trust_remote_code=True)")
    attention_spec(config["lolcats"], where)


def attention_spec(saved: dict, where: str) -> AttentionSpec:
    """The export's attention spec, validated by the project's schema (an option this version
    does not know is refused, naming it)."""
    try:
        return stored_attention(saved)
    except ValidationError as err:
        raise ExportError(f"{where}: the export's attention spec is not one this version serves "
                          f"({format_validation_error(err)}); serve it with the workbench version that "
                          "exported it, or re-export the run with this one") from None


@dataclass(frozen=True)
class ServingPlan:
    """The attention of each decoder layer of a served export."""

    spec: AttentionSpec
    num_layers: int
    softmax_layers: frozenset[int]  # layers that keep the base model's softmax attention

    def is_converted(self, layer: int) -> bool:
        return layer not in self.softmax_layers

    @property
    def hybrid(self) -> bool:
        """Whether some layers keep softmax attention (and a key/value cache)."""
        return bool(self.softmax_layers)

    def layer_options(self, layer_class: type) -> dict:
        """The spec's fields that ``layer_class`` (a :class:`core.attention.layer.LolcatsAttention`)
        takes as keyword arguments: the attention options of one converted layer."""
        accepted = inspect.signature(layer_class.__init__).parameters
        return {name: value for name, value in self.spec.model_dump().items() if name in accepted}


def serving_plan(text_config) -> ServingPlan:
    """The plan for a model whose (transformers) text config carries ``lolcats``: the layers listed
    in ``softmax_layers`` and, with ``keep_sliding_layers``, the model's own sliding-window layers
    keep softmax attention; every other layer is converted (as :func:`core.attention.surgery.linearize`)."""
    num_layers = text_config.num_hidden_layers
    spec = attention_spec(getattr(text_config, "lolcats", None) or {}, "the model config")
    keep = set() if spec.softmax_layers == "auto" else set(spec.softmax_layers)
    bad = sorted(i for i in keep if not 0 <= i < num_layers)
    if bad:
        raise ExportError(f"softmax_layers {bad} out of range: the model has {num_layers} layers")
    if spec.keep_sliding_layers:
        from core.attention.surgery import sliding_layers

        keep |= sliding_layers(text_config, num_layers)
    return ServingPlan(spec, num_layers, frozenset(keep))


__all__ = ["ARCHITECTURE", "ExportError", "SERVED_FAMILIES", "SERVED_MODEL_TYPES", "ServingPlan", "check_export_config",
           "read_export_config", "serving_plan"]
