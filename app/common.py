"""What every workbench page shares: the workspace, the job database, job lists, loaded models.

Pages read the job database through :mod:`jobs.api` (plain records) and artifact files in run
folders; they submit jobs and never train. The only heavy work in the UI process is chat
generation and heatmaps of short prompts, both on a finished conversion loaded once per process
(:func:`loaded_model`) and guarded by a lock, because teacher and student share one model object.
"""

from __future__ import annotations

import json
import math
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import streamlit as st

from app.charts.style import RATIO_FORMAT
from app.navigation import page
from app.progress import (PACE_METRICS, estimate_seconds, overall_progress, pace, seconds_per_unit,
                          seconds_per_unit_from_timings)
from core.config import PRESET_DESCRIPTIONS, preset
from core.eval.long_context_result import WINDOW, LongContextResult, read_long_context
from core.io import read_json_object
from core.run_folder import CONFIG_FILE, EXPORT_CONFIG, REPORT_FILE, STAGE_LABELS, is_export, is_run
from core.workspace import workspace_root
from jobs import api
from jobs.db import open_db
from jobs.errors import JobsError
from jobs.kinds import BENCH, CONVERT, EXPORT  # noqa: F401 - the kinds the pages name as common.CONVERT, ...
from jobs.records import JobInfo, MetricPoint

DEMO_PRESET = "cpu-demo"  # the conversion the empty states offer to launch
ACTIVE = ("queued", "running")
REFRESH_S = 2.0  # auto-refresh period of live views


# ----------------------------------------------------------------------------------------------
# Workspace and database
# ----------------------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def _database(root: str):
    return open_db(root)  # creates the schema on first open


def workspace() -> Path:
    """The workspace folder (``LOLCATS_WORKSPACE``, else ``./workspace``); its database is opened once.
    A database that cannot be opened (damaged, locked too long) ends the page with the reason and
    the fix instead of a traceback; the next page load tries again."""
    root = workspace_root(None)
    try:
        _database(str(root))
    except JobsError as exc:
        st.error(str(exc), icon=":material/error:")
        st.stop()
    return root


def ws() -> dict[str, Any]:
    """Keyword arguments for every :mod:`jobs.api` call."""
    return {"workspace": workspace()}


def list_jobs(kind: str | None = None, status: str | tuple[str, ...] | None = None, limit: int = 200) -> list[JobInfo]:
    return api.list_jobs(kind=kind, status=status, limit=limit, **ws())


STATUS_STYLE = {  # Material icon and colour of each job status
    "queued": (":material/schedule:", "gray"), "running": (":material/autorenew:", "blue"),
    "succeeded": (":material/check_circle:", "green"), "failed": (":material/error:", "red"),
    "cancelled": (":material/cancel:", "orange"), "interrupted": (":material/warning:", "orange"),
}


def job_label(job: JobInfo) -> str:
    """Label of a job in select boxes (no status: a select box does not refresh its labels)."""
    name = f" {job.name}" if job.name else ""
    return f"#{job.id}{name} · {job.kind} · {local_time(job.created_at)}"


def status_badge(status: str) -> str:
    """Markdown of a coloured status with its icon."""
    icon, colour = STATUS_STYLE.get(status, (":material/help:", "gray"))
    return f":{colour}[{icon} {status}]"


@dataclass(frozen=True)
class Conversion:
    """A converted model a page can open: a succeeded conversion job's run folder, or a finished run
    folder (``lolcats convert -o``) or an export (``lolcats export``) made outside the workbench
    in the workspace. It reads like a job where the pages need one: ``run_dir``, ``config``,
    ``result`` (its report, when known)."""

    key: str  # stable across reruns: "job:7", or the folder relative to the workspace
    origin: str  # "job #7", "run", "export"
    run_dir: Path
    config: dict
    name: str = ""
    result: dict | None = None
    job: JobInfo | None = None

    @property
    def title(self) -> str:
        """What a message calls it: ``conversion #7``, ``runs/demo (run)``, ``exports/demo (export)``."""
        return f"conversion #{self.job.id}" if self.job else f"{self.name} ({self.origin})"

    @property
    def tag(self) -> str:
        """A job-name part: the job's id, else the folder with its slashes as dashes."""
        return str(self.job.id) if self.job else re.sub(r"[^\w.\-]+", "-", self.name).strip("-")

    @property
    def label(self) -> str:
        model = self.config.get("model", {}).get("source", "?")
        attn = self.config.get("attention", {})
        return f"{self.name} ({self.origin}) · {model} · {attn.get('kind', '?')}/{attn.get('feature_map', '?')}"


def finished_conversions() -> list[JobInfo]:
    """Succeeded conversion jobs whose run folder still holds a loadable model, newest first."""
    return [job for job in list_jobs(kind=CONVERT, status="succeeded") if job.run_dir and is_run(job.run_dir)]


def _outside_folders(root: Path, known: set[Path]) -> list[Path]:
    """Finished run folders and exports one or two levels into the workspace that no job made,
    newest first (the models' cache is not searched)."""
    found = []
    for top in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "models" and not p.name.startswith(".")):
        for folder in [top, *(p for p in top.iterdir() if p.is_dir())]:
            if folder.resolve() not in known and (is_export(folder) or (is_run(folder) and (folder / REPORT_FILE).is_file())):
                found.append(folder)
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _folder_conversion(root: Path, folder: Path) -> Conversion:
    exported = is_export(folder)
    meta = read_json_object(folder / (EXPORT_CONFIG if exported else CONFIG_FILE)) or {}
    where = folder.relative_to(root).as_posix()
    return Conversion(where, "export" if exported else "run", folder, meta.get("config", {}) if exported else meta,
                      name=where, result=None if exported else read_json_object(folder / REPORT_FILE))


def conversions(*, loadable: bool = True) -> list[Conversion]:
    """Every converted model in the workspace: succeeded conversion jobs (newest first), then the run
    folders and exports made outside the workbench (:func:`_outside_folders`). ``loadable=False``
    also keeps the succeeded jobs whose run folder is gone: their report, in the database, is what a
    comparison reads."""
    root = workspace()
    done = finished_conversions() if loadable else list_jobs(kind=CONVERT, status="succeeded")
    jobs = [Conversion(f"job:{j.id}", f"job #{j.id}", j.run_dir, j.config, name=j.name or f"#{j.id}", result=j.result,
                       job=j) for j in done]
    outside = _outside_folders(root, {c.run_dir.resolve() for c in jobs if c.run_dir})
    return jobs + [_folder_conversion(root, folder) for folder in outside]


def demo_button(key: str) -> None:
    """The empty-state call to action: queue the demo conversion (the bundled model, about 12 minutes on
    2 CPU cores), then watch it on the Jobs page."""
    if st.button(f"Launch the demo conversion ({DEMO_PRESET})", key=key, type="primary",
                 help=f"{PRESET_DESCRIPTIONS[DEMO_PRESET]} (bundled, no download; GSM8K, short stages)."):
        queue_and_show(CONVERT, preset(DEMO_PRESET).model_dump(), DEMO_PRESET,
                       lambda job: f"Queued the demo conversion as job #{job.id}.")


def queue_and_show(kind: str, config: dict, name: str | None, flash: Callable[[JobInfo], str]) -> JobInfo | None:
    """Queue a job and go to the Jobs page with the message ``flash(job)``; a config the job system
    refuses is shown as an error on this page (returns None)."""
    try:
        job = api.submit_job(kind, config, name=name, **ws())
    except (JobsError, ValueError) as exc:
        st.error(str(exc))
        return None
    st.session_state["flash"] = flash(job)
    st.switch_page(page("jobs").script)
    return job


LAUNCH_FROM = "launch_from"  # a config the Launch page opens with: {"label": ..., "config": ...}
FROM_JOB = "from_job"  # the Launch page's query parameter: open with this job's config


def open_in_launch(label: str, config: dict) -> None:
    """Go to the Launch page with its form filled from ``config`` (``label`` says where it came
    from); the fields outside the form keep ``config``'s values."""
    st.session_state[LAUNCH_FROM] = {"label": label, "config": config}
    st.switch_page(page("launch").script)


def page_link(key: str, label: str, *, where=st, icon: str | None = None, **kw) -> None:
    """A link to page ``key`` of :data:`app.navigation.PAGES` in ``where`` (with that page's icon
    unless given; ``kw``: st.page_link's ``query_params``, ``help``)."""
    target = page(key)
    where.page_link(target.script, label=label, icon=icon or target.icon, **kw)


def show_flash() -> None:
    """A one-shot message left by the previous page (e.g. after a redirect)."""
    message = st.session_state.pop("flash", None)
    if message:
        st.success(message)


def no_conversion_notice(what: str, key: str) -> None:
    """Empty state of the pages that need a finished conversion."""
    running = [j for j in list_jobs(kind=CONVERT, status=ACTIVE)]
    if running:
        st.info(f"{what} needs a finished conversion. Job #{running[0].id} is {running[0].status}: this page "
                "lists it as soon as it succeeds.")
        page_link("jobs", "Watch it on the Jobs page")
        return
    st.info(f"{what} needs a finished conversion, and there is none yet. Launch one on the Launch page, or "
            "start the demo conversion now.")
    cols = st.columns([1, 1, 2])
    with cols[0]:
        demo_button(key)
    with cols[1]:
        page_link("launch", "Configure a conversion")


def worker_hint(jobs: list[JobInfo]) -> None:
    """Warn when jobs wait in the queue and nothing runs: most likely no worker is started."""
    now = utcnow()
    waiting = [j for j in jobs if j.status == "queued" and (now - j.created_at).total_seconds() > 15]
    if waiting and not any(j.status == "running" for j in jobs):
        st.warning(f"Job #{waiting[-1].id} has been queued for {fmt_duration((now - waiting[-1].created_at).total_seconds())} "
                   "and nothing is running: is a worker started? `lolcats app` starts one; otherwise run "
                   "`lolcats worker` in another terminal.")


# ----------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def local_time(dt: datetime | None) -> str:
    if dt is None:
        return ""
    return dt.replace(tzinfo=timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return ""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


def sample_text(text: str | None) -> str:
    """A generated sample as shown: ``(empty)`` when it holds nothing but whitespace."""
    return text if text and text.strip() else "(empty)"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def fmt_number(value: float | None, digits: int = 4) -> str:
    return f"{value:.{digits}g}" if _finite(value) else "n/a"


def fmt_ratio(value: float | None) -> str:
    """A perplexity ratio with 3 decimals (1.0012 reads 1.001, never 1), ``n/a`` when unknown."""
    return format(value, RATIO_FORMAT) if _finite(value) else "n/a"


# ----------------------------------------------------------------------------------------------
# Progress
# ----------------------------------------------------------------------------------------------


def latest_attempt(points: list[MetricPoint]) -> list[MetricPoint]:
    """Metric rows with, for every (stage, step, layer, name), only the newest value (resumes
    repeat steps after the last checkpoint)."""
    newest: dict[tuple, MetricPoint] = {}
    for p in points:
        key = (p.stage, p.step, p.layer, p.name)
        if key not in newest or p.id > newest[key].id:
            newest[key] = p
    return sorted(newest.values(), key=lambda p: p.id)


def stage_eta(job: JobInfo, points: list[MetricPoint]) -> float | None:
    """Seconds left in the running stage, from the pace of its steps so far (None if unknown).

    The pace is that of this attempt's steps. With one step so far: an attempt that resumed the
    stage (earlier attempts logged steps of it) takes the earlier attempts' pace, since its first
    step number counts the steps done before it; an attempt that started the stage takes the time
    since the attempt started over the steps done."""
    if job.status != "running" or not job.progress_total or job.progress_step is None:
        return None
    stage = [p for p in points if p.stage == job.progress_stage]
    current = [p for p in stage if p.attempt == job.attempt]
    if not current:
        return None
    per_step, last_step, last_time = pace(current)
    if per_step is None:
        earlier = [p for p in stage if p.attempt < job.attempt]
        if earlier:
            per_step = pace(earlier)[0]
        elif job.started_at is not None:
            per_step = (last_time - job.started_at).total_seconds() / max(last_step, 1)
    if per_step is None:
        return None
    left = max(job.progress_total - job.progress_step, 0) * per_step
    since_last = (utcnow() - last_time).total_seconds()
    return max(left - since_last, 0.0)


def _pace_points(job_id: int, root: Path | str) -> list[MetricPoint]:
    """A job's metric rows that time its steps (one per step of each stage)."""
    return [p for name in PACE_METRICS for p in api.job_metrics(job_id, name=name, workspace=root)]


def overall(job: JobInfo):
    """:func:`app.progress.overall_progress` of ``job`` now (None unless a running conversion)."""
    if job.kind != CONVERT or job.status != "running":
        return None
    return overall_progress(job, _pace_points(job.id, workspace()), utcnow())


@st.cache_data(show_spinner=False, max_entries=256)
def _unit_seconds(job_id: int, root: str, config_json: str) -> float | None:
    """Seconds per cost unit a finished conversion measured (it does not change: cached)."""
    return seconds_per_unit(json.loads(config_json), _pace_points(job_id, root))


def wall_time_estimate(config: dict) -> tuple[float, str] | None:
    """(seconds, what they are measured from: ``job #7``, ``runs/demo (run)``): how long the phases
    of a conversion with ``config`` take here, at the pace of the newest finished conversion job of
    the same model and dtype (its steps' times), else of a run folder made outside the workbench
    (its report's timings), scaled by the blocks' length; None when no such conversion is here."""
    def same_model(theirs: dict) -> bool:
        model = theirs.get("model", {})
        return (model.get("source"), model.get("dtype")) == (config["model"]["source"], config["model"]["dtype"])

    def scaled(per_unit: float, theirs: dict) -> float:
        return estimate_seconds(config, per_unit * config["data"]["seq_len"] / theirs["data"]["seq_len"])

    for job in list_jobs(kind=CONVERT, status="succeeded"):
        if same_model(job.config):
            per_unit = _unit_seconds(job.id, str(workspace()), json.dumps(job.config, sort_keys=True))
            if per_unit is not None:
                return scaled(per_unit, job.config), f"job #{job.id}"
    for run in conversions():
        if run.job is None and run.origin == "run" and same_model(run.config):
            per_unit = seconds_per_unit_from_timings(run.config, (run.result or {}).get("timings") or {})
            if per_unit is not None:
                return scaled(per_unit, run.config), run.title
    return None


def stage_name(stage: str | None) -> str:
    return STAGE_LABELS.get(stage, stage) if stage else ""


def progress_fraction(job: JobInfo) -> float | None:
    if job.status == "succeeded":
        return 1.0
    if job.progress_step is None or not job.progress_total:
        return None
    return min(max(job.progress_step / job.progress_total, 0.0), 1.0)


# ----------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------


def report(job: JobInfo) -> dict | None:
    """The job's report (result column or ``report.json``), or None; never raises on a bad file."""
    if job.result is not None:
        return job.result
    return read_json_object(job.run_dir / REPORT_FILE if job.run_dir else None)


def long_context(result: dict | None) -> LongContextResult | None:
    """The typed ``long_context`` section of a report or ``eval.json`` (:mod:`core.eval.long_context_result`),
    or None when it is absent (older reports), null (nothing converted) or has no length evaluated."""
    return read_long_context(result)


def window_worse(section: LongContextResult) -> str | None:
    """The verdict when the student is worse, beyond the noise, than the student-window baseline
    (the teacher's softmax over the student's own window and sinks, untrained) at some length, else None."""
    worse = section.worse_than(WINDOW)
    if not worse or WINDOW not in section.baselines:
        return None
    return (f"the student is worse than the {section.reference_label(WINDOW)} at "
            f"{', '.join(map(str, worse))} tokens")


def ratio_headline(result: dict, seq_len: int | None) -> str:
    """``ppl ratio 1.062 at 512 · 1.180 at 4096 (window 64+4: 1.450)``: the report's student /
    teacher perplexity at the training length ``seq_len``, then, with a long-context section, the
    student's ratio at the longest evaluated length and the student-window baseline's there."""
    text = f"ppl ratio {fmt_ratio(result.get('ppl_ratio'))}" + (f" at {seq_len}" if seq_len else "")
    section = long_context(result)
    if section is None:
        return text
    longest = section.by_length[-1]
    text += f" · {fmt_ratio(longest.scores['student'].ratio)} at {longest.length}"
    window = section.baselines.get(WINDOW)
    if window and WINDOW in longest.scores:
        text += f" (window {window.window}+{window.sinks}: {fmt_ratio(longest.scores[WINDOW].ratio)})"
    return text


def _layer_list(value: Any) -> list[int] | None:
    """``value`` when it is a list of layer indices (never a string such as ``"auto"``), else None."""
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None


def softmax_layers(job: JobInfo, result: dict | None = None) -> list[int]:
    """The layers ``job`` leaves softmax: its report's ``softmax_layers`` (``result``, else
    :func:`report`) when present, else the config's ``attention.softmax_layers`` when it is a list,
    else ``[]`` (``"auto"`` before the run has chosen, or a report older than the key)."""
    result = report(job) if result is None else result
    chosen = _layer_list((result or {}).get("softmax_layers"))
    if chosen is not None:
        return chosen
    return _layer_list(job.config.get("attention", {}).get("softmax_layers")) or []


# ----------------------------------------------------------------------------------------------
# Converted models (chat and heatmaps)
# ----------------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    info: dict
    lock: threading.Lock  # teacher_context switches the shared model: one user of it at a time

    @property
    def config(self) -> dict:
        return self.info.get("config", {})


@st.cache_resource(show_spinner="Loading the converted model (once per workbench process)...", max_entries=2)
def _load(run_dir: str, stamp: float, root: str, dtype: str | None = None) -> LoadedModel:
    from core.load import load_converted

    model, tokenizer, info = load_converted(run_dir, workspace=root, dtype=dtype)
    return LoadedModel(model, tokenizer, info, threading.Lock())


def loaded_model(job: JobInfo, dtype: str | None = None) -> LoadedModel:
    """The finished conversion of ``job``, loaded once per process and ``dtype`` (None: the run's;
    reloaded if its report changes)."""
    report_file = job.run_dir / REPORT_FILE
    stamp = report_file.stat().st_mtime if report_file.exists() else 0.0
    return _load(str(job.run_dir), stamp, str(workspace()), dtype)


def conversion_picker(conversions: list[Conversion], key: str) -> Conversion:
    """Select box over converted models; the choice is shared by the pages that pick one."""
    by_key = {c.key: c for c in conversions}
    keys = list(by_key)
    chosen = st.session_state.get("conversion")
    index = keys.index(chosen) if chosen in keys else 0
    picked = st.selectbox("Conversion", keys, index=index, key=key, format_func=lambda k: by_key[k].label)
    st.session_state["conversion"] = picked
    return by_key[picked]
