"""Evaluation: task accuracy of teacher and student (lm-evaluation-harness), per task with error
bars, the retention ratio student / teacher, and several runs side by side; and quality by context
length of one conversion against the untrained sliding-window baselines and the training-free
frontier (core.eval.long_context).
Task results come from eval jobs' reports and from conversions whose config asked for tasks
(report.json ``tasks``); long-context sections from eval jobs on the run, ``lolcats eval``'s
eval.json and the conversion's report.json. A form queues an evaluation of a finished conversion
(it never runs in the UI process)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import common
from app.charts import evaluation as charts
from app.charts import long_context as long_context_charts
from app.charts.style import RATIO_FORMAT
from core.eval.long_context_result import LongContextResult
from core.io import read_json_object
from core.run_folder import EVAL_FILE
from jobs.kinds import EVAL
from jobs.records import JobInfo

DEFAULT_LIMIT = 20  # items per task the form proposes (0: every item)
LENGTHS_HINT = "256,1024,2048,4096"  # the context lengths the empty state suggests
NO_VALUE = "–"  # a table cell without a number (a retention where the teacher scores 0), never "None"


def _results(job: JobInfo) -> dict[str, dict] | None:
    """The task results of a succeeded eval job or of a conversion that evaluated tasks."""
    report = common.report(job) or {}
    if job.kind == common.CONVERT:
        report = report.get("tasks") or {}
    results = report.get("results")
    return results if isinstance(results, dict) and results else None


def _label(job: JobInfo) -> str:
    what = f"evaluation of {job.config.get('run', '?')}" if job.kind == EVAL else "conversion"
    return f"#{job.id} {job.name or ''} · {what}".replace("  ", " ")


def _launch_form(conversions: list[common.Conversion], expanded: bool) -> None:
    """Queue an eval job on one finished conversion's run folder."""
    with st.expander("Evaluate a conversion", expanded=expanded, icon=":material/fact_check:"):
        st.caption("Runs the teacher (the same weights with the original attention) and the converted student "
                   "through lm-evaluation-harness on the same items, in the background like a conversion. "
                   "`offline` is the bundled task set (no network); `paper` is the LoLCATs suite (PiQA, ARC, "
                   "HellaSwag, Winogrande, MMLU 5-shot), which downloads its data sets from the hub. Context "
                   "lengths add the conversion's own evaluation (its held-out text and settings) with quality by "
                   "context length against the untrained sliding-window baselines and the frontier.")
        by_key = {c.key: c for c in conversions}
        chosen = st.selectbox("Conversion", list(by_key), key="eval_conversion", format_func=lambda k: by_key[k].label)
        c1, c2, c3 = st.columns([2, 1, 2])
        tasks = c1.text_input("Tasks", "offline", key="eval_tasks",
                              help="lm-eval task names separated by commas, or `offline` / `paper`; empty: no task "
                                   "accuracy.")
        limit = c2.number_input("Items per task (0: all)", min_value=0, value=DEFAULT_LIMIT, key="eval_limit")
        lengths = c3.text_input("Context lengths", "", key="eval_lengths", placeholder=LENGTHS_HINT,
                                help="Quality by context length against the untrained sliding-window baselines and "
                                     "the frontier: "
                                     "token counts separated by commas, or `auto` (up to 8x the training length); "
                                     "empty: none.")
        if st.button("Evaluate", type="primary", key="eval_submit", icon=":material/play_arrow:"):
            conv = by_key[chosen]
            config = {"run": conv.run_dir.relative_to(common.workspace()).as_posix(), "tasks": tasks.strip() or None,
                      "limit": int(limit) or None, "lengths": lengths.strip() or None}
            common.queue_and_show(EVAL, config, f"eval-{conv.tag}",
                                  lambda queued: f"Queued evaluation job #{queued.id} of {conv.title}.")


def _active() -> None:
    """Progress of evaluations in the queue or running: items done / total of the current stage."""
    for job in common.list_jobs(kind=EVAL, status=common.ACTIVE):
        fraction = common.progress_fraction(job) or 0.0
        where = (f"{common.stage_name(job.progress_stage)} {job.progress_step}/{job.progress_total} items"
                 if job.progress_step is not None else job.status)
        st.progress(fraction, text=f"#{job.id} {job.name or ''} on {_asked(job.config)}: {where}")


def _asked(config: dict) -> str:
    """What an eval job measures: its tasks, long context at its lengths, or both."""
    lengths = config.get("lengths")
    long = lengths and "long context " + (lengths if isinstance(lengths, str) else ",".join(map(str, lengths)))
    return " + ".join(part for part in (config.get("tasks"), long) if part)


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
    st.dataframe(_table(runs), hide_index=True, width="stretch", placeholder=NO_VALUE,
                 column_config={"retention": st.column_config.NumberColumn(
                     format=f"%{RATIO_FORMAT}", help=f"student / teacher; {NO_VALUE} where the teacher scores 0")})


def _long_context_sources(job: common.Conversion) -> list[tuple[str, LongContextResult]]:
    """``(where from, section)`` of every long-context evaluation of conversion ``job``: eval jobs
    on its run folder (newest first), then ``lolcats eval``'s eval.json, then its own report.json."""
    here = job.run_dir.resolve()
    found = [(f"eval job #{ev.id}", common.long_context(common.report(ev)))
             for ev in common.list_jobs(kind=EVAL, status="succeeded")
             if (common.workspace() / ev.config.get("run", "")).resolve() == here]
    found += [(f"`lolcats eval` ({EVAL_FILE})", common.long_context(read_json_object(job.run_dir / EVAL_FILE))),
              ("the conversion's report", common.long_context(common.report(job)))]
    return [(where, section) for where, section in found if section]


_VERDICT_BOXES = {"worse": st.error, "level": st.info, "better": st.success}


def _frontier(section: LongContextResult, job: common.Conversion, conversions: list[common.Conversion]) -> None:
    """The frontier chart at a chosen length, with the other conversions' latest evaluations as
    points, and the frontier table by length."""
    lengths = long_context_charts.frontier_lengths(section)
    if not lengths:
        st.caption("No frontier: this evaluation was made before the frontier was measured; evaluate the conversion "
                   "again to draw it.")
        return
    length = st.select_slider("Length for the frontier (tokens)", lengths, value=lengths[-1], key="frontier_length")
    others = [(c.label, found[0][1]) for c in conversions if c.key != job.key
              and (found := _long_context_sources(c))]
    st.plotly_chart(long_context_charts.frontier_chart(section, length, others), key="long_frontier")
    header, rows = section.frontier_table()
    st.caption("The curve is the teacher's own softmax over sliding windows of several sizes plus the sinks, "
               "untrained, each at the bytes its key/value cache holds per layer; the conversion sits at the bytes "
               "its decode state holds per layer. Below the curve at its own bytes (read between the two nearest "
               "windows, linearly in log bytes and log ratio), it is worth its memory; the last column is the "
               "bytes a window needs for the conversion's quality.")
    st.dataframe(pd.DataFrame(rows, columns=header), hide_index=True, width="stretch",
                 column_config={**{name: st.column_config.NumberColumn(format="%.3f") for name in header[1:-2]},
                                header[-1]: st.column_config.NumberColumn(format="%.0f")})


def _passkey(section: LongContextResult) -> None:
    key = section.passkey
    st.plotly_chart(long_context_charts.passkey_grid(section), key="long_passkey")
    hits = max(key.trials // 2, 1)  # an example count to show the interval of
    lo, hi = key.interval(hits / key.trials)
    keys = "one key" if key.trials == 1 else f"{key.trials} keys"
    st.caption(f"Each cell hides {keys} at a depth (0: the prompt's start, 1: its end) in filler text of the row's "
               f"length and counts a key found when greedy decoding writes it whole. With {keys} a cell the "
               f"counts are coarse: {hits}/{key.trials} found means 95 % between {lo:.0%} and {hi:.0%} (hover a "
               "cell for its interval).")


def _long_context(conversions: list[common.Conversion]) -> None:
    """Quality by context length of one conversion: the verdicts, the frontier (chart and table),
    the ratio by position (chart) and by length (table), and the passkey grid."""
    st.subheader("Long context")
    job = common.conversion_picker(conversions, key="long_conversion")
    sources = _long_context_sources(job)
    if not sources:
        run = job.run_dir.relative_to(common.workspace()).as_posix()
        st.info(f"This run has no long-context evaluation: `lolcats eval {run} --lengths {LENGTHS_HINT}` measures one "
                "(or queue one above with context lengths).")
        return
    by_where = dict(sources)
    where = sources[0][0] if len(sources) == 1 else st.selectbox("Long-context evaluation", list(by_where),
                                                                 key="long_source")
    section = by_where[where]
    dropped = section.dropped_lengths
    st.caption(f"From {where}: {section.text}, {section.sequences} held-out sequence(s), trained on "
               f"{section.train_seq_len}-token blocks. Ratios are perplexity over the teacher's (lower is better, "
               "1.000 = as good as the teacher); the baselines are the teacher's own softmax over a window of "
               f"recent keys plus sink tokens, untrained. {section.margin_note()}"
               + (f" Left out for time: {', '.join(map(str, dropped))} tokens." if dropped else ""))
    for outcome, line in section.verdict_lines():
        _VERDICT_BOXES[outcome](f"{line[:1].upper()}{line[1:]}.")
    _frontier(section, job, conversions)
    buckets = section.by_position
    if len(buckets) > 1:
        st.plotly_chart(charts.position_ratios(section.model_dump()), key="long_positions")
    elif buckets:
        st.caption(f"No chart by position: every evaluated position ({buckets[0].start}-{buckets[0].end}) falls "
                   "in one bucket of the chart, which needs two or more; the table below has the ratios.")
    header, rows = section.length_table()
    st.dataframe(pd.DataFrame(rows, columns=header), hide_index=True, width="stretch",
                 column_config={**{name: st.column_config.NumberColumn(format="%.3f") for name in header[1:-1]},
                                "top-1 agreement": st.column_config.NumberColumn(format="percent")})
    if section.passkey:
        _passkey(section)


st.title("Evaluation")
st.caption("Task accuracy, measured the way the field measures it: lm-evaluation-harness on the teacher and the "
           "converted student, side by side; and quality by context length against the untrained "
           "sliding-window baselines.")
common.show_flash()
conversions = common.conversions()
sources = [(job, results) for job in [*common.list_jobs(kind=EVAL, status="succeeded"),
                                      *common.list_jobs(kind=common.CONVERT, status="succeeded")]
           if (results := _results(job))]
_active()
if sources:
    _compare(sources)
elif conversions:
    st.info("No task accuracy yet. Evaluate a finished conversion on the offline tasks (a few minutes on CPU "
            "with the bundled model), or set `eval.tasks` in a conversion's config to evaluate it as it finishes.")
else:
    common.no_conversion_notice("The Evaluation view", "eval_demo")
if conversions:
    _launch_form(conversions, expanded=not sources)
    _long_context(conversions)
