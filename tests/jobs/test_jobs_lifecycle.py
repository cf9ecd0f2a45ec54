"""Job lifecycle with real worker and runner processes and a real SQLite file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from jobs import api, store
from jobs.db import open_db
from jobs.selftest import selftest_state
from jobs.supervisor import Attempt
from jobs.worker import Worker, WorkerOptions
from jobs_testutil import WORKER_EXIT_S, group_alive, pid_alive, read_checkpoint, run_dir, starts, wait_for, wait_status

pytestmark = pytest.mark.slow  # real worker and job processes, signals and timeouts


def _progress_at_least(ws, job_id, step):
    def check():
        info = api.get_job(job_id, workspace=ws)
        return info if info.pid and (info.progress_step or 0) >= step else None

    return wait_for(check, 20, what=f"job {job_id} to reach step {step}")


def test_job_succeeds_with_metrics_checkpoint_and_report(ws, start_worker):
    job_id = api.submit_job("selftest", {"steps": 4, "layers": 2, "output_path": "exports/report.json"},
                            workspace=ws).id
    worker = start_worker("--exit-when-idle")
    assert worker.wait(WORKER_EXIT_S) == 0, worker.output()
    info = api.get_job(job_id, workspace=ws)
    assert info.status == "succeeded", info
    expected = selftest_state(4)
    assert info.result == {"steps": 4, "resumed_from": 0, "final_loss": expected["loss"], "state": expected}
    assert json.loads((run_dir(ws, job_id) / "report.json").read_text()) == info.result
    assert json.loads((ws / "exports" / "report.json").read_text()) == info.result
    assert read_checkpoint(ws, job_id) == {"step": 4, "state": expected}
    assert json.loads((run_dir(ws, job_id) / "job.json").read_text())["config"]["steps"] == 4
    assert (info.progress_stage, info.progress_step, info.progress_total) == ("selftest", 4, 4)

    loss = api.job_metrics(job_id, name="loss", workspace=ws)
    assert [(m.stage, m.step, m.layer) for m in loss] == [("selftest", n, None) for n in range(1, 5)]
    assert [m.value for m in loss] == pytest.approx([selftest_state(n)["loss"] for n in range(1, 5)])
    per_layer = [m for m in api.job_metrics(job_id, name="mse", workspace=ws) if m.step == 4]
    assert {m.layer: m.value for m in per_layer} == pytest.approx({0: expected["loss"], 1: expected["loss"] / 2})
    assert api.latest_metrics(job_id, workspace=ws) == pytest.approx({"loss": expected["loss"]})
    messages = [e.message for e in api.job_events(job_id, workspace=ws)]
    assert "starting: 4 steps" in messages and messages[-1] == "succeeded"


def test_nan_loss_fails_naming_the_step_and_keeps_the_last_good_checkpoint(ws, start_worker):
    job_id = api.submit_job("selftest", {"steps": 6, "nan_at_step": 4}, workspace=ws).id
    assert start_worker("--exit-when-idle").wait(WORKER_EXIT_S) == 0
    info = api.get_job(job_id, workspace=ws)
    assert info.status == "failed"
    assert "non-finite loss at step 4" in info.error and "RuntimeError" in info.log_tail
    assert read_checkpoint(ws, job_id) == {"step": 3, "state": selftest_state(3)}
    assert [m.step for m in api.job_metrics(job_id, name="loss", workspace=ws)] == [1, 2, 3]


def test_out_of_memory_fails_fast_with_the_hint(ws, start_worker):
    job_id = api.submit_job("selftest", {"steps": 5, "oom_at_step": 2}, workspace=ws).id
    assert start_worker("--exit-when-idle").wait(WORKER_EXIT_S) == 0  # no hang
    info = api.get_job(job_id, workspace=ws)
    assert info.status == "failed"
    assert info.error.startswith("out of memory") and "batch_size" in info.error and "seq_len" in info.error
    assert "MemoryError" in info.log_tail
    assert read_checkpoint(ws, job_id)["step"] == 1


def test_sigkill_of_the_job_process_interrupts_and_resume_continues_from_the_checkpoint(ws, start_worker):
    # Paced so that the job is far from done when the kill lands; the resume runs unpaced.
    config = {"steps": 50, "step_seconds": 0.25, "spawn_grandchild": True}
    job_id = api.submit_job("selftest", config, workspace=ws).id
    start_worker()
    info = _progress_at_least(ws, job_id, 3)
    grandchild = int((run_dir(ws, job_id) / "grandchild.pid").read_text())
    os.kill(info.pid, signal.SIGSTOP)  # frozen: the checkpoint on disk is the last one it writes
    killed_at = read_checkpoint(ws, job_id)["step"]
    os.kill(info.pid, signal.SIGKILL)
    info = wait_status(ws, job_id, "interrupted")
    assert f"job process {info.pid} was killed by SIGKILL" in info.status_reason
    wait_for(lambda: not group_alive(info.pgid), 10, what="the rest of the job's process group to be killed")
    assert not pid_alive(grandchild)
    checkpoint = read_checkpoint(ws, job_id)  # valid JSON: the write was atomic
    assert checkpoint["step"] == killed_at
    assert 3 <= killed_at < 50 and checkpoint["state"] == selftest_state(killed_at)  # killed mid-run

    assert api.resume_job(job_id, {**config, "step_seconds": 0.0}, workspace=ws).attempt == 2
    info = wait_status(ws, job_id, ("succeeded", "failed"), timeout=30)
    assert info.status == "succeeded", info.error
    assert info.result["resumed_from"] == killed_at
    assert info.result["state"] == selftest_state(50)  # same end state as an uninterrupted run
    assert [s["attempt"] for s in starts(ws, job_id)] == [1, 2]
    second = [m.step for m in api.job_metrics(job_id, name="loss", workspace=ws) if m.attempt == 2]
    assert second == list(range(killed_at + 1, 51))


def test_sigkill_of_the_worker_leaves_no_job_running_or_lost(ws, start_worker):
    config = {"steps": 60, "step_seconds": 0.25}  # far from done when the worker dies; resumed unpaced
    a, b = (api.submit_job("selftest", config, workspace=ws).id for _ in range(2))
    c = api.submit_job("selftest", {"steps": 2}, workspace=ws).id
    worker = start_worker("--concurrency", "2")
    info_a, info_b = _progress_at_least(ws, a, 3), _progress_at_least(ws, b, 3)

    # Freeze the worker, kill job b's process, then kill the worker: b is left `running` with
    # nobody to record it (the restart must reconcile it); job a's runner sees its supervisor die.
    os.kill(worker.pid, signal.SIGSTOP)
    os.kill(info_b.pid, signal.SIGKILL)
    worker.kill(signal.SIGKILL)
    worker.wait(10)

    info_a = wait_status(ws, a, "interrupted", timeout=10)
    assert "supervising this job exited" in info_a.status_reason
    wait_for(lambda: not pid_alive(info_a.pid), 10, what="job a's process to exit")
    assert api.get_job(b, workspace=ws).status == "running"
    assert api.get_job(c, workspace=ws).status == "queued"

    assert start_worker("--exit-when-idle").wait(WORKER_EXIT_S) == 0
    states = {j.id: j for j in api.list_jobs(workspace=ws)}
    assert states[b].status == "interrupted" and "no longer running" in states[b].status_reason
    assert states[c].status == "succeeded"
    assert not [j for j in states.values() if j.status == "running"]

    checkpoints = {job: read_checkpoint(ws, job)["step"] for job in (a, b)}
    assert all(3 <= step < 60 for step in checkpoints.values()), checkpoints  # both stopped mid-run
    for job in (a, b):
        api.resume_job(job, {**config, "step_seconds": 0.0}, workspace=ws)
    assert start_worker("--exit-when-idle", "--concurrency", "2").wait(WORKER_EXIT_S) == 0
    for job in (a, b):
        info = api.get_job(job, workspace=ws)
        assert info.status == "succeeded", info.error
        assert info.result["resumed_from"] == checkpoints[job] > 0
        assert info.result["state"] == selftest_state(60)


def test_cancel_stops_at_a_step_with_a_checkpoint_and_the_whole_group_is_gone(ws, start_worker):
    job_id = api.submit_job("selftest", {"steps": 400, "step_seconds": 0.05, "spawn_grandchild": True},
                            workspace=ws).id
    start_worker()
    info = _progress_at_least(ws, job_id, 3)
    grandchild = int(wait_for(lambda: (run_dir(ws, job_id) / "grandchild.pid").exists() and
                              (run_dir(ws, job_id) / "grandchild.pid").read_text()))
    pgid = info.pgid
    assert pgid == info.pid and os.getpgid(grandchild) == pgid and group_alive(pgid)

    api.cancel_job(job_id, workspace=ws)
    wait_for(lambda: not group_alive(pgid), timeout=10, what="the job's process group to disappear")
    assert not pid_alive(grandchild)
    info = wait_status(ws, job_id, "cancelled", timeout=5)
    assert "checkpoint is kept" in info.status_reason
    checkpoint = read_checkpoint(ws, job_id)
    assert checkpoint["step"] == info.progress_step < 400
    assert checkpoint["state"] == selftest_state(checkpoint["step"])
    assert api.resume_job(job_id, workspace=ws).status == "queued"  # cancelled jobs are resumable
    api.cancel_job(job_id, workspace=ws)


def test_cancel_escalates_to_sigterm_then_sigkill_for_a_stuck_job(ws, start_worker):
    config = {"steps": 400, "step_seconds": 0.05, "ignore_stop": True, "ignore_sigterm": True,
              "spawn_grandchild": True}
    job_id = api.submit_job("selftest", config, workspace=ws).id
    start_worker("--cancel-grace", "0.5", "--kill-grace", "1")
    info = _progress_at_least(ws, job_id, 2)
    api.cancel_job(job_id, workspace=ws)
    wait_for(lambda: not group_alive(info.pgid), timeout=10, what="the job's process group to disappear")
    info = wait_status(ws, job_id, "cancelled", timeout=5)
    assert "killed by SIGKILL after the cancel request" in info.status_reason
    messages = " | ".join(e.message for e in api.job_events(job_id, workspace=ws))
    assert "sent SIGTERM" in messages and "sent SIGKILL" in messages


def test_a_hung_job_process_is_killed_and_interrupted(ws, start_worker):
    job_id = api.submit_job("selftest", {"steps": 400, "step_seconds": 0.05}, workspace=ws).id
    start_worker("--stale-after", "2.5", env={"LOLCATS_HEARTBEAT_INTERVAL": "0.2"})
    info = _progress_at_least(ws, job_id, 2)
    os.kill(info.pid, signal.SIGSTOP)  # frozen: no more steps, no more heartbeats
    info = wait_status(ws, job_id, "interrupted", timeout=15)
    assert "no heartbeat for" in info.status_reason and "hung" in info.status_reason
    wait_for(lambda: not group_alive(info.pgid), 10, what="the hung process group to be killed")


def test_worker_sigterm_interrupts_its_jobs_resumably(ws, start_worker):
    job_id = api.submit_job("selftest", {"steps": 400, "step_seconds": 0.05}, workspace=ws).id
    worker = start_worker()
    info = _progress_at_least(ws, job_id, 2)
    worker.kill(signal.SIGTERM)
    assert worker.wait(WORKER_EXIT_S) == 0
    info = api.get_job(job_id, workspace=ws)
    assert info.status == "interrupted" and "worker shut down by SIGTERM" in info.status_reason
    assert not pid_alive(info.pid)
    assert api.resume_job(job_id, workspace=ws).status == "queued"


def test_once_runs_a_single_batch(ws, start_worker):
    ids = [api.submit_job("selftest", {"steps": 1}, workspace=ws).id for _ in range(3)]
    assert start_worker("--once", "--concurrency", "2").wait(WORKER_EXIT_S) == 0
    assert [api.get_job(i, workspace=ws).status for i in ids] == ["succeeded", "succeeded", "queued"]


def test_exit_codes_of_unrecorded_runner_deaths(ws):
    """A runner that dies before recording its outcome: signal -> interrupted, code -> failed."""
    db = open_db(ws)
    worker = Worker(db, WorkerOptions())
    crashed, killed = (api.submit_job("selftest", {"steps": 1}, workspace=ws).id for _ in range(2))
    for job_id, code in ((crashed, "print('ImportError: no module named kaput'); raise SystemExit(2)"),
                         (killed, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")):
        claim = store.claim_next_job(db, worker.id)
        folder = run_dir(ws, job_id)
        folder.mkdir(parents=True)
        with open(folder / "runner.log", "wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
        worker._judge_exit(Attempt(job_id, claim.attempt, proc, folder), proc.wait())
    info = api.get_job(crashed, workspace=ws)
    assert info.status == "failed"
    assert "exited with code 2" in info.error and "no module named kaput" in info.error
    info = api.get_job(killed, workspace=ws)
    assert info.status == "interrupted" and "SIGKILL" in info.status_reason
