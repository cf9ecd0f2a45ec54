"""A real tiny-test conversion through the worker: the job process is killed with SIGKILL in stage 1,
resumed, and ends with the numbers of an uninterrupted run of the same config."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from core.config import TINY_MODEL, build_config, preset
from core.models.tiny import tiny_model_dir
from core.pipeline.convert import run_convert
from core.train.checkpoint import load_checkpoint
from jobs import api
from jobs_testutil import run_dir, wait_for, wait_status

STAGE1_STEPS = 40


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory):
    """The tiny model, built once; each test copies it into its fresh workspace."""
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-ws"))


@pytest.mark.slow
def test_sigkill_in_stage1_then_resume_ends_like_an_uninterrupted_run(ws, start_worker, tiny_model_folder, tmp_path):
    shutil.copytree(tiny_model_folder, ws / "models" / TINY_MODEL)
    config = preset("tiny-test", stage1={"steps": STAGE1_STEPS, "eval_every": 2}).model_dump()
    job_id = api.submit_job("convert", config, name="killed", workspace=ws).id
    run = run_dir(ws, job_id)
    start_worker()

    def in_stage1():  # step 6 reported: the checkpoint of step 4 at least is on disk
        info = api.get_job(job_id, workspace=ws)
        return info if info.pid and info.progress_stage == "stage1" and (info.progress_step or 0) >= 6 else None

    info = wait_for(in_stage1, 180, interval=0.02, what="the conversion to reach stage-1 step 6")
    os.kill(info.pid, signal.SIGSTOP)  # frozen: the checkpoint on disk is the last one it writes
    killed_at = load_checkpoint(run / "stage1" / "last")[1]["step"]
    os.kill(info.pid, signal.SIGKILL)
    info = wait_status(ws, job_id, "interrupted")
    assert f"job process {info.pid} was killed by SIGKILL" in info.status_reason
    assert 4 <= killed_at < STAGE1_STEPS and not (run / "report.json").exists()

    assert api.resume_job(job_id, workspace=ws).attempt == 2
    info = wait_status(ws, job_id, ("succeeded", "failed"), timeout=300)
    assert info.status == "succeeded", info.error
    report = json.loads((run / "report.json").read_text())
    assert report["training"]["stage1"]["resumed_from"] == killed_at
    second = [m.step for m in api.job_metrics(job_id, stage="stage1", name="loss", workspace=ws) if m.attempt == 2]
    assert second == list(range(killed_at + 1, STAGE1_STEPS + 1))

    uninterrupted = run_convert(build_config(config), tmp_path / "uninterrupted", workspace=ws)
    for key in ("teacher_ppl", "student_ppl", "val_ppl"):
        assert report[key] == pytest.approx(uninterrupted[key], rel=1e-5), key
    assert report["per_layer_mse"] == pytest.approx(uninterrupted["per_layer_mse"], rel=1e-5)
