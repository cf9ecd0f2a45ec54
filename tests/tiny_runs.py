"""Tiny-test conversions for the tests that read a finished run (seconds each, on CPU)."""

from __future__ import annotations

from pathlib import Path

from core.config import preset
from core.pipeline.convert import run_convert
from core.progress import ProgressCallback


def convert_tiny(workspace: Path, name: str = "tiny", progress: ProgressCallback | None = None,
                 **overrides) -> tuple[Path, dict]:
    """Convert the tiny-test preset, its sections updated by ``overrides`` as in
    :func:`core.config.preset`, into ``workspace/runs/<name>``; returns the run folder and its report."""
    out = workspace / "runs" / name
    return out, run_convert(preset("tiny-test", **overrides), out, progress, workspace=workspace)
