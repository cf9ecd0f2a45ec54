"""Atomic file writes: a reader (or a resume after a crash) sees the old file or the new one,
never a half-written one.

Contract: :func:`atomic_write_text` writes a temporary file in the same folder, flushes and
fsyncs it, then ``os.replace``-s it over the target (atomic on POSIX and Windows). If anything
fails before the rename (disk full, an exception while serialising, the process killed), the
previous file is untouched and the temporary file is removed when possible.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    # Serialise first: a value json cannot encode must fail before any file is touched.
    return atomic_write_text(path, json.dumps(data, indent=1, allow_nan=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
