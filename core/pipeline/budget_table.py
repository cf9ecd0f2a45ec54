"""How a softmax-budget sweep's result (``budgets.json``, :mod:`core.pipeline.budgets`) reads: a
markdown table and a Plotly figure of quality against decode cost. Torch-free, so the workbench
can draw a finished sweep without loading a model."""

from __future__ import annotations

import math


def markdown_table(result: dict) -> str:
    teacher = result["teacher"]
    lines = [f"| softmax budget | layers kept softmax | held-out ppl | ppl ratio | decode ms/step at {result['context']} "
             "| cache MiB |", "|---:|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['budget']} | {r['softmax_layers'] or 'none'} | {r['student_ppl']:.3f} | "
                     f"{r['ppl_ratio']:.3f} | {_fmt(r['decode_ms_per_step'])} | {_mib(r['cache_bytes'])} |")
    lines.append(f"| teacher | all | {result['teacher_ppl']:.3f} | 1.000 | {_fmt(teacher['decode_ms_per_step'])} | "
                 f"{_mib(teacher['cache_bytes'])} |")
    return "\n".join(lines) + f"\n\nLayers ranked by `{score_name(result)}` after one attention transfer.\n"


def score_name(result: dict) -> str | None:
    """How the layers were ranked (``attention.softmax_score``); results and reports written before the
    name was shared call it ``score`` (budgets.json) or ``layer_score`` (report.json)."""
    return result.get("softmax_score", result.get("score", result.get("layer_score")))


def tradeoff_figure(result: dict):
    """Perplexity ratio against decode ms/step, one point per budget (labelled K), the teacher at ratio 1."""
    import plotly.graph_objects as go

    rows = [r for r in result["rows"] if r["decode_ms_per_step"] is not None]
    fig = go.Figure(go.Scatter(
        x=[r["decode_ms_per_step"] for r in rows], y=[r["ppl_ratio"] for r in rows], mode="lines+markers+text",
        text=[f"K={r['budget']}" for r in rows], textposition="top center", name="student",
        customdata=[[str(r["softmax_layers"]), _mib(r["cache_bytes"])] for r in rows],
        hovertemplate="%{text}: layers %{customdata[0]}<br>%{x:.1f} ms/step, cache %{customdata[1]} MiB"
                      "<br>ppl ratio %{y:.3f}<extra></extra>"))
    teacher = result["teacher"]
    if teacher["decode_ms_per_step"] is not None:
        fig.add_trace(go.Scatter(x=[teacher["decode_ms_per_step"]], y=[1.0], mode="markers+text", text=["teacher"],
                                 textposition="top center", name="teacher", marker={"symbol": "star", "size": 12}))
    fig.update_layout(title=f"Quality vs decode cost by softmax budget ({result['context']} tokens of context)",
                      xaxis_title="decode ms per step (batch 1)", yaxis_title="held-out perplexity / teacher",
                      template="plotly_white", height=420)
    return fig


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.1f}"


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.1f}"


__all__ = ["markdown_table", "score_name", "tradeoff_figure"]
