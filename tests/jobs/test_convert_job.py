"""A real tiny-test conversion through the worker: the job process is killed with SIGKILL in stage 1,
in stage 2 or in its final evaluation, resumed, and ends with the numbers of an uninterrupted run
of the same config."""

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

STEPS = 40  # of the stage a kill hits


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory):
    """The tiny model, built once; each test copies it into its fresh workspace."""
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-ws"))


def _config(stage: str) -> dict:
    """tiny-test with ``STEPS`` steps in the stage killed (the final evaluation: 24 perplexity blocks)."""
    if stage == "student_eval":
        return preset("tiny-test", eval={"ppl_blocks": 24}).model_dump()
    return preset("tiny-test", **{stage: {"steps": STEPS, "eval_every": 2}}).model_dump()


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["stage1", "stage2", "student_eval"])
def test_sigkill_then_resume_ends_like_an_uninterrupted_run(ws, start_worker, tiny_model_folder, tmp_path, stage):
    """Killed in stage 1, in stage 2, or in the final evaluation (after both stages' last
    checkpoints): the resumed attempt continues after the last checkpoint it finds, or evaluates
    again, and the report equals an uninterrupted run's."""
    shutil.copytree(tiny_model_folder, ws / "models" / TINY_MODEL)
    config = _config(stage)
    job_id = api.submit_job("convert", config, name="killed", workspace=ws).id
    run = run_dir(ws, job_id)
    start_worker()

    def reached():  # step 6 reported: the checkpoint of step 4 at least is on disk
        info = api.get_job(job_id, workspace=ws)
        return info if info.pid and info.progress_stage == stage and (info.progress_step or 0) >= 6 else None

    info = wait_for(reached, 180, interval=0.02, what=f"the conversion to reach {stage} step 6")
    os.kill(info.pid, signal.SIGSTOP)  # frozen: the checkpoint on disk is the last one it writes
    killed_at = load_checkpoint(run / stage / "last")[1]["step"] if stage != "student_eval" else None
    os.kill(info.pid, signal.SIGKILL)
    info = wait_status(ws, job_id, "interrupted")
    assert f"job process {info.pid} was killed by SIGKILL" in info.status_reason
    assert not (run / "report.json").exists()

    assert api.resume_job(job_id, workspace=ws).attempt == 2
    info = wait_status(ws, job_id, ("succeeded", "failed"), timeout=300)
    assert info.status == "succeeded", info.error
    report = json.loads((run / "report.json").read_text())
    trained = [m for m in api.job_metrics(job_id, name="loss", workspace=ws) if m.attempt == 2]
    if killed_at is None:
        assert trained == []  # both stages were finished: the second attempt only evaluates
    else:
        assert 4 <= killed_at < STEPS and report["training"][stage]["resumed_from"] == killed_at
        assert [m.step for m in trained if m.stage == stage] == list(range(killed_at + 1, STEPS + 1))

    uninterrupted = run_convert(build_config(config), tmp_path / "uninterrupted", workspace=ws)
    for key in ("teacher_ppl", "student_ppl", "val_ppl"):
        assert report[key] == pytest.approx(uninterrupted[key], rel=1e-5), key
    assert report["per_layer_mse"] == pytest.approx(uninterrupted["per_layer_mse"], rel=1e-5)


@pytest.mark.slow
def test_a_run_folder_deleted_under_the_job_fails_it_clearly_and_the_worker_serves_on(ws, start_worker,
                                                                                       tiny_model_folder):
    """The run folder removed while stage 1 trains: the job fails naming the folder, nothing
    recreates it with checkpoints that lack their config, and the worker runs the next job."""
    shutil.copytree(tiny_model_folder, ws / "models" / TINY_MODEL)
    job_id = api.submit_job("convert", _config("stage1"), workspace=ws).id
    run = run_dir(ws, job_id)
    start_worker()
    wait_for(lambda: (api.get_job(job_id, workspace=ws).progress_step or 0) >= 3 and (run / "stage1").is_dir(), 180,
             interval=0.02, what="stage 1 to write its first checkpoint")
    while run.exists():  # the job may be writing into it meanwhile
        shutil.rmtree(run, ignore_errors=True)
    info = wait_status(ws, job_id, ("succeeded", "failed"), timeout=180)
    assert info.status == "failed"
    assert info.error.startswith(f"RunFolderGoneError: the run folder {run} was deleted while the conversion ran")
    assert not run.exists()
    after = api.submit_job("selftest", {"steps": 2}, workspace=ws).id
    assert wait_status(ws, after, ("succeeded", "failed"), timeout=120).status == "succeeded"
