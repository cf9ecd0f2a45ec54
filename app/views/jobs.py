"""Jobs: every job with its live state (from the database, so a reload or a second browser shows the
same thing), cancel and resume, export, a new conversion from a job's config (edit and relaunch for
a failed one), logs, the headline figures of a finished conversion, the config as YAML, and the
error that ended a job (its tab only when there is one); an export serves through vLLM from here.
Below, the finished run folders and exports no job made, with the same actions: export, a new
conversion from the config, evaluate, delete, serve."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import streamlit as st
import yaml

from app import common, served
from app.charts.style import RATIO_FORMAT
from app.navigation import page
from core.config import PRESET_DESCRIPTIONS
from core.eval.long_context_result import passkey_accuracy
from core.run_folder import delete_folder
from jobs import api
from jobs.errors import JobsError
from jobs.records import JobInfo


def _note(job: JobInfo) -> str:
    text = job.error or job.status_reason or ("cancel requested" if job.cancel_requested and not job.is_terminal else "")
    text = (text or "").strip().splitlines()[0] if text else ""
    return text[:160] + ("..." if len(text) > 160 else "")


def _table(jobs: list[JobInfo]) -> pd.DataFrame:
    rows = []
    for j in jobs:
        eta, fraction = None, common.progress_fraction(j)
        whole = common.overall(j)
        if whole is not None:
            eta, fraction = whole.eta_s, whole.fraction
        elif j.status == "running":
            eta = common.stage_eta(j, api.job_metrics(j.id, stage=j.progress_stage, **common.ws()))
        rows.append({  # what matters first: a narrow window cuts the last columns
            "id": j.id,
            "name": j.name or "",
            "status": j.status,
            "progress": fraction,
            "ETA": common.fmt_duration(eta) if eta is not None else "",
            "stage": common.stage_name(j.progress_stage),
            "step": f"{j.progress_step}/{j.progress_total or '?'}" if j.progress_step is not None else "",
            "kind": j.kind,
            "error / reason": _note(j),
            "attempt": j.attempt,
            "created": common.local_time(j.created_at),
        })
    return pd.DataFrame(rows)


def _select(jobs: list[JobInfo]) -> JobInfo:
    ids = [j.id for j in jobs]
    by_id = {j.id: j for j in jobs}
    current = st.session_state.get("jobs_selected")
    if current not in ids:
        running = [j.id for j in jobs if j.status == "running"]
        st.session_state["jobs_selected"] = running[0] if running else ids[0]
    job_id = st.selectbox("Job", ids, key="jobs_selected", format_func=lambda i: common.job_label(by_id[i]))
    return by_id[job_id]


def _run_path(run_dir: Path) -> str:
    return run_dir.relative_to(common.workspace()).as_posix()


def _active_export(run_dir: Path) -> JobInfo | None:
    """The export job of this run folder still queued or running, if any."""
    run = _run_path(run_dir)
    return next((j for j in common.list_jobs(kind=common.EXPORT, status=common.ACTIVE) if j.config.get("run") == run),
                None)


def _queue_export(run_dir: Path, key: str) -> None:
    """The Export button's callback (before the page is drawn, so the button is drawn off at once):
    queue an ``export`` job of the run folder; a refusal is kept for the page to show."""
    try:
        api.submit_job(common.EXPORT, {"run": _run_path(run_dir)}, **common.ws())
    except JobsError as exc:
        st.session_state[f"{key}_refused"] = str(exc)


def _export_button(column, run_dir: Path, key: str, enabled: bool, help_text: str) -> None:
    """The Export button of a finished conversion's run folder: it queues an ``export`` job (into
    exports/<its name>); while that job is queued or running the button is off and says so."""
    active = _active_export(run_dir) if enabled else None
    column.button("Export", key=key, disabled=not enabled or active is not None, icon=":material/output:",
                  help=f"Export job #{active.id} is {active.status}." if active else help_text,
                  on_click=_queue_export, args=(run_dir, key))
    refused = st.session_state.pop(f"{key}_refused", None)
    if refused:
        st.error(refused)
    if active is not None:
        st.info(f"Export job #{active.id} is {active.status}, into `{active.config['output']}`: its result (the "
                "folder, the snippet that loads it, the model card) shows on that job when it succeeds.",
                icon=":material/output:")


EXPORT_HELP = "Queue an export job: a standalone folder (LoRA merged) that plain transformers loads."


def _actions(job: JobInfo) -> None:
    c1, c2, c3, c4, _ = st.columns([1, 1, 1, 2, 1])
    can_cancel = job.status in common.ACTIVE and not job.cancel_requested
    if c1.button("Cancel", key=f"cancel_{job.id}", disabled=not can_cancel, icon=":material/stop_circle:",
                 help="A queued job is cancelled at once; a running one stops at its next step (checkpoint kept)."):
        try:
            api.cancel_job(job.id, **common.ws())
            st.toast(f"Cancel requested for job #{job.id}")
        except JobsError as exc:
            st.error(str(exc))
    can_resume = job.status in ("failed", "cancelled", "interrupted")
    if c2.button("Resume", key=f"resume_{job.id}", disabled=not can_resume, icon=":material/play_circle:",
                 help="Queue the job again; it continues from its last checkpoint."):
        try:
            info = api.resume_job(job.id, **common.ws())
            st.toast(f"Job #{job.id} queued again (attempt {info.attempt})")
        except JobsError as exc:
            st.error(str(exc))
    can_export = job.kind == common.CONVERT and job.status == "succeeded" and job.run_dir is not None
    _export_button(c3, job.run_dir, f"export_{job.id}", can_export, EXPORT_HELP)
    if job.kind == common.CONVERT:
        # a link, not a button calling st.switch_page: a page switched to from inside the
        # auto-refreshing fragment this is drawn in is sometimes left blank by the fragment's timer
        failed = job.status in ("failed", "cancelled", "interrupted")
        common.page_link("launch", "Edit and relaunch" if failed else "New conversion from this job", where=c4,
                         icon=":material/edit:", query_params={common.FROM_JOB: job.id},
                         help="Open the Launch page with this job's config in the form.")


def _manage(job: JobInfo) -> None:
    """Rename the job; delete it with its run folder, after a confirmation (not while it is active)."""
    c1, c2, c3 = st.columns([3, 1, 1], vertical_alignment="bottom")
    name = c1.text_input("Name", value=job.name or "", key=f"name_{job.id}", placeholder="no name")
    if c2.button("Rename", key=f"rename_{job.id}", disabled=name.strip() == (job.name or "")):
        try:
            api.rename_job(job.id, name, **common.ws())
            st.toast(f"Job #{job.id} renamed")
        except JobsError as exc:
            st.error(str(exc))
    active = job.status in common.ACTIVE
    with c3.popover("Delete", icon=":material/delete:", disabled=active,
                    help="Cancel the job first." if active else "Delete the job, its logs and its run folder."):
        st.markdown(f":red[Job #{job.id}, its logs, metrics and run folder `{job.run_dir}` are deleted for good.]")
        if st.button(f"Delete job #{job.id}", key=f"delete_{job.id}", type="primary"):
            try:
                api.delete_job(job.id, **common.ws())
            except JobsError as exc:
                st.error(str(exc))
            else:
                st.session_state["flash"] = f"Deleted job #{job.id}."
                st.rerun()


def _filtered(jobs: list[JobInfo]) -> list[JobInfo]:
    """The jobs of the kinds and statuses picked above the table (all when none is picked)."""
    c1, c2 = st.columns(2)
    kinds = c1.multiselect("Kind", sorted({j.kind for j in jobs}), key="jobs_kinds", placeholder="every kind")
    statuses = c2.multiselect("Status", sorted({j.status for j in jobs}), key="jobs_statuses",
                              placeholder="every status")
    return [j for j in jobs if (not kinds or j.kind in kinds) and (not statuses or j.status in statuses)]


def _details(job: JobInfo) -> None:
    st.markdown(f"### Job #{job.id} {job.name or ''} · {common.status_badge(job.status)}")
    if job.status == "running":
        _running(job)
    if job.error:
        st.error(f"**Why it failed:** {job.error}", icon=":material/error:")
    elif job.status_reason:
        (st.warning if job.status == "interrupted" else st.info)(job.status_reason)
    if job.cancel_requested and not job.is_terminal:
        st.info("Cancel requested: the job stops at its next step.")
    result = common.report(job)
    if result is not None and job.kind == common.CONVERT:
        _headline(job, result)
    _actions(job)
    if result is not None and job.kind == common.EXPORT and (export_dir := common.workspace() / result["folder"]).is_dir():
        served.panel(export_dir, f"job{job.id}")
    meta = {"kind": job.kind, "attempt": job.attempt, "created": common.local_time(job.created_at),
            "started": common.local_time(job.started_at), "finished": common.local_time(job.finished_at),
            "heartbeat": common.local_time(job.heartbeat_at), "process": job.pid, "worker": job.worker_id,
            "run folder": str(job.run_dir or "")}
    has_error = bool(job.error or job.log_tail)
    names = ["Log", *(["Error details"] if has_error else []), "Result", "Config", "Info"]
    tabs = dict(zip(names, st.tabs(names)))
    with tabs["Log"]:
        events = api.job_events(job.id, **common.ws())[-300:]
        lines = [f"{common.local_time(e.time)} [{e.source}, attempt {e.attempt}] {e.level.upper() if e.level != 'info' else ''}"
                 f"{' ' if e.level != 'info' else ''}{e.message}" for e in events]
        st.code("\n".join(lines) or "(no log lines yet)", language=None)
        runner_log = job.run_dir / "runner.log" if job.run_dir else None
        if runner_log and runner_log.is_file():
            with st.expander("Process output (runner.log, last lines)"):
                st.code(_tail(runner_log), language=None)
    if has_error:
        with tabs["Error details"]:
            st.code(job.log_tail or job.error, language=None)
    with tabs["Result"]:
        if result is None:
            st.caption("The result appears when the job succeeds.")
        else:
            _result(job, result)
    with tabs["Config"]:
        st.download_button("Download (YAML)", yaml.safe_dump(job.config, sort_keys=False), key=f"config_{job.id}",
                           file_name=f"job-{job.id}.yaml", mime="application/x-yaml", icon=":material/download:")
        st.code(json.dumps(job.config, indent=2), language="json")
    with tabs["Info"]:
        st.json(meta)
        _manage(job)


def _running(job: JobInfo) -> None:
    """The running job's progress: for a conversion one overall bar (all its phases, with the time
    left) over the current stage's, else the stage's bar."""
    eta = common.stage_eta(job, api.job_metrics(job.id, stage=job.progress_stage, **common.ws()))
    step = f"step {job.progress_step}/{job.progress_total or '?'}" if job.progress_step is not None else "starting"
    text = f"{common.stage_name(job.progress_stage) or 'starting'}: {step}" + (
        f" · about {common.fmt_duration(eta)} left in this stage" if eta is not None else "")
    whole = common.overall(job)
    if whole is not None:
        left = f" · about {common.fmt_duration(whole.eta_s)} left" if whole.eta_s is not None else ""
        then = f", then {whole.after}" if whole.after else ""
        st.progress(whole.fraction, text=f"**Overall {whole.fraction:.0%}**{left}{then}")
    st.progress(common.progress_fraction(job) or 0.0, text=text)


def _headline(job: JobInfo, result: dict) -> None:
    """The conversion's figures in one row: perplexities, their ratio, passkey accuracy over the
    grid, time taken; under it the ratio at the training length and at the longest evaluated length
    against the student-window baseline, with a warning when that untrained baseline beats the student."""
    cols = st.columns(5)
    cols[0].metric("Teacher perplexity", common.fmt_number(result.get("teacher_ppl")))
    cols[1].metric("Student perplexity", common.fmt_number(result.get("student_ppl")))
    cols[2].metric("Ratio", common.fmt_ratio(result.get("ppl_ratio")), help="student / teacher perplexity at the "
                   "training length (lower is better; 1.000 = as good as the teacher)")
    passkey = passkey_accuracy(result) or {}
    cols[3].metric("Passkey (student / teacher)",
                   f"{common.fmt_number(passkey.get('student'), 2)} / {common.fmt_number(passkey.get('teacher'), 2)}")
    seconds = (result.get("timings") or {}).get("total_s")
    if seconds is None and job.started_at and job.finished_at:
        seconds = (job.finished_at - job.started_at).total_seconds()
    cols[4].metric("Time", common.fmt_duration(seconds) or "n/a", help="load, teacher evaluation, both stages "
                                                                      "and the final evaluation")
    st.markdown(common.ratio_headline(result, job.config.get("data", {}).get("seq_len")))
    section = common.long_context(result)
    worse = section and common.window_worse(section)
    if worse:
        st.warning(f"Long context: {worse}.", icon=":material/warning:")


def _export_result(result: dict) -> None:
    """An export job's folder, size and files, the snippet that loads it, and its model card."""
    st.markdown(f"**Folder** `{result['folder']}` · {common.fmt_bytes(result['bytes'])} in {len(result['files'])} files"
                + (f" · pushed: {result['pushed']}" if result.get("pushed") else ""))
    st.code(result["load"], language="python")
    front, body = _front_matter(result["card"])
    with st.expander("Model card (README.md)", expanded=True):
        if front:
            st.code(front, language="yaml")
        st.markdown(body)
    with st.expander("Files"):
        st.dataframe(pd.DataFrame({"file": list(result["files"]),
                                   "size": [common.fmt_bytes(n) for n in result["files"].values()]}), hide_index=True)


def _front_matter(card: str) -> tuple[str, str]:
    """A model card split into its YAML front matter (between the ``---`` lines that open it; the
    Hub reads it, Markdown would print it as loose text) and its body; no front matter: ``""``."""
    lines = card.splitlines()
    if lines and lines[0].strip() == "---":
        end = next((i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---"), None)
        if end is not None:
            return "\n".join(lines[1:end]), "\n".join(lines[end + 1:]).lstrip("\n")
    return "", card


def _result(job: JobInfo, result: dict) -> None:
    if job.kind == common.EXPORT:
        _export_result(result)
    if job.kind == common.CONVERT:
        for sample in (result.get("samples") or [])[:3]:
            with st.expander(f"Sample: {str(sample.get('prompt', ''))[:80]}"):
                c1, c2 = st.columns(2)
                c1.markdown("**Teacher**")
                c1.text(common.sample_text(sample.get("teacher")))
                c2.markdown("**Student**")
                c2.text(common.sample_text(sample.get("student")))
    with st.expander("Full report"):
        st.json({k: v for k, v in result.items() if k != "config"}, expanded=False)


def _tail(path, size: int = 12000) -> str:
    with open(path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - size))
        return f.read().decode("utf-8", "replace")


def live() -> None:
    """The job table and the selected job (a fragment: redrawn alone by its widgets, and every
    :data:`common.REFRESH_S` seconds while the page's last whole drawing found a job active)."""
    jobs = common.list_jobs()
    if not jobs:
        if any(c.job is None for c in common.conversions()):  # listed below the fragment
            st.info("No jobs yet: the conversions below were made outside the workbench.")
            return
        st.info("No jobs yet. Launch a conversion on the Launch page, or start the demo conversion: "
                f"{PRESET_DESCRIPTIONS[common.DEMO_PRESET]}.")
        c1, c2, _ = st.columns([1, 1, 2])
        with c1:
            common.demo_button("jobs_demo")
        with c2:
            common.page_link("launch", "Configure a conversion")
        return
    common.worker_hint(jobs)
    jobs = _filtered(jobs)
    if not jobs:
        st.info("No job matches the filters.")
        return
    st.dataframe(
        _table(jobs), hide_index=True, width="stretch",
        column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
            "id": st.column_config.NumberColumn("id", format="%d"),
            "error / reason": st.column_config.TextColumn(  # wide only when a job has one
                "error / reason", width="large" if any(_note(j) for j in jobs) else "small"),
        },
    )
    refresh = (f"refreshes every {common.REFRESH_S:g} s while a job is queued or running"
               if any(j.status in common.ACTIVE for j in jobs) else
               "no job is queued or running: the table refreshes by itself while one is")
    st.caption(f"Updated {common.local_time(common.utcnow())} · {refresh}")
    _details(_select(jobs))


ORIGINS = {"run": "run folder (lolcats convert, or copied in)", "export": "export (lolcats export, or copied in)"}


def _origin(conversion: common.Conversion, export_jobs: dict[str, int]) -> str:
    """Where a folder came from: an export job of the workbench (its ``output``), else the command line."""
    job_id = export_jobs.get(conversion.name) if conversion.origin == "export" else None
    return f"export job #{job_id}" if job_id else ORIGINS.get(conversion.origin, conversion.origin)


def _folders_table(folders: list[common.Conversion]) -> pd.DataFrame:
    export_jobs = {j.config.get("output"): j.id for j in common.list_jobs(kind=common.EXPORT)}
    return pd.DataFrame([{
        "folder": c.name, "origin": _origin(c, export_jobs),
        "model": c.config.get("model", {}).get("source"),
        "attention": f"{c.config.get('attention', {}).get('kind')}/{c.config.get('attention', {}).get('feature_map')}",
        "ppl ratio": (c.result or {}).get("ppl_ratio"),
        "modified": common.local_time(datetime.fromtimestamp(c.run_dir.stat().st_mtime, timezone.utc)),
    } for c in folders])


def _folder_actions(conversion: common.Conversion) -> None:
    """What a job's actions offer, for a folder no job made: export (a run folder), a new conversion
    from its config, evaluate, delete after a confirmation."""
    key = conversion.tag
    c1, c2, c3, c4, _ = st.columns([1, 2, 1, 1, 1])
    is_run = conversion.origin == "run"
    _export_button(c1, conversion.run_dir, f"folder_export_{key}", is_run,
                   EXPORT_HELP if is_run else "This folder is an export already.")
    if c2.button("New conversion from its config", key=f"folder_relaunch_{key}", disabled=not conversion.config,
                 icon=":material/edit:", help="Open the Launch page with this conversion's config in the form."):
        common.open_in_launch(conversion.title, conversion.config)
    if c3.button("Evaluate", key=f"folder_evaluate_{key}", icon=":material/fact_check:",
                 help="Open the Evaluation page with this conversion picked."):
        st.session_state["eval_conversion"] = key
        st.switch_page(page("evaluation").script)
    with c4.popover("Delete", icon=":material/delete:", help="Delete this folder."):
        st.markdown(f":red[The folder `{conversion.name}` and everything in it are deleted for good.]")
        if st.button(f"Delete {conversion.name}", key=f"folder_delete_{key}", type="primary"):
            served.stop_if_served(conversion.run_dir)
            delete_folder(common.workspace(), conversion.run_dir)
            st.session_state["flash"] = f"Deleted {conversion.name}."
            st.rerun()
    if not is_run:
        served.live_panel(conversion.run_dir, key)


def folders(found: list[common.Conversion]) -> None:
    """The finished run folders and exports in the workspace that no job made, each with its actions."""
    st.subheader("Run folders and exports")
    st.caption("The finished run folders and exports in the workspace besides the conversion jobs' own: made on the "
               "command line, copied in, or written by an export job. The Layers, Attention, Chat, Evaluation and "
               "Benchmark pages open them too.")
    st.dataframe(_folders_table(found), hide_index=True, width="stretch",
                 column_config={"ppl ratio": st.column_config.NumberColumn(format=f"%{RATIO_FORMAT}")})
    by_key = {c.key: c for c in found}
    chosen = st.selectbox("Folder", list(by_key), key="jobs_folder", format_func=lambda k: by_key[k].label)
    _folder_actions(by_key[chosen])


st.title("Jobs")
common.show_flash()
outside = [c for c in common.conversions() if c.job is None]
# a timer only while it has something to show: an idle page keeps none that could fire into the
# next page's run
st.fragment(run_every=common.REFRESH_S if common.list_jobs(status=common.ACTIVE) else None)(live)()
if outside:
    st.divider()
    folders(outside)
