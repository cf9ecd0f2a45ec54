"""One tiny-test conversion shared by the pipeline tests (its workspace caches the tiny model)."""

import pytest

from core.config import preset
from core.pipeline.convert import run_convert
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
