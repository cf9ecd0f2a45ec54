"""Charts of the long-context evaluation (:class:`core.eval.long_context_result.LongContextResult`):
the training-free frontier with the conversion as a point on it, and the passkey grid."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts.style import COLORS, RATIO_FORMAT, TEMPLATE
from core.eval.long_context_result import MEMORY_MATCHED, LongContextResult

CURVE_COLOR = "#7f7f7f"
OTHERS_COLOR = "#ff7f0e"


def frontier_lengths(section: LongContextResult) -> list[int]:
    """The lengths at which ``section`` has a frontier to draw (none without one)."""
    return [at.length for at in section.frontier.at] if section.frontier else []


def frontier_chart(section: LongContextResult, length: int,
                   others: list[tuple[str, LongContextResult]] = ()) -> go.Figure:
    """Perplexity / the teacher's at ``length`` against key/value (or state) bytes per layer, log x:
    the untrained sliding windows as the curve (the memory-matched one marked), the conversion at its
    state bytes as a red point, and each of ``others`` (label, section) that measured ``length`` and
    has state bytes as an orange point. Lower and further left is better; below the curve at its own
    bytes the conversion is worth its memory."""
    f = section.frontier
    j = [at.length for at in f.at].index(length)
    fig = go.Figure()
    matched = section.baselines.get(MEMORY_MATCHED)
    fig.add_trace(go.Scatter(
        x=[p.bytes_per_layer for p in f.points], y=[p.ratios[j] for p in f.points], mode="lines+markers",
        name="untrained sliding windows", line={"color": CURVE_COLOR, "dash": "dash"},
        text=[f"window {p.window} + {p.sinks} sinks" + (" (memory-matched)" if matched and p.window == matched.window
                                                         else "") for p in f.points],
        hovertemplate=f"%{{text}}<br>%{{x:,}} bytes / layer<br>ppl / teacher's %{{y:{RATIO_FORMAT}}}<extra></extra>"))
    mine = section.student_ratio(length)
    fig.add_trace(go.Scatter(
        x=[f.student_bytes], y=[mine], mode="markers", name="this conversion",
        marker={"color": COLORS["student"], "size": 13, "symbol": "diamond"},
        hovertemplate=f"this conversion<br>%{{x:,}} bytes / layer<br>ppl / teacher's %{{y:{RATIO_FORMAT}}}"
                      "<extra></extra>"))
    points = [(label, other.state_bytes_per_layer, other.student_ratio(length)) for label, other in others]
    points = [p for p in points if p[1] and p[2] is not None]
    if points:
        fig.add_trace(go.Scatter(
            x=[p[1] for p in points], y=[p[2] for p in points], mode="markers", name="other conversions",
            text=[p[0] for p in points], marker={"color": OTHERS_COLOR, "size": 10},
            hovertemplate=f"%{{text}}<br>%{{x:,}} bytes / layer<br>ppl / teacher's %{{y:{RATIO_FORMAT}}}"
                          "<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray", annotation_text="teacher")
    fig.update_layout(title=f"Quality against memory at {length} tokens", template=TEMPLATE,
                      xaxis={"type": "log", "title": "state or key/value cache, bytes per layer (log)"},
                      yaxis_title="perplexity / teacher's (lower is better)", height=420, margin={"t": 60, "b": 40})
    return fig


def passkey_grid(section: LongContextResult) -> go.Figure:
    """The passkey grid (like the paper's Fig. 10), one panel per model of the grid (teacher,
    student, the baselines): x the depth of the key in the prompt, y the prompt length, colour the
    accuracy in percent; each cell reads hits / keys, its hover the 95 % interval of the accuracy."""
    key = section.passkey
    models = section.passkey_models()
    depths = [f"{d:g}" for d in key.depths]
    lengths = [str(n) for n in key.lengths]
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=[title for _, title in models],
                        horizontal_spacing=0.08)
    for col, (name, title) in enumerate(models, start=1):
        z = key.accuracy[name]
        bounds = [[key.interval(v) for v in row] for row in z]
        fig.add_trace(go.Heatmap(
            z=z, x=depths, y=lengths, coloraxis="coloraxis", name=title,
            text=[[f"{round(v * key.trials)}/{key.trials}" for v in row] for row in z], texttemplate="%{text}",
            customdata=[[[lo, hi] for lo, hi in row] for row in bounds],
            hovertemplate="length %{y}<br>depth %{x}<br>found %{text} (%{z:.0%})<br>95% interval "
                          "%{customdata[0]:.0%} to %{customdata[1]:.0%}<extra>" + title + "</extra>"),
            row=1, col=col)
    fig.update_xaxes(title_text="depth of the key", type="category")
    fig.update_yaxes(type="category", showticklabels=False)
    fig.update_yaxes(title_text="prompt length (tokens)", showticklabels=True, row=1, col=1)
    keys = "key" if key.trials == 1 else "keys"
    fig.update_layout(title=f"Passkey retrieval: {key.trials} {keys} a cell", template=TEMPLATE,
                      height=max(320, 160 + 60 * len(lengths)), margin={"t": 80, "b": 40},
                      coloraxis={"colorscale": "Viridis", "cmin": 0.0, "cmax": 1.0,
                                 "colorbar": {"title": {"text": "found"}, "tickformat": ".0%"}})
    return fig


__all__ = ["frontier_chart", "frontier_lengths", "passkey_grid"]
