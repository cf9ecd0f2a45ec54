"""The worker: claims queued jobs and supervises one runner process per job.

Contract:
  * Each claimed job runs as ``python -m jobs.runner <id>`` (see :mod:`jobs.runner`) in a new
    session, i.e. its own process group whose id is the runner's pid; at most ``concurrency``
    at a time. Claims are atomic (:func:`jobs.store.claim_next_job`), so any number of workers
    can share one database.
  * When a runner exits, whatever is left of its process group is killed (while the runner is
    still an unreaped zombie, so the group id cannot have been reused), then the exit is judged:
    the runner records success / failure / cancel itself; if the job is still ``running``, a
    death by signal becomes ``cancelled`` (cancel requested) or ``interrupted``, and any other
    exit becomes ``failed`` with the end of ``runner.log`` as the error.
  * Cancel: the runner stops cooperatively at its next step (checkpoint kept). If it has not
    exited ``cancel_grace`` seconds after the request, its group gets SIGTERM, and
    ``kill_grace`` seconds later SIGKILL.
  * A child whose heartbeat is older than ``stale_after`` seconds (the runner beats every
    ``LOLCATS_HEARTBEAT_INTERVAL`` s, default 2, from a background thread) is hung: its group
    is killed and the job becomes ``interrupted`` with that reason.
  * Reconcile, at start and every ``reconcile_every`` seconds: a ``running`` job of another
    worker becomes ``interrupted`` (with the reason) when that worker's process is gone (same
    host) or its heartbeat is older than ``stale_after`` seconds; a leftover process group on
    this host is killed first. Nothing is ever left ``running`` without a live supervisor.
  * SIGTERM / SIGINT: stop claiming, terminate the running jobs' groups (SIGTERM, then SIGKILL
    after ``kill_grace``), mark them ``interrupted`` (resumable), exit.

Worker ids are ``host:pid:process-start-time``, so a reused pid is never taken for a live worker.
POSIX only (process groups, ``os.killpg``): Linux and macOS.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import psutil
from sqlalchemy.exc import SQLAlchemyError

import jobs
from jobs import store
from jobs.db import DB_URL_ENV, Database
from jobs.errors import JobsError
from jobs.models import JobStatus, utcnow
from jobs.runner import EXIT_STOPPED, SUPERVISOR_ENV

log = logging.getLogger("jobs.worker")
PROJECT_ROOT = Path(jobs.__file__).resolve().parent.parent


@dataclass
class WorkerOptions:
    concurrency: int = 1
    poll_interval: float = 1.0  # seconds between looks at the queue and the children
    stale_after: float = 60.0  # a heartbeat older than this marks another worker's job interrupted
    reconcile_every: float = 10.0
    cancel_grace: float = 10.0  # wait this long for a cooperative stop before SIGTERM
    kill_grace: float = 5.0  # then this long before SIGKILL
    once: bool = False  # claim at most `concurrency` jobs, run them, exit
    exit_when_idle: bool = False  # exit when nothing is queued and nothing runs


@dataclass
class _Child:
    job_id: int
    attempt: int
    proc: subprocess.Popen
    run_dir: Path
    cancel_seen: float | None = None
    term_sent: float | None = None
    kill_sent: float | None = None
    killed_because: str | None = None  # set when the worker itself kills the job (shutdown, hang)


def make_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{int(psutil.Process().create_time())}"


def parse_worker_id(worker_id: str | None) -> tuple[str, int, int] | None:
    try:
        host, pid, start = (worker_id or "").rsplit(":", 2)
        return host, int(pid), int(start)
    except ValueError:
        return None


def process_alive(pid: int, create_time: int | None = None) -> bool:
    """True if ``pid`` is a live (non-zombie) process started at ``create_time`` (when given)."""
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(int(p.create_time()) - create_time) > 1:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


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


def _exited(child: _Child) -> bool:
    """True once the runner has exited, without reaping it where the platform allows."""
    if not hasattr(os, "waitid"):  # e.g. macOS: poll() reaps; the group is signalled right after
        return child.proc.poll() is not None
    try:
        return os.waitid(os.P_PID, child.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
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


@dataclass
class Worker:
    db: Database
    options: WorkerOptions = field(default_factory=WorkerOptions)

    def __post_init__(self) -> None:
        self.id = make_worker_id()
        self.host = socket.gethostname()
        self.children: dict[int, _Child] = {}
        self._stop_reason: str | None = None

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        """Supervise until stopped (or idle / done with --exit-when-idle / --once); returns 0."""
        previous = self._install_signal_handlers()
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _loop(self) -> int:
        log.info("worker %s started (concurrency %d, workspace %s)", self.id, self.options.concurrency,
                 self.db.workspace)
        self.reconcile()
        self._last_reconcile = time.monotonic()
        self._claimed = 0
        while True:
            try:
                if self._tick():
                    break
            except (JobsError, SQLAlchemyError) as exc:  # e.g. the database locked for minutes
                log.error("worker loop: %s; retrying", exc)  # never abandon the running children
            time.sleep(self.options.poll_interval)
        log.info("worker %s exiting (%d jobs claimed)", self.id, self._claimed)
        return 0

    def _tick(self) -> bool:
        """One supervision pass; True when the worker should exit."""
        self._reap_children()
        if self._stop_reason:
            self._shutdown()
            return True
        self._watch_children()
        if time.monotonic() - self._last_reconcile >= self.options.reconcile_every:
            self.reconcile()
            self._last_reconcile = time.monotonic()
        idle_queue = False
        while len(self.children) < self.options.concurrency and not self._stop_reason:
            if self.options.once and self._claimed >= self.options.concurrency:
                break
            claim = store.claim_next_job(self.db, self.id)
            if claim is None:
                idle_queue = True
                break
            self._claimed += 1
            self._launch(claim)
        if self.children:
            return False
        if self.options.once and (self._claimed >= self.options.concurrency or idle_queue):
            return True
        return self.options.exit_when_idle and idle_queue

    def _install_signal_handlers(self) -> dict:
        def handler(signum, _frame):
            self._stop_reason = f"worker shut down by {signal.Signals(signum).name}"

        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread (embedded use): the caller handles signals
                pass
        return previous

    def stop(self, reason: str = "worker stopped") -> None:
        self._stop_reason = reason

    # -- launching and judging runners ----------------------------------------------------------
    def _launch(self, claim: store.Claim) -> None:
        run_dir = self.db.workspace / claim.run_dir
        env = dict(os.environ)
        env[DB_URL_ENV] = self.db.url  # in the environment, not argv: a password stays out of `ps`
        env[SUPERVISOR_ENV] = str(os.getpid())
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "jobs.runner", str(claim.job_id), "--workspace", str(self.db.workspace)]
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            with open(run_dir / "runner.log", "ab") as out:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        cwd=self.db.workspace, env=env, start_new_session=True, close_fds=True)
        except OSError as exc:
            store.mark_failed(self.db, claim.job_id, claim.attempt,
                              f"could not start the job process: {exc}; check the Python environment",
                              source="worker")
            return
        self.children[claim.job_id] = _Child(claim.job_id, claim.attempt, proc, run_dir)
        if not store.set_process(self.db, claim.job_id, self.id, proc.pid, proc.pid):
            log.warning("job %s left the running state before its process started; stopping it", claim.job_id)
            signal_group(proc.pid, signal.SIGKILL)
        log.info("job %s attempt %s: runner pid %s", claim.job_id, claim.attempt, proc.pid)

    def _reap_children(self) -> None:
        for job_id, child in list(self.children.items()):
            if not _exited(child):
                continue
            # The runner is a zombie until wait(): its pid, hence the group id, cannot be reused yet.
            signal_group(child.proc.pid, signal.SIGKILL)
            code = child.proc.wait()
            del self.children[job_id]
            self._judge_exit(child, code)

    def _judge_exit(self, child: _Child, code: int) -> None:
        state = store.job_state(self.db, child.job_id)
        if state.status != JobStatus.RUNNING or state.attempt != child.attempt:
            log.info("job %s: runner exited %s, job %s", child.job_id, code, state.status.value)
            return  # the runner recorded its own outcome
        pid = child.proc.pid
        if code < 0 or code == EXIT_STOPPED:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else "stopped"
            if child.killed_because:
                store.mark_interrupted(self.db, child.job_id, child.attempt,
                                       f"{child.killed_because}; job process {pid} {how}; resume continues "
                                       "from the last checkpoint")
            elif state.cancel_requested:
                store.mark_cancelled(self.db, child.job_id, child.attempt,
                                     f"job process {pid} {how} after the cancel request", source="worker")
            else:
                hint = (" (by a user, or by the kernel when the host ran out of memory: then lower "
                        "batch_size or seq_len)") if code == -signal.SIGKILL else ""
                store.mark_interrupted(self.db, child.job_id, child.attempt,
                                       f"job process {pid} was {how}{hint}; resume continues from the last "
                                       "checkpoint")
        else:
            tail = _tail(child.run_dir / "runner.log")
            last = tail.splitlines()[-1] if tail else "(no output)"
            store.mark_failed(self.db, child.job_id, child.attempt,
                              f"the job process exited with code {code} without recording a result: {last}",
                              tail, source="worker")
        log.info("job %s: runner exited %s", child.job_id, code)

    def _watch_children(self) -> None:
        """Escalate unanswered cancels; kill children whose heartbeat stopped (hung processes)."""
        if not self.children:
            return
        now = time.monotonic()
        for job in store.running_jobs(self.db, worker_id=self.id):
            child = self.children.get(job.id)
            if child is None or child.killed_because:
                continue
            silent = (utcnow() - job.heartbeat_at).total_seconds() if job.heartbeat_at else 0.0
            if silent > self.options.stale_after:
                child.killed_because = (f"no heartbeat for {silent:.0f} s (limit {self.options.stale_after:g} s): "
                                        "the job process hung")
                signal_group(child.proc.pid, signal.SIGKILL)
                continue
            if job.cancel_requested_at is None:
                continue
            if child.cancel_seen is None:
                child.cancel_seen = now
            elif child.term_sent is None and now - child.cancel_seen >= self.options.cancel_grace:
                child.term_sent = now
                signal_group(child.proc.pid, signal.SIGTERM)
                store.add_event(self.db, job.id, f"no cooperative stop within {self.options.cancel_grace:g} s: "
                                "sent SIGTERM to the job's process group", source="worker", level="warning",
                                attempt=job.attempt)
            elif child.term_sent is not None and child.kill_sent is None and \
                    now - child.term_sent >= self.options.kill_grace:
                child.kill_sent = now
                signal_group(child.proc.pid, signal.SIGKILL)
                store.add_event(self.db, job.id, f"still alive {self.options.kill_grace:g} s after SIGTERM: sent "
                                "SIGKILL to the job's process group", source="worker", level="warning",
                                attempt=job.attempt)

    def _shutdown(self) -> None:
        if self.children:
            log.info("%s: stopping %d running job(s)", self._stop_reason, len(self.children))
        for child in self.children.values():
            child.killed_because = self._stop_reason
            signal_group(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.options.kill_grace
        while self.children and time.monotonic() < deadline:
            self._reap_children()
            time.sleep(0.05)
        for child in self.children.values():
            signal_group(child.proc.pid, signal.SIGKILL)
        while self.children:
            self._reap_children()
            time.sleep(0.05)

    # -- reconcile ----------------------------------------------------------------------------
    def reconcile(self) -> list[int]:
        """Mark abandoned ``running`` jobs ``interrupted``; returns their ids."""
        interrupted = []
        now = utcnow()
        for job in store.running_jobs(self.db):
            if job.id in self.children or job.worker_id == self.id:
                continue
            owner = parse_worker_id(job.worker_id)
            same_host = owner is not None and owner[0] == self.host
            owner_dead = owner is None or (same_host and not process_alive(owner[1], owner[2]))
            beat = job.heartbeat_at or job.started_at
            silent_for = (now - beat) if beat else timedelta.max
            stale = silent_for > timedelta(seconds=self.options.stale_after)
            if not (owner_dead or stale):
                continue
            alive = same_host and runner_alive(job.pid, job.id)
            if alive:
                signal_group(job.pgid, signal.SIGKILL)
            if owner_dead:
                gone = "was killed" if alive else "is gone"
                reason = (f"worker {job.worker_id} is no longer running; the job process {job.pid} {gone}; "
                          "resume continues from the last checkpoint")
            else:
                reason = (f"no heartbeat for {silent_for.total_seconds():.0f} s (limit {self.options.stale_after:g} "
                          "s): the job process hung or died; resume continues from the last checkpoint")
            if store.mark_interrupted(self.db, job.id, job.attempt, reason):
                log.warning("job %s interrupted: %s", job.id, reason)
                interrupted.append(job.id)
        return interrupted
