"""SQLAlchemy tables of the job system.

Contract:
  * ``Job`` is one submitted unit of work. ``config`` holds the *validated* config of its kind
    (defaults filled in, JSON-serialisable), so any job can be replayed. ``status`` only moves
    along ``queued -> running -> succeeded | failed | cancelled | interrupted`` (and back to
    ``queued`` on resume), always through a compare-and-set UPDATE in :mod:`jobs.store`.
  * ``Metric`` is one number reported by a job step (``layer`` set for per-layer metrics).
  * ``JobEvent`` is one human-readable line: lifecycle events and the job's own log messages.
  * ``SchemaVersion`` holds a single row with the schema version (see :mod:`jobs.db`).

Times are naive UTC datetimes. ORM objects stay inside ``jobs``; callers outside get the plain
dataclasses of :mod:`jobs.api`.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone

from sqlalchemy import JSON, DateTime, Enum, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    """Naive UTC now (SQLite has no time zones; every stored time is UTC)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED}
)
# States from which `resume` may requeue a job (a succeeded job has nothing left to do).
RESUMABLE_STATES = frozenset({JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED})


# Kind names jobs were stored under before the kinds took their commands' names (`lolcats bench`,
# `lolcats eval`): the schema upgrade to version 2 renames them, and the API still accepts them.
FORMER_KIND_NAMES = {"benchmark": "bench", "evaluate": "eval"}


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_priority", "status", "priority", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(200))  # optional user label
    config: Mapped[dict] = mapped_column(JSON)  # validated config of `kind`, defaults filled in
    # Stored as the enum *value* in a VARCHAR (no native enum type), so new states never need
    # an ALTER TYPE on PostgreSQL.
    status: Mapped[JobStatus] = mapped_column(
        Enum(JobStatus, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e],
             validate_strings=True),
        default=JobStatus.QUEUED,
    )
    priority: Mapped[int] = mapped_column(Integer, default=0)  # higher runs first, then FIFO
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # 1 on first run, +1 per resume
    worker_id: Mapped[str | None] = mapped_column(String(200))  # "host:pid:start-time"
    pid: Mapped[int | None] = mapped_column(Integer)  # runner process
    pgid: Mapped[int | None] = mapped_column(Integer)  # its process group (== pid)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime)
    status_reason: Mapped[str | None] = mapped_column(Text)  # why interrupted / cancelled
    error: Mapped[str | None] = mapped_column(Text)  # one clear message: cause and fix
    log_tail: Mapped[str | None] = mapped_column(Text)  # traceback / last log lines
    run_dir: Mapped[str | None] = mapped_column(String(500))  # relative to the workspace
    progress_stage: Mapped[str | None] = mapped_column(String(64))
    progress_step: Mapped[int | None] = mapped_column(Integer)
    progress_total: Mapped[int | None] = mapped_column(Integer)
    result: Mapped[dict | None] = mapped_column(JSON)  # the run function's report


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    stage: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(Integer)
    layer: Mapped[int | None] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    value: Mapped[float | None] = mapped_column(Float)  # NULL when the reported value was not finite
    time: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    time: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    level: Mapped[str] = mapped_column(String(16), default="info")  # info | warning | error
    source: Mapped[str] = mapped_column(String(16))  # api | worker | runner | job
    message: Mapped[str] = mapped_column(Text)


class SchemaVersion(Base):
    __tablename__ = "schema_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)  # always 1: a single row
    version: Mapped[int] = mapped_column(Integer)
