"""Commands of the ``jobs`` layer for the ``lolcats`` CLI.

    lolcats jobs submit [CONFIG.yaml] [--preset NAME] [--kind KIND] [--name N] [--priority P] [--set a.b=v ...]
    lolcats jobs list [--status S] [--kind K] [--limit N]
    lolcats jobs show ID
    lolcats jobs logs ID [--follow]
    lolcats jobs cancel ID
    lolcats jobs resume ID [--config CONFIG.yaml]
    lolcats worker [--concurrency N] [--once | --exit-when-idle] [--poll-interval S]
                   [--executor local|ray] [--ray-address http://HEAD:8265] [--ray-num-gpus G]

Every command takes ``--workspace`` (else ``LOLCATS_WORKSPACE``, else ``./workspace``) and
``--db-url`` (else ``LOLCATS_DB_URL``, else the workspace's ``workbench.db``). A config file is a
YAML mapping: optional ``kind``, ``name``, ``priority`` and ``preset`` (the base preset) keys, and
the config fields either under ``config:`` or at top level. User errors print one line (cause and fix) and exit 1.
``python -m jobs`` runs the same commands without the rest of the ``lolcats`` app.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from core.cli.common import PRESET_HELP, SET_HELP, WorkspaceOpt, cli_errors
from core.config import apply_overrides, current_names, deep_merge, read_yaml_mapping
from core.config.loading import PRESET_KEY, base_preset
from jobs import api
from jobs.errors import ConfigError, JobsError
from jobs.kinds import JOB_KINDS, get_preset, kind_name

console = Console()

jobs_app = typer.Typer(name="jobs", help="Submit, watch, cancel and resume jobs.", no_args_is_help=True,
                       add_completion=False)

DbUrlOpt = typer.Option(None, "--db-url", envvar="LOLCATS_DB_URL", help="SQLAlchemy URL of the job database.")

_user_errors = cli_errors(JobsError)  # a JobsError (or a core user error) is one line and exit status 1


def _local(dt: datetime | None) -> str:
    if dt is None:
        return "-"
    return dt.replace(tzinfo=timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _config_section(data: dict[str, Any], kind: str) -> dict[str, Any]:
    """The config fields of a loaded file: under ``config:`` or, without it, the top level."""
    if "config" not in data:
        return data
    config = data.pop("config")
    if data:
        raise ConfigError(kind, [(k, "unexpected top-level key next to `config:`") for k in data])
    if not isinstance(config, dict):
        raise ConfigError(kind, [("config", "must be a mapping of field names to values")])
    return config


def _job_kind(option: str | None, from_file: str | None, from_preset: str | None, config_file: Path | None,
              preset: str | None) -> str:
    """The one kind that ``--kind``, the file's ``kind:`` and the base preset agree on (former
    kind names read as the kinds' current ones)."""
    option, from_file = (None if k is None else kind_name(k) for k in (option, from_file))
    if option is not None and from_file is not None and option != from_file:
        raise ConfigError("job", [("kind", f"--kind {option} disagrees with kind: {from_file} in {config_file}")])
    given = option or from_file
    if given is not None and from_preset is not None and given != from_preset:
        raise ConfigError("job", [("--kind", f"preset {preset!r} is a {from_preset} job, not {given}")])
    kind = given or from_preset
    if kind is None:
        raise ConfigError("job", [("kind", f"missing: add `kind:` to {config_file} or pass --kind "
                                           f"({', '.join(sorted(JOB_KINDS))})")])
    return kind


@jobs_app.command("submit")
@_user_errors
def submit(
    config_file: Optional[Path] = typer.Argument(None, help="YAML config file (may name its base `preset:`)."),
    preset: Optional[str] = typer.Option(None, "--preset", help=PRESET_HELP),
    kind: Optional[str] = typer.Option(None, "--kind", help=f"Job kind ({', '.join(sorted(JOB_KINDS))})."),
    name: Optional[str] = typer.Option(None, "--name", help="Run name (a label; must stay inside the workspace)."),
    priority: Optional[int] = typer.Option(None, "--priority", help="Higher runs first (default 0)."),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
    workspace: Optional[Path] = WorkspaceOpt,
    db_url: Optional[str] = DbUrlOpt,
) -> None:
    """Validate a config and queue a job (nothing is queued if the config is invalid).

    The config is the preset (``--preset`` or the file's ``preset:``, which must agree), then the
    file's fields, then every ``--set``.
    """
    if config_file is None and preset is None:
        raise ConfigError("job", [("config", "give a CONFIG.yaml file, --preset NAME, or both "
                                             "(the file's fields override the preset)")])
    data = read_yaml_mapping(config_file) if config_file is not None else {}
    preset = base_preset(data.pop(PRESET_KEY, None), preset, config_file)
    base = get_preset(preset) if preset is not None else None
    job_kind = _job_kind(kind, data.pop("kind", None), base and base.kind, config_file, preset)
    file_name, file_priority = data.pop("name", None), data.pop("priority", None)
    config = deep_merge(base.config if base else {}, current_names(_config_section(data, job_kind)))
    config = apply_overrides(config, sets)
    priority = priority if priority is not None else int(file_priority or 0)
    info = api.submit_job(job_kind, config, name=name or file_name or preset, priority=priority,
                          workspace=workspace, db_url=db_url)
    console.print(f"queued job {info.id} ({info.kind}); run folder {info.run_dir}", highlight=False)


def _status_style(status: str) -> str:
    return {"queued": "cyan", "running": "yellow", "succeeded": "green", "failed": "red",
            "cancelled": "magenta", "interrupted": "bright_red"}.get(status, "white")


def _progress(info: api.JobInfo) -> str:
    if info.progress_step is None:
        return "-"
    total = f"/{info.progress_total}" if info.progress_total else ""
    return f"{info.progress_stage} {info.progress_step}{total}"


@jobs_app.command("list")
@_user_errors
def list_(
    status: Optional[list[str]] = typer.Option(None, "--status", help="Only these states (repeatable)."),
    kind: Optional[str] = typer.Option(None, "--kind"),
    limit: int = typer.Option(50, "--limit"),
    workspace: Optional[Path] = WorkspaceOpt,
    db_url: Optional[str] = DbUrlOpt,
) -> None:
    """List jobs, newest first."""
    jobs = api.list_jobs(status=status or None, kind=kind, limit=limit, workspace=workspace, db_url=db_url)
    table = Table(title=f"{len(jobs)} job(s)")
    for col in ("id", "kind", "status", "step", "try", "created"):
        table.add_column(col, no_wrap=True)
    table.add_column("name", overflow="fold")
    table.add_column("note", overflow="fold", ratio=1)
    for j in jobs:
        note = j.error or j.status_reason or ("cancel requested" if j.cancel_requested and not j.is_terminal else "")
        note = (note[:120] + "...") if len(note) > 120 else note
        step = "-" if j.progress_step is None else f"{j.progress_step}/{j.progress_total or '?'}"
        table.add_row(str(j.id), j.kind, f"[{_status_style(j.status)}]{j.status}[/]", step, str(j.attempt),
                      _local(j.created_at)[5:16], escape(j.name or ""), escape(note))
    console.print(table)


@jobs_app.command("show")
@_user_errors
def show(job_id: int = typer.Argument(...), workspace: Optional[Path] = WorkspaceOpt,
         db_url: Optional[str] = DbUrlOpt) -> None:
    """Show one job: state, config, latest metrics, error."""
    j = api.get_job(job_id, workspace=workspace, db_url=db_url)
    table = Table(title=f"job {j.id}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [("kind", j.kind), ("name", escape(j.name or "")), ("status", f"[{_status_style(j.status)}]{j.status}[/]"),
            ("reason", escape(j.status_reason or "")), ("attempt", str(j.attempt)), ("priority", str(j.priority)),
            ("progress", _progress(j)), ("created", _local(j.created_at)), ("started", _local(j.started_at)),
            ("finished", _local(j.finished_at)), ("heartbeat", _local(j.heartbeat_at)),
            ("worker", j.worker_id or ""), ("pid / pgid", f"{j.pid or '-'} / {j.pgid or '-'}"),
            ("cancel requested", "yes" if j.cancel_requested else "no"), ("run folder", escape(str(j.run_dir or ""))),
            ("config", escape(yaml.safe_dump(j.config, sort_keys=False).strip()))]
    metrics = api.latest_metrics(job_id, workspace=workspace, db_url=db_url)
    if metrics:
        rows.append(("latest metrics", ", ".join(f"{k}={v:.6g}" if v is not None else f"{k}=non-finite"
                                                 for k, v in metrics.items())))
    if j.result is not None:
        rows.append(("result", escape(yaml.safe_dump(j.result, sort_keys=False).strip())))
    if j.error:
        rows.append(("error", f"[red]{escape(j.error)}[/red]"))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    if j.log_tail:
        console.print("[bold]log tail[/bold]")
        console.print(j.log_tail, markup=False, highlight=False)


def _print_event(e) -> None:
    style = {"error": "red", "warning": "yellow"}.get(e.level, "")
    line = escape(f"{_local(e.time)} [{e.source}#{e.attempt}] {e.message}")
    console.print(f"[{style}]{line}[/]" if style else line, highlight=False, soft_wrap=True)


@jobs_app.command("logs")
@_user_errors
def logs(
    job_id: int = typer.Argument(...),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    poll: float = typer.Option(0.5, "--poll", help="Seconds between polls with --follow."),
    workspace: Optional[Path] = WorkspaceOpt,
    db_url: Optional[str] = DbUrlOpt,
) -> None:
    """Print a job's events and log lines."""
    last = 0
    while True:
        info = api.get_job(job_id, workspace=workspace, db_url=db_url)  # read before events: no line is missed
        for e in api.job_events(job_id, after_id=last, workspace=workspace, db_url=db_url):
            _print_event(e)
            last = e.id
        if not follow or info.is_terminal:
            break
        time.sleep(poll)
    if info.log_tail and info.status == "failed":
        console.print(info.log_tail, markup=False, highlight=False)


@jobs_app.command("cancel")
@_user_errors
def cancel(job_id: int = typer.Argument(...), workspace: Optional[Path] = WorkspaceOpt,
           db_url: Optional[str] = DbUrlOpt) -> None:
    """Cancel a queued job, or stop a running one at its next step (checkpoint kept)."""
    j = api.cancel_job(job_id, workspace=workspace, db_url=db_url)
    if j.status == "cancelled":
        console.print(f"job {job_id} cancelled")
    else:
        console.print(f"job {job_id}: cancel requested; it stops at its next step (the worker kills it if it "
                      "does not)")


@jobs_app.command("delete")
@_user_errors
def delete(job_id: int = typer.Argument(...),
           keep_files: bool = typer.Option(False, "--keep-files", help="Keep the job's run folder."),
           yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
           workspace: Optional[Path] = WorkspaceOpt, db_url: Optional[str] = DbUrlOpt) -> None:
    """Delete a finished job with its logs and metrics, and its run folder unless --keep-files."""
    info = api.get_job(job_id, workspace=workspace, db_url=db_url)
    what = "" if keep_files else f" and its folder {info.run_dir}"
    if not yes and not typer.confirm(f"Delete job {job_id} ({info.kind}, {info.status}){what}?"):
        raise typer.Exit(1)
    api.delete_job(job_id, keep_files=keep_files, workspace=workspace, db_url=db_url)
    console.print(f"job {job_id} deleted{what}")


@jobs_app.command("rename")
@_user_errors
def rename(job_id: int = typer.Argument(...), name: str = typer.Argument(..., help="New name ('' removes it)."),
           workspace: Optional[Path] = WorkspaceOpt, db_url: Optional[str] = DbUrlOpt) -> None:
    """Give a job a new name."""
    j = api.rename_job(job_id, name, workspace=workspace, db_url=db_url)
    console.print(f"job {job_id} is now named {j.name!r}" if j.name else f"job {job_id} has no name")


@jobs_app.command("resume")
@_user_errors
def resume(
    job_id: int = typer.Argument(...),
    config_file: Optional[Path] = typer.Option(None, "--config", help="Full config to resume with (checked)."),
    workspace: Optional[Path] = WorkspaceOpt,
    db_url: Optional[str] = DbUrlOpt,
) -> None:
    """Requeue a failed, cancelled or interrupted job; it continues from its last checkpoint."""
    config = None
    if config_file is not None:
        data = read_yaml_mapping(config_file)
        for key in ("kind", "name", "priority"):
            data.pop(key, None)
        config = _config_section(data, "job")
    j = api.resume_job(job_id, config, workspace=workspace, db_url=db_url)
    console.print(f"job {job_id} queued again as attempt {j.attempt}")


def worker(
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, help="Jobs run at the same time."),
    once: bool = typer.Option(False, "--once", help="Run at most CONCURRENCY queued jobs, then exit."),
    exit_when_idle: bool = typer.Option(False, "--exit-when-idle", help="Exit when nothing is queued or running."),
    poll_interval: float = typer.Option(1.0, "--poll-interval", min=0.01, help="Seconds between queue polls."),
    stale_after: float = typer.Option(60.0, "--stale-after", help="Heartbeat age that marks a job interrupted."),
    cancel_grace: float = typer.Option(10.0, "--cancel-grace", help="Seconds to wait for a cooperative stop."),
    kill_grace: float = typer.Option(5.0, "--kill-grace", help="Seconds between SIGTERM and SIGKILL."),
    executor: str = typer.Option("local", "--executor", help="local: job processes on this machine; ray: one Ray "
                                 "job per attempt on a Ray cluster (pip install -r requirements-ray.txt)."),
    ray_address: str = typer.Option("http://127.0.0.1:8265", "--ray-address", envvar="LOLCATS_RAY_ADDRESS",
                                    help="Ray Jobs API (dashboard) address, with --executor ray."),
    ray_num_gpus: float = typer.Option(0.0, "--ray-num-gpus", min=0, help="GPUs Ray reserves for each job."),
    ray_workspace: Optional[str] = typer.Option(None, "--ray-workspace", help="The workspace path on the Ray "
                                                "nodes (default: the same path as here)."),
    workspace: Optional[Path] = WorkspaceOpt,
    db_url: Optional[str] = DbUrlOpt,
) -> None:
    """Run queued jobs, each in its own process group (or as Ray jobs); reconcile jobs of dead workers."""
    from jobs.db import open_db
    from jobs.worker import Worker, WorkerOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from jobs.executors import EXECUTORS

    if executor not in EXECUTORS:
        raise ConfigError("worker", [("--executor", f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")])
    if executor == "ray":
        from jobs.executors.ray_jobs import RayWorker, RayWorkerOptions

        ray_options = RayWorkerOptions(
            address=ray_address, concurrency=concurrency, poll_interval=poll_interval, cancel_grace=cancel_grace,
            stale_after=stale_after, once=once, exit_when_idle=exit_when_idle, remote_workspace=ray_workspace,
            num_gpus=ray_num_gpus or None)
        raise typer.Exit(RayWorker(open_db(workspace, db_url), ray_options).run())
    options = WorkerOptions(concurrency=concurrency, poll_interval=poll_interval, stale_after=stale_after,
                            cancel_grace=cancel_grace, kill_grace=kill_grace, once=once,
                            exit_when_idle=exit_when_idle)
    raise typer.Exit(Worker(open_db(workspace, db_url), options).run())


def register(app: typer.Typer) -> None:
    """Add this layer's commands to the top-level app."""
    app.add_typer(jobs_app, name="jobs")
    app.command("worker")(_user_errors(worker))


def main() -> None:
    """``python -m jobs``: the job commands without the rest of the app."""
    app = typer.Typer(name="jobs", no_args_is_help=True, add_completion=False)
    register(app)
    app()
