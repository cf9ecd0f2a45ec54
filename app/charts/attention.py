"""Attention heatmaps of the Attention page.

Heatmaps follow the bertviz / CircuitsVis conventions: rows are queries, columns are keys, the
causal upper triangle is masked (left blank), tokens label both axes, teacher and
student share one colour scale and their difference has one of its own range, and a log scale keeps
attention sinks from washing out the rest.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts.style import TEMPLATE

LOG_FLOOR = 1e-6  # weights below this are drawn at the floor of the log scale


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
    """Teacher and student weights of one head (``[L, L]`` each) on one shared colour scale, and their
    |difference| on a scale of its own range (a difference of 0.03 would be invisible on the weights'
    0-1 scale), each with its colour bar; the query labels are on the first panel only."""
    diff = np.abs(student - teacher)
    weights, difference = [causal(teacher), causal(student)], causal(diff)
    top = float(np.nanmax(difference)) if difference.size else 0.0
    if log:
        zmin, zmax = math.log10(LOG_FLOOR), 0.0
        dmin, dmax = math.log10(LOG_FLOOR), max(math.log10(max(top, LOG_FLOOR)), math.log10(LOG_FLOOR) + 1)
    else:
        zmin, zmax = 0.0, float(np.nanmax([np.nanmax(m) for m in weights]) or 1.0)
        dmin, dmax = 0.0, top or 1.0
    labels = token_labels(tokens)
    fig = make_subplots(rows=1, cols=3, subplot_titles=["teacher (softmax)", "student (LoLCATs)",
                                                       "|student − teacher| (own scale)"], horizontal_spacing=0.09)
    for col, (m, axis, what) in enumerate([(weights[0], "coloraxis", "weight"), (weights[1], "coloraxis", "weight"),
                                           (difference, "coloraxis2", "|difference|")], start=1):
        fig.add_trace(go.Heatmap(
            z=_scaled(m, log), x=labels, y=labels, coloraxis=axis,
            customdata=m, hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{what} %{{customdata:.4f}}<extra></extra>",
        ), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(title_text="query", row=1, col=1)
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    fig.update_yaxes(showticklabels=False, row=1, col=3)
    fig.update_xaxes(title_text="key", tickangle=-60)
    prefix = "log10 " if log else ""
    fig.update_layout(
        title=title, template=TEMPLATE, height=min(max(460, 14 * len(labels) + 200), 820), margin={"t": 80, "b": 40},
        coloraxis={"colorscale": "Viridis", "cmin": zmin, "cmax": zmax,
                   "colorbar": {"title": {"text": prefix + "weight", "side": "right"}, "x": 1.01, "len": 0.9}},
        # white where the student matches the teacher, so the window's exact part reads as blank
        coloraxis2={"colorscale": "Reds", "cmin": dmin, "cmax": dmax,
                    "colorbar": {"title": {"text": prefix + "|difference|", "side": "right"}, "x": 1.11, "len": 0.9}},
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
