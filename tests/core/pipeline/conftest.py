"""Tiny-test conversions shared by the pipeline tests: a plain finished run, and a run with its export."""

from __future__ import annotations

import pytest

from core.config import preset
from core.pipeline.convert import run_convert
from core.pipeline.runs import export
from core.progress import RecordingProgress


@pytest.fixture(scope="package")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="package")
def finished_run(workspace):
    """``(run folder, report, progress)`` of an uninterrupted tiny-test run."""
    out = workspace / "runs" / "tiny"
    progress = RecordingProgress()
    report = run_convert(preset("tiny-test"), out, progress, workspace=workspace)
    return out, report, progress


@pytest.fixture(scope="session")
def export_workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("export-ws")


@pytest.fixture(scope="session")
def exported(export_workspace):
    """``(run folder, its report, its export folder)`` of a tiny-test conversion."""
    run = export_workspace / "runs" / "tiny"
    report = run_convert(preset("tiny-test"), run, workspace=export_workspace)
    return run, report, export(run, export_workspace / "export", workspace=export_workspace)
