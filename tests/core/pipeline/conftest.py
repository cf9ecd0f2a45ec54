"""A finished tiny-test run and its export, shared by the export tests."""

from __future__ import annotations

import pytest

from core.config import preset
from core.pipeline.convert import run_convert
from core.pipeline.runs import export


@pytest.fixture(scope="session")
def export_workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("export-ws")


@pytest.fixture(scope="session")
def exported(export_workspace):
    """``(run folder, its report, its export folder)`` of a tiny-test conversion."""
    run = export_workspace / "runs" / "tiny"
    report = run_convert(preset("tiny-test"), run, workspace=export_workspace)
    return run, report, export(run, export_workspace / "export", workspace=export_workspace)
