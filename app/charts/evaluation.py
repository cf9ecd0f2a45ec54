"""Charts of the Evaluation page: task accuracy and retention, perplexity by position (the frontier and
the passkey grid: :mod:`app.charts.long_context`)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from app.charts.style import COLORS, RATIO_FORMAT, TEMPLATE


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
