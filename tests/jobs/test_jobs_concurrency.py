"""Several processes on one SQLite file: racing workers, a held lock, readers during heavy writes,
and checkpoint writes killed half-way."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from jobs import api
from jobs.db import open_db
from core.io import atomic_write_json
from jobs.models import JobEvent
from jobs.selftest import selftest_state
from jobs_testutil import WriteLockHolder, read_checkpoint, starts, wait_for, wait_status

pytestmark = pytest.mark.slow  # workers racing over many jobs

HERE = Path(__file__).resolve().parent


def test_four_workers_racing_over_100_jobs_run_each_exactly_once(ws, start_worker):
    ids = [api.submit_job("selftest", {"steps": 1, "layers": 0}, workspace=ws).id for _ in range(100)]
    workers = [start_worker("--exit-when-idle", "--poll-interval", "0.02") for _ in range(4)]
    for w in workers:
        assert w.wait(150) == 0, w.output()

    jobs = {j.id: j for j in api.list_jobs(workspace=ws, limit=1000)}
    assert sorted(jobs) == ids
    assert Counter(j.status for j in jobs.values()) == {"succeeded": 100}
    assert all(j.attempt == 1 for j in jobs.values())
    runs = {job_id: starts(ws, job_id) for job_id in ids}
    assert all(len(r) == 1 for r in runs.values()), {k: v for k, v in runs.items() if len(v) != 1}
    db = open_db(ws)
    claims = db.read(lambda s: Counter(s.scalars(select(JobEvent.job_id).where(
        JobEvent.message.like("claimed by worker%"))).all()))
    assert claims == Counter({job_id: 1 for job_id in ids})
    assert len({j.worker_id for j in jobs.values()}) >= 2  # the workers really competed


def _checkpointed_ahead_of_its_progress(ws, job_id):
    """The job's step whose checkpoint is on disk while its progress row is not in the database
    (the job is stuck writing that row), else None."""
    recorded = api.get_job(job_id, workspace=ws).progress_step or 0
    on_disk = read_checkpoint(ws, job_id)["step"]
    return on_disk if on_disk == recorded + 1 else None


def test_a_locked_database_during_a_job_is_retried_not_a_crash(ws, start_worker):
    # Connections give up on a lock after 50 ms, so only the retry loop can carry the job through.
    env = {"LOLCATS_DB_BUSY_TIMEOUT": "0.05", "LOLCATS_HEARTBEAT_INTERVAL": "0.2"}
    steps = 100
    job_id = api.submit_job("selftest", {"steps": steps, "step_seconds": 0.03}, workspace=ws).id
    worker = start_worker(env=env)
    wait_for(lambda: (api.get_job(job_id, workspace=ws).progress_step or 0) >= 3, 20, what="progress")
    with WriteLockHolder(ws / "workbench.db") as holder:
        blocked_at = wait_for(lambda: _checkpointed_ahead_of_its_progress(ws, job_id), 20,
                              what="the job to wait on the lock with a step checkpointed but not recorded")
        time.sleep(1.0)  # twenty busy timeouts: the job's writes are refused again and again
        assert holder.is_held()
        assert api.get_job(job_id, workspace=ws).progress_step == blocked_at - 1  # reads still work...
        assert read_checkpoint(ws, job_id)["step"] == blocked_at  # ...and the job waited, alive, on the lock
    info = wait_status(ws, job_id, ("succeeded", "failed", "interrupted"), timeout=30)
    assert info.status == "succeeded", (info.error, worker.output())
    assert blocked_at < steps
    assert [m.step for m in api.job_metrics(job_id, name="loss", workspace=ws)] == list(range(1, steps + 1))
    assert info.result["state"] == selftest_state(steps)
    assert "Traceback" not in worker.output()


def test_reading_from_another_process_during_heavy_metric_writes_never_fails(ws, start_worker, tmp_path):
    steps, layers = 300, 8
    job_id = api.submit_job("selftest", {"steps": steps, "layers": layers}, workspace=ws).id
    out = tmp_path / "reader.json"
    reader = subprocess.Popen([sys.executable, str(HERE / "_reader.py"), str(ws), str(job_id), str(out)])
    start_worker()
    assert reader.wait(90) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == []
    assert result["status"] == "succeeded"
    assert result["seen"] == steps * (1 + layers)  # every metric row, read incrementally
    assert result["reads"] > 10 and len(set(result["counts"])) > 3  # it read while the job was writing


_WRITER = r"""
import sys
from core.io import atomic_write_json
path, step = sys.argv[1], 0
while True:
    step += 1
    atomic_write_json(path, {"step": step, "blob": [step] * 200_000})
"""


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _freeze_mid_write(writer: subprocess.Popen, tmp: Path) -> None:
    """SIGSTOP ``writer`` at a moment its temporary file exists: frozen between creating the new
    version and renaming it over the checkpoint."""
    while True:
        wait_for(tmp.exists, 20, interval=0.005, what="the writer to start writing a new version")
        writer.send_signal(signal.SIGSTOP)
        wait_for(lambda: _stopped(writer.pid), 10, interval=0.005, what="the writer to stop")
        if tmp.exists():
            return
        writer.send_signal(signal.SIGCONT)


def test_checkpoint_writes_are_atomic_when_the_writer_is_killed(tmp_path):
    path = tmp_path / "checkpoint.json"
    for _ in range(3):
        atomic_write_json(path, {"step": 0, "blob": []})
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)])
        tmp = path.with_name(f".{path.name}.{writer.pid}.tmp")
        wait_for(lambda: json.loads(path.read_text())["step"] >= 2, 30, what="two versions written by this writer")
        _freeze_mid_write(writer, tmp)
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(10) == -signal.SIGKILL
        assert tmp.exists()  # the kill landed half-way through writing a version...
        data = json.loads(path.read_text())  # ...yet the checkpoint is a complete file...
        assert data["blob"] == [data["step"]] * 200_000  # ...of one version
        assert data["step"] >= 2  # this writer's, not the file it started from


def test_a_failed_checkpoint_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "checkpoint.json"
    atomic_write_json(path, {"step": 1})
    try:
        atomic_write_json(path, {"step": 2, "bad": float("nan")})  # refused before touching the file
    except ValueError:
        pass
    else:
        raise AssertionError("a NaN in a checkpoint must be refused")
    assert json.loads(path.read_text()) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]
