"""The teacher model: where a source points, its config files, GGUF and hub sources, loading.

    from core.models import load_model
    model, tokenizer = load_model("smollm2-135m-instruct", device="cpu")

Modules: :mod:`~core.models.sources` (classifying a source string, :class:`ModelLoadError`),
:mod:`~core.models.config_files` (``config.json`` and weight-file checks), :mod:`~core.models.gguf`
(the bundled GGUF, materialising GGUF files), :mod:`~core.models.hub` (the Hugging Face Hub),
:mod:`~core.models.tiny` (the tiny test model), :mod:`~core.models.loading` (:func:`load_model`),
:mod:`~core.models.fit` (checking a conversion config against the model without loading it).
Names are imported on first use (PEP 562): only :mod:`~core.models.loading` imports torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BUNDLED_GGUF": "sources",
    "BUNDLED_MODEL": "sources",
    "BUNDLED_PACKAGE": "sources",
    "BUNDLED_PIP": "sources",
    "SUPPORTED_ARCHITECTURES": "sources",
    "TINY_MODEL": "sources",
    "ModelLoadError": "sources",
    "ModelSource": "sources",
    "resolve_source": "sources",
    "check_config": "config_files",
    "check_folder": "config_files",
    "check_safetensors_file": "config_files",
    "check_seq_len": "config_files",
    "folder_config": "config_files",
    "max_positions": "config_files",
    "num_layers": "config_files",
    "read_config_json": "config_files",
    "PROVENANCE_FILE": "gguf",
    "bundled_gguf_path": "gguf",
    "bundled_model_dir": "gguf",
    "check_gguf_file": "gguf",
    "gguf_cache_dir": "gguf",
    "gguf_header_config": "gguf",
    "materialize_gguf": "gguf",
    "read_gguf_metadata": "gguf",
    "cached_hub_config": "hub",
    "hub_offline": "hub",
    "hub_reachable": "hub",
    "tiny_model_config": "tiny",
    "tiny_model_dir": "tiny",
    "DTYPES": "loading",
    "load_model": "loading",
    "resolve_device": "loading",
    "resolve_dtype": "loading",
    "ModelFitError": "fit",
    "check_model_fit": "fit",
    "read_model_config": "fit",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'core.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"core.models.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
