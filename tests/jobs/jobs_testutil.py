"""Helpers shared by the job system tests (a uniquely named module: tests/ has no packages)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from jobs import api


WORKER_EXIT_S = 120.0
"""How long a test waits for a worker process to exit: far above its run on a loaded 2-core machine
(a runner process per job starts Python and imports the job system), so only a hang reaches it."""


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Poll until ``predicate()`` is truthy; return its value or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_status(ws: Path, job_id: int, statuses: str | tuple[str, ...], timeout: float = 20.0):
    statuses = (statuses,) if isinstance(statuses, str) else statuses

    def check():
        info = api.get_job(job_id, workspace=ws)
        return info if info.status in statuses else None

    return wait_for(check, timeout, what=f"job {job_id} to become {'/'.join(statuses)}")


def stop_and_resume(ws: Path, job_id: int, how: str, timeout: float = 600.0):
    """Stop a running job ``how`` (``"cancel"``: a cooperative stop; ``"kill"``: SIGKILL of its
    process), check it ended cancelled or interrupted, resume it and wait for its end; returns
    ``(the final JobInfo, the status it stopped in)``."""
    if how == "cancel":
        api.cancel_job(job_id, workspace=ws)
    else:
        os.kill(api.get_job(job_id, workspace=ws).pid, signal.SIGKILL)
    stopped = "cancelled" if how == "cancel" else "interrupted"
    info = wait_status(ws, job_id, (stopped, "succeeded"), timeout=120)
    assert info.status == stopped, f"the job finished before the {how} reached it"
    assert api.resume_job(job_id, workspace=ws).attempt == info.attempt + 1
    info = wait_status(ws, job_id, ("succeeded", "failed"), timeout=timeout)
    assert info.status == "succeeded", (info.error, info.log_tail)
    return info, stopped


class WorkerProc:
    """A real ``python -m jobs worker`` process; output in ``log``."""

    def __init__(self, ws: Path, *args: str, env: dict[str, str] | None = None, name: str = "worker"):
        self.log = ws.parent / f"{name}-{time.monotonic_ns()}.log"
        self._out = open(self.log, "wb")
        cmd = [sys.executable, "-m", "jobs", "worker", "--workspace", str(ws), "--poll-interval", "0.05", *args]
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.pid = self.proc.pid

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


_LOCK_HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")   # the write lock: every other writer must wait
conn.execute("UPDATE schema_version SET version = version")
print("locked", flush=True)
sys.stdin.readline()              # held until the test says so
conn.execute("COMMIT")
print("released", flush=True)
"""


class WriteLockHolder:
    """Another process holding the SQLite write lock of ``db_path`` from construction until
    :meth:`release`: the test decides when the lock ends, so nothing races a fixed sleep."""

    def __init__(self, db_path: Path):
        self.db_path = db_path
        self.proc = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(db_path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "locked"

    def is_held(self) -> bool:
        """True when a writer really cannot get the lock now (checked with a connection that does not wait)."""
        probe = sqlite3.connect(self.db_path, isolation_level=None, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            return "locked" in str(exc)
        else:
            probe.execute("ROLLBACK")
            return False
        finally:
            probe.close()

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            assert self.proc.stdout.readline().strip() == "released"
        self.proc.wait(10)

    def __enter__(self) -> "WriteLockHolder":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def run_dir(ws: Path, job_id: int) -> Path:
    return ws / "runs" / str(job_id)


def read_checkpoint(ws: Path, job_id: int) -> dict:
    import json

    return json.loads((run_dir(ws, job_id) / "checkpoint.json").read_text())


def starts(ws: Path, job_id: int) -> list[dict]:
    import json

    path = run_dir(ws, job_id) / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
