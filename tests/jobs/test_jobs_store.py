"""Store, schema, validation and transition tests (one process, a real SQLite file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import inspect, text, update

from jobs import api, db as jobs_db, store
from jobs.db import open_db, retry_stats, schema_version
from jobs.errors import (ConfigError, DatabaseBusyError, InvalidTransition, ResumeConfigMismatch, UnknownKind,
                         describe_failure, is_out_of_memory)
from core.config import config_diff, preset
from jobs.models import Job, utcnow
from jobs.supervisor import make_worker_id
from jobs.worker import Worker, WorkerOptions
from jobs_testutil import WriteLockHolder, wait_for


def test_fresh_database_is_wal_and_versioned(ws):
    db = open_db(ws)
    assert (ws / "workbench.db").exists()
    assert schema_version(db) == jobs_db.SCHEMA_VERSION
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    assert {"jobs", "metrics", "job_events", "schema_version"} <= set(inspect(db.engine).get_table_names())


def test_older_schema_is_upgraded_in_order(ws, monkeypatch):
    open_db(ws)
    jobs_db.close_all()
    applied = []
    new = jobs_db.SCHEMA_VERSION + 1

    def add_column(conn):
        applied.append(new)
        conn.execute(text("ALTER TABLE jobs ADD COLUMN note_for_upgrade_test VARCHAR(20)"))

    monkeypatch.setattr(jobs_db, "SCHEMA_VERSION", new)
    monkeypatch.setitem(jobs_db.UPGRADES, new, add_column)
    db = open_db(ws)
    assert applied == [new]
    assert schema_version(db) == new
    assert "note_for_upgrade_test" in {c["name"] for c in inspect(db.engine).get_columns("jobs")}
    jobs_db.close_all()
    open_db(ws)  # already at the new version: the step does not run again
    assert applied == [new]


def test_jobs_stored_under_former_kind_names_take_the_kinds_names(ws):
    """A version-1 database's benchmark and evaluate jobs become bench and eval jobs; the API still
    takes the former names, to submit and to list."""
    db = open_db(ws)
    ids = [store.insert_job(db, kind, {}) for kind in ("benchmark", "evaluate", "selftest")]
    db.write(lambda s: s.execute(text("UPDATE schema_version SET version = 1")))
    jobs_db.close_all()
    assert schema_version(open_db(ws)) == jobs_db.SCHEMA_VERSION
    assert [api.get_job(i, workspace=ws).kind for i in ids] == ["bench", "eval", "selftest"]
    assert [j.id for j in api.list_jobs(kind="benchmark", workspace=ws)] == [ids[0]]
    assert [j.id for j in api.list_jobs(kind="eval", workspace=ws)] == [ids[1]]
    info = api.submit_job("benchmark", {}, workspace=ws)
    assert info.kind == "bench"


def test_newer_schema_is_refused(ws, monkeypatch):
    db = open_db(ws)
    db.write(lambda s: s.execute(text("UPDATE schema_version SET version = 99")))
    jobs_db.close_all()
    with pytest.raises(Exception, match="schema version 99, newer than this code"):
        open_db(ws)


def test_submit_stores_validated_config_with_defaults(ws):
    info = api.submit_job("selftest", {"steps": "3"}, name="demo", priority=2, workspace=ws)
    assert info.status == "queued" and info.attempt == 1 and info.priority == 2 and info.name == "demo"
    assert info.config["steps"] == 3 and info.config["step_seconds"] == 0.0 and info.config["layers"] == 2
    assert info.run_dir == ws / "runs" / str(info.id)
    assert [e.message for e in api.job_events(info.id, workspace=ws)] == ["submitted (selftest)"]


@pytest.mark.parametrize("config, field", [
    ({"steps": 0}, "steps"),
    ({"steps": 2, "step_seconds": -1}, "step_seconds"),
    ({"steps": 2, "step_seconds": "inf"}, "step_seconds"),
    ({"steps": 2, "stepz": 3}, "stepz"),
    ({"steps": "many"}, "steps"),
], ids=["zero-steps", "negative-sleep", "infinite-sleep", "typo", "not-a-number"])
def test_invalid_config_rejected_naming_the_field_nothing_queued(ws, config, field):
    with pytest.raises(ConfigError) as err:
        api.submit_job("selftest", config, workspace=ws)
    assert field in [f for f, _ in err.value.problems]
    assert f"{field}:" in str(err.value)
    assert api.list_jobs(workspace=ws) == []


def test_unknown_kind_and_preset_list_the_valid_names(ws):
    with pytest.raises(UnknownKind, match="valid kinds: .*selftest"):
        api.submit_job("selftset", {}, workspace=ws)
    with pytest.raises(UnknownKind, match="valid presets: .*selftest-quick"):
        api.submit_preset("nope", workspace=ws)
    assert api.list_jobs(workspace=ws) == []


@pytest.mark.parametrize("name, output_path", [
    ("../escape", None), ("a/../../../escape", None), (None, "../outside.json"), (None, "/etc/lolcats.json"),
    (None, "runs/../../outside.json"),
], ids=["name-dotdot", "name-nested-dotdot", "output-dotdot", "output-absolute", "output-nested-dotdot"])
def test_paths_escaping_the_workspace_are_rejected_at_submit(ws, name, output_path):
    config = {"steps": 1} if output_path is None else {"steps": 1, "output_path": output_path}
    with pytest.raises(ConfigError, match="escapes the workspace") as err:
        api.submit_job("selftest", config, name=name, workspace=ws)
    assert err.value.problems[0][0] == ("name" if name else "output_path")
    assert api.list_jobs(workspace=ws) == []


def test_paths_inside_the_workspace_are_accepted(ws):
    info = api.submit_job("selftest", {"steps": 1, "output_path": "exports/report.json"}, name="nested/name",
                          workspace=ws)
    assert info.config["output_path"] == "exports/report.json"


def test_claim_is_exclusive_and_ordered_by_priority_then_age(ws):
    db = open_db(ws)
    low = api.submit_job("selftest", {"steps": 1}, workspace=ws).id
    high = api.submit_job("selftest", {"steps": 1}, priority=5, workspace=ws).id
    first = store.claim_next_job(db, "host:1:1")
    second = store.claim_next_job(db, "host:2:2")
    assert (first.job_id, second.job_id) == (high, low)
    assert store.claim_next_job(db, "host:3:3") is None
    jobs = {j.id: j for j in api.list_jobs(workspace=ws)}
    assert jobs[high].worker_id == "host:1:1" and jobs[low].worker_id == "host:2:2"
    assert {j.status for j in jobs.values()} == {"running"}


def test_transitions_are_compare_and_set(ws):
    db = open_db(ws)
    job_id = api.submit_job("selftest", {"steps": 1}, workspace=ws).id
    assert not store.mark_succeeded(db, job_id, 1, {})  # not running yet
    claim = store.claim_next_job(db, "w:1:1")
    assert not store.mark_failed(db, job_id, claim.attempt + 1, "stale attempt")  # wrong attempt
    assert store.mark_failed(db, job_id, claim.attempt, "boom")
    assert not store.mark_succeeded(db, job_id, claim.attempt, {})  # already failed
    info = api.get_job(job_id, workspace=ws)
    assert info.status == "failed" and info.error == "boom" and info.finished_at is not None


def test_cancel_queued_is_immediate_running_is_flagged_finished_is_refused(ws):
    db = open_db(ws)
    queued = api.submit_job("selftest", {"steps": 1}, workspace=ws).id
    assert api.cancel_job(queued, workspace=ws).status == "cancelled"
    running = api.submit_job("selftest", {"steps": 1}, workspace=ws).id
    store.claim_next_job(db, "w:1:1")
    info = api.cancel_job(running, workspace=ws)
    assert info.status == "running" and info.cancel_requested
    assert store.heartbeat(db, running, info.attempt).cancel_requested
    with pytest.raises(InvalidTransition, match="is cancelled"):
        api.cancel_job(queued, workspace=ws)


def _failed_job(ws, config):
    db = open_db(ws)
    job_id = api.submit_job("selftest", config, workspace=ws).id
    claim = store.claim_next_job(db, "w:1:1")
    store.mark_failed(db, job_id, claim.attempt, "injected")
    return job_id


def test_resume_with_changed_config_is_refused_with_the_diff(ws):
    job_id = _failed_job(ws, {"steps": 5, "fail_at_step": 3})
    changed = {"steps": 6, "fail_at_step": 3, "layers": 4}
    with pytest.raises(ResumeConfigMismatch) as err:
        api.resume_job(job_id, changed, workspace=ws)
    assert {(c.field, c.old, c.new) for c in err.value.changes} == {("steps", 5, 6), ("layers", 2, 4)}
    assert "steps: 5 -> 6" in str(err.value) and "layers: 2 -> 4" in str(err.value)
    info = api.get_job(job_id, workspace=ws)
    assert (info.status, info.attempt, info.config["steps"]) == ("failed", 1, 5)  # nothing changed


def test_resume_requeues_as_next_attempt_and_accepts_resume_safe_changes(ws):
    job_id = _failed_job(ws, {"steps": 5, "fail_at_step": 3})
    info = api.resume_job(job_id, {"steps": 5, "fail_at_step": None}, workspace=ws)
    assert (info.status, info.attempt, info.config["fail_at_step"]) == ("queued", 2, None)
    assert info.error is None and info.worker_id is None
    assert "fail_at_step: 3 -> None" in api.job_events(job_id, workspace=ws)[-1].message
    with pytest.raises(InvalidTransition, match="only failed, cancelled or interrupted"):
        api.resume_job(job_id, workspace=ws)


def test_a_conversion_stored_with_former_field_names_resumes_with_its_config_as_it_reads_now(ws):
    config = preset("tiny-test").model_dump(mode="json")
    former = {"passkey_lengths": [64], "passkey_depths": [0.5], "passkey_trials": 1}  # eval.long_context.passkey_*
    stored = {**config, "eval": {**config["eval"], **former}}
    db = open_db(ws)
    job_id = store.insert_job(db, "convert", stored)
    store.mark_failed(db, job_id, store.claim_next_job(db, "w:1:1").attempt, "injected")
    assert api.resume_job(job_id, config, workspace=ws).attempt == 2


def test_config_diff_names_nested_fields():
    old = {"a": 1, "lora": {"rank": 8, "alpha": 16}, "gone": True}
    new = {"a": 1, "lora": {"rank": 4, "alpha": 16}, "added": 2}
    assert [str(c) for c in config_diff(old, new)] == ["lora.rank: 8 -> 4", "gone: True -> None",
                                                         "added: None -> 2"]


def test_out_of_memory_errors_get_the_hint():
    class OutOfMemoryError(RuntimeError):  # torch.cuda.OutOfMemoryError, without importing torch
        pass

    for exc in (MemoryError(), OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                RuntimeError("[enforce fail at alloc_cpu.cpp:116] DefaultCPUAllocator: can't allocate memory")):
        assert is_out_of_memory(exc)
        message = describe_failure(exc)
        assert message.startswith("out of memory") and "batch_size" in message and "seq_len" in message
    assert not is_out_of_memory(ValueError("bad value"))
    assert describe_failure(ValueError("bad value")) == "ValueError: bad value"


def test_write_waits_for_a_lock_held_by_another_process_with_retries(ws, monkeypatch):
    monkeypatch.setenv("LOLCATS_DB_BUSY_TIMEOUT", "0.05")  # give up on the lock fast: the retry loop must cope
    open_db(ws)
    before = retry_stats.retries
    with ThreadPoolExecutor(1) as pool:
        with WriteLockHolder(ws / "workbench.db") as holder:
            submitted = pool.submit(api.submit_job, "selftest", {"steps": 1}, workspace=ws)
            wait_for(lambda: retry_stats.retries >= before + 3, what="the submit to be refused the lock and retry")
            assert holder.is_held() and not submitted.done()  # really blocked by the other process...
            assert api.list_jobs(workspace=ws) == []
        info = submitted.result(timeout=30)  # ...and through by retrying once it let go
    assert info.status == "queued"
    assert [j.id for j in api.list_jobs(workspace=ws)] == [info.id]


def test_reads_never_wait_for_a_writer_even_on_a_fresh_connection(ws, monkeypatch):
    job_id = api.submit_job("selftest", {"steps": 1}, workspace=ws).id
    jobs_db.close_all()  # the next call opens (and checks) the database anew
    monkeypatch.setenv("LOLCATS_DB_BUSY_TIMEOUT", "0.05")  # a read that waited would be refused and retried...
    monkeypatch.setenv("LOLCATS_DB_RETRY_TIMEOUT", "2")  # ...then fail, instead of passing once the lock ends
    before = retry_stats.retries
    with WriteLockHolder(ws / "workbench.db") as holder:
        assert [j.id for j in api.list_jobs(workspace=ws)] == [job_id]
        assert api.get_job(job_id, workspace=ws).status == "queued"
        assert holder.is_held()  # answered while the other process held the write lock
    assert retry_stats.retries == before  # without waiting for it even once


def test_a_lock_longer_than_the_retry_budget_gives_a_clear_error(ws, monkeypatch):
    monkeypatch.setenv("LOLCATS_DB_BUSY_TIMEOUT", "0.05")
    monkeypatch.setenv("LOLCATS_DB_RETRY_TIMEOUT", "0.5")
    open_db(ws)
    with WriteLockHolder(ws / "workbench.db") as holder:
        with pytest.raises(DatabaseBusyError, match="locked by another process"):
            api.submit_job("selftest", {"steps": 1}, workspace=ws)
        assert holder.is_held()  # the lock outlasted the budget: the error is not a lucky timing
    assert api.list_jobs(workspace=ws) == []


def test_reconcile_interrupts_jobs_of_dead_or_silent_workers_only(ws):
    db = open_db(ws)
    ids = [api.submit_job("selftest", {"steps": 1}, workspace=ws).id for _ in range(3)]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = make_worker_id().rsplit(":", 2)[0]
    dead_worker = f"{host}:{dead.pid}:{int(time.time())}"
    silent_remote, live_remote = "elsewhere:4242:1", "elsewhere:4343:1"
    for worker_id in (dead_worker, silent_remote, live_remote):
        store.claim_next_job(db, worker_id)
    db.write(lambda s: s.execute(update(Job).where(Job.id == ids[1]).values(
        heartbeat_at=utcnow() - timedelta(seconds=300))))

    worker = Worker(db, WorkerOptions(stale_after=60))
    assert sorted(worker.reconcile()) == ids[:2]
    states = {j.id: j for j in api.list_jobs(workspace=ws)}
    assert states[ids[0]].status == "interrupted" and "no longer running" in states[ids[0]].status_reason
    assert states[ids[1]].status == "interrupted" and "no heartbeat for 300 s" in states[ids[1]].status_reason
    assert states[ids[2]].status == "running"  # another host, fresh heartbeat: left alone


def test_importing_the_job_system_does_not_load_the_conversion_library():
    code = "import sys, jobs.api, jobs.worker, jobs.runner, jobs.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    code = ("import jobs.api, core, core.progress, sys; names = getattr(core, '__all__', []);"
            "assert all(hasattr(core, n) for n in names); print(core.progress.StopRequested.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "core.progress"


def test_database_url_can_point_outside_the_workspace(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    info = api.submit_job("selftest", {"steps": 1}, workspace=tmp_path / "ws", db_url=url)
    assert (tmp_path / "shared.db").exists() and not (tmp_path / "ws" / "workbench.db").exists()
    assert [j.id for j in api.list_jobs(workspace=tmp_path / "ws", db_url=url)] == [info.id]


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_database_is_one_clear_error(tmp_path, damage):
    """A truncated or overwritten workbench.db: every call says it is damaged and how to start afresh
    (one line, no traceback), and a new database beside the run folders works."""
    from jobs.db import close_all
    from jobs.errors import DatabaseDamagedError

    ws = tmp_path / "ws"
    api.submit_job("selftest", {"steps": 2}, workspace=ws)
    close_all()
    path = ws / "workbench.db"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3] if damage == "truncated" else bytes(range(256)) * 20)
    for name in ("workbench.db-wal", "workbench.db-shm"):
        (ws / name).unlink(missing_ok=True)
    (ws / "runs" / "1").mkdir(parents=True, exist_ok=True)
    with pytest.raises(DatabaseDamagedError) as err:
        api.list_jobs(workspace=ws)
    message = str(err.value)
    assert "\n" not in message and f"mv {path} {path}.damaged" in message and "run folders" in message
    close_all()
    path.rename(path.with_name("workbench.db.damaged"))
    assert api.list_jobs(workspace=ws) == [] and (ws / "runs" / "1").is_dir()


def test_a_full_disk_on_the_report_write_fails_the_job_clearly_and_keeps_the_old_report(ws, monkeypatch):
    """ENOSPC while the runner writes report.json: the job fails with one line naming the file and
    the fix, the report an earlier attempt wrote is intact, and the job resumes once there is room."""
    import errno

    import core.io
    from jobs import runner

    db = open_db(ws)
    job_id = api.submit_job("selftest", {"steps": 2, "step_seconds": 0.0}, workspace=ws).id
    report = ws / "runs" / str(job_id) / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text('{"earlier": true}')
    real_fsync = core.io.os.fsync

    def full(fd):  # the disk fills up exactly when the report is written
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".report.json."):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    store.claim_next_job(db, "here:1:1")
    monkeypatch.setattr(core.io.os, "fsync", full)
    assert runner.run_job(db, job_id) == runner.EXIT_FAILED
    info = api.get_job(job_id, workspace=ws)
    assert info.error == (f"the disk is full (No space left on device writing {report}). Fix: free space on that "
                          "disk (or move the workspace), then resume: what the job saved before is kept")
    assert report.read_text() == '{"earlier": true}' and [p.name for p in report.parent.glob(".*tmp")] == []
    monkeypatch.setattr(core.io.os, "fsync", real_fsync)
    api.resume_job(job_id, workspace=ws)
    store.claim_next_job(db, "here:1:1")
    assert runner.run_job(db, job_id) == runner.EXIT_OK and json.loads(report.read_text())["steps"] == 2
