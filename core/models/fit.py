"""Does a conversion config fit its model? Checked from the model's ``config.json`` alone, before a
job is queued: no weights are read, and neither torch nor transformers is imported.

Where the config comes from, by source (:func:`read_model_config`):

* a local folder: its ``config.json``;
* the bundled model or a ``.gguf`` file: the workspace folder it was materialised into, if it
  was, else the GGUF header's metadata;
* ``tiny-random-llama``: its known config (:data:`core.models.tiny.TINY_CONFIG`);
* a hub id: the local Hugging Face cache's ``config.json``; when the model is not cached the
  model checks are skipped (the job downloads it and checks then).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from core.config import ConfigError
from core.models.config_files import check_config, check_seq_len, folder_config, num_layers
from core.models.gguf import bundled_gguf_path, bundled_model_target, gguf_cache_dir, gguf_source_config
from core.models.hub import cached_hub_config
from core.models.sources import TINY_MODEL, ModelLoadError, resolve_source
from core.models.tiny import tiny_model_config


class ModelFitError(ModelLoadError):
    """A conversion config that does not fit its model; the message names the field, the value and
    the fix, and ``field`` is that field's dotted path (for forms that show problems per field)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field

    @property
    def problem(self) -> str:
        """The message without the leading field name."""
        return str(self).removeprefix(self.field).lstrip(": ")


class _ModelFields(Protocol):
    source: str
    trust_remote_code: bool


class _AttentionFields(Protocol):
    softmax_layers: list[int] | str
    softmax_budget: int | None


class _DataFields(Protocol):
    seq_len: int


class FitConfig(Protocol):
    """The fields of a conversion config (``ConvertConfig``) that :func:`check_model_fit` reads."""

    model: _ModelFields
    attention: _AttentionFields
    data: _DataFields


def read_model_config(
    source: str | os.PathLike, workspace: str | os.PathLike | None = None, revision: str | None = None
) -> dict[str, Any] | None:
    """The raw ``config.json`` dict of a model source without loading it (see the module docstring);
    None for a hub model that is not in the local cache. Raises :class:`ModelLoadError` for a
    missing path, a folder without ``config.json`` or an unreadable GGUF file."""
    resolved = resolve_source(source)
    if resolved.kind == "bundled":
        if resolved.name == TINY_MODEL:
            return tiny_model_config()
        return gguf_source_config(
            lambda: bundled_gguf_path(resolved.name, workspace), bundled_model_target(workspace, resolved.name)
        )
    if resolved.kind == "gguf":
        path = resolved.path
        return gguf_source_config(lambda: path, gguf_cache_dir(path, workspace))
    if resolved.kind == "folder":
        return folder_config(resolved.path)
    return cached_hub_config(resolved.repo_id, revision)


def check_model_fit(cfg: FitConfig, workspace: str | os.PathLike | None = None) -> None:
    """Raise :class:`ModelFitError` (one line) if ``cfg`` cannot run on its model: a model source
    that does not exist or is not a model, an unsupported architecture (or remote code not
    trusted), ``attention.softmax_layers`` outside the model's layers, an ``attention.softmax_budget``
    that keeps every layer softmax, or ``data.seq_len`` above
    its maximum positions. A hub model not in the local cache passes (it is checked when loaded).
    """
    source = cfg.model.source
    try:
        config = read_model_config(source, workspace)
        if config is None:
            return
        check_config(config, repr(source), cfg.model.trust_remote_code, consult_transformers=False)
    except ModelLoadError as exc:
        raise ModelFitError(f"model.source: {exc}", "model.source") from None
    layers = num_layers(config)
    auto = cfg.attention.softmax_layers == "auto"
    outside = [i for i in ([] if auto else cfg.attention.softmax_layers) if layers is not None and not 0 <= i < layers]
    if auto and layers is not None and cfg.attention.softmax_budget >= layers:
        raise ModelFitError(
            f"attention.softmax_budget {cfg.attention.softmax_budget} would keep every layer of model {source!r} "
            f"softmax ({layers} layers); use at most {layers - 1}", "attention.softmax_budget"
        )
    if outside:
        raise ModelFitError(
            f"attention.softmax_layers {outside} out of range: model {source!r} has {layers} layers; "
            f"use layer indices 0..{layers - 1}", "attention.softmax_layers"
        )
    try:
        check_seq_len(config, cfg.data.seq_len, field="data.seq_len")
    except ConfigError as exc:
        raise ModelFitError(str(exc), "data.seq_len") from None
