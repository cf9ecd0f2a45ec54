"""Figures of benchmark results (app.charts.benchmark) from real tiny-model runs."""

import math
import re

import pytest

from app import bench_results
from app.charts import benchmark as charts
from app.charts.benchmark import benchmark_figures
from tests.core.bench.runs import OOM_ERRORS, OOM_PHASES, capacity_result, result_with_oom, small_result


@pytest.fixture(scope="module")
def result():
    return small_result()


def test_figures_build(result):
    figs = benchmark_figures(result)
    lines = {"throughput_vs_batch", "throughput_vs_context", "memory_vs_batch", "memory_vs_context"}
    assert set(figs) == lines | {"floor_gap"}
    for fig in (figs[name] for name in lines):
        traces = [t for t in fig.data if len(t.x)]
        assert {t.name.split()[0] for t in traces} == {"teacher", "student", "floor"}
        assert all(y > 0 and math.isfinite(y) for t in traces for y in t.y)
        fig.to_json()
    batch_traces = figs["throughput_vs_batch"].data
    assert sorted(batch_traces[0].x) == [1, 3]


def test_floor_gap_bars_are_the_comparisons(result):
    fig = benchmark_figures(result)["floor_gap"]
    by_name = {(t.name, t.xaxis): list(t.y) for t in fig.data}
    rows = result["comparisons"]
    assert by_name[("student / teacher", "x")] == [c["prefill_speedup"] for c in rows]
    assert by_name[("student / floor", "x2")] == [c["decode_vs_floor"] for c in rows]
    assert by_name[("floor / teacher", "x2")] == [c["floor_decode_speedup"] for c in rows]
    assert all(y > 0 for ys in by_name.values() for y in ys)


@OOM_ERRORS
@OOM_PHASES
def test_figures_build_with_an_out_of_memory_point(monkeypatch, error, phase):
    out, _, _ = result_with_oom(monkeypatch, error, phase)
    figs = benchmark_figures(out)  # figures still build with an OOM point
    assert "out of memory" in figs["throughput_vs_batch"].layout.title.text


def test_capacity_figure_draws_the_trials_and_the_budget():
    out = capacity_result()
    figs = benchmark_figures(out)
    assert set(figs) == {"capacity"}
    fig = figs["capacity"]
    found = out["capacity"]["contexts"][0]["models"]
    for model in ("teacher", "student"):
        line = next(t for t in fig.data if t.name == f"{model} (L=24)" and t.xaxis == "x")
        assert list(line.x) == [1, 2, 4, 8] == [t["batch_size"] for t in found[model]["trials"]]
        assert list(line.y) == [t["decode_tokens_per_second"] for t in found[model]["trials"]]
        assert found[model]["largest_batch"] == 8 and found[model]["reached_max_batch"]
    budget = [s for s in fig.layout.shapes if s.y0 == s.y1]
    assert len(budget) == 1 and budget[0].y0 == 1.0  # 1 GiB


def test_a_factor_held_at_one_value_has_no_chart_against_it(result):
    one_batch = {**result, "points": [p for p in result["points"] if p["batch_size"] == 1]}
    assert {p["prompt_length"] for p in one_batch["points"]} == {16, 40}
    figs = benchmark_figures(one_batch)
    assert {"throughput_vs_context", "memory_vs_context"} <= set(figs)
    assert not {"throughput_vs_batch", "memory_vs_batch"} & set(figs)


def test_ratio_hovers_show_the_difference_from_1(result):
    for trace in benchmark_figures(result)["floor_gap"].data:
        spec = re.search(r"%\{y:([^}]*)\}", trace.hovertemplate or "")
        assert spec and format(1.0012, spec.group(1)) == "1.001", trace.hovertemplate


def test_throughput_figure_one_line_per_model():
    pts = bench_results.normalise({"points": [
        {"model": m, "batch_size": b, "prompt_length": 64, "gen_length": 4, "tokens_per_second": t * b,
         "peak_memory_bytes": 2**30 * b}
        for m, t in (("teacher", 10.0), ("student", 20.0)) for b in (1, 2, 4)]
        + [{"model": "teacher", "batch_size": 8, "prompt_length": 64, "gen_length": 4, "status": "oom"}]})
    fig = charts.throughput_figure(pts, "batch_size", "tokens_per_second")
    lines = {t.name: (list(t.x), list(t.y)) for t in fig.data}
    assert lines == {"teacher (context=64, gen=4)": ([1, 2, 4], [10.0, 20.0, 40.0]),
                     "student (context=64, gen=4)": ([1, 2, 4], [20.0, 40.0, 80.0])}
    mem = charts.throughput_figure(pts, "batch_size", "peak_memory_bytes")
    assert list(mem.data[0].y) == [1.0, 2.0, 4.0]  # GiB
    assert mem.layout.yaxis.title.text.endswith("(GiB)")
