"""Checks on a model's ``config.json`` and weight files, before any weights are read.

Everything here reads plain files; transformers is consulted only to explain why an unsupported
architecture is unsupported (and only when asked to), so these checks run without torch.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from core.config import ConfigError
from core.models.sources import SUPPORTED_HINT, SUPPORTED_ARCHITECTURES, ModelLoadError


def read_config_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`ModelLoadError` when it is not one."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON ({exc}); restore the model's original config.json"
        ) from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object; restore the model's original config.json")
    return config


def check_config(
    config: dict[str, Any], where: str, trust_remote_code: bool = False, *, consult_transformers: bool = True
) -> str:
    """Validate a raw ``config.json`` dict; return its ``model_type``.

    Refuses custom code (``auto_map``) unless ``trust_remote_code`` is set, and any architecture
    outside :data:`SUPPORTED_ARCHITECTURES`, saying why (not a causal LM, no RoPE, not yet supported).
    The reason consults transformers' model registry unless ``consult_transformers`` is False;
    then it comes from the dict alone, and nothing here imports transformers (or torch).
    """
    if config.get("auto_map") and not trust_remote_code:
        raise ModelLoadError(
            f"{where} needs custom code from the model repository (config.json has 'auto_map'), "
            f"which is refused by default because it runs arbitrary Python; pass "
            f"trust_remote_code=True (--trust-remote-code) only if you trust its author"
        )
    model_type = config.get("model_type")
    if not model_type:
        raise ModelLoadError(
            f"{where}: config.json has no 'model_type', so the architecture is unknown; "
            f"restore the model's original config.json. {SUPPORTED_HINT}"
        )
    if model_type in SUPPORTED_ARCHITECTURES:
        return model_type
    architectures = config.get("architectures") or []
    arch = f"model_type {model_type!r}" + (f" ({', '.join(architectures)})" if architectures else "")
    reason = _unsupported_reason(config, model_type, consult_transformers)
    raise ModelLoadError(f"unsupported architecture: {where} is {arch}, which {reason}. {SUPPORTED_HINT}")


def _unsupported_reason(config: dict[str, Any], model_type: str, consult_transformers: bool) -> str:
    architectures = config.get("architectures") or []
    causal_names = ("ForCausalLM", "LMHeadModel")
    not_causal = bool(
        config.get("is_encoder_decoder")
        or (architectures and not any(a.endswith(causal_names) for a in architectures))
    )
    if consult_transformers:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        )

        if model_type not in CONFIG_MAPPING_NAMES:
            return "is a custom architecture that transformers does not know"
        not_causal = (
            not_causal
            or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            or model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        )
    rope_keys = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_dim", "rotary_pct")
    has_rope = any(config.get(key) is not None for key in rope_keys)
    has_rope = has_rope or config.get("position_embedding_type") == "rotary"
    if not_causal:
        return "is not a decoder-only causal language model"
    if not has_rope:
        return "has no rotary position embeddings (RoPE), which the hybrid attention needs"
    return "is a RoPE decoder the conversion does not support yet"


def check_safetensors_file(path: Path) -> None:
    """Raise :class:`ModelLoadError` if a ``.safetensors`` file is truncated or its header is corrupt.

    Reads only the header: 8 bytes of little-endian length, then JSON mapping tensor names to
    ``data_offsets``; the data section must be exactly as long as the largest end offset.
    """
    size = path.stat().st_size
    fix = "re-download or re-save the model"
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"file is only {size} bytes")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > size - 8:
                raise ValueError(f"header claims {header_len} bytes but the file has {size}")
            header = json.loads(f.read(header_len))
        end = max(
            (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"weight file {path} is corrupted ({exc}); {fix}") from None
    expected = 8 + header_len + end
    if size < expected:
        raise ModelLoadError(
            f"weight file {path} is truncated: {size} bytes, expected {expected}; {fix}"
        )


def folder_config(folder: Path) -> dict[str, Any]:
    """The ``config.json`` of a model folder; :class:`ModelLoadError` when it has none (naming a
    GGUF file in it, if there is one, as the source to pass instead)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        ggufs = sorted(folder.glob("*.gguf"))
        hint = (
            f"; it holds a GGUF file, pass that file instead: {ggufs[0]}"
            if ggufs
            else "; pass the folder that contains config.json and the *.safetensors weights"
        )
        raise ModelLoadError(f"folder {folder} has no config.json, so it is not a Hugging Face model folder{hint}")
    return read_config_json(config_path)


def check_folder(folder: Path, trust_remote_code: bool) -> dict[str, Any]:
    """Check a model folder before loading it (config, architecture, weight files); return its config."""
    config = folder_config(folder)
    check_config(config, f"the model in {folder}", trust_remote_code)
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not any(folder.glob("*.bin")):
        raise ModelLoadError(
            f"folder {folder} has config.json but no weight files (*.safetensors); "
            f"copy the weights into it, or re-save the model with save_pretrained"
        )
    for file in weights:
        check_safetensors_file(file)
    return config


def _config_value(model_or_config: Any, key: str) -> int | None:
    """``key`` of a model's config, a ``PretrainedConfig`` or a raw ``config.json`` dict, looking
    into ``text_config`` for multimodal configs; None if absent."""
    config = getattr(model_or_config, "config", model_or_config)
    if isinstance(config, dict):
        value = config.get(key) or (config.get("text_config") or {}).get(key)
    else:
        value = getattr(config, key, None)
        if value is None and getattr(config, "text_config", None) is not None:
            value = getattr(config.text_config, key, None)
    return int(value) if value else None


def max_positions(model_or_config: Any) -> int | None:
    """The model's maximum sequence length (``config.max_position_embeddings``), or None if unknown.

    Accepts a model, a ``PretrainedConfig`` or a raw ``config.json`` dict.
    """
    return _config_value(model_or_config, "max_position_embeddings")


def num_layers(model_or_config: Any) -> int | None:
    """The model's number of decoder layers (``config.num_hidden_layers``), or None if unknown."""
    return _config_value(model_or_config, "num_hidden_layers")


def check_seq_len(model_or_config: Any, seq_len: int, field: str = "seq_len") -> None:
    """Raise :class:`ConfigError` if ``seq_len`` is not positive or exceeds the model's maximum
    positions; the message names the setting as ``field``."""
    if seq_len <= 0:
        raise ConfigError(f"{field} must be >= 1, got {seq_len}")
    limit = max_positions(model_or_config)
    if limit is not None and seq_len > limit:
        raise ConfigError(
            f"{field} {seq_len} is above the model's maximum positions ({limit}, "
            f"config.max_position_embeddings); use {field} <= {limit}"
        )
