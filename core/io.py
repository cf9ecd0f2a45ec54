"""File writes that survive a crash, and the one rule for recognising out-of-memory errors.

Atomic writes: a reader (or a resume after a crash) sees the old file or the new one, never a
half-written one.

Contract: :func:`atomic_write_text` writes a temporary file in the same folder, flushes and
fsyncs it, then ``os.replace``-s it over the target (atomic on POSIX and Windows). If anything
fails before the rename (disk full, an exception while serialising, the process killed), the
previous file is untouched and the temporary file is removed when possible; an ``OSError``
(a full disk) names the target file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None:  # a failed write or fsync does not name the file: name the target
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    # Serialise first: a value json cannot encode must fail before any file is touched.
    return atomic_write_text(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_json_object(path: str | os.PathLike | None) -> dict | None:
    """The JSON object in ``path``, or None (no path, no file, unreadable, not JSON, not an object);
    never raises: for files a reader may find missing, half-made by another program, or edited by hand."""
    if path is None or not Path(path).is_file():
        return None
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_oom(exc: BaseException) -> bool:
    """True for the ways running out of memory surfaces: Python's MemoryError, torch's
    OutOfMemoryError (CUDA), and the RuntimeError a CPU allocator raises. Reads torch only if it
    is already loaded, so this module stays torch-free."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MESSAGES)
