"""Pre-checks of local data files (UTF-8 text, well-formed JSON, not empty) and :class:`DataError`.

``datasets`` reports a bad byte or a broken JSON line deep in a traceback; these checks run
first, so each problem ends in one :class:`DataError` that names the file, the place and the fix.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from pathlib import Path
from typing import Iterator


class DataError(ValueError):
    """A dataset that cannot be used; the message names the cause and the fix."""


def _bad_utf8(path: Path, offset: int, line: int, byte: int) -> DataError:
    return DataError(
        f"{path} is not valid UTF-8: byte 0x{byte:02x} at byte offset {offset} (line {line}); "
        f"re-save the file as UTF-8 (for example: iconv -f latin1 -t utf-8 in > out)"
    )


def _iter_utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)``; raise :class:`DataError` at the first non-UTF-8 byte."""
    offset = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _bad_utf8(path, offset + exc.start, number, raw[exc.start]) from None
            offset += len(raw)


def _json_line_rows(path: Path) -> Iterator[dict]:
    """The objects of a JSON-lines file, one per non-empty line; :class:`DataError` at the first bad line."""
    for number, line in _iter_utf8_lines(path):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"malformed JSON on line {number} of {path} ({exc.msg}, column {exc.colno}); "
                f"fix or remove that line (each line must be one JSON object)"
            ) from None
        if not isinstance(value, dict):
            raise DataError(
                f"line {number} of {path} is a JSON {type(value).__name__}, not an object; "
                f"each line must be one object such as {{\"text\": ...}}"
            )
        yield value


def _check_json_lines(path: Path) -> int:
    return sum(1 for _ in _json_line_rows(path))


def _empty(path: Path) -> DataError:
    return DataError(f"dataset file {path} is empty; add rows to it or choose another dataset")


def peek_fields(path: Path, limit: int = 50) -> list[str]:
    """The fields of the first ``limit`` rows of a local data file (the union of their keys in the
    order first seen; ``["text"]`` for a text file), those rows checked as :func:`check_local_file`
    checks the whole file (a ``.json`` document is read whole). :class:`DataError` when the file
    has no row among them."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises its own errors on a file that is not Parquet
            raise DataError(f"{path} is not a readable Parquet file ({exc}); check the file") from None
        if meta.metadata.num_rows == 0:
            raise _empty(path)
        return list(meta.schema_arrow.names)
    if suffix == ".csv":
        import csv

        lines = (line for _, line in _iter_utf8_lines(path))
        header = next(csv.reader(lines), None)
        if not header or next(lines, None) is None:
            raise _empty(path)
        return header
    if suffix in (".json", ".jsonl"):
        value = None
        if suffix == ".json":  # one document: read whole
            check_local_file(path)
            with contextlib.suppress(json.JSONDecodeError):  # else JSON lines under a .json name
                value = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(value, (list, dict)):
            rows = value[:limit] if isinstance(value, list) else [value]
        else:
            rows = list(itertools.islice(_json_line_rows(path), limit))
        if not rows:
            raise _empty(path)
        return list(dict.fromkeys(key for row in rows for key in row))
    if not any(line.strip() for _, line in _iter_utf8_lines(path)):
        raise _empty(path)
    return ["text"]


def check_local_file(path: Path) -> None:
    """Pre-check a local data file: UTF-8 text, well-formed JSON (with the line number), not empty."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return
    if suffix == ".jsonl":
        rows = _check_json_lines(path)
    elif suffix == ".json":
        lines = list(_iter_utf8_lines(path))  # also validates UTF-8
        text = "".join(line for _, line in lines)
        stripped = text.lstrip()
        if stripped.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"malformed JSON on line {exc.lineno} of {path} ({exc.msg}, column {exc.colno}); fix the file"
                ) from None
            bad = next((i for i, v in enumerate(value) if not isinstance(v, dict)), None)
            if bad is not None:
                raise DataError(f"item {bad} of the JSON array in {path} is not an object; every item must be one")
            rows = len(value)
        else:
            try:
                value = json.loads(text)
                rows = 1 if isinstance(value, dict) and value else 0
            except json.JSONDecodeError:
                rows = _check_json_lines(path)  # JSON lines under a .json name
    else:
        rows = sum(1 for _, line in _iter_utf8_lines(path) if line.strip())
    if rows == 0:
        raise _empty(path)
