"""Charts of the Layers and Budgets pages: per-layer attention MSE over training and at the end, layer scores."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import plotly.graph_objects as go

from app.charts.style import COLORS, TEMPLATE

# a log axis whose ticks all read as powers of ten (10⁻⁶, 10⁻³), not a mix of SI prefixes and decimals (1μ, 0.001)
LOG_AXIS = {"type": "log", "exponentformat": "power", "minexponent": 0}


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
        fig.update_yaxes(**LOG_AXIS)
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
        fig.update_yaxes(**LOG_AXIS)
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
    _layer_axis(fig, max((len(v) for v in per_job.values()), default=0))
    if log_y:
        fig.update_yaxes(**LOG_AXIS)
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
    _layer_axis(fig, len(scores))
    if log_y:
        fig.update_yaxes(**LOG_AXIS)
    return fig


def _layer_axis(fig: go.Figure, layers: int) -> None:
    """An x axis of ``layers`` layers: from layer 0 to the last (no layer -1 of padding), each one
    ticked when there are at most 32."""
    fig.update_xaxes(range=[-0.5, max(layers, 1) - 0.5], dtick=1 if layers <= 32 else None)


def _ramp(t: float) -> str:
    """Colour of layer position ``t`` in [0, 1] (early layers blue, late layers red)."""
    import plotly.colors as pc

    return pc.sample_colorscale("Turbo", [0.1 + 0.8 * t])[0]


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
        fig.update_yaxes(**LOG_AXIS)
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
    _layer_axis(fig, max((len(v) for v in per_job.values()), default=0))
    fig.update_yaxes(**LOG_AXIS)
    return fig
