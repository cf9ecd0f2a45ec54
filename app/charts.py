"""Plotly figures of the workbench (pure functions of plain data; no Streamlit, no torch).

Heatmaps follow the bertviz / CircuitsVis conventions: rows are queries, columns are keys, the
causal upper triangle is masked (left blank), tokens label both axes, teacher / student /
difference share one colour scale, and a log scale keeps attention sinks from washing out the rest.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

TEMPLATE = "plotly_white"
LOG_FLOOR = 1e-6  # weights below this are drawn at the floor of the log scale
COLORS = {"teacher": "#1f77b4", "student": "#d62728"}  # also the order models are drawn in
BENCH_COLORS = {**COLORS, "floor": "#7f7f7f"}  # benchmarks also draw the attention-free floor
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]  # one per group of fixed factors
GIB = 1024**3
MEMORY_UNIT = "GiB"  # the one unit of benchmark memory, in charts and tables: bytes / GIB
RATIO_FORMAT = ".3f"  # ratios near 1 (student / teacher), as common.fmt_ratio: 1.0012 reads 1.001, never 1


# ----------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------


def layer_curves(rows: Sequence[dict], *, log_y: bool = True, title: str = "Per-layer attention MSE") -> go.Figure:
    """One line per layer: ``rows`` are dicts with ``layer``, ``step``, ``value`` (and ``stage``)."""
    fig = go.Figure()
    layers = sorted({r["layer"] for r in rows})
    n = max(len(layers), 1)
    for i, layer in enumerate(layers):
        pts = sorted((r for r in rows if r["layer"] == layer), key=lambda r: r["step"])
        fig.add_trace(go.Scatter(
            x=[p["step"] for p in pts], y=[p["value"] for p in pts], mode="lines+markers", name=f"layer {layer}",
            line={"color": _ramp(i / max(n - 1, 1))}, marker={"size": 5},
            hovertemplate=f"layer {layer}<br>step %{{x}}<br>MSE %{{y:.3g}}<extra></extra>",
        ))
    fig.update_layout(title=title, template=TEMPLATE, xaxis_title="training step", yaxis_title="attention-output MSE",
                      legend_title_text="layer", height=420, margin={"t": 60, "b": 40})
    _integer_steps(fig, [r["step"] for r in rows])
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def _integer_steps(fig: go.Figure, steps: Iterable[int]) -> None:
    """Steps are whole numbers: with few of them, tick exactly those (no 2.5)."""
    distinct = sorted(set(steps))
    if 0 < len(distinct) <= 12:
        fig.update_xaxes(tickmode="array", tickvals=distinct)
    else:
        fig.update_xaxes(tickformat="d")


def stage_curves(series: dict[str, Sequence[tuple[int, float]]], *, title: str, y_title: str,
                 log_y: bool = False) -> go.Figure:
    """Named ``(step, value)`` series on one chart (loss, validation loss, ...)."""
    fig = go.Figure()
    for name, pts in series.items():
        pts = sorted(pts)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name,
                                 marker={"size": 5}))
    fig.update_layout(title=title, template=TEMPLATE, xaxis_title="step", yaxis_title=y_title, height=360,
                      margin={"t": 60, "b": 40})
    _integer_steps(fig, [p[0] for pts in series.values() for p in pts])
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def layer_bars(per_job: dict[str, Sequence[float]], softmax_layers: dict[str, Iterable[int]] | None = None, *,
               log_y: bool = True) -> go.Figure:
    """Final per-layer MSE (``report.json`` ``per_layer_mse``), grouped bars, one colour per job; a value
    that is null or not positive (a layer kept softmax) has no bar."""
    fig = go.Figure()
    for name, values in per_job.items():
        kept = set((softmax_layers or {}).get(name, ()))
        text = ["softmax" if i in kept else "" for i in range(len(values))]
        fig.add_trace(go.Bar(x=list(range(len(values))), y=[v if v and v > 0 else None for v in values], name=name,
                             text=text, hovertemplate="layer %{x}<br>MSE %{y:.3g}<extra>" + name + "</extra>"))
    fig.update_layout(title="Final per-layer attention MSE (held-out text)", template=TEMPLATE, barmode="group",
                      xaxis_title="layer", yaxis_title="attention-output MSE", height=400, margin={"t": 60, "b": 40})
    fig.update_xaxes(dtick=1 if max((len(v) for v in per_job.values()), default=0) <= 32 else None)
    if log_y:
        fig.update_yaxes(type="log")
    return fig


SCORE_LABELS = {"kl": "next-token KL", "mse": "normalised attention-output MSE"}  # attention.softmax_score
SCORE_COLORS = {"converted": "#7f7f7f", "kept": COLORS["student"]}


def layer_score_bars(scores: Sequence[float | None], kept: Iterable[int], score_name: str, *,
                     log_y: bool = True) -> go.Figure:
    """The score of each converted layer (``report.json`` ``layer_scores``, ``attention.softmax_score``
    ``score_name``), one bar per layer; the layers ``softmax_layers: auto`` kept softmax (``kept``) are
    drawn in their own colour with the text "kept softmax". A null score (a layer never converted) has no bar."""
    kept = set(kept)
    layers = [i for i, v in enumerate(scores) if v is not None]
    label = SCORE_LABELS.get(score_name, score_name)
    fig = go.Figure(go.Bar(
        x=layers, y=[scores[i] for i in layers], text=["kept softmax" if i in kept else "" for i in layers],
        marker={"color": [SCORE_COLORS["kept" if i in kept else "converted"] for i in layers]},
        hovertemplate="layer %{x}<br>" + label + " %{y:.3g}<extra></extra>", name=label))
    fig.update_layout(title=f"Layer scores after stage 1 ({label})", template=TEMPLATE, xaxis_title="layer",
                      yaxis_title=label, height=400, margin={"t": 60, "b": 40})
    fig.update_xaxes(dtick=1 if len(scores) <= 32 else None)
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def _ramp(t: float) -> str:
    """Colour of layer position ``t`` in [0, 1] (early layers blue, late layers red)."""
    import plotly.colors as pc

    return pc.sample_colorscale("Turbo", [0.1 + 0.8 * t])[0]


# ----------------------------------------------------------------------------------------------
# Attention heatmaps
# ----------------------------------------------------------------------------------------------


VISIBLE_WHITESPACE = str.maketrans({" ": "␣", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def token_labels(tokens: Sequence[str]) -> list[str]:
    """Readable, unique axis labels of decoded token texts (:func:`core.models.token_text.token_texts`):
    the index first (plotly merges equal category names), spaces as ``␣``, newlines as ``\\n``: ``3 ␣the``."""
    return [f"{i} {str(tok).translate(VISIBLE_WHITESPACE)}" for i, tok in enumerate(tokens)]


def causal(matrix: np.ndarray) -> np.ndarray:
    """Copy of an ``[L, L]`` matrix with the upper triangle (future keys) set to NaN (drawn blank)."""
    m = np.array(matrix, dtype=float)
    m[np.triu_indices(m.shape[0], k=1)] = np.nan
    return m


def _scaled(m: np.ndarray, log: bool) -> np.ndarray:
    return np.log10(np.clip(m, LOG_FLOOR, None)) if log else m


def attention_heatmaps(teacher: np.ndarray, student: np.ndarray, tokens: Sequence[str], *, log: bool = False,
                       title: str = "") -> go.Figure:
    """Teacher, student and |difference| of one head (``[L, L]`` each) on one shared colour scale."""
    diff = np.abs(student - teacher)
    mats = [causal(teacher), causal(student), causal(diff)]
    if log:
        zmin, zmax = math.log10(LOG_FLOOR), 0.0
    else:
        zmin, zmax = 0.0, float(np.nanmax([np.nanmax(m) for m in mats]) or 1.0)
    labels = token_labels(tokens)
    fig = make_subplots(rows=1, cols=3, subplot_titles=["teacher (softmax)", "student (LoLCATs)",
                                                       "|student − teacher|"], horizontal_spacing=0.06)
    for col, m in enumerate(mats, start=1):
        fig.add_trace(go.Heatmap(
            z=_scaled(m, log), x=labels, y=labels, coloraxis="coloraxis",
            customdata=m, hovertemplate="query %{y}<br>key %{x}<br>weight %{customdata:.4f}<extra></extra>",
        ), row=1, col=col)
    fig.update_yaxes(autorange="reversed", title_text="query", row=1, col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="key", tickangle=-60)
    fig.update_layout(
        title=title, template=TEMPLATE, height=min(max(460, 14 * len(labels) + 200), 820), margin={"t": 80, "b": 40},
        coloraxis={"colorscale": "Viridis", "cmin": zmin, "cmax": zmax,
                   "colorbar": {"title": {"text": "log10 weight" if log else "weight"}}},
    )
    return fig


def head_grid(maps: np.ndarray, *, log: bool = False, title: str = "", cols: int = 4) -> go.Figure:
    """Small multiples: one ``[L, L]`` map per head (``maps`` is ``[H, L, L]``), one colour scale."""
    heads = maps.shape[0]
    rows = math.ceil(heads / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"head {h}" for h in range(heads)],
                        horizontal_spacing=0.03, vertical_spacing=0.08)
    if log:
        zmin, zmax = math.log10(LOG_FLOOR), 0.0
    else:
        zmin, zmax = 0.0, float(np.max(maps)) or 1.0
    for h in range(heads):
        fig.add_trace(go.Heatmap(z=_scaled(causal(maps[h]), log), coloraxis="coloraxis",
                                 hovertemplate=f"head {h}<br>query %{{y}}<br>key %{{x}}<br>%{{z:.4f}}<extra></extra>"),
                      row=h // cols + 1, col=h % cols + 1)
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(title=title, template=TEMPLATE, height=230 * rows + 80, margin={"t": 80, "b": 20},
                      coloraxis={"colorscale": "Viridis", "cmin": zmin, "cmax": zmax})
    return fig


# ----------------------------------------------------------------------------------------------
# Throughput
# ----------------------------------------------------------------------------------------------

THROUGHPUT_METRICS = {
    "tokens_per_second": "tokens/s (prefill + decode)",
    "decode_tokens_per_second": "decode tokens/s",
    "prefill_tokens_per_second": "prefill tokens/s",
    "peak_memory_bytes": f"peak memory ({MEMORY_UNIT})",
}
# the factors a benchmark chart is drawn against, by their keys in app.bench_results.normalise and in core.bench
FACTORS = {"batch_size": "batch size", "context_length": "context length", "prompt_length": "context length"}


def axis_label(x: str) -> str:
    """The axis title of factor ``x``: ``batch size``, ``context length (prompt tokens)``."""
    return FACTORS[x] + ("" if x == "batch_size" else " (prompt tokens)")


def varies(points: Sequence[dict[str, Any]], x: str) -> bool:
    """Whether ``points`` take more than one value of ``x``: a chart against ``x`` needs two."""
    return len({p.get(x) for p in points}) > 1


def throughput_figure(points: Sequence[dict[str, Any]], x: str, metric: str) -> go.Figure:
    """``metric`` against ``x`` (``batch_size`` or ``context_length``), teacher vs student.

    ``points`` are normalised benchmark points (:func:`app.bench_results.normalise`): one line per
    model and per combination of the other factors; points that ran out of memory are left out
    (the page lists them)."""
    fig = go.Figure()
    others = [k for k in ("batch_size", "context_length", "gen_length") if k != x]
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault(tuple(p.get(k) for k in others), []).append(p)
    varied = {k: v for k, v in groups.items() if len({p.get(x) for p in v}) > 1} or groups
    dashes = ["solid", "dash", "dot", "dashdot"]
    scale = GIB if metric.endswith("_bytes") else 1.0
    for gi, (key, pts) in enumerate(sorted(varied.items(), key=lambda kv: str(kv[0]))):
        fixed = ", ".join(f"{k.split('_')[0]}={v}" for k, v in zip(others, key) if v is not None)
        for model in BENCH_COLORS:
            ok = sorted((p for p in pts if p.get("model") == model and p.get("status") == "ok"
                         and isinstance(p.get(metric), (int, float)) and p.get(x) is not None), key=lambda p: p[x])
            if not ok:
                continue
            fig.add_trace(go.Scatter(
                x=[p[x] for p in ok], y=[p[metric] / scale for p in ok], mode="lines+markers",
                name=f"{model} ({fixed})" if fixed else model,
                line={"color": BENCH_COLORS[model], "dash": dashes[gi % len(dashes)]},
            ))
    label = axis_label(x)
    fig.update_layout(title=f"{THROUGHPUT_METRICS.get(metric, metric)} vs {label}", template=TEMPLATE,
                      xaxis_title=label, yaxis_title=THROUGHPUT_METRICS.get(metric, metric), height=380,
                      margin={"t": 60, "b": 40})
    fig.update_xaxes(type="log", dtick=math.log10(2))
    return fig


def _bench_groups(points: list[dict], x: str) -> dict[tuple, list[dict]]:
    """Points grouped by the two factors other than ``x``; groups where ``x`` takes several values
    come first (all groups are kept so that a single-point result still plots)."""
    others = [k for k in ("batch_size", "prompt_length", "gen_length") if k != x]
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault(tuple(p[k] for k in others), []).append(p)
    varied = {k: v for k, v in groups.items() if len({p[x] for p in v}) > 1}
    return varied or groups


def _fixed_label(x: str, key: tuple) -> str:
    names = {"batch_size": "B", "prompt_length": "L", "gen_length": "G"}
    others = [k for k in ("batch_size", "prompt_length", "gen_length") if k != x]
    return " ".join(f"{names[k]}={v}" for k, v in zip(others, key))


def _bench_figure(result: dict, x: str, panels: list[tuple[str, str, float]], title: str, log_y: bool) -> go.Figure:
    """One row of panels (``(metric, y label, scale)``) against ``x``; OOM points are named in the title."""
    xlabel = axis_label(x)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels])
    groups = _bench_groups(result["points"], x)
    ooms = []
    for gi, (key, pts) in enumerate(sorted(groups.items())):
        for model in BENCH_COLORS:
            rows = sorted((p for p in pts if p["model"] == model), key=lambda p: p[x])
            ooms += [f"{model} {_fixed_label(x, key)} {x.split('_')[0]}={p[x]}" for p in rows if p["status"] == "oom"]
            ok = [p for p in rows if p["status"] == "ok"]
            if not ok:
                continue
            for col, (metric, _, scale) in enumerate(panels, start=1):
                fig.add_trace(
                    go.Scatter(
                        x=[p[x] for p in ok],
                        y=[p[metric] / scale for p in ok],
                        mode="lines+markers",
                        name=f"{model} ({_fixed_label(x, key)})",
                        legendgroup=f"{model}-{key}",
                        showlegend=col == 1,
                        line={"color": BENCH_COLORS[model], "dash": DASHES[gi % len(DASHES)]},
                    ),
                    row=1, col=col,
                )
    fig.update_xaxes(title_text=xlabel, type="log", dtick=math.log10(2))
    if log_y:
        fig.update_yaxes(type="log")
    for col, (_, ylabel, _) in enumerate(panels, start=1):
        fig.update_yaxes(title_text=ylabel, row=1, col=col)
    text = title + (f"<br><sup>out of memory: {', '.join(ooms)}</sup>" if ooms else "")
    fig.update_layout(title_text=text, template=TEMPLATE, legend_title_text="model (fixed factors)")
    return fig


def benchmark_figures(result: dict[str, Any]) -> dict[str, go.Figure]:
    """Figures of a :func:`core.bench.run_benchmark` result: throughput and peak memory against batch size and
    against context length, teacher vs student (and the attention-free floor where measured). Keys:
    ``throughput_vs_batch``, ``throughput_vs_context``, ``memory_vs_batch``, ``memory_vs_context``
    (those against a factor the points hold at one value are left out: :func:`varies`),
    ``floor_gap`` (:func:`floor_gap_figure`) when the floor was measured and ``capacity``
    (:func:`capacity_figure`) for a capacity run. A capacity run alone has only ``capacity``."""
    if not result.get("points") and result.get("capacity"):
        return {"capacity": capacity_figure(result["capacity"])}
    throughput = [
        ("prefill_tokens_per_second", "prefill tokens/s", 1.0),
        ("decode_tokens_per_second", "decode tokens/s", 1.0),
    ]
    memory = [
        ("peak_memory_bytes", f"peak memory, prefill + decode ({MEMORY_UNIT})", GIB),
        ("decode_peak_memory_bytes", f"peak memory while decoding ({MEMORY_UNIT})", GIB),
    ]
    axes = {x: key for x, key in (("batch_size", "batch"), ("prompt_length", "context")) if varies(result["points"], x)}
    return {
        **{f"throughput_vs_{key}": _bench_figure(result, x, throughput, f"Throughput vs {FACTORS[x]}", True)
           for x, key in axes.items()},
        **{f"memory_vs_{key}": _bench_figure(result, x, memory, f"Peak memory vs {FACTORS[x]}", False)
           for x, key in axes.items()},
        **({"floor_gap": floor_gap_figure(result)} if any("prefill_vs_floor" in c for c in result.get("comparisons", [])) else {}),
        **({"capacity": capacity_figure(result["capacity"])} if result.get("capacity") else {}),
    }


def floor_gap_figure(result: dict[str, Any]) -> go.Figure:
    """Per point, the student's speed over the teacher's and over the attention-free floor's
    (``comparisons`` of a result with the floor), prefill and decode side by side; the floor over
    the teacher is the limit of any attention replacement. The dotted line at 1 is parity."""
    rows = [c for c in result.get("comparisons", []) if "prefill_vs_floor" in c]
    labels = [f"B={c['batch_size']} L={c['prompt_length']}" for c in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["prefill", "decode"])
    bars = [("student / teacher", "speedup", COLORS["student"]), ("floor / teacher", "floor_speedup", BENCH_COLORS["floor"]),
            ("student / floor", "vs_floor", "#ff9896")]
    for col, phase in enumerate(("prefill", "decode"), start=1):
        for name, key, colour in bars:
            field = f"floor_{phase}_speedup" if key == "floor_speedup" else f"{phase}_{key}"
            fig.add_trace(go.Bar(x=labels, y=[c[field] for c in rows], name=name, legendgroup=name, showlegend=col == 1,
                                 marker={"color": colour},
                                 hovertemplate=f"%{{x}}<br>{phase} {name} %{{y:{RATIO_FORMAT}}}<extra></extra>"),
                          row=1, col=col)
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_yaxes(title_text="ratio of tokens/s", row=1, col=1)
    fig.update_layout(title_text="Speed against the teacher and the attention-free floor", template=TEMPLATE,
                      barmode="group", height=400)
    return fig


def capacity_figure(capacity: dict[str, Any]) -> go.Figure:
    """A capacity run (``core.bench.capacity``, like the paper's Fig. 8): decode tokens/s against batch
    size and the measured peak memory against batch size with the budget as a line, per model and
    context length, from the trials that ran; the largest batch within the budget is ringed, and
    trials out of memory or over the budget are named in the title."""
    fig = make_subplots(rows=1, cols=2,
                        subplot_titles=["decode tokens/s", f"peak memory while decoding ({MEMORY_UNIT})"])
    over = []
    for gi, context in enumerate(capacity.get("contexts", [])):
        for model, found in context.get("models", {}).items():
            measured = sorted((t for t in found["trials"] if "peak_memory_bytes" in t), key=lambda t: t["batch_size"])
            fits = [t for t in measured if t["status"] == "ok"]
            over += [f"{model} B={t['batch_size']} ({t['status']})" for t in found["trials"] if t["status"] != "ok"]
            name = f"{model} (L={context['prompt_length']})"
            line = {"color": BENCH_COLORS[model], "dash": DASHES[gi % len(DASHES)]}
            fig.add_trace(go.Scatter(x=[t["batch_size"] for t in fits], y=[t["decode_tokens_per_second"] for t in fits],
                                     mode="lines+markers", name=name, legendgroup=name, line=line), row=1, col=1)
            fig.add_trace(go.Scatter(x=[t["batch_size"] for t in measured], y=[t["peak_memory_bytes"] / GIB for t in measured],
                                     mode="lines+markers", name=name, legendgroup=name, showlegend=False, line=line),
                          row=1, col=2)
            if found.get("largest_batch"):
                fig.add_trace(go.Scatter(x=[found["largest_batch"]], y=[found["decode_tokens_per_second"]], mode="markers",
                                         name=f"{name}: largest batch {found['largest_batch']}", legendgroup=name,
                                         marker={"size": 14, "symbol": "circle-open", "color": BENCH_COLORS[model]}),
                              row=1, col=1)
    budget = capacity.get("memory_budget_bytes")
    if budget:
        fig.add_hline(y=budget / GIB, line_dash="dot", line_color="black", row=1, col=2,
                      annotation_text=f"budget {capacity.get('memory_budget', '')}")
    fig.update_xaxes(title_text="batch size", type="log", dtick=math.log10(2))
    fig.update_yaxes(type="log", row=1, col=1)
    title = f"Capacity under a {capacity.get('memory_budget', '')} memory budget"
    fig.update_layout(title_text=title + (f"<br><sup>not within the budget: {', '.join(over)}</sup>" if over else ""),
                      template=TEMPLATE, height=420)
    return fig


# ----------------------------------------------------------------------------------------------
# Task accuracy (core.eval.harness results: TASK -> {"metric", "teacher": {...}, "student": {...}, ...})
# ----------------------------------------------------------------------------------------------

PATTERNS = ["", "/", "x", ".", "\\", "+"]  # one bar pattern per compared run


def headline(entry: dict[str, Any], role: str) -> tuple[float | None, float | None]:
    """``(value, standard error)`` of the entry's headline metric for ``role`` (teacher / student)."""
    metric = entry.get("metric")
    if metric is None:
        return None, None
    scores = entry.get(role) or {}
    return scores.get(metric), scores.get(f"{metric}_stderr")


def retention(entry: dict[str, Any]) -> float | None:
    """Student over teacher on the headline metric; None when the teacher scores 0 or either is missing."""
    teacher, _ = headline(entry, "teacher")
    student, _ = headline(entry, "student")
    return student / teacher if teacher and student is not None else None


def task_bars(runs: dict[str, dict[str, dict]], *, title: str = "Task accuracy: teacher vs student") -> go.Figure:
    """Grouped bars per task: teacher and student headline metric of every run (``label -> results``),
    error bars of ±1 standard error (lm-eval's ``<metric>_stderr``); runs differ by bar pattern."""
    fig = go.Figure()
    for i, (label, results) in enumerate(runs.items()):
        tasks = list(results)
        for role, colour in COLORS.items():
            values = [headline(results[t], role) for t in tasks]
            name = role if len(runs) == 1 else f"{label} · {role}"
            fig.add_trace(go.Bar(
                x=tasks, y=[v for v, _ in values], name=name, legendgroup=label,
                error_y={"type": "data", "array": [e for _, e in values], "visible": True},
                marker={"color": colour, "pattern": {"shape": PATTERNS[i % len(PATTERNS)]}},
                customdata=[[results[t]["metric"], e] for t, (_, e) in zip(tasks, values)],
                hovertemplate="%{x}<br>%{customdata[0]} %{y:.3f} ± %{customdata[1]:.3f}<extra>" + name + "</extra>",
            ))
    fig.update_layout(title=title, template=TEMPLATE, barmode="group", xaxis_title="task",
                      yaxis_title="score (headline metric)", yaxis_range=[0, 1], height=420, margin={"t": 60, "b": 40})
    return fig


def retention_bars(runs: dict[str, dict[str, dict]]) -> go.Figure:
    """Per task, the student's score as a fraction of the teacher's (:func:`retention`), one bar per run;
    the dotted line at 1 is parity."""
    fig = go.Figure()
    for label, results in runs.items():
        tasks = list(results)
        fig.add_trace(go.Bar(x=tasks, y=[retention(results[t]) for t in tasks], name=label,
                             hovertemplate=f"%{{x}}<br>student / teacher %{{y:{RATIO_FORMAT}}}<extra>{label}</extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(title="Retention: student / teacher", template=TEMPLATE, barmode="group", xaxis_title="task",
                      yaxis_title="student / teacher", height=360, margin={"t": 60, "b": 40})
    return fig


# ----------------------------------------------------------------------------------------------
# Long context (core.eval.long_context: the ``long_context`` section of report.json / eval.json)
# ----------------------------------------------------------------------------------------------

BASELINE_COLORS = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2"]  # one per sliding-window baseline


def tokens_label(n: int) -> str:
    """A token count as an axis label: 64, 256, 1k, 2k; 4095 (the last bucket of a 4096-token
    evaluation ends one short, since position t predicts token t + 1) reads 4k."""
    return str(n) if n < 1000 else f"{round(n / 1024, 1):g}k"


def _ratio_series(section: dict[str, Any]) -> list[tuple[str, str, dict]]:
    """``(key, name, line)`` of the student (solid) and of each baseline (dashed, by its label)."""
    series = [("student", "student", {"color": COLORS["student"]})]
    for i, (name, baseline) in enumerate(section["baselines"].items()):
        series.append((name, baseline["label"], {"color": BASELINE_COLORS[i % len(BASELINE_COLORS)], "dash": "dash"}))
    return series


def position_ratios(section: dict[str, Any]) -> go.Figure:
    """Perplexity over the teacher's by position of the predicted token (``by_position`` buckets,
    labelled ``1k-2k``): one line for the student, one dashed line per untrained sliding-window
    baseline, and the teacher as the dotted line at 1.0. Lower is better."""
    rows = section["by_position"]
    x = [f"{tokens_label(r['start'])}-{tokens_label(r['end'])}" for r in rows]
    fig = go.Figure()
    for key, name, line in _ratio_series(section):
        fig.add_trace(go.Scatter(
            x=x, y=[r[key] for r in rows], mode="lines+markers", name=name, line=line,
            customdata=[r["teacher_ppl"] for r in rows],
            hovertemplate=f"positions %{{x}}<br>ppl / teacher's %{{y:{RATIO_FORMAT}}}"
                          f"<br>teacher ppl %{{customdata:.3f}}<extra>{name}</extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray", annotation_text="teacher")
    fig.update_layout(title=f"Perplexity / teacher's by position (trained on {section['train_seq_len']} tokens)",
                      template=TEMPLATE, xaxis_title="position of the predicted token",
                      yaxis_title="perplexity / teacher's (lower is better)", height=400, margin={"t": 60, "b": 40})
    return fig


# ----------------------------------------------------------------------------------------------
# Layers over training
# ----------------------------------------------------------------------------------------------


def layer_step_heatmap(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Layers x steps: ``rows`` are dicts with ``layer``, ``step``, ``value``; one row per layer (layer 0
    on top, every layer labelled), one column per step, colour the log10 of the value. A cell without a
    positive value is blank; the last row of a (layer, step) pair wins."""
    layers = sorted({r["layer"] for r in rows})
    steps = sorted({r["step"] for r in rows})
    value = {(r["layer"], r["step"]): r["value"] for r in rows}
    mse = [[value.get((layer, step)) for step in steps] for layer in layers]
    fig = go.Figure(go.Heatmap(
        x=steps, y=[f"layer {layer}" for layer in layers], customdata=mse,
        z=[[math.log10(v) if v and v > 0 else None for v in row] for row in mse],
        colorscale="Viridis", colorbar={"title": {"text": "log10 MSE"}},
        hovertemplate="%{y}<br>step %{x}<br>MSE %{customdata:.3g}<extra></extra>"))
    fig.update_layout(title=title, template=TEMPLATE, xaxis_title="training step", height=140 + 16 * len(layers),
                      margin={"t": 60, "b": 40})
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=[f"layer {layer}" for layer in layers],
                     tickfont={"size": 10 if len(layers) > 24 else 12})
    _integer_steps(fig, steps)
    return fig


def chosen_layer_curves(train: Sequence[dict], val: Sequence[dict], layers: Sequence[int], *,
                        log_y: bool = True) -> go.Figure:
    """The training (solid line) and validation (dashed, markers) curves of ``layers``, one distinct
    colour per layer; ``train`` and ``val`` are rows with ``layer``, ``step``, ``value``. A layer
    without validation rows has its training line only."""
    import plotly.colors as pc

    palette = pc.qualitative.D3
    fig = go.Figure()
    for i, layer in enumerate(layers):
        colour = palette[i % len(palette)]
        for rows, kind, dash in ((train, "training", "solid"), (val, "validation", "dash")):
            pts = sorted(((r["step"], r["value"]) for r in rows if r["layer"] == layer))
            if pts:
                fig.add_trace(go.Scatter(
                    x=[s for s, _ in pts], y=[v for _, v in pts], name=f"layer {layer} ({kind})",
                    mode="lines" if kind == "training" else "lines+markers", line={"color": colour, "dash": dash},
                    hovertemplate=f"layer {layer} {kind}<br>step %{{x}}<br>MSE %{{y:.3g}}<extra></extra>"))
    fig.update_layout(title="Chosen layers: attention MSE during stage 1", template=TEMPLATE,
                      xaxis_title="training step", yaxis_title="attention-output MSE", height=400,
                      margin={"t": 60, "b": 40})
    _integer_steps(fig, [r["step"] for r in train])
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def final_layer_mse(per_job: dict[str, Sequence[float]], softmax_layers: dict[str, Iterable[int]] | None = None, *,
                    log_y: bool = True) -> go.Figure:
    """Final per-layer MSE (``report.json`` ``per_layer_mse``), one colour per job: points joined by
    lines on a log axis (a bar's height means nothing there), grouped bars (:func:`layer_bars`) on a
    linear one. A value that is null or not positive (a layer kept softmax) has no point."""
    if not log_y:
        return layer_bars(per_job, softmax_layers, log_y=False)
    fig = go.Figure()
    for name, values in per_job.items():
        kept = set((softmax_layers or {}).get(name, ()))
        fig.add_trace(go.Scatter(
            x=list(range(len(values))), y=[v if v and v > 0 else None for v in values], name=name,
            text=["softmax" if i in kept else "" for i in range(len(values))], mode="lines+markers",
            hovertemplate="layer %{x}<br>MSE %{y:.3g}<extra>" + name + "</extra>"))
    fig.update_layout(title="Final per-layer attention MSE (held-out text)", template=TEMPLATE, xaxis_title="layer",
                      yaxis_title="attention-output MSE", height=400, margin={"t": 60, "b": 40})
    fig.update_xaxes(dtick=1 if max((len(v) for v in per_job.values()), default=0) <= 32 else None)
    fig.update_yaxes(type="log")
    return fig
