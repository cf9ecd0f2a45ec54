"""The teacher model: where a source points, its config files, GGUF and hub sources, loading.

    from core.models import load_model
    model, tokenizer = load_model("smollm2-135m-instruct", device="cpu")

Modules: :mod:`~core.models.sources` (classifying a source string, :class:`ModelLoadError`),
:mod:`~core.models.config_files` (``config.json`` and weight-file checks), :mod:`~core.models.gguf`
(the bundled GGUF, materialising GGUF files), :mod:`~core.models.hub` (the Hugging Face Hub),
:mod:`~core.models.tiny` (the tiny test model), :mod:`~core.models.loading` (:func:`load_model`),
:mod:`~core.models.fit` (checking a conversion config against the model without loading it),
:mod:`~core.models.token_text` (what each token reads as, for per-token views).
Names are imported on first use (PEP 562): only :mod:`~core.models.loading` imports torch.
"""

from __future__ import annotations

from core.lazy import lazy_exports

_EXPORTS = {
    ".sources": ["BUNDLED_MODEL", "BUNDLED_MODELS", "GEMMA3_MODEL", "BundledModel", "SUPPORTED_ARCHITECTURES", "TINY_MODEL", "ModelLoadError", "ModelSource", "resolve_source"],
    ".config_files": ["check_config", "check_folder", "check_safetensors_file", "check_seq_len", "folder_config", "max_positions", "num_layers", "read_config_json"],
    ".gguf": ["PROVENANCE_FILE", "bundled_gguf_path", "bundled_model_dir", "bundled_tokenizer", "check_gguf_file", "gguf_cache_dir", "gguf_header_config", "gguf_model_type", "materialize_gguf", "read_gguf_metadata"],
    ".hub": ["cached_hub_config", "hub_offline", "hub_reachable"],
    ".tiny": ["tiny_model_config", "tiny_model_dir"],
    ".loading": ["DTYPES", "load_model", "resolve_device", "resolve_dtype"],
    ".fit": ["ModelFitError", "check_model_fit", "read_model_config"],
    ".token_text": ["token_texts"],
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
