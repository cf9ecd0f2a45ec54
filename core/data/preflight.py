"""Checking a conversion's data before its job is queued: each source exists, can be read, and its
first rows have the fields its format needs.

``data.source``: a bundled set passes; a local file must exist (a relative path is read from the
workspace, as the job reads it), be of a known type and have, among its first :data:`PEEK_ROWS`
rows, well-formed rows with the fields of ``data.format`` (after ``data.*_field`` renames, the
rules of :func:`core.data.formats.field_plan`); a Hub dataset id must be reachable and exist
(:func:`core.data.sources.check_hub_dataset`). ``data.eval_text`` (``"bundled"``, or a source
read as text rows) likewise. Neither torch nor ``datasets`` is imported, and a large file is not read whole.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.config import DataSpec
from core.data.formats import field_plan
from core.data.sources import bundled_path, check_hub_dataset, file_builder, held_out_source, locate
from core.data.validation import DataError, peek_fields

PEEK_ROWS = 50  # rows of a local file read at submit


class DataSourceError(DataError):
    """A data source a job cannot use; ``field`` is its dotted config path (``data.source`` or
    ``data.eval_text``) and ``problem`` the message without it."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


def source_fields(source: str, base: Path | None = None) -> list[str] | None:
    """The fields of the first rows of ``source`` (a bundled set, a local file), None for a Hub
    dataset once it is known to exist; :class:`DataError` for a source that cannot be read."""
    where = locate(source, base)
    if where.kind == "hub":
        check_hub_dataset(where.name)
        return None
    path = bundled_path(where.name) if where.kind == "bundled" else where.path
    file_builder(path)
    return peek_fields(path, PEEK_ROWS)


def _check_source(field: str, source: str, base: Path | None, format: str, columns: dict[str, str],
                  text_field: str) -> None:
    try:
        fields = source_fields(source, base)
        if fields is not None:
            field_plan(fields, source, format, columns, text_field)
    except DataError as exc:
        raise DataSourceError(field, str(exc)) from None


def check_data_spec(spec: DataSpec, workspace: str | os.PathLike | None = None) -> None:
    """Raise :class:`DataSourceError` (one line) for a ``data`` section whose training source or
    held-out text (read as text rows, as the run reads it) cannot be used (module docstring)."""
    base = Path(workspace) if workspace is not None else None
    _check_source("data.source", spec.source, base, spec.format, spec.columns(), spec.text_field)
    _check_source("data.eval_text", held_out_source(spec.eval_text), base, "text", {}, "text")


__all__ = ["PEEK_ROWS", "DataSourceError", "check_data_spec", "source_fields"]
