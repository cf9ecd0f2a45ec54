"""The process that runs one job: ``python -m jobs.runner JOB_ID [--workspace W]``.

The worker starts it with ``start_new_session=True`` (its own process group, so the whole job,
grandchildren included, can be signalled at once), the workspace as working directory,
stdout/stderr appended to ``runs/<id>/runner.log``, and ``LOLCATS_DB_URL`` /
``LOLCATS_SUPERVISOR_PID`` in its environment.

Contract:
  * Runs only a job that is ``running`` (claimed); otherwise exits with :data:`EXIT_NOT_RUNNABLE`.
  * Validates the stored config again, writes ``job.json`` (kind, attempt, resolved config)
    and appends one line per start to ``starts.jsonl`` in the run folder, then calls the kind's
    run function with a :class:`jobs.progress.DbProgress`. Every other name in the run folder
    (``config.json``, checkpoints, ...) belongs to the kind.
  * Records its own outcome with a compare-and-set on (running, attempt):
    success -> ``succeeded`` (report in the ``result`` column, and in ``report.json`` unless
    the run function wrote that file itself), exit 0;
    StopRequested after a cancel request -> ``cancelled``, exit :data:`EXIT_STOPPED`;
    any exception -> ``failed`` with one clear message (out of memory gets the batch / seq_len
    hint) and the traceback tail, exit :data:`EXIT_FAILED`.
    Death by a signal is recorded by the worker (see :mod:`jobs.worker`).
  * A background thread refreshes the heartbeat every ``LOLCATS_HEARTBEAT_INTERVAL`` seconds
    (default 2) and watches the supervising worker: if it disappears, the job is marked
    ``interrupted`` and the whole process group is killed, so no job outlives its supervisor.
  * Before exiting, every remaining child process of the runner is terminated and reaped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback

import psutil

from core.progress import StopRequested
from core.run_folder import REPORT_FILE
from jobs import store
from jobs.db import DB_URL_ENV, Database, open_db
from jobs.errors import describe_failure, traceback_tail
from core.io import atomic_write_json
from jobs.kinds import get_kind
from jobs.models import Job, JobStatus, utcnow
from jobs.progress import DbProgress

EXIT_OK, EXIT_FAILED, EXIT_STOPPED, EXIT_NOT_RUNNABLE = 0, 1, 3, 4
SUPERVISOR_ENV = "LOLCATS_SUPERVISOR_PID"
JOB_FILE = "job.json"
HEARTBEAT_ENV = "LOLCATS_HEARTBEAT_INTERVAL"


def _say(message: str) -> None:
    print(f"[{utcnow().isoformat(timespec='seconds')}Z runner {os.getpid()}] {message}", flush=True)


class Guard(threading.Thread):
    """Heartbeat + supervisor watch, in the background of the runner."""

    def __init__(self, progress: DbProgress, supervisor_pid: int | None, interval: float):
        super().__init__(name="job-guard", daemon=True)
        self.progress, self.supervisor_pid, self.interval = progress, supervisor_pid, interval
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(min(0.5, self.interval)):
            if self.supervisor_pid is not None and os.getppid() != self.supervisor_pid:
                self._orphaned()
            if self.progress.seconds_since_beat() >= self.interval:
                try:
                    self.progress.beat()
                except Exception as exc:  # a heartbeat must never kill the job; the next one retries
                    _say(f"heartbeat failed: {exc}")

    def _orphaned(self) -> None:
        reason = f"the worker process {self.supervisor_pid} supervising this job exited; resume to continue"
        _say(reason)
        try:  # a few seconds at most: the group must not outlive its supervisor for long
            store.mark_interrupted(self.progress.db, self.progress.job_id, self.progress.attempt, reason,
                                   source="runner", timeout=5.0)
        finally:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def _reap_children(timeout: float = 3.0) -> None:
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            child.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(children, timeout=timeout)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)


def run_job(db: Database, job_id: int) -> int:
    row = db.read(lambda s: (lambda j: None if j is None else (JobStatus(j.status), j.attempt, j.kind,
                                                                  dict(j.config), j.run_dir))(s.get(Job, job_id)))
    if row is None or row[0] != JobStatus.RUNNING:
        _say(f"job {job_id} is {'missing' if row is None else row[0].value}, not running: nothing to do")
        return EXIT_NOT_RUNNABLE
    _, attempt, kind_name, config, run_dir_rel = row
    run_dir = db.workspace / (run_dir_rel or f"runs/{job_id}")
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "starts.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"attempt": attempt, "pid": os.getpid(), "time": utcnow().isoformat()}) + "\n")
    _say(f"job {job_id} attempt {attempt}: {kind_name}")

    progress = DbProgress(db, job_id, attempt)
    supervisor = os.environ.get(SUPERVISOR_ENV)
    guard = Guard(progress, int(supervisor) if supervisor else None,
                  float(os.environ.get(HEARTBEAT_ENV, "2")))
    progress.beat()
    if progress.lost:  # declared interrupted by another worker between the claim and this start
        _say(f"job {job_id} attempt {attempt} is no longer running: nothing to do")
        return EXIT_NOT_RUNNABLE
    guard.start()
    try:
        kind = get_kind(kind_name)
        config_obj = kind.validate(config, db.workspace)
        atomic_write_json(run_dir / JOB_FILE, {"kind": kind_name, "attempt": attempt, "config": config})
        started = time.time()
        report = kind.function()(config_obj, run_dir, progress)
        report = json.loads(json.dumps(report if report is not None else {}, allow_nan=False, default=str))
        report_file = run_dir / REPORT_FILE
        if not report_file.exists() or report_file.stat().st_mtime < started:  # the kind's own file wins
            atomic_write_json(report_file, report)
        store.mark_succeeded(db, job_id, attempt, report)
        _say("succeeded")
        return EXIT_OK
    except StopRequested as exc:
        if progress.cancel_requested:
            store.mark_cancelled(db, job_id, attempt, f"cancelled on request ({exc}); the checkpoint is kept")
            _say(f"cancelled: {exc}")
        else:
            _say(f"stopped, the job is no longer owned by this run: {exc}")
        return EXIT_STOPPED
    except BaseException as exc:  # noqa: BLE001 - every failure must end in a recorded state
        traceback.print_exc()
        error = describe_failure(exc)
        store.mark_failed(db, job_id, attempt, error, traceback_tail(exc))
        _say(f"failed: {error}")
        return EXIT_FAILED
    finally:
        guard.halt.set()
        _reap_children()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.runner", description="Run one claimed job.")
    parser.add_argument("job_id", type=int)
    parser.add_argument("--workspace", default=None)
    args = parser.parse_args(argv)
    db = open_db(args.workspace, os.environ.get(DB_URL_ENV))
    os.chdir(db.workspace)  # WorkspacePath config values are relative to the workspace
    started = time.monotonic()
    code = run_job(db, args.job_id)
    _say(f"exit {code} after {time.monotonic() - started:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
