"""Charts of benchmark results (core.bench), drawn on the Benchmark page: speed and memory against batch size
and context length, the attention-free floor, capacity under a memory budget."""

from __future__ import annotations

import math
from typing import Any, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts.style import BENCH_COLORS, COLORS, DASHES, GIB, MEMORY_UNIT, RATIO_FORMAT, TEMPLATE


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


def served_figure(result: dict[str, Any]) -> go.Figure:
    """A served-engine result (``benchmarks/serving_throughput.py``): generated tokens/s (left) and the
    most requests running at once (right) against concurrent requests, teacher vs student, each
    model's capacity under the cache budget a dotted line on the right."""
    points = result["points"]
    requests = [p["requests"] for p in points]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("generated tokens/s", "requests running at once"))
    for model, color in COLORS.items():
        fig.add_trace(go.Scatter(x=requests, y=[p[f"{model}_tokens_per_s"] for p in points], mode="lines+markers",
                                 name=model, line={"color": color}, legendgroup=model), row=1, col=1)
        fig.add_trace(go.Scatter(x=requests, y=[p[f"{model}_in_flight"] for p in points], mode="lines+markers",
                                 name=model, line={"color": color}, legendgroup=model, showlegend=False), row=1, col=2)
        capacity = result.get("capacity", {}).get(model)
        if capacity:
            fig.add_hline(y=capacity, line={"color": color, "dash": "dot"}, row=1, col=2,
                          annotation_text=f"{model} capacity {capacity:.0f}")
    fig.update_xaxes(type="log", dtick=math.log10(2), title_text="concurrent requests")
    fig.update_layout(title="Served by vLLM: teacher and student under one cache budget", template=TEMPLATE,
                      height=400, margin={"t": 80, "b": 40})
    return fig
