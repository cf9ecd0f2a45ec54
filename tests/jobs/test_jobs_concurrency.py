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

from sqlalchemy import select

from jobs import api
from jobs.db import open_db
from core.io import atomic_write_json
from jobs.models import JobEvent
from jobs.selftest import selftest_state
from jobs_testutil import hold_write_lock, starts, wait_for, wait_status

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


def test_a_locked_database_during_a_job_is_retried_not_a_crash(ws, start_worker):
    # Connections give up on a lock after 50 ms, so only the retry loop can carry the job through.
    env = {"LOLCATS_DB_BUSY_TIMEOUT": "0.05", "LOLCATS_HEARTBEAT_INTERVAL": "0.2"}
    job_id = api.submit_job("selftest", {"steps": 40, "step_seconds": 0.03}, workspace=ws).id
    worker = start_worker(env=env)
    wait_for(lambda: (api.get_job(job_id, workspace=ws).progress_step or 0) >= 3, 20, what="progress")
    holder = hold_write_lock(ws / "workbench.db", 1.5)
    progress_while_locked = api.get_job(job_id, workspace=ws).progress_step  # reads still work
    holder.wait(10)
    info = wait_status(ws, job_id, ("succeeded", "failed", "interrupted"), timeout=30)
    assert info.status == "succeeded", (info.error, worker.output())
    assert progress_while_locked < 40
    assert [m.step for m in api.job_metrics(job_id, name="loss", workspace=ws)] == list(range(1, 41))
    assert info.result["state"] == selftest_state(40)
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


def test_checkpoint_writes_are_atomic_when_the_writer_is_killed(tmp_path):
    path = tmp_path / "checkpoint.json"
    atomic_write_json(path, {"step": 0, "blob": []})
    for delay in (0.3, 0.45, 0.6):
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)])
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        data = json.loads(path.read_text())  # always a complete file...
        assert data["blob"] == [data["step"]] * (200_000 if data["step"] else 0)  # ...of one version


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
