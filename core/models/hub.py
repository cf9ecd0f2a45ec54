"""Hugging Face Hub sources: whether the Hub can be reached, and a model's ``config.json`` from it
(downloaded) or from the local cache only (no network).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from core.models.config_files import read_config_json
from core.models.sources import BUNDLED_MODEL, ModelLoadError

HUB_PROBE_TIMEOUT_S = 3.0  # a quick TCP probe so a machine without network fails fast


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


def fetch_hub_config(repo_id: str, revision: str | None, offline: bool, why_offline: str) -> Path:
    """The local path of the hub model's ``config.json``: downloaded, or from the cache when
    ``offline`` (``why_offline`` says why, for the error). Every hub failure is a :class:`ModelLoadError`."""
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


def cached_hub_config(repo_id: str, revision: str | None = None) -> dict[str, Any] | None:
    """The hub model's ``config.json`` from the local Hugging Face cache, or None when it is not
    cached. Never touches the network."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return read_config_json(Path(path)) if isinstance(path, str) else None
