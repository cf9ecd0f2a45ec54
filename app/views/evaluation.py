"""Evaluation: task accuracy of teacher and student (lm-evaluation-harness), per task with error
bars, the retention ratio student / teacher, and several runs side by side. Results come from
evaluate jobs' reports and from conversions whose config asked for tasks (report.json ``tasks``);
a form queues an evaluation of a finished conversion (it never runs in the UI process)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, common
from jobs.records import JobInfo

EVALUATE = "evaluate"  # job kind of a task evaluation (core.eval.harness.evaluate_tasks)
DEFAULT_LIMIT = 20  # items per task the form proposes (0: every item)


def _results(job: JobInfo) -> dict[str, dict] | None:
    """The task results of a succeeded evaluate job or of a conversion that evaluated tasks."""
    report = common.report(job) or {}
    if job.kind == common.CONVERT:
        report = report.get("tasks") or {}
    results = report.get("results")
    return results if isinstance(results, dict) and results else None


def _label(job: JobInfo) -> str:
    what = f"evaluation of {job.config.get('run', '?')}" if job.kind == EVALUATE else "conversion"
    return f"#{job.id} {job.name or ''} · {what}".replace("  ", " ")


def _launch_form(conversions: list[JobInfo], expanded: bool) -> None:
    """Queue an evaluate job on one finished conversion's run folder."""
    with st.expander("Evaluate a conversion", expanded=expanded, icon=":material/fact_check:"):
        st.caption("Runs the teacher (the same weights with the original attention) and the converted student "
                   "through lm-evaluation-harness on the same items, in the background like a conversion. "
                   "`offline` is the bundled task set (no network); `paper` is the LoLCATs suite (PiQA, ARC, "
                   "HellaSwag, Winogrande, MMLU 5-shot), which downloads its data sets from the hub.")
        by_id = {j.id: j for j in conversions}
        chosen = st.selectbox("Conversion", list(by_id), key="eval_conversion",
                              format_func=lambda i: common.job_label(by_id[i]))
        c1, c2 = st.columns([3, 1])
        tasks = c1.text_input("Tasks", "offline", key="eval_tasks",
                              help="lm-eval task names separated by commas, or `offline` / `paper`.")
        limit = c2.number_input("Items per task (0: all)", min_value=0, value=DEFAULT_LIMIT, key="eval_limit")
        if st.button("Evaluate", type="primary", key="eval_submit", icon=":material/play_arrow:"):
            job = by_id[chosen]
            config = {"run": job.run_dir.relative_to(common.workspace()).as_posix(), "tasks": tasks.strip(),
                      "limit": int(limit) or None}
            common.queue_and_show(EVALUATE, config, f"eval-{job.id}",
                                  lambda queued: f"Queued evaluation job #{queued.id} of conversion #{job.id}.")


def _active() -> None:
    """Progress of evaluations in the queue or running: items done / total of the current stage."""
    for job in common.list_jobs(kind=EVALUATE, status=common.ACTIVE):
        fraction = common.progress_fraction(job) or 0.0
        where = (f"{common.stage_name(job.progress_stage)} {job.progress_step}/{job.progress_total} items"
                 if job.progress_step is not None else job.status)
        st.progress(fraction, text=f"#{job.id} {job.name or ''} on {job.config.get('tasks')}: {where}")


def _table(runs: dict[str, dict[str, dict]]) -> pd.DataFrame:
    rows = []
    for label, results in runs.items():
        for task, entry in results.items():
            teacher, teacher_se = charts.headline(entry, "teacher")
            student, student_se = charts.headline(entry, "student")
            lo, hi = entry.get("diff_ci95") or (None, None)
            rows.append({"run": label, "task": task, "n": entry.get("n"), "metric": entry.get("metric"),
                         "teacher": teacher, "± teacher": teacher_se, "student": student, "± student": student_se,
                         "diff": entry.get("diff"), "CI low": lo, "CI high": hi,
                         "retention": charts.retention(entry)})
    return pd.DataFrame(rows)


def _compare(sources: list[tuple[JobInfo, dict[str, dict]]]) -> None:
    by_id = {job.id: (job, results) for job, results in sources}
    chosen = st.multiselect("Runs to show", list(by_id), default=list(by_id)[:3], key="eval_runs",
                            format_func=lambda i: _label(by_id[i][0]))
    if not chosen:
        st.caption("Choose at least one run.")
        return
    runs = {f"#{i} {by_id[i][0].name or ''}".strip(): by_id[i][1] for i in chosen}
    st.plotly_chart(charts.task_bars(runs), key="eval_bars")
    st.plotly_chart(charts.retention_bars(runs), key="eval_retention")
    st.caption("Bars: the headline metric of each task (acc_norm for ARC-challenge and HellaSwag, else acc), error "
               "bars ±1 standard error. diff is student − teacher on the same items, with its 95% paired-bootstrap "
               "interval: an interval that excludes 0 is a real change.")
    st.dataframe(_table(runs), hide_index=True, width="stretch")


st.title("Evaluation")
st.caption("Task accuracy, measured the way the field measures it: lm-evaluation-harness on the teacher and the "
           "converted student, side by side.")
common.show_flash()
conversions = common.finished_conversions()
sources = [(job, results) for job in [*common.list_jobs(kind=EVALUATE, status="succeeded"),
                                      *common.list_jobs(kind=common.CONVERT, status="succeeded")]
           if (results := _results(job))]
_active()
if sources:
    _compare(sources)
    if conversions:
        _launch_form(conversions, expanded=False)
elif conversions:
    st.info("No task accuracy yet. Evaluate a finished conversion on the offline tasks (a few minutes on CPU "
            "with the bundled model), or set `eval.tasks` in a conversion's config to evaluate it as it finishes.")
    _launch_form(conversions, expanded=True)
else:
    common.no_conversion_notice("The Evaluation view", "eval_demo")
