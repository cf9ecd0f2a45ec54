"""A tiny-test conversion shared by the pipeline tests: a plain finished run."""

from __future__ import annotations

import pytest

from core.progress import RecordingProgress
from tests.tiny_runs import convert_tiny


@pytest.fixture(scope="package")
def workspace(tmp_path_factory):
    """One workspace for the whole package, so that its modules share one finished run."""
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="package")
def finished_run(workspace):
    """``(run folder, report, progress)`` of an uninterrupted tiny-test run."""
    progress = RecordingProgress()
    out, report = convert_tiny(workspace, progress=progress)
    return out, report, progress
