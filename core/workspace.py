"""The workspace folder: everything a run produces lives below it.

Layout: ``workbench.db`` (job database), ``models/`` (cached model folders), ``runs/<name>/``
(resolved config, checkpoints, logs, report), ``servers/`` (the records and logs of the exports the
workbench serves, ``serving.servers``). The folder is ``--workspace`` when given, else the
``LOLCATS_WORKSPACE`` environment variable, else ``./workspace``.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "LOLCATS_WORKSPACE"
SERVERS_DIR = "servers"


class WorkspaceError(ValueError):
    """A path that would leave the workspace."""


def workspace_root(explicit: str | os.PathLike | None = None) -> Path:
    """Resolve (and create) the workspace folder."""
    root = Path(explicit or os.environ.get(ENV_VAR) or "workspace").expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def safe_child(root: Path, name: str | os.PathLike) -> Path:
    """Return ``root / name`` if it stays inside ``root``; raise :class:`WorkspaceError` otherwise.

    Rejects absolute paths and ``..`` components that would escape the workspace, so a run name
    or output path typed by a user can never write outside it.
    """
    root = Path(root).resolve()
    candidate = (root / name).resolve()
    if candidate != root and root not in candidate.parents:
        raise WorkspaceError(
            f"path {str(name)!r} escapes the workspace {str(root)!r}; use a name inside the workspace"
        )
    return candidate


def models_dir(root: Path) -> Path:
    path = root / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir(root: Path) -> Path:
    path = root / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path
