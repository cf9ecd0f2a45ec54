"""The local worker: claims queued jobs and supervises one runner process group per job.

The loop (claiming, heartbeat staleness, cancel grace, shutdown) is :class:`jobs.supervisor.Supervisor`;
this module is its local executor (:class:`LocalExecutor`) and :class:`Worker`, the two put together.

Contract of the local executor:
  * Each claimed job runs as ``python -m jobs.runner <id>`` (see :mod:`jobs.runner`) in a new
    session, i.e. its own process group whose id is the runner's pid; at most ``concurrency``
    at a time. Claims are atomic (:func:`jobs.store.claim_next_job`), so any number of workers
    can share one database.
  * When a runner exits, whatever is left of its process group is killed (while the runner is
    still an unreaped zombie, so the group id cannot have been reused), then the exit is judged:
    the runner records success / failure / cancel itself; if the job is still ``running``, a
    death by signal becomes ``cancelled`` (cancel requested) or ``interrupted``, and any other
    exit becomes ``failed`` with the end of ``runner.log`` as the error.
  * Terminate is SIGTERM to the group, kill is SIGKILL: a cancel unanswered for ``cancel_grace``
    seconds gets SIGTERM, and ``kill_grace`` seconds later SIGKILL; a child whose heartbeat is
    older than ``stale_after`` seconds (the runner beats every ``LOLCATS_HEARTBEAT_INTERVAL`` s,
    default 2, from a background thread) is hung: its group is killed and the job becomes
    ``interrupted`` with that reason.
  * Reconcile, at start and every ``reconcile_every`` seconds: a ``running`` job of another
    worker becomes ``interrupted`` (with the reason) when that worker's process is gone (same
    host) or its heartbeat is older than ``stale_after`` seconds; a leftover process group on
    this host is killed first. Nothing is ever left ``running`` without a live supervisor.
  * SIGTERM / SIGINT: stop claiming, terminate the running jobs' groups (SIGTERM, then SIGKILL
    after ``kill_grace``), mark them ``interrupted`` (resumable), exit.

POSIX only (process groups, ``os.killpg``): Linux and macOS.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

import jobs
from jobs import store
from jobs.db import DB_URL_ENV, Database
from jobs.models import utcnow
from jobs.runner import EXIT_STOPPED, SUPERVISOR_ENV
from jobs.supervisor import (ALIVE, Attempt, Poll, Supervisor, SupervisorOptions, owner_gone, parse_worker_id,
                             process_alive)

log = logging.getLogger("jobs.worker")
PROJECT_ROOT = Path(jobs.__file__).resolve().parent.parent

WorkerOptions = SupervisorOptions  # the local worker takes the loop's options as they are


def runner_alive(pid: int | None, job_id: int) -> bool:
    """True if ``pid`` is a live runner of ``job_id`` (command line checked, guarding pid reuse)."""
    if not pid or not process_alive(pid):
        return False
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False
    return "jobs.runner" in cmd and str(job_id) in cmd


def signal_group(pgid: int | None, sig: int) -> bool:
    """Send ``sig`` to a process group; False if the group no longer exists."""
    if not pgid or pgid <= 1:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("not allowed to signal process group %s", pgid)
        return False


def _exited(proc: subprocess.Popen) -> bool:
    """True once the runner has exited, without reaping it where the platform allows."""
    if not hasattr(os, "waitid"):  # e.g. macOS: poll() reaps; the group is signalled right after
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


class LocalExecutor:
    """Runners as process groups on this machine; the handle of an attempt is its ``Popen``."""

    id_prefix = ""
    owns_processes = True
    transient_errors: tuple[type[BaseException], ...] = ()

    def describe(self) -> str:
        return "local process groups"

    def start(self, db: Database, claim: store.Claim, supervisor_id: str) -> subprocess.Popen | None:
        run_dir = db.workspace / claim.run_dir
        env = dict(os.environ)
        env[DB_URL_ENV] = db.url  # in the environment, not argv: a password stays out of `ps`
        env[SUPERVISOR_ENV] = str(os.getpid())
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "jobs.runner", str(claim.job_id), "--workspace", str(db.workspace)]
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            with open(run_dir / "runner.log", "ab") as out:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        cwd=db.workspace, env=env, start_new_session=True, close_fds=True)
        except OSError as exc:
            store.mark_failed(db, claim.job_id, claim.attempt,
                              f"could not start the job process: {exc}; check the Python environment",
                              source="worker")
            return None
        if not store.set_process(db, claim.job_id, supervisor_id, proc.pid, proc.pid):
            log.warning("job %s left the running state before its process started; stopping it", claim.job_id)
            signal_group(proc.pid, signal.SIGKILL)
        log.info("job %s attempt %s: runner pid %s", claim.job_id, claim.attempt, proc.pid)
        return proc

    def poll(self, proc: subprocess.Popen) -> Poll:
        if not _exited(proc):
            return ALIVE
        # The runner is a zombie until wait(): its pid, hence the group id, cannot be reused yet.
        signal_group(proc.pid, signal.SIGKILL)
        return Poll(ended=True, exit=proc.wait())

    def terminate(self, proc: subprocess.Popen) -> str:
        signal_group(proc.pid, signal.SIGTERM)
        return "sent SIGTERM to the job's process group"

    def kill(self, proc: subprocess.Popen) -> str:
        signal_group(proc.pid, signal.SIGKILL)
        return "sent SIGKILL to the job's process group"

    def collect(self, attempt: Attempt) -> None:
        pass  # the runner's output is already in runs/<id>/runner.log

    def judge(self, db: Database, attempt: Attempt, code: int, cancel_requested: bool) -> None:
        pid = attempt.handle.pid
        if code < 0 or code == EXIT_STOPPED:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else "stopped"
            if attempt.killed_because:
                store.mark_interrupted(db, attempt.job_id, attempt.attempt,
                                       f"{attempt.killed_because}; job process {pid} {how}; resume continues "
                                       "from the last checkpoint")
            elif cancel_requested:
                store.mark_cancelled(db, attempt.job_id, attempt.attempt,
                                     f"job process {pid} {how} after the cancel request", source="worker")
            else:
                hint = (" (by a user, or by the kernel when the host ran out of memory: then lower "
                        "batch_size or seq_len)") if code == -signal.SIGKILL else ""
                store.mark_interrupted(db, attempt.job_id, attempt.attempt,
                                       f"job process {pid} was {how}{hint}; resume continues from the last "
                                       "checkpoint")
        else:
            tail = _tail(attempt.run_dir / "runner.log")
            last = tail.splitlines()[-1] if tail else "(no output)"
            store.mark_failed(db, attempt.job_id, attempt.attempt,
                              f"the job process exited with code {code} without recording a result: {last}",
                              tail, source="worker")
        log.info("job %s: runner exited %s", attempt.job_id, code)

    def reconcile(self, supervisor: Supervisor) -> list[int]:
        """Mark abandoned ``running`` jobs of other workers ``interrupted``; returns their ids."""
        db, stale_after = supervisor.db, supervisor.options.stale_after
        interrupted = []
        now = utcnow()
        for job in store.running_jobs(db):
            if job.id in supervisor.tracked or job.worker_id == supervisor.id:
                continue
            owner = parse_worker_id(job.worker_id)
            same_host = owner is not None and owner[0] == supervisor.host
            owner_dead = owner is None or owner_gone(owner, supervisor.host)
            silent = job.silent_seconds(now)
            if not (owner_dead or silent > stale_after):
                continue
            alive = same_host and runner_alive(job.pid, job.id)
            if alive:
                signal_group(job.pgid, signal.SIGKILL)
            if owner_dead:
                gone = "was killed" if alive else "is gone"
                reason = (f"worker {job.worker_id} is no longer running; the job process {job.pid} {gone}; "
                          "resume continues from the last checkpoint")
            else:
                reason = (f"no heartbeat for {silent:.0f} s (limit {stale_after:g} "
                          "s): the job process hung or died; resume continues from the last checkpoint")
            if store.mark_interrupted(db, job.id, job.attempt, reason):
                log.warning("job %s interrupted: %s", job.id, reason)
                interrupted.append(job.id)
        return interrupted


class Worker(Supervisor):
    """``lolcats worker``: the supervision loop over a :class:`LocalExecutor`."""

    def __init__(self, db: Database, options: WorkerOptions | None = None):
        super().__init__(db, options or WorkerOptions(), LocalExecutor())
