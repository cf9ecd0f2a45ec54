"""Tiny-test conversions shared by the pipeline tests: a plain finished run, and a run with its export."""

from __future__ import annotations

import pytest

from core.export.folder import export
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


@pytest.fixture(scope="session")
def export_workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("export-ws")


@pytest.fixture(scope="session")
def exported(export_workspace):
    """``(run folder, its report, its export folder)`` of a tiny-test conversion."""
    run, report = convert_tiny(export_workspace)
    return run, report, export(run, export_workspace / "export", workspace=export_workspace)
