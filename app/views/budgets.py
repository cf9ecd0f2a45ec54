"""Budgets: how many layers to keep softmax. A budgets job (core.pipeline.budgets) runs one attention
transfer, then the recipe with K = 0, 1, 2, ... of the worst-to-linearize layers kept softmax; this
page draws each finished sweep's perplexity ratio against decode cost, its table and the layer
scores the choice came from, and queues a new sweep (it never runs in the UI process)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import common
from app.charts import layers as charts
from app.charts.style import RATIO_FORMAT
from core.config import PRESETS, preset
from core.lists import comma_ints
from core.pipeline.budget_spec import BudgetSweepConfig
from core.pipeline.budget_table import score_name, tradeoff_figure
from jobs.kinds import BUDGETS
from jobs.records import JobInfo

_DEFAULTS = BudgetSweepConfig.model_fields
DEFAULT_BUDGETS = ", ".join(map(str, _DEFAULTS["budgets"].get_default(call_default_factory=True)))


def _launch_form(expanded: bool) -> None:
    with st.expander("Sweep softmax budgets", expanded=expanded, icon=":material/tune:"):
        st.caption("One attention transfer with every layer converted, then stage 2 and the evaluation for each "
                   "budget K, keeping the K layers whose linearization costs most (next-token KL to the teacher "
                   "with only that layer linear). With the cpu-demo preset on 2 CPU cores: about 6 minutes for the "
                   "attention transfer and the scoring, then about 5 per budget.")
        c1, c2, c3 = st.columns([2, 2, 1])
        name = c1.selectbox("Recipe (conversion preset)", list(PRESETS), index=list(PRESETS).index("cpu-demo"),
                            key="budgets_preset")
        text = c2.text_input("Budgets", DEFAULT_BUDGETS, key="budgets_values",
                             help="numbers of layers kept softmax, separated by commas")
        context = c3.number_input("Context for cost", min_value=1, value=_DEFAULTS["context"].default, step=1024,
                                   key="budgets_context")
        if st.button("Queue the sweep", type="primary", key="budgets_submit", icon=":material/play_arrow:"):
            try:
                values = comma_ints(text)
            except ValueError:
                st.error(f"Budgets must be whole numbers separated by commas, such as {DEFAULT_BUDGETS}; got {text!r}.")
                return
            config = {"base": preset(name).model_dump(), "budgets": values, "context": int(context)}
            common.queue_and_show(BUDGETS, config, f"budgets-{name}", lambda job: f"Queued budget sweep #{job.id}.")


def _table(result: dict) -> pd.DataFrame:
    teacher = result["teacher"]
    rows = [{"budget": r["budget"], "layers kept softmax": ", ".join(map(str, r["softmax_layers"])) or "none",
             "held-out ppl": r["student_ppl"], "ppl ratio": r["ppl_ratio"], "decode ms/step": r["decode_ms_per_step"],
             "cache MiB": None if r["cache_bytes"] is None else r["cache_bytes"] / 2**20} for r in result["rows"]]
    rows.append({"budget": None, "layers kept softmax": "teacher (all)", "held-out ppl": result["teacher_ppl"],
                 "ppl ratio": 1.0, "decode ms/step": teacher["decode_ms_per_step"],
                 "cache MiB": None if teacher["cache_bytes"] is None else teacher["cache_bytes"] / 2**20})
    return pd.DataFrame(rows)


def _sweep(job: JobInfo, result: dict) -> None:
    st.plotly_chart(tradeoff_figure(result), key=f"budgets_tradeoff_{job.id}")
    st.dataframe(_table(result), hide_index=True, width="stretch",
                 column_config={"ppl ratio": st.column_config.NumberColumn(format=f"%{RATIO_FORMAT}")})
    scores = result.get("layer_scores") or []
    if scores:
        kept = max(result["rows"], key=lambda r: r["budget"])["softmax_layers"]
        score = score_name(result) or "kl"
        st.plotly_chart(charts.layer_score_bars(scores, kept, score), key=f"budgets_scores_{job.id}")
        st.caption(f"Layer scores after the shared attention transfer ({score}); marked: the layers the "
                   f"largest budget keeps softmax. Decode cost measured at {result['context']} tokens of context, "
                   "batch 1, on this machine.")


st.title("Softmax budgets")
st.caption("Quality against cost: every layer kept softmax lowers the perplexity gap to the teacher and adds a "
           "key/value cache that grows with the context.")
common.show_flash()
for running in common.list_jobs(kind=BUDGETS, status=common.ACTIVE):
    where = (f"{common.stage_name(running.progress_stage)} {running.progress_step}/{running.progress_total or '?'}"
             if running.progress_step is not None else running.status)
    st.progress(common.progress_fraction(running) or 0.0, text=f"#{running.id} {running.name or ''}: {where}")
finished = [(job, result) for job in common.list_jobs(kind=BUDGETS, status="succeeded")
            if isinstance(result := common.report(job), dict) and result.get("rows")]
if finished:
    by_id = dict((job.id, (job, result)) for job, result in finished)
    chosen = st.selectbox("Sweep", list(by_id), key="budgets_job", format_func=lambda i: common.job_label(by_id[i][0]))
    _sweep(*by_id[chosen])
else:
    st.info("No finished budget sweep yet. Queue one below, or run `lolcats ablate --budgets 0,1,2,4,8`.")
_launch_form(expanded=not finished)
