"""Plain records returned by :mod:`jobs.api`: no ORM object leaves the job system.

All times are naive UTC datetimes. ``JobInfo.run_dir`` is an absolute path in the caller's
workspace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jobs.models import Job, JobEvent, JobStatus, Metric


@dataclass(frozen=True)
class JobInfo:
    id: int
    kind: str
    name: str | None
    status: str  # a JobStatus value
    priority: int
    config: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempt: int
    worker_id: str | None
    pid: int | None
    pgid: int | None
    heartbeat_at: datetime | None
    cancel_requested: bool
    status_reason: str | None
    error: str | None
    log_tail: str | None
    run_dir: Path | None
    progress_stage: str | None
    progress_step: int | None
    progress_total: int | None
    result: dict[str, Any] | None

    @property
    def is_terminal(self) -> bool:
        return JobStatus(self.status).is_terminal

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir) if self.run_dir else None
        return data


@dataclass(frozen=True)
class MetricPoint:
    id: int
    attempt: int
    stage: str
    step: int
    layer: int | None
    name: str
    value: float | None  # None when the job reported a non-finite value
    time: datetime


@dataclass(frozen=True)
class EventInfo:
    id: int
    attempt: int
    time: datetime
    level: str
    source: str
    message: str


def job_info(job: Job, workspace: Path) -> JobInfo:
    return JobInfo(
        id=job.id,
        kind=job.kind,
        name=job.name,
        status=JobStatus(job.status).value,
        priority=job.priority,
        config=dict(job.config or {}),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempt=job.attempt,
        worker_id=job.worker_id,
        pid=job.pid,
        pgid=job.pgid,
        heartbeat_at=job.heartbeat_at,
        cancel_requested=job.cancel_requested_at is not None,
        status_reason=job.status_reason,
        error=job.error,
        log_tail=job.log_tail,
        run_dir=(workspace / job.run_dir) if job.run_dir else None,
        progress_stage=job.progress_stage,
        progress_step=job.progress_step,
        progress_total=job.progress_total,
        result=dict(job.result) if job.result is not None else None,
    )


def metric_point(m: Metric) -> MetricPoint:
    return MetricPoint(m.id, m.attempt, m.stage, m.step, m.layer, m.name, m.value, m.time)


def event_info(e: JobEvent) -> EventInfo:
    return EventInfo(e.id, e.attempt, e.time, e.level, e.source, e.message)
