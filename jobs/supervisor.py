"""The supervision loop every executor shares: claim queued jobs, watch the attempts started,
escalate cancels, kill hung attempts, judge runners that died without recording.

An executor (:class:`Executor`) is where a job's runner (``python -m jobs.runner <id>``) runs:
:class:`jobs.worker.LocalExecutor` starts one process group per job on this machine,
:class:`jobs.executors.ray_jobs.RayExecutor` one Ray job per attempt. The runner records its own
outcome in the job database; the loop (:class:`Supervisor`) does the rest, every ``poll_interval`` s:

  * polls every attempt, then reads the database. A runner records its outcome before it exits,
    so an attempt that ended while its job still reads ``running`` died without recording: the
    executor judges it (:meth:`Executor.judge`). Otherwise the executor only collects what is left
    (:meth:`Executor.collect`: Ray's logs);
  * an attempt whose job ended in the database but whose runner is still alive ``exit_grace``
    seconds later is terminated: the database wins (None: never);
  * an attempt still waiting for resources (Ray ``PENDING``) has no runner to beat or to stop
    itself: the loop refreshes its heartbeat, and a cancel terminates it at once;
  * a heartbeat older than ``stale_after`` seconds means a hung runner: the attempt is killed and
    judged ``interrupted`` with that reason;
  * cancel: the runner stops cooperatively at its next step (checkpoint kept); ``cancel_grace``
    seconds after the request the attempt is terminated (SIGTERM, Ray's ``stop_job``) and
    ``kill_grace`` seconds later killed (None: the executor's terminate escalates on its own);
  * reconcile, at start and every ``reconcile_every`` seconds: ``running`` jobs whose supervisor
    is gone or silent are the executor's to settle (:meth:`Executor.reconcile`: the local one marks
    them interrupted, the Ray one adopts them);
  * claims queued jobs, at most ``concurrency`` attempts at a time.

SIGTERM / SIGINT stop claiming. An executor that owns its processes (local) terminates them, kills
them ``kill_grace`` seconds later and they are judged ``interrupted`` (resumable); the others (Ray)
leave their jobs running for a restarted supervisor to adopt.

Supervisor ids are ``[prefix]host:pid:process-start-time``, so a reused pid is never taken for a
live supervisor.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
from sqlalchemy.exc import SQLAlchemyError

from jobs import store
from jobs.db import Database
from jobs.errors import JobsError
from jobs.models import JobStatus, utcnow

log = logging.getLogger("jobs.supervisor")


@dataclass
class SupervisorOptions:
    concurrency: int = 1
    poll_interval: float = 1.0  # seconds between looks at the queue and the attempts
    stale_after: float = 60.0  # a heartbeat older than this marks a job hung (or, for reconcile, abandoned)
    reconcile_every: float = 10.0
    cancel_grace: float = 10.0  # wait this long for a cooperative stop before terminating
    kill_grace: float | None = 5.0  # then this long before killing (None: terminate escalates by itself)
    exit_grace: float | None = None  # an attempt alive this long after its job ended in the database is terminated
    once: bool = False  # claim at most `concurrency` jobs, supervise them to the end, exit
    exit_when_idle: bool = False  # exit when nothing is queued and nothing runs


@dataclass(frozen=True)
class Poll:
    """What an executor says about one attempt."""

    ended: bool
    pending: bool = False  # started but waiting for resources: no runner yet
    exit: Any = None  # how it ended, for Executor.judge: an exit code (local), a Ray status (None: unknown)


ALIVE, PENDING = Poll(False), Poll(False, pending=True)


@dataclass
class Attempt:
    """One started attempt of a job, as the supervisor tracks it (times are ``time.monotonic()``)."""

    job_id: int
    attempt: int
    handle: Any  # the executor's: a Popen (local), a submission id (Ray)
    run_dir: Path
    cancel_seen: float | None = None
    term_sent: float | None = None
    kill_sent: float | None = None
    ended_seen: float | None = None  # when the database first said this attempt ended (runner still alive)
    killed_because: str | None = None  # set when the supervisor itself stops the job (shutdown, hang)


class Executor(Protocol):
    """Where runners run. ``terminate`` and ``kill`` return what they did, for the job's events."""

    id_prefix: str  # of the supervisor ids, so reconcile knows whose jobs it may settle
    owns_processes: bool  # True: the attempts stop with the supervisor; False: they keep running
    transient_errors: tuple[type[BaseException], ...]  # logged and retried by the loop, like database errors

    def describe(self) -> str: ...
    def start(self, db: Database, claim: store.Claim, supervisor_id: str) -> Any | None:
        """Start the runner of a claimed attempt; its handle, or None when it could not start (the
        executor recorded the failure)."""
    def poll(self, handle: Any) -> Poll: ...
    def terminate(self, handle: Any) -> str: ...
    def kill(self, handle: Any) -> str: ...
    def judge(self, db: Database, attempt: Attempt, exit: Any, cancel_requested: bool) -> None:
        """Record the outcome of an attempt that ended while its job still reads ``running``."""
    def collect(self, attempt: Attempt) -> None:
        """After an attempt whose runner recorded its own outcome ended."""
    def reconcile(self, supervisor: "Supervisor") -> list[int]:
        """Settle ``running`` jobs whose supervisor is gone or silent; returns their ids."""


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


def owner_gone(owner: tuple[str, int, int] | None, host: str) -> bool:
    """The supervisor ``owner`` (:func:`parse_worker_id`) ran on ``host`` and its process is gone."""
    return owner is not None and owner[0] == host and not process_alive(owner[1], owner[2])


class Supervisor:
    """The loop of the module docstring over one executor (``lolcats worker [--executor ray]``)."""

    def __init__(self, db: Database, options: SupervisorOptions, executor: Executor):
        self.db, self.options, self.executor = db, options, executor
        self.id = executor.id_prefix + make_worker_id()
        self.host = socket.gethostname()
        self.tracked: dict[int, Attempt] = {}
        self._stop_reason: str | None = None

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        """Supervise until stopped (or idle / done with exit_when_idle / once); returns 0."""
        previous = self._install_signal_handlers()
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _loop(self) -> int:
        log.info("supervisor %s started (%s, concurrency %d, workspace %s)", self.id, self.executor.describe(),
                 self.options.concurrency, self.db.workspace)
        self.reconcile()
        self._last_reconcile = time.monotonic()
        self._claimed = 0
        while True:
            try:
                if self._tick():
                    break
            except (JobsError, SQLAlchemyError, *self.executor.transient_errors) as exc:  # e.g. a database locked
                log.error("supervisor loop: %s; retrying", exc)  # for minutes: never abandon the running attempts
            time.sleep(self.options.poll_interval)
        log.info("supervisor %s exiting (%d jobs claimed)", self.id, self._claimed)
        return 0

    def _tick(self) -> bool:
        """One supervision pass; True when the supervisor should exit."""
        self.watch()
        if self._stop_reason:
            self._shutdown()
            return True
        if time.monotonic() - self._last_reconcile >= self.options.reconcile_every:
            self.reconcile()
            self._last_reconcile = time.monotonic()
        idle_queue = False
        while len(self.tracked) < self.options.concurrency and not self._stop_reason:
            if self.options.once and self._claimed >= self.options.concurrency:
                break
            if not self.claim_and_submit():
                idle_queue = True
                break
            self._claimed += 1
        if self.tracked:
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

    def _shutdown(self) -> None:
        if not self.tracked:
            return
        if not self.executor.owns_processes:
            log.info("%s: %d job(s) keep running (%s); a restarted supervisor adopts them", self._stop_reason,
                     len(self.tracked), ", ".join(str(a.handle) for a in self.tracked.values()))
            return
        log.info("%s: stopping %d running job(s)", self._stop_reason, len(self.tracked))
        for a in self.tracked.values():
            a.killed_because = self._stop_reason
            self.executor.terminate(a.handle)
        deadline = time.monotonic() + (self.options.kill_grace or 0.0)
        while self.tracked and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        for a in self.tracked.values():
            self.executor.kill(a.handle)
        while self.tracked:
            self._reap()
            time.sleep(0.05)

    # -- starting and judging attempts -----------------------------------------------------------
    def claim_and_submit(self) -> bool:
        """Claim the next queued job and start it on the executor; False when nothing is queued."""
        claim = store.claim_next_job(self.db, self.id)
        if claim is None:
            return False
        handle = self.executor.start(self.db, claim, self.id)
        if handle is not None:
            self.tracked[claim.job_id] = Attempt(claim.job_id, claim.attempt, handle, self.db.workspace / claim.run_dir)
        return True

    def _reap(self) -> None:
        for a in list(self.tracked.values()):
            poll = self.executor.poll(a.handle)
            if poll.ended:
                del self.tracked[a.job_id]
                self._judge_exit(a, poll.exit)

    def _judge_exit(self, a: Attempt, exit: Any) -> None:
        """An attempt ended: the runner recorded its outcome, else the executor judges it."""
        state = store.job_state(self.db, a.job_id)
        if state.status != JobStatus.RUNNING or state.attempt != a.attempt:
            self.executor.collect(a)
            log.info("job %s: attempt %s ended (%s), job %s", a.job_id, a.attempt, exit, state.status.value)
            return
        self.executor.judge(self.db, a, exit, state.cancel_requested)

    # -- watching -------------------------------------------------------------------------------
    def watch(self) -> None:
        """One pass over the tracked attempts (see the module docstring)."""
        if not self.tracked:
            return
        # The executor first, then the database: a runner records its outcome before it exits, so an
        # ended attempt whose job still reads `running` afterwards really died without recording.
        polls = {a.job_id: self.executor.poll(a.handle) for a in self.tracked.values()}
        running = {j.id: j for j in store.running_jobs(self.db) if j.id in self.tracked}
        now = time.monotonic()
        for a in list(self.tracked.values()):
            poll = polls[a.job_id]
            if poll.ended:
                del self.tracked[a.job_id]
                self._judge_exit(a, poll.exit)
                continue
            job = running.get(a.job_id)
            if job is None or job.attempt != a.attempt:  # ended in the database; the runner exits just after
                if self.options.exit_grace is not None:
                    a.ended_seen = a.ended_seen or now
                    if a.term_sent is None and now - a.ended_seen >= self.options.exit_grace:
                        a.term_sent = now
                        self.executor.terminate(a.handle)
                continue
            if poll.pending:
                store.heartbeat(self.db, a.job_id, a.attempt)
                if job.cancel_requested_at is not None and a.term_sent is None:
                    a.term_sent = now
                    self.executor.terminate(a.handle)
                continue
            if a.killed_because:
                continue
            silent = (utcnow() - job.heartbeat_at).total_seconds() if job.heartbeat_at else 0.0
            if silent > self.options.stale_after:
                a.killed_because = (f"no heartbeat for {silent:.0f} s (limit {self.options.stale_after:g} s): "
                                    "the job process hung")
                a.kill_sent = now
                self.executor.kill(a.handle)
                continue
            if job.cancel_requested_at is not None:
                self._escalate_cancel(a, now)

    def _escalate_cancel(self, a: Attempt, now: float) -> None:
        """Cancel requested: give the runner ``cancel_grace`` s, then terminate, then kill."""
        grace, kill_grace = self.options.cancel_grace, self.options.kill_grace
        if a.cancel_seen is None:
            a.cancel_seen = now
        elif a.term_sent is None and now - a.cancel_seen >= grace:
            a.term_sent = now
            done = self.executor.terminate(a.handle)
            store.add_event(self.db, a.job_id, f"no cooperative stop within {grace:g} s: {done}", source="worker",
                            level="warning", attempt=a.attempt)
        elif a.term_sent is not None and a.kill_sent is None and kill_grace is not None and \
                now - a.term_sent >= kill_grace:
            a.kill_sent = now
            done = self.executor.kill(a.handle)
            store.add_event(self.db, a.job_id, f"still alive {kill_grace:g} s after the stop: {done}",
                            source="worker", level="warning", attempt=a.attempt)

    # -- reconcile ----------------------------------------------------------------------------
    def reconcile(self) -> list[int]:
        """Settle ``running`` jobs of supervisors that are gone or silent; returns their ids."""
        return self.executor.reconcile(self)
