"""Benchmark page: charts and table from benchmark reports (read defensively), launching a benchmark."""

from __future__ import annotations

import json
import re

import pytest

from app import bench_results
from app.common import fmt_duration
from jobs import api, store
from jobs.db import open_db
from tests.app.apptest import button, column_format, open_page, plotly_figures, texts, widget
from tests.app.seed import tiny_convert_config


def _finished_job(ws, report: dict, kind: str = "bench") -> int:
    """A job row that succeeded with ``report`` (what the runner records)."""
    db = open_db(ws)
    job_id = store.insert_job(db, kind, {}, name="handmade")
    claim = store.claim_next_job(db, "otherhost:1:1")
    store.mark_succeeded(db, job_id, claim.attempt, report)
    return job_id


def test_charts_and_table_of_a_benchmark_job(seeded_ws):
    at = open_page("views/bench.py")
    widget(at, "selectbox", "bench_job").set_value(seeded_ws.benchmark).run()
    assert not at.exception
    report = api.job_report(seeded_ws.benchmark, workspace=seeded_ws.workspace)
    points = bench_results.normalise(report)
    assert points and all(p["status"] == "ok" for p in points)
    figs = plotly_figures(at)
    assert len(figs) >= 2
    titles = " ".join(str(f["layout"]["title"]["text"]) for f in figs)
    assert "batch size" in titles and "context length" in titles
    names = {t.get("name", "") for f in figs for t in f["data"]}
    assert any(n.startswith("teacher") for n in names) and any(n.startswith("student") for n in names)
    assert any(n.startswith("floor") for n in names)  # the attention-free floor is drawn
    assert "Speed against the teacher and the attention-free floor" in titles
    gaps = at.dataframe[1].value
    comparisons = report["comparisons"]
    assert len(gaps) == len(comparisons) > 0
    assert list(gaps["decode student / floor"]) == pytest.approx([c["decode_vs_floor"] for c in comparisons])
    assert list(gaps["prefill floor / teacher"]) == pytest.approx([c["floor_prefill_speedup"] for c in comparisons])
    table = at.dataframe[0].value
    assert len(table) == len(points)
    row = table[(table["model"] == "student") & (table["batch"] == points[0]["batch_size"])].iloc[0]
    match = next(p for p in points if p["model"] == "student" and p["batch_size"] == row["batch"]
                 and p["context_length"] == row["context"])
    assert row["decode tok/s"] == pytest.approx(match["decode_tokens_per_second"])
    assert row["peak memory (GiB)"] == pytest.approx(match["peak_memory_bytes"] / 2**30)


def _memory_units(at) -> set[str]:
    """Every unit of bytes named on the page: in figure titles, subplot titles, axis titles and table columns."""
    names = [str(name) for table in at.dataframe for name in table.value.columns]
    for fig in plotly_figures(at):
        layout = fig["layout"]
        axes = [axis for key, axis in layout.items() if key.startswith(("xaxis", "yaxis"))]
        names += [str((part.get("title") or {}).get("text", "")) for part in (layout, *axes)]
        names += [str(note.get("text", "")) for note in layout.get("annotations", [])]  # subplot titles
    return {unit for name in names for unit in re.findall(r"\b([KMGT]iB|[KMGT]B)\b", name)}


def test_memory_reads_in_one_unit_in_charts_and_tables(seeded_ws):
    at = open_page("views/bench.py")
    widget(at, "selectbox", "bench_job").set_value(seeded_ws.benchmark).run()
    assert _memory_units(at) == {"GiB"}


def native_report(batch_sizes: list[int], contexts: list[int], ratio: float = 1.5) -> dict:
    """A core.bench report (teacher, student, floor) over ``batch_sizes`` x ``contexts``, every
    floor ratio of its comparisons ``ratio``, timed 3 times after a warm-up run."""
    points = [{"model": model, "batch_size": b, "prompt_length": l, "gen_length": 4, "status": "ok",
               "tokens_per_second": 100.0 * b, "prefill_tokens_per_second": 1000.0 * b,
               "decode_tokens_per_second": 10.0 * b, "peak_memory_bytes": 2**30 * b,
               "decode_peak_memory_bytes": 2**29 * b}
              for b in batch_sizes for l in contexts for model in ("teacher", "student", "floor")]
    ratios = ("prefill_speedup", "decode_speedup", "prefill_vs_floor", "decode_vs_floor", "floor_prefill_speedup",
              "floor_decode_speedup")
    comparisons = [{"batch_size": b, "prompt_length": l, "gen_length": 4, **dict.fromkeys(ratios, ratio)}
                   for b in batch_sizes for l in contexts]
    return {"schema": "lolcats-bench/1", "points": points, "comparisons": comparisons,
            "timing": {"warmup_runs": 1, "warmup_decode_steps": 1, "repeats": 3}}


FOREIGN_ONE_BATCH = {"points": [{"variant": m, "batch": 1, "context_length": c, "tokens_per_second": 10.0,
                                 "peak_memory_bytes": 2**20} for m in ("teacher", "student") for c in (64, 128)]}


@pytest.mark.parametrize("report", [native_report([1], [64, 128]), FOREIGN_ONE_BATCH], ids=["core.bench", "foreign"])
def test_a_single_batch_size_has_no_chart_against_it(fresh_ws, report):
    _finished_job(fresh_ws, report)
    at = open_page("views/bench.py")
    assert not at.exception
    titles = [str(f["layout"]["title"]["text"]) for f in plotly_figures(at)]
    assert not [t for t in titles if "batch size" in t], titles
    assert [t for t in titles if "context length" in t]
    assert ("No chart against batch size: every point of this benchmark has batch size 1, and a chart against it "
            "needs two values or more.") in [c.value for c in at.caption]


def test_the_page_says_what_is_timed(fresh_ws):
    _finished_job(fresh_ws, native_report([1, 2], [64]))
    at = open_page("views/bench.py")
    assert ("Each point is timed 3 times (medians shown), after 1 untimed warm-up run of the same point (its prefill "
            "and 1 decode step). Prefill and decode are timed separately") in texts(at)


def test_floor_ratios_near_1_show_their_difference_from_1(fresh_ws):
    _finished_job(fresh_ws, native_report([1, 2], [64], ratio=1.0012))
    at = open_page("views/bench.py")
    gaps = at.dataframe[1]
    assert list(gaps.value["decode student / floor"]) == [1.0012, 1.0012]
    for column in ("prefill student / teacher", "decode floor / teacher", "decode student / floor"):
        assert column_format(gaps, column) % 1.0012 == "1.001"


def test_foreign_report_falls_back_to_the_workbench_charts(fresh_ws):
    report = {"points": [
        {"variant": m, "batch": b, "context_length": 64, "tokens_per_second": 10.0 * b * (2 if m == "student" else 1),
         "peak_memory_bytes": 2**20 * b}
        for m in ("teacher", "student") for b in (1, 2, 4)]
        + [{"variant": "teacher", "batch": 8, "context_length": 64, "status": "oom"}]}
    job_id = _finished_job(fresh_ws, report)
    at = open_page("views/bench.py")
    assert widget(at, "selectbox", "bench_job").value == job_id
    assert not at.exception
    assert any("Out of memory at: teacher batch 8 context 64" in w.value for w in at.warning)
    figs = plotly_figures(at)
    tps = next(f for f in figs if f["layout"]["title"]["text"] == "tokens/s (prefill + decode) vs batch size")
    lines = {t["name"]: t["y"] for t in tps["data"]}
    assert lines == {"teacher (context=64)": [10.0, 20.0, 40.0], "student (context=64)": [20.0, 40.0, 80.0]}


def test_capacity_run_is_drawn_with_its_budget(fresh_ws):
    from tests.core.bench.runs import capacity_result

    report = capacity_result()
    _finished_job(fresh_ws, report)
    at = open_page("views/bench.py")
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    figs = plotly_figures(at)
    assert [f["layout"]["title"]["text"] for f in figs] == ["Capacity under a 1GiB memory budget"]
    table = at.dataframe[0].value
    found = report["capacity"]["contexts"][0]["models"]
    assert list(table["model"]) == ["teacher", "student"]
    assert list(table["largest batch"]) == [found["teacher"]["largest_batch"], found["student"]["largest_batch"]] == [8, 8]
    assert list(table["decode tok/s"]) == pytest.approx([found[m]["decode_tokens_per_second"] for m in ("teacher", "student")])


@pytest.mark.parametrize("report", [{}, {"points": "nothing"}, {"points": [{"model": "teacher"}]}])
def test_unreadable_report_is_reported_not_crashed(fresh_ws, report):
    _finished_job(fresh_ws, report)
    at = open_page("views/bench.py")
    assert not at.exception
    assert any("holds no benchmark points" in w.value for w in at.warning)


def test_launch_a_benchmark_from_the_page(fresh_ws):
    at = open_page("views/bench.py")
    assert "No benchmark yet" in texts(at)
    widget(at, "text_input", "bench_batches").set_value("1, 2").run()
    widget(at, "text_input", "bench_contexts").set_value("64 128").run()
    widget(at, "number_input", "bench_gen").set_value(8).run()
    button(at, "bench_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    jobs = api.list_jobs(workspace=fresh_ws)
    assert [(j.kind, j.status) for j in jobs] == [("bench", "queued")]
    cfg = jobs[0].config
    assert (cfg["batch_sizes"], cfg["prompt_lengths"], cfg["gen_lengths"]) == ([1, 2], [64, 128], [8])
    assert f"Queued bench job #{jobs[0].id}." in texts(at)


def test_benchmark_of_an_auto_conversion_gets_the_chosen_layers(fresh_ws):
    config = tiny_convert_config(attention={"softmax_layers": "auto", "softmax_budget": 1})
    db = open_db(fresh_ws)
    conversion = api.submit_job("convert", config, name="auto", workspace=fresh_ws).id
    run = fresh_ws / "runs" / str(conversion)  # what the conversions picker needs: a loadable run folder
    (run / "stage1").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    claim = store.claim_next_job(db, "otherhost:1:1")
    store.mark_succeeded(db, conversion, claim.attempt, {"softmax_layers": [1], "layer_score": "kl",
                                                         "layer_scores": [0.5, 0.75]})
    at = open_page("views/bench.py")
    widget(at, "selectbox", "bench_source").set_value(f"job:{conversion}").run()
    button(at, "bench_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (bench,) = api.list_jobs(kind="bench", workspace=fresh_ws)
    attention = bench.config["attention"]
    assert attention["softmax_layers"] == [1]
    assert (attention["feature_dim"], attention["window_size"]) == (config["attention"]["feature_dim"],
                                                                     config["attention"]["window_size"])


def test_benchmark_settings_errors_are_shown(fresh_ws):
    at = open_page("views/bench.py")
    widget(at, "text_input", "bench_batches").set_value("1, two").run()
    button(at, "bench_submit").click().run()
    assert any("batch sizes takes whole numbers separated by commas" in e.value for e in at.error)
    widget(at, "text_input", "bench_batches").set_value("0").run()
    button(at, "bench_submit").click().run()
    assert any("batch_sizes must be >= 1" in e.value for e in at.error), [e.value for e in at.error]
    assert api.list_jobs(workspace=fresh_ws) == []


def test_the_form_starts_past_the_memory_crossover_with_repeats_help_and_a_time_estimate(seeded_ws):
    at = open_page("views/bench.py")
    assert not at.exception
    assert widget(at, "text_input", "bench_contexts").value == "512, 1024, 2048"
    assert widget(at, "number_input", "bench_repeats").value == 3
    for kind, key in (("text_input", "bench_batches"), ("text_input", "bench_contexts"),
                      ("number_input", "bench_gen"), ("number_input", "bench_repeats")):
        assert widget(at, kind, key).help, key
    seeded = api.get_job(seeded_ws.benchmark, workspace=seeded_ws.workspace)
    took = (seeded.finished_at - seeded.started_at).total_seconds()
    # the seeded benchmark: batches [1, 2] at 16 tokens and contexts [16, 32] at batch 1, 4 generated, once
    done = 1 * 20 + 2 * 20 + 1 * 36
    tokens = (1 * 528 + 2 * 528 + 4 * 528 + 1 * 1040 + 1 * 2064) * 3  # the defaults, one factor at a time
    expected = fmt_duration(took * tokens / done)
    assert f"About {expected}: {tokens:,} tokens a model, at the pace of bench job #{seeded.id}" in texts(at)


def test_a_benchmark_run_on_a_busy_machine_is_flagged(fresh_ws):
    report = native_report([1, 2], [64, 128])
    report["environment"] = {"cpu_count": 2, "load_average_start": [5.5, 3.0, 2.0], "load_average_end": [4.0, 3, 2],
                             "cpu_pressure": 0.05}
    _finished_job(fresh_ws, report)
    at = open_page("views/bench.py")
    assert not at.exception
    assert any("The machine was busy while this benchmark ran (load 5.5 on 2 cores)" in w.value for w in at.warning)
    report["environment"] = {"cpu_count": 2, "load_average_start": [0.5, 0, 0], "cpu_pressure": 0.01}
    quiet = _finished_job(fresh_ws, report)
    at = open_page("views/bench.py")
    widget(at, "selectbox", "bench_job").set_value(quiet).run()
    assert not any("was busy" in w.value for w in at.warning)
    report["environment"]["cpu_pressure"] = 0.35  # other tasks waiting for a CPU a third of the time
    pressed = _finished_job(fresh_ws, report)
    at = open_page("views/bench.py")
    widget(at, "selectbox", "bench_job").set_value(pressed).run()
    assert any("other tasks waited for a CPU 35% of the time" in w.value for w in at.warning)


def _served() -> dict:
    """A served-engine result as ``benchmarks/serving_throughput.py`` writes it (two request counts)."""
    points = [{"requests": n, "teacher_tokens_per_s": 10.0 * n, "student_tokens_per_s": 7.0 * n + 1,
               "ratio": (7.0 * n + 1) / (10.0 * n), "teacher_in_flight": min(n, 5), "student_in_flight": n,
               "teacher_preemptions": 0, "student_preemptions": 0} for n in (1, 8)]
    return {"setup": {"prompt_len": 1024, "max_tokens": 64, "cache_bytes": 2**28, "cpu_count": 2},
            "capacity": {"teacher": 5.4, "student": 29.0}, "points": points}


def test_the_served_engine_measurement_is_shown_when_the_project_holds_one(fresh_ws, tmp_path, monkeypatch):
    result = _served()
    monkeypatch.setattr(bench_results, "SERVED_RESULT", tmp_path / "served.json")
    at = open_page("views/bench.py")
    assert not at.exception and not plotly_figures(at)  # no file: no section
    (tmp_path / "served.json").write_text(json.dumps(result))
    at = open_page("views/bench.py")
    assert not at.exception
    assert "holds 5.4 of the teacher's requests and 29.0 of the student's" in texts(at)
    (fig,) = plotly_figures(at)
    tokens = {t["name"]: t["y"] for t in fig["data"] if t.get("xaxis", "x") == "x"}
    assert tokens == {"teacher": [10.0, 80.0], "student": [8.0, 57.0]}
    table = at.dataframe[0].value
    assert list(table["student / teacher"]) == pytest.approx([p["ratio"] for p in result["points"]])
    assert list(table["teacher at once"]) == [1, 5]
