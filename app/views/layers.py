"""Layers: where the conversion fails. Per-layer attention-output MSE over training (live while the
job runs: every layer's training MSE as a layers x steps heatmap from stage 1's first step, the curves
of the layers picked, and every layer's validation MSE), the final per-layer MSE of the report (beside
the layer scores of a ``softmax_layers: auto`` run), and several conversions side by side."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import common, forms
from app.charts import layers as charts
from core.pipeline.budget_table import score_name
from core.run_folder import STAGE1, STAGE2
from jobs import api
from jobs.records import JobInfo, MetricPoint


def _pick(jobs: list[JobInfo], outside: list[common.Conversion]) -> JobInfo | common.Conversion:
    """A conversion job (by id; a running one first), or a run folder or export made outside the
    workbench (by its folder)."""
    by_key: dict = {j.id: j for j in jobs} | {c.key: c for c in outside}
    keys = list(by_key)
    if st.session_state.get("layers_job") not in keys:
        running = [j.id for j in jobs if j.status == "running"]
        st.session_state["layers_job"] = running[0] if running else keys[0]
    key = st.selectbox("Conversion", keys, key="layers_job", format_func=lambda k: (
        common.job_label(by_key[k]) if isinstance(k, int) else by_key[k].label))
    return by_key[key]


def _series(points, stage: str, names: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for p in points:
        if p.stage == stage and p.layer is None and p.name in names and p.value is not None:
            out.setdefault(p.name, []).append((p.step, p.value))
    return out


def _layer_rows(points: list[MetricPoint], name: str) -> list[dict]:
    """Chart rows (``layer``, ``step``, ``value``, ``stage``) of the per-layer metric ``name``, null values left out."""
    return [{"layer": p.layer, "step": p.step, "value": p.value, "stage": p.stage}
            for p in points if p.layer is not None and p.name == name and p.value is not None]


def _worst_layers(rows: list[dict], n: int = 3) -> list[int]:
    """The ``n`` layers with the highest value at their latest step, in layer order."""
    latest = {r["layer"]: r["value"] for r in sorted(rows, key=lambda r: r["step"])}
    return sorted(sorted(latest, key=latest.get, reverse=True)[:n])


def _pick_layers(job_id: int, rows: list[dict]) -> list[int]:
    """The layer picker of a job: first the worst layers, then what the user chose among the layers
    that have rows."""
    layers = sorted({r["layer"] for r in rows})
    key = f"layers_pick_{job_id}"
    chosen = st.session_state.get(key)
    st.session_state[key] = _worst_layers(rows) if chosen is None else [i for i in chosen if i in layers]
    return st.multiselect("Layers to plot", layers, key=key, format_func=lambda i: f"layer {i}")


def _training_view(job_id: int, train: list[dict], val: list[dict], log_y: bool) -> None:
    """Every layer's training MSE as a heatmap, and the curves of the layers picked."""
    st.plotly_chart(charts.layer_step_heatmap(train, title="Stage 1 training: attention MSE by layer and step"),
                    key="layers_heatmap")
    st.caption("Colour: log10 of each layer's training attention MSE, averaged over the steps since the "
               "previous column (stage 1 reports it every few steps).")
    chosen = _pick_layers(job_id, train)
    if chosen:
        st.plotly_chart(charts.chosen_layer_curves(train, val, chosen, log_y=log_y), key="layers_chosen")


def _validation_view(job: JobInfo, val: list[dict], log_y: bool, expanded: bool) -> None:
    """Every layer's validation MSE curve, or why there is none."""
    with st.expander("Validation MSE of every layer", expanded=expanded):
        if val:
            st.plotly_chart(charts.layer_curves(val, log_y=log_y,
                                                title="Per-layer attention MSE during stage 1 (validation)"),
                            key="layers_curves")
        elif job.is_terminal:
            st.info("This job recorded no per-layer validation MSE (stage 1 was off, or it ended before its first "
                    "validation).")
        else:
            st.info("Per-layer validation curves appear at the first stage-1 validation (every "
                    "`stage1.eval_every` steps).")


def _job_view(job_id: int) -> None:
    job = api.get_job(job_id, **common.ws())
    log_y = st.session_state.get("layers_log", True)
    points = common.latest_attempt(api.job_metrics(job.id, **common.ws()))
    train, val = _layer_rows(points, "train_mse"), _layer_rows(points, "mse")
    if job.status == "running":
        st.caption(f"Live: {job.progress_stage or 'starting'} step {job.progress_step or 0}/{job.progress_total or '?'}"
                   f" · refreshes every {common.REFRESH_S:g} s")
    if train:
        _training_view(job.id, train, val, log_y)
    elif not job.is_terminal:
        st.info("Each layer's training MSE appears after stage 1's first step.")
    _validation_view(job, val, log_y, expanded=not train)
    c1, c2 = st.columns(2)
    s1 = _series(points, STAGE1, ("mse", "val_mse"))
    if s1:
        c1.plotly_chart(charts.stage_curves(s1, title="Stage 1: mean attention MSE", y_title="MSE", log_y=log_y),
                        key="layers_stage1")
    s2 = _series(points, STAGE2, ("loss", "val_loss"))
    if s2:
        c2.plotly_chart(charts.stage_curves(s2, title="Stage 2: next-token loss", y_title="cross-entropy"),
                        key="layers_stage2")
    if job.status != "succeeded":
        st.caption("The final per-layer MSE appears when the job succeeds.")
    elif not _final_view(f"#{job.id}", job, common.report(job), log_y):
        st.caption("This conversion's report has no per-layer MSE.")


def _final_view(label: str, conversion, result: dict | None, log_y: bool) -> bool:
    """The final per-layer MSE of a report (beside the layer scores of a ``softmax_layers: auto``
    run); False when the report has none."""
    mse = (result or {}).get("per_layer_mse")
    if not (isinstance(mse, list) and mse):
        return False
    kept = common.softmax_layers(conversion, result)
    scores = result.get("layer_scores")
    left, right = st.columns(2) if isinstance(scores, list) else (st.container(), None)
    left.plotly_chart(charts.final_layer_mse({label: mse}, {label: kept}, log_y=log_y), key="layers_bars")
    worst = max(range(len(mse)), key=lambda i: mse[i] or 0.0)
    left.caption(f"Highest final MSE: layer {worst} ({common.fmt_number(mse[worst])}). Layers kept as softmax "
                 "have no value.")
    if right is not None:
        _scores_view(right, scores, kept, str(score_name(result) or ""), log_y)
    return True


def _folder_view(conversion: common.Conversion) -> None:
    """A run folder or export made outside the workbench: no training metrics here, its report's final
    per-layer MSE when it has one."""
    st.caption(f"{conversion.title}: made outside the workbench, so its training curves are not recorded here.")
    if not _final_view(conversion.name, conversion, conversion.result, st.session_state.get("layers_log", True)):
        st.info("Its report has no per-layer MSE (an export keeps none; `lolcats eval` on it measures one).")


def _scores_view(column, scores: list, kept: list[int], score: str, log_y: bool) -> None:
    """The layer scores of a ``softmax_layers: auto`` run and the layers they kept softmax."""
    chosen = [i for i in kept if i < len(scores) and scores[i] is not None]  # not the layers never converted
    column.plotly_chart(charts.layer_score_bars(scores, chosen, score, log_y=log_y), key="layers_scores")
    how = forms.SCORE_HELP.get(score, score)
    column.caption(f"softmax_layers auto scored every converted layer after stage 1 by {score} ({how}) and kept "
                   f"the highest as softmax: layer(s) {', '.join(map(str, chosen)) or 'none'}.")


def _converted_mean(mse: list | None, kept: list[int]) -> float | None:
    """Mean final MSE over the converted layers (not the softmax ones, not null values), None if none."""
    values = [v for i, v in enumerate(mse or []) if i not in kept and isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None


def _compare_label(conversion: common.Conversion) -> str:
    """``#7 tiny-test`` for a job's conversion, ``runs/demo (run)`` for a folder no job made."""
    return f"#{conversion.job.id} {conversion.job.name or ''}".strip() if conversion.job else conversion.title


def _compare(conversions: list[common.Conversion]) -> None:
    """Every finished conversion (the jobs' and the folders no job made) side by side."""
    by_key = {c.key: c for c in conversions}
    if len(by_key) < 2:
        st.caption("Comparing conversions needs at least two finished ones.")
        return
    chosen = st.multiselect("Conversions to compare", list(by_key), default=list(by_key)[:3], key="layers_compare",
                            format_func=lambda k: _compare_label(by_key[k]))
    if not chosen:
        return
    bars, kept, rows, curves = {}, {}, [], {}
    for key in chosen:
        conversion = by_key[key]
        result = (common.report(conversion.job) if conversion.job else conversion.result) or {}
        label = _compare_label(conversion)
        kept[label] = common.softmax_layers(conversion, result)
        if isinstance(result.get("per_layer_mse"), list):
            bars[label] = result["per_layer_mse"]
        attn = conversion.config.get("attention", {})
        rows.append({"conversion": label, "model": conversion.config.get("model", {}).get("source"),
                     "attention": f"{attn.get('kind')}/{attn.get('feature_map')}",
                     "window": attn.get("window_size"), "softmax layers": ", ".join(map(str, kept[label])) or "none",
                     "teacher ppl": result.get("teacher_ppl"), "student ppl": result.get("student_ppl"),
                     "ratio": result.get("ppl_ratio"), "mean layer MSE": _converted_mean(bars.get(label), kept[label])})
        val = [] if conversion.job is None else [
            (p.step, p.value) for p in common.latest_attempt(api.job_metrics(conversion.job.id, name="val_mse",
                                                                             stage=STAGE1, **common.ws()))
            if p.layer is None and p.value is not None]
        if val:
            curves[label] = val
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    if bars:
        st.plotly_chart(charts.final_layer_mse(bars, kept, log_y=st.session_state.get("layers_log", True)),
                        key="layers_compare_bars")
    if curves:
        st.plotly_chart(charts.stage_curves(curves, title="Stage 1 validation MSE", y_title="MSE", log_y=True),
                        key="layers_compare_curves")


st.title("Layers")
st.caption("Attention-output MSE between each converted layer and its original softmax attention, on the same "
           "layer input. Stage 1 trains the feature maps to drive it down.")
jobs = common.list_jobs(kind=common.CONVERT)
outside = [c for c in common.conversions() if c.job is None]
if not jobs and not outside:
    common.no_conversion_notice("The Layers view", "layers_demo")
else:
    c1, c2 = st.columns([3, 1])
    with c1:
        selected = _pick(jobs, outside)
    with c2:
        st.toggle("Log scale", value=True, key="layers_log")
    if isinstance(selected, common.Conversion):
        _folder_view(selected)
    elif selected.status in common.ACTIVE:
        st.fragment(run_every=common.REFRESH_S)(_job_view)(selected.id)
    else:
        _job_view(selected.id)
    st.divider()
    st.subheader("Compare conversions")
    _compare(common.conversions(loadable=False))
