"""The Ray executor: status mapping and judging with a stand-in client (fast), then selftest jobs
on a real one-node Ray head on 127.0.0.1 (slow): metrics written by the remote job itself, a
cooperative cancel, and a cancel forwarded as stop_job."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import update

from jobs import api
from jobs.db import open_db
from jobs.executors.ray_jobs import RayExecutor, RayWorker, RayWorkerOptions, map_status, submission_id
from jobs.models import Job, JobStatus
from jobs.selftest import selftest_state
from tests.deploy.helpers import RayHead, wait_for

HAVE_RAY = importlib.util.find_spec("ray") is not None


@pytest.mark.parametrize("ray_status, cancel, expected", [
    ("PENDING", False, JobStatus.RUNNING), ("RUNNING", True, JobStatus.RUNNING),
    ("SUCCEEDED", False, JobStatus.SUCCEEDED), ("FAILED", False, JobStatus.FAILED),
    ("STOPPED", True, JobStatus.CANCELLED), ("STOPPED", False, JobStatus.INTERRUPTED),
    (None, False, JobStatus.INTERRUPTED),
], ids=["pending", "running", "succeeded", "failed", "stopped-cancel", "stopped-outside", "unknown"])
def test_map_status(ray_status, cancel, expected):
    assert map_status(ray_status, cancel) == expected


class FakeClient:
    """Stands in for JobSubmissionClient: jobs never run, the test sets their Ray status."""

    class _Status:
        def __init__(self, value):
            self.value = value

    def __init__(self):
        self.jobs: dict[str, dict] = {}
        self.stopped: list[str] = []

    def submit_job(self, *, entrypoint, submission_id, runtime_env, metadata, **kw):
        self.jobs[submission_id] = {"status": "PENDING", "entrypoint": entrypoint, "env": runtime_env["env_vars"]}
        return submission_id

    def get_job_status(self, sid):
        if sid not in self.jobs:
            raise RuntimeError(f"Request failed with status code 404: Job {sid} does not exist.")
        return self._Status(self.jobs[sid]["status"])

    def get_job_info(self, sid):
        return type("Info", (), {"message": f"Job entrypoint command failed with exit code 1 ({sid})"})()

    def stop_job(self, sid):
        self.stopped.append(sid)
        self.jobs[sid]["status"] = "STOPPED"
        return True

    def get_job_logs(self, sid):
        return "line one\nTraceback: boom\n"


def _fake_worker(ws: Path, **options) -> tuple[RayWorker, FakeClient]:
    db = open_db(ws)
    client = FakeClient()
    executor = RayExecutor("http://127.0.0.1:1", db_url=db.url, workspace=ws, client=client)
    return RayWorker(db, RayWorkerOptions(concurrency=4, cancel_grace=0.0, **options), executor), client


def test_submission_and_judging_with_a_stand_in_client(tmp_path):
    ws = tmp_path / "ws"
    ids = [api.submit_job("selftest", {"steps": 3}, workspace=ws).id for _ in range(4)]
    worker, client = _fake_worker(ws)
    for _ in ids:
        assert worker.claim_and_submit()
    assert not worker.claim_and_submit()  # queue empty
    sid = submission_id(ids[0], 1)
    job = client.jobs[sid]
    assert job["entrypoint"].split()[1:4] == ["-m", "jobs.runner", str(ids[0])]
    assert job["env"]["LOLCATS_DB_URL"] == worker.db.url and job["env"]["LOLCATS_SUPERVISOR_PID"] == ""
    assert {api.get_job(i, workspace=ws).status for i in ids} == {"running"}

    worker.watch()  # PENDING: the supervisor keeps the heartbeat fresh
    client.jobs[submission_id(ids[0], 1)]["status"] = "FAILED"  # died without recording anything
    client.jobs[submission_id(ids[1], 1)]["status"] = "STOPPED"  # `ray job stop` by someone else
    del client.jobs[submission_id(ids[2], 1)]  # the cluster forgot it
    client.jobs[submission_id(ids[3], 1)]["status"] = "RUNNING"
    api.cancel_job(ids[3], workspace=ws)
    worker.watch()  # notes the cancel request
    worker.watch()  # grace 0: forwards it as stop_job
    assert client.stopped == [submission_id(ids[3], 1)]
    worker.watch()  # Ray says STOPPED after the cancel request
    failed, stopped, forgotten, cancelled = (api.get_job(i, workspace=ws) for i in ids)
    assert failed.status == "failed" and "exit code 1" in failed.error and "boom" in failed.log_tail
    assert stopped.status == "interrupted" and "stopped outside the workbench" in stopped.status_reason
    assert forgotten.status == "interrupted" and "no longer knows" in forgotten.status_reason
    assert cancelled.status == "cancelled" and "after the cancel request" in cancelled.status_reason
    assert not worker.tracked
    assert "boom" in (ws / "runs" / str(ids[0]) / "runner.log").read_text()


def test_a_supervisor_adopts_the_jobs_of_a_dead_one(tmp_path):
    ws = tmp_path / "ws"
    job_id = api.submit_job("selftest", {"steps": 3}, workspace=ws).id
    first, client = _fake_worker(ws)
    first.claim_and_submit()
    client.jobs[submission_id(job_id, 1)]["status"] = "RUNNING"
    dead = "ray:" + first.host + ":999999999:1"  # a supervisor process that no longer exists
    first.db.write(lambda s: s.execute(update(Job).where(Job.id == job_id).values(worker_id=dead)))
    second, _ = _fake_worker(ws)
    second.executor = first.executor
    assert second.reconcile() == [job_id]
    assert job_id in second.tracked and api.get_job(job_id, workspace=ws).status == "running"
    client.jobs[submission_id(job_id, 1)]["status"] = "SUCCEEDED"  # but the runner recorded nothing
    second.watch()
    info = api.get_job(job_id, workspace=ws)
    assert info.status == "failed" and "without recording a result" in info.error


def test_ray_executor_is_an_optional_dependency(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray.job_submission", None)  # as if ray were not installed
    from jobs.errors import JobsError

    with pytest.raises(JobsError, match="requirements-ray.txt"):
        RayExecutor("http://127.0.0.1:1", db_url="sqlite://", workspace=tmp_path)


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead(num_cpus=1)
    try:
        yield head.wait_ready()
    finally:
        head.stop()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (pip install -r requirements-ray.txt)")
def test_selftest_jobs_on_a_local_ray_head(ray_head, tmp_path):
    ws = tmp_path / "ws"
    ok = api.submit_job("selftest", {"steps": 4, "step_seconds": 0.05, "layers": 2}, workspace=ws).id
    polite = api.submit_job("selftest", {"steps": 500, "step_seconds": 0.2}, workspace=ws).id
    stubborn = api.submit_job("selftest", {"steps": 500, "step_seconds": 0.2, "ignore_stop": True}, workspace=ws).id
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOLCATS_")}
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "jobs", "worker", "--executor", "ray", "--ray-address", ray_head,
             "--workspace", str(ws), "--concurrency", "3", "--poll-interval", "0.2", "--cancel-grace", "2",
             "--exit-when-idle"], stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            for job_id in (polite, stubborn):  # both report steps: the remote jobs write their own metrics
                wait_for(lambda job_id=job_id: (api.get_job(job_id, workspace=ws).progress_step or 0) >= 2, 90,
                         what=f"job {job_id} to report steps\n{log.read_text(errors='replace')}")
            api.cancel_job(polite, workspace=ws)
            api.cancel_job(stubborn, workspace=ws)
            assert worker.wait(90) == 0, log.read_text(errors="replace")
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    done, cooperative, forced = (api.get_job(i, workspace=ws) for i in (ok, polite, stubborn))
    output = log.read_text(errors="replace")

    assert done.status == "succeeded", (done, output)
    assert done.result["final_loss"] == pytest.approx(selftest_state(4)["loss"])
    losses = api.job_metrics(ok, name="loss", workspace=ws)
    assert [(m.step, m.layer) for m in losses] == [(s, None) for s in (1, 2, 3, 4)]
    assert [m.value for m in losses] == pytest.approx([selftest_state(s)["loss"] for s in (1, 2, 3, 4)])
    assert len(api.job_metrics(ok, name="mse", workspace=ws)) == 4 * 2  # per-layer rows of 2 layers
    events = [e.message for e in api.job_events(ok, workspace=ws)]
    assert any(f"as {submission_id(ok, 1)}" in m for m in events) and any(m.startswith("succeeded") for m in events)
    assert "succeeded" in (ws / "runs" / str(ok) / "runner.log").read_text()

    assert cooperative.status == "cancelled" and "cancelled on request" in cooperative.status_reason
    assert forced.status == "cancelled" and "stopped after the cancel request" in forced.status_reason
    forced_events = [e.message for e in api.job_events(stubborn, workspace=ws)]
    assert any("cancel forwarded to Ray (stop_job" in m for m in forced_events), forced_events

    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_head)
    assert client.get_job_status(submission_id(ok, 1)).value == "SUCCEEDED"
    assert client.get_job_status(submission_id(stubborn, 1)).value == "STOPPED"
