"""Every job state transition, as a compare-and-set UPDATE.

Contract:
  * A transition is ``UPDATE jobs SET ... WHERE id = :id AND status = :expected [AND ...]`` and
    succeeds only when it changed exactly one row; the functions return ``True``/``False`` (or
    raise :class:`InvalidTransition` for user requests). Two processes can therefore never both
    move a job out of the same state: in particular :func:`claim_next_job` hands each queued job
    to exactly one worker, on SQLite and on PostgreSQL alike.
  * Transitions that end a run also match ``attempt``, so a late message from an old run of a
    resumed job can never overwrite the new run.
  * Each function is one short transaction through :meth:`Database.write` (lock-retried).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from jobs.db import Database
from jobs.errors import InvalidTransition, JobNotFound
from jobs.models import RESUMABLE_STATES, Job, JobEvent, JobStatus, Metric, utcnow

Q, R = JobStatus.QUEUED, JobStatus.RUNNING
_NO_SYNC = {"synchronize_session": False}


def _cas(session: Session, job_id: int, expected: JobStatus | frozenset[JobStatus], values: dict[str, Any],
         **match: Any) -> bool:
    """UPDATE the job if it is in ``expected`` (and matches ``match``); True if one row changed."""
    stmt = update(Job).where(Job.id == job_id)
    if isinstance(expected, JobStatus):
        stmt = stmt.where(Job.status == expected)
    else:
        stmt = stmt.where(Job.status.in_(list(expected)))
    for column, value in match.items():
        stmt = stmt.where(getattr(Job, column) == value)
    result = session.execute(stmt.values(**values).execution_options(**_NO_SYNC))
    return result.rowcount == 1


def _event(session: Session, job_id: int, message: str, *, source: str, level: str = "info",
           attempt: int = 0) -> None:
    session.add(JobEvent(job_id=job_id, attempt=attempt, time=utcnow(), level=level, source=source,
                         message=message))


def add_event(db: Database, job_id: int, message: str, *, source: str, level: str = "info",
              attempt: int = 0) -> None:
    db.write(lambda s: _event(s, job_id, message, source=source, level=level, attempt=attempt),
             what=f"logging an event of job {job_id}")


def insert_job(db: Database, kind: str, config: dict[str, Any], *, name: str | None = None,
               priority: int = 0) -> int:
    """Queue a job whose config was already validated; returns its id."""

    def txn(s: Session) -> int:
        job = Job(kind=kind, name=name, config=config, status=Q, priority=priority, created_at=utcnow(),
                  attempt=1)
        s.add(job)
        s.flush()
        job.run_dir = f"runs/{job.id}"
        _event(s, job.id, f"submitted ({kind})", source="api", attempt=1)
        return job.id

    return db.write(txn, what="queueing a job")


@dataclass(frozen=True)
class Claim:
    job_id: int
    attempt: int
    run_dir: str  # relative to the workspace


def claim_next_job(db: Database, worker_id: str) -> Claim | None:
    """Move the next queued job (highest priority, then oldest) to ``running`` for this worker.

    Returns the :class:`Claim`, or None when nothing is queued. The claim itself is the
    conditional UPDATE ``... WHERE id = ? AND status = 'queued'``: a candidate another worker took
    first changes no row and is skipped. An idle queue costs one read, no write lock.
    """
    candidates_stmt = (select(Job.id).where(Job.status == Q).order_by(Job.priority.desc(), Job.id).limit(8))
    if not db.read(lambda s: s.scalars(candidates_stmt).all(), what="looking for queued jobs"):
        return None

    def txn(s: Session) -> Claim | None:
        for job_id in s.scalars(candidates_stmt).all():
            now = utcnow()
            values = dict(status=R, worker_id=worker_id, started_at=now, heartbeat_at=now, finished_at=None,
                          pid=None, pgid=None, status_reason=None)
            if _cas(s, job_id, Q, values):
                attempt, run_dir = s.execute(select(Job.attempt, Job.run_dir).where(Job.id == job_id)).one()
                _event(s, job_id, f"claimed by worker {worker_id}", source="worker", attempt=attempt)
                return Claim(job_id, attempt, run_dir or f"runs/{job_id}")
        return None

    return db.write(txn, what="claiming a job")


@dataclass(frozen=True)
class JobState:
    status: JobStatus
    attempt: int
    cancel_requested: bool


def job_state(db: Database, job_id: int) -> JobState:
    def txn(s: Session) -> JobState:
        row = s.execute(select(Job.status, Job.attempt, Job.cancel_requested_at).where(Job.id == job_id)).one_or_none()
        if row is None:
            raise JobNotFound(job_id)
        return JobState(JobStatus(row[0]), row[1], row[2] is not None)

    return db.read(txn, what=f"reading the state of job {job_id}")


def set_process(db: Database, job_id: int, worker_id: str, pid: int, pgid: int) -> bool:
    def txn(s: Session) -> bool:
        ok = _cas(s, job_id, R, dict(pid=pid, pgid=pgid, heartbeat_at=utcnow()), worker_id=worker_id)
        if ok:
            _event(s, job_id, f"runner process {pid} started (process group {pgid})", source="worker",
                   attempt=_attempt(s, job_id))
        return ok

    return db.write(txn, what=f"recording the process of job {job_id}")


def _attempt(s: Session, job_id: int) -> int:
    return s.scalar(select(Job.attempt).where(Job.id == job_id)) or 0


@dataclass(frozen=True)
class Beat:
    """Answer to a heartbeat: is the run still ours, and was a cancel requested?"""

    owned: bool
    cancel_requested: bool


def heartbeat(db: Database, job_id: int, attempt: int, *, stage: str | None = None, step: int | None = None,
              total: int | None = None, metrics: dict[str, float] | None = None,
              layer_metrics: dict[int, dict[str, float]] | None = None) -> Beat:
    """Refresh the heartbeat of a running attempt; with ``stage``, also its progress columns and
    one metric row per metric / layer metric (written only while the attempt owns the job)."""

    def txn(s: Session) -> Beat:
        values: dict[str, Any] = {"heartbeat_at": utcnow()}
        if stage is not None:
            values.update(progress_stage=stage, progress_step=step, progress_total=total)
        owned = _cas(s, job_id, R, values, attempt=attempt)
        if owned and stage is not None and (metrics or layer_metrics):
            # Rows are built inside the transaction so that a lock retry starts from fresh objects.
            s.add_all(metric_rows(job_id, attempt, stage, step or 0, metrics or {}, layer_metrics))
        cancel = s.scalar(select(Job.cancel_requested_at).where(Job.id == job_id)) is not None
        return Beat(owned, cancel)

    return db.write(txn, what=f"recording progress of job {job_id}")


def metric_rows(job_id: int, attempt: int, stage: str, step: int, metrics: dict[str, float],
                layer_metrics: dict[int, dict[str, float]] | None) -> list[Metric]:
    now = utcnow()

    def value(v: Any) -> float | None:
        v = float(v)
        return v if math.isfinite(v) else None

    rows = [Metric(job_id=job_id, attempt=attempt, stage=stage, step=step, layer=None, name=k, value=value(v),
                   time=now) for k, v in metrics.items()]
    for layer, per_layer in (layer_metrics or {}).items():
        rows += [Metric(job_id=job_id, attempt=attempt, stage=stage, step=step, layer=int(layer), name=k,
                        value=value(v), time=now) for k, v in per_layer.items()]
    return rows


def finish(db: Database, job_id: int, attempt: int, status: JobStatus, *, reason: str | None = None,
           error: str | None = None, log_tail: str | None = None, result: dict | None = None,
           source: str = "runner", timeout: float | None = None) -> bool:
    """End the running ``attempt`` with ``status`` (CAS from running); False if it was not running."""
    assert status.is_terminal, status

    def txn(s: Session) -> bool:
        values: dict[str, Any] = dict(status=status, finished_at=utcnow(), status_reason=reason)
        if error is not None:
            values["error"] = error
        if log_tail is not None:
            values["log_tail"] = log_tail
        if result is not None:
            values["result"] = result
        ok = _cas(s, job_id, R, values, attempt=attempt)
        if ok:
            message = status.value + (f": {reason}" if reason else "") + (f" - {error}" if error else "")
            level = "info" if status in (JobStatus.SUCCEEDED, JobStatus.CANCELLED) else "error"
            _event(s, job_id, message, source=source, level=level, attempt=attempt)
        return ok

    return db.write(txn, what=f"finishing job {job_id}", timeout=timeout)


def mark_succeeded(db: Database, job_id: int, attempt: int, result: dict) -> bool:
    return finish(db, job_id, attempt, JobStatus.SUCCEEDED, result=result)


def mark_failed(db: Database, job_id: int, attempt: int, error: str, log_tail: str | None = None,
                source: str = "runner") -> bool:
    return finish(db, job_id, attempt, JobStatus.FAILED, error=error, log_tail=log_tail, source=source)


def mark_cancelled(db: Database, job_id: int, attempt: int, reason: str, source: str = "runner") -> bool:
    return finish(db, job_id, attempt, JobStatus.CANCELLED, reason=reason, source=source)


def mark_interrupted(db: Database, job_id: int, attempt: int, reason: str, source: str = "worker",
                     timeout: float | None = None) -> bool:
    return finish(db, job_id, attempt, JobStatus.INTERRUPTED, reason=reason, source=source, timeout=timeout)


def request_cancel(db: Database, job_id: int) -> JobStatus:
    """Cancel a queued job at once, or flag a running one for a cooperative stop.

    Returns the status afterwards (``cancelled`` or ``running`` with the request recorded).
    """

    def txn(s: Session) -> JobStatus:
        job = s.get(Job, job_id)
        if job is None:
            raise JobNotFound(job_id)
        now = utcnow()
        if _cas(s, job_id, Q, dict(status=JobStatus.CANCELLED, finished_at=now, cancel_requested_at=now,
                                   status_reason="cancelled before it started")):
            _event(s, job_id, "cancelled before it started", source="api", attempt=job.attempt)
            return JobStatus.CANCELLED
        if _cas(s, job_id, R, dict(cancel_requested_at=now)):
            _event(s, job_id, "cancel requested: the job stops at its next step, with a checkpoint",
                   source="api", attempt=job.attempt)
            return JobStatus.RUNNING
        raise InvalidTransition(f"job {job_id} is {JobStatus(job.status).value}: only queued or running jobs "
                                "can be cancelled")

    return db.write(txn, what=f"cancelling job {job_id}")


def delete_job(db: Database, job_id: int) -> str | None:
    """Remove a finished job (succeeded, failed, cancelled or interrupted) with its metrics and
    events; returns its run folder (relative to the workspace). A queued or running job is refused."""
    def txn(s: Session) -> str | None:
        job = s.get(Job, job_id)
        if job is None:
            raise JobNotFound(job_id)
        if job.status in (Q, R):
            raise InvalidTransition(f"job {job_id} is {JobStatus(job.status).value}: cancel it before deleting it")
        run_dir = job.run_dir
        s.execute(delete(Metric).where(Metric.job_id == job_id))
        s.execute(delete(JobEvent).where(JobEvent.job_id == job_id))
        s.delete(job)
        return run_dir

    return db.write(txn, what=f"deleting job {job_id}")


def rename_job(db: Database, job_id: int, name: str | None) -> None:
    """Set a job's label (None: no name)."""

    def txn(s: Session) -> None:
        job = s.get(Job, job_id)
        if job is None:
            raise JobNotFound(job_id)
        job.name = name
        _event(s, job_id, f"renamed to {name!r}" if name else "name removed", source="api", attempt=job.attempt)

    db.write(txn, what=f"renaming job {job_id}")


def requeue(db: Database, job_id: int, expected: JobStatus, config: dict[str, Any] | None,
            note: str) -> int:
    """Put a finished-but-resumable job back in the queue as attempt+1; returns the new attempt."""
    if expected not in RESUMABLE_STATES:
        raise InvalidTransition(f"job {job_id} is {expected.value}: only failed, cancelled or interrupted jobs "
                                "can be resumed")

    def txn(s: Session) -> int:
        job = s.get(Job, job_id)
        if job is None:
            raise JobNotFound(job_id)
        attempt = job.attempt + 1
        values: dict[str, Any] = dict(status=Q, attempt=attempt, cancel_requested_at=None, finished_at=None,
                                      started_at=None, worker_id=None, pid=None, pgid=None, heartbeat_at=None,
                                      error=None, log_tail=None, status_reason=None, result=None)
        if config is not None:
            values["config"] = config
        if not _cas(s, job_id, expected, values, attempt=job.attempt):
            now_status = JobStatus(s.scalar(select(Job.status).where(Job.id == job_id))).value
            raise InvalidTransition(f"job {job_id} changed state while resuming (now {now_status}); try again")
        _event(s, job_id, f"resumed: queued as attempt {attempt}" + (f" ({note})" if note else ""), source="api",
               attempt=attempt)
        return attempt

    return db.write(txn, what=f"resuming job {job_id}")


@dataclass(frozen=True)
class RunningJob:
    """What the worker needs to judge a running job."""

    id: int
    attempt: int
    worker_id: str | None
    pid: int | None
    pgid: int | None
    heartbeat_at: datetime | None
    started_at: datetime | None
    cancel_requested_at: datetime | None

    def silent_seconds(self, now: datetime) -> float:
        """Seconds since the job last showed life (its heartbeat, else its start); inf when it never did."""
        beat = self.heartbeat_at or self.started_at
        return (now - beat).total_seconds() if beat else math.inf


def running_jobs(db: Database, worker_id: str | None = None) -> list[RunningJob]:
    def txn(s: Session) -> list[RunningJob]:
        stmt = select(Job.id, Job.attempt, Job.worker_id, Job.pid, Job.pgid, Job.heartbeat_at, Job.started_at,
                      Job.cancel_requested_at).where(Job.status == R)
        if worker_id is not None:
            stmt = stmt.where(Job.worker_id == worker_id)
        return [RunningJob(*row) for row in s.execute(stmt.order_by(Job.id)).all()]

    return db.read(txn, what="listing running jobs")


def get_job_row(s: Session, job_id: int) -> Job:
    job = s.get(Job, job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job
