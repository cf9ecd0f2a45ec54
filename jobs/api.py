"""Python API of the job system: what the CLI and the Streamlit app call.

Every function takes keyword arguments ``workspace`` (folder; default ``--workspace`` /
``LOLCATS_WORKSPACE`` / ``./workspace``) and ``db_url`` (any SQLAlchemy URL; default the
workspace's ``workbench.db``), returns plain records of :mod:`jobs.records` (never ORM
objects), and raises :class:`jobs.errors.JobsError` subclasses with a message that names the
cause and the fix:

    submit_job(kind, config, *, name=None, priority=0) -> JobInfo
    submit_preset(preset, *, overrides=None, name=None, priority=0) -> JobInfo
    list_jobs(*, status=None, kind=None, limit=200) -> list[JobInfo]          # newest first
    get_job(job_id) -> JobInfo
    job_metrics(job_id, *, name=None, stage=None, after_id=0, limit=None) -> list[MetricPoint]
    latest_metrics(job_id) -> dict[str, float | None]                       # run-level metrics
    job_events(job_id, *, after_id=0, limit=None) -> list[EventInfo]
    job_report(job_id) -> dict | None
    cancel_job(job_id) -> JobInfo
    resume_job(job_id, config=None) -> JobInfo

A config is validated before anything is written: a bad value raises ConfigError naming the
field and nothing is queued.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from core.config import config_diff, current_names
from core.run_folder import REPORT_FILE
from core.workspace import runs_dir, safe_child
from jobs import store
from jobs.db import Database, open_db
from jobs.errors import ConfigError, InvalidTransition, ResumeConfigMismatch
from core.io import read_json
from jobs.kinds import get_kind, get_preset, kind_name
from jobs.models import RESUMABLE_STATES, Job, JobEvent, JobStatus, Metric
from jobs.records import EventInfo, JobInfo, MetricPoint, event_info, job_info, metric_point

PathLike = str | os.PathLike | None


def _db(workspace: PathLike, db_url: str | None) -> Database:
    return open_db(workspace, db_url)


def _check_name(name: str | None, root: Path) -> str | None:
    if name is None:
        return None
    name = str(name).strip()
    if not name:
        raise ConfigError("job", [("name", "must not be empty")])
    try:
        safe_child(runs_dir(root), name)
    except ValueError as exc:
        raise ConfigError("job", [("name", str(exc))]) from None
    return name


def submit_job(kind: str, config: dict[str, Any] | None = None, *, name: str | None = None, priority: int = 0,
               workspace: PathLike = None, db_url: str | None = None) -> JobInfo:
    """Validate ``config`` for ``kind`` and queue a job; its run folder is ``runs/<id>/``."""
    job_kind = get_kind(kind)
    db = _db(workspace, db_url)
    name = _check_name(name, db.workspace)
    normalized = job_kind.normalize(dict(config or {}), db.workspace)
    job_id = store.insert_job(db, job_kind.name, normalized, name=name, priority=int(priority))
    return get_job(job_id, workspace=db.workspace, db_url=db_url)


def submit_preset(preset: str, *, overrides: dict[str, Any] | None = None, name: str | None = None,
                  priority: int = 0, workspace: PathLike = None, db_url: str | None = None) -> JobInfo:
    p = get_preset(preset)
    return submit_job(p.kind, {**p.config, **(overrides or {})}, name=name or preset, priority=priority,
                      workspace=workspace, db_url=db_url)


def get_job(job_id: int, *, workspace: PathLike = None, db_url: str | None = None) -> JobInfo:
    db = _db(workspace, db_url)
    return db.read(lambda s: job_info(store.get_job_row(s, job_id), db.workspace), what=f"reading job {job_id}")


def list_jobs(*, status: str | Iterable[str] | None = None, kind: str | None = None, limit: int = 200,
              workspace: PathLike = None, db_url: str | None = None) -> list[JobInfo]:
    db = _db(workspace, db_url)
    stmt = select(Job).order_by(Job.id.desc()).limit(limit)
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        valid = [s.value for s in JobStatus]
        unknown = [s for s in statuses if s not in valid]
        if unknown:
            raise ConfigError("job list", [("status", f"unknown state {unknown[0]!r}; valid states: "
                                                      f"{', '.join(valid)}")])
        stmt = stmt.where(Job.status.in_([JobStatus(s) for s in statuses]))
    if kind is not None:
        stmt = stmt.where(Job.kind == kind_name(kind))
    return db.read(lambda s: [job_info(j, db.workspace) for j in s.scalars(stmt)], what="listing jobs")


def job_metrics(job_id: int, *, name: str | None = None, stage: str | None = None, after_id: int = 0,
                limit: int | None = None, workspace: PathLike = None, db_url: str | None = None) -> list[MetricPoint]:
    """Metric rows of a job in write order; ``after_id`` makes incremental polling cheap."""
    stmt = select(Metric).where(Metric.job_id == job_id, Metric.id > after_id).order_by(Metric.id)
    if name is not None:
        stmt = stmt.where(Metric.name == name)
    if stage is not None:
        stmt = stmt.where(Metric.stage == stage)
    if limit is not None:
        stmt = stmt.limit(limit)
    return _db(workspace, db_url).read(lambda s: [metric_point(m) for m in s.scalars(stmt)],
                                       what=f"reading metrics of job {job_id}")


def latest_metrics(job_id: int, *, workspace: PathLike = None, db_url: str | None = None) -> dict[str, float | None]:
    """The last reported value of every run-level (non-layer) metric of a job."""
    last = (select(Metric.name, func.max(Metric.id).label("id"))
            .where(Metric.job_id == job_id, Metric.layer.is_(None)).group_by(Metric.name).subquery())
    stmt = select(Metric.name, Metric.value).join(last, Metric.id == last.c.id).order_by(Metric.name)
    return _db(workspace, db_url).read(lambda s: {n: v for n, v in s.execute(stmt).all()},
                                       what=f"reading metrics of job {job_id}")


def job_events(job_id: int, *, after_id: int = 0, limit: int | None = None, workspace: PathLike = None,
               db_url: str | None = None) -> list[EventInfo]:
    stmt = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id).order_by(JobEvent.id)
    if limit is not None:
        stmt = stmt.limit(limit)
    return _db(workspace, db_url).read(lambda s: [event_info(e) for e in s.scalars(stmt)],
                                       what=f"reading events of job {job_id}")


def job_report(job_id: int, *, workspace: PathLike = None, db_url: str | None = None) -> dict | None:
    info = get_job(job_id, workspace=workspace, db_url=db_url)
    if info.result is not None:
        return info.result
    path = info.run_dir / REPORT_FILE if info.run_dir else None
    return read_json(path) if path and path.exists() else None


def cancel_job(job_id: int, *, workspace: PathLike = None, db_url: str | None = None) -> JobInfo:
    """Cancel a queued job now; ask a running one to stop at its next step (checkpoint kept).

    The worker escalates to SIGTERM, then SIGKILL, on the whole process group if it does not stop.
    """
    db = _db(workspace, db_url)
    store.request_cancel(db, job_id)
    return get_job(job_id, workspace=db.workspace, db_url=db_url)


def delete_job(job_id: int, *, keep_files: bool = False, workspace: PathLike = None, db_url: str | None = None) -> None:
    """Delete a job that is not queued or running, and its run folder unless ``keep_files``
    (:class:`InvalidTransition` for an active job: cancel it first). The database row goes first,
    so a folder that cannot be removed is left behind, never a job without its folder."""
    db = _db(workspace, db_url)
    run_dir = store.delete_job(db, job_id)
    if run_dir and not keep_files:
        shutil.rmtree(safe_child(db.workspace, run_dir), ignore_errors=True)


def rename_job(job_id: int, name: str | None, *, workspace: PathLike = None, db_url: str | None = None) -> JobInfo:
    """Give a job a new label (None or blank: none); the name rules of :func:`submit_job` apply."""
    db = _db(workspace, db_url)
    store.rename_job(db, job_id, _check_name(name, db.workspace) if name and str(name).strip() else None)
    return get_job(job_id, workspace=db.workspace, db_url=db_url)


def resume_job(job_id: int, config: dict[str, Any] | None = None, *, workspace: PathLike = None,
               db_url: str | None = None) -> JobInfo:
    """Requeue a failed, cancelled or interrupted job as attempt+1; it continues from its checkpoint.

    With ``config`` (a full config of the job's kind), only the kind's ``resume_safe`` fields may
    differ from the stored config (its former field names read as the current ones); any other
    difference raises ResumeConfigMismatch listing every changed field with its old and new value,
    and nothing changes.
    """
    db = _db(workspace, db_url)
    info = get_job(job_id, workspace=db.workspace, db_url=db_url)
    status = JobStatus(info.status)
    if status not in RESUMABLE_STATES:
        raise InvalidTransition(f"job {job_id} is {status.value}: only failed, cancelled or interrupted jobs can "
                                "be resumed" + (" (it is still in the queue or running)"
                                                if status in (JobStatus.QUEUED, JobStatus.RUNNING) else ""))
    new_config, note = None, ""
    if config is not None:
        kind = get_kind(info.kind)
        normalized = kind.normalize(dict(config), db.workspace)
        changes = config_diff(current_names(info.config), normalized)  # stored before a rename: as it reads now
        refused = [c for c in changes if c.field.split(".")[0] not in kind.resume_safe]
        if refused:
            raise ResumeConfigMismatch(job_id, refused)
        if changes:
            new_config = normalized
            note = "config changed: " + "; ".join(str(c) for c in changes)
    store.requeue(db, job_id, status, new_config, note)
    return get_job(job_id, workspace=db.workspace, db_url=db_url)
