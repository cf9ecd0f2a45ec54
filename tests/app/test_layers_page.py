"""Layers page: per-layer MSE curves from the metric rows, final bars from report.json, comparisons."""

from __future__ import annotations

import math

import pytest

from jobs import api, store
from jobs.db import open_db
from tests.app.apptest import open_page, plotly_figures, texts, widget
from tests.app.seed import tiny_convert_config


def _figure(at, title_part):
    for fig in plotly_figures(at):
        title = fig["layout"].get("title", {})
        if title_part in (title.get("text", "") if isinstance(title, dict) else str(title)):
            return fig
    raise AssertionError(f"no figure titled {title_part!r}")


def test_curves_follow_the_recorded_per_layer_metrics(seeded_ws):
    at = open_page("views/layers.py")
    widget(at, "selectbox", "layers_job").set_value(seeded_ws.conversion).run()
    assert not at.exception
    rows = [p for p in api.job_metrics(seeded_ws.conversion, name="mse", workspace=seeded_ws.workspace)
            if p.layer is not None]
    assert rows, "the conversion recorded per-layer validation MSE"
    fig = _figure(at, "Per-layer attention MSE during stage 1")
    traces = {t["name"]: t for t in fig["data"]}
    assert set(traces) == {f"layer {p.layer}" for p in rows}
    for layer in {p.layer for p in rows}:
        expected = sorted((p.step, p.value) for p in rows if p.layer == layer)
        assert list(traces[f"layer {layer}"]["x"]) == [step for step, _ in expected]
        assert traces[f"layer {layer}"]["y"] == pytest.approx([value for _, value in expected])


def test_heatmap_of_a_conversion_the_worker_ran(seeded_ws):
    at = open_page("views/layers.py")
    widget(at, "selectbox", "layers_job").set_value(seeded_ws.conversion).run()
    rows = [p for p in api.job_metrics(seeded_ws.conversion, name="train_mse", workspace=seeded_ws.workspace)
            if p.layer is not None]
    layers = {p.layer for p in api.job_metrics(seeded_ws.conversion, name="mse", workspace=seeded_ws.workspace)
              if p.layer is not None}
    assert {p.layer for p in rows if p.step == 1} == layers, "every layer's training MSE from step 1"
    (heat,) = _figure(at, "Stage 1 training: attention MSE by layer and step")["data"]
    assert list(heat["x"]) == sorted({p.step for p in rows}) and heat["x"][0] == 1
    assert list(heat["y"]) == [f"layer {i}" for i in sorted(layers)]


def test_final_bars_are_the_report_per_layer_mse(seeded_ws):
    at = open_page("views/layers.py")
    widget(at, "selectbox", "layers_job").set_value(seeded_ws.conversion).run()
    report = api.job_report(seeded_ws.conversion, workspace=seeded_ws.workspace)
    fig = _figure(at, "Final per-layer attention MSE")
    assert fig["data"][0]["y"] == pytest.approx(report["per_layer_mse"])
    assert "Highest final MSE: layer" in texts(at)


def test_compare_two_conversions(seeded_ws):
    at = open_page("views/layers.py")
    chosen = [f"job:{seeded_ws.conversion}", f"job:{seeded_ws.conversion_sw}"]
    widget(at, "multiselect", "layers_compare").set_value(chosen).run()
    assert not at.exception
    final = [f for f in plotly_figures(at)
             if "Final per-layer attention MSE" in f["layout"]["title"]["text"] and len(f["data"]) == 2]
    assert final, "one final per-layer MSE chart with a series per conversion"
    table = at.dataframe[0].value
    assert sorted(table["attention"]) == ["sliding_window/hedgehog", "terraced/hedgehog"]
    for job_id, name in ((seeded_ws.conversion, "tiny-test"), (seeded_ws.conversion_sw, "tiny-sw")):
        report = api.job_report(job_id, workspace=seeded_ws.workspace)
        row = table[table["conversion"] == f"#{job_id} {name}"].iloc[0]
        assert row["student ppl"] == pytest.approx(report["student_ppl"])


def test_live_view_of_a_running_conversion(fresh_ws):
    db = open_db(fresh_ws)
    from app import forms

    job = api.submit_job("convert", forms.preset_config("tiny-test"), name="live", workspace=fresh_ws)
    claim = store.claim_next_job(db, "otherhost:1:1")
    store.heartbeat(db, job.id, claim.attempt, stage="stage1", step=2, total=4, metrics={"val_mse": 0.5},
                    layer_metrics={0: {"mse": 0.25}, 1: {"mse": 0.75}})
    at = open_page("views/layers.py")
    assert "Live: stage1 step 2/4" in texts(at)
    fig = _figure(at, "Per-layer attention MSE during stage 1")
    assert {t["name"]: t["y"] for t in fig["data"]} == {"layer 0": [0.25], "layer 1": [0.75]}
    assert "appears when the job succeeds" in texts(at)
    store.heartbeat(db, job.id, claim.attempt, stage="stage1", step=4, total=4, metrics={"val_mse": 0.4},
                    layer_metrics={0: {"mse": 0.2}, 1: {"mse": 0.6}})
    at.run()
    fig = _figure(at, "Per-layer attention MSE during stage 1")
    assert {t["name"]: t["y"] for t in fig["data"]} == {"layer 0": [0.25, 0.2], "layer 1": [0.75, 0.6]}


def _succeeded_conversion(ws, attention: dict, report: dict, name: str) -> int:
    """A conversion row that succeeded with ``report`` (what the runner records), no run folder."""
    db = open_db(ws)
    job = api.submit_job("convert", tiny_convert_config(attention=attention), name=name, workspace=ws)
    claim = store.claim_next_job(db, "otherhost:1:1")
    store.mark_succeeded(db, job.id, claim.attempt, report)
    return job.id


AUTO_REPORT = {"teacher_ppl": 10.0, "student_ppl": 12.5, "ppl_ratio": 1.25, "per_layer_mse": [0.0, 0.375],
               "softmax_layers": [0], "layer_score": "kl", "layer_scores": [0.75, 0.0625]}


def test_scores_of_an_auto_conversion_beside_the_final_bars(fresh_ws):
    job_id = _succeeded_conversion(fresh_ws, {"softmax_layers": "auto", "softmax_budget": 1}, AUTO_REPORT, "auto")
    at = open_page("views/layers.py")
    assert not at.exception
    scores = _figure(at, "Layer scores after stage 1 (next-token KL)")
    (bars,) = scores["data"]
    assert list(bars["x"]) == [0, 1] and bars["y"] == pytest.approx([0.75, 0.0625])
    assert list(bars["text"]) == ["kept softmax", ""]
    assert bars["marker"]["color"][0] != bars["marker"]["color"][1]
    final = _figure(at, "Final per-layer attention MSE")
    assert list(final["data"][0]["text"]) == ["softmax", ""] and final["data"][0]["y"][1] == pytest.approx(0.375)
    shown = texts(at)
    assert "by kl (next-token KL to the teacher with only that layer linear)" in shown
    assert "kept the highest as softmax: layer(s) 0." in shown
    assert api.get_job(job_id, workspace=fresh_ws).config["attention"]["softmax_layers"] == "auto"


def test_a_conversion_without_scores_has_no_score_chart(seeded_ws):
    at = open_page("views/layers.py")
    widget(at, "selectbox", "layers_job").set_value(seeded_ws.conversion).run()
    titles = [str(f["layout"].get("title", {}).get("text", "")) for f in plotly_figures(at)]
    assert any("Final per-layer attention MSE" in t for t in titles)
    assert not any("Layer scores" in t for t in titles)


def test_compare_lists_the_resolved_softmax_layers(fresh_ws):
    auto = _succeeded_conversion(fresh_ws, {"softmax_layers": "auto", "softmax_budget": 1}, AUTO_REPORT, "auto")
    old_report = {key: AUTO_REPORT[key] for key in ("teacher_ppl", "student_ppl", "ppl_ratio")}
    listed = _succeeded_conversion(fresh_ws, {"softmax_layers": [1]}, {**old_report, "per_layer_mse": [0.25, None]},
                                   "listed")  # a report older than softmax_layers, null for the softmax layer
    at = open_page("views/layers.py")
    widget(at, "multiselect", "layers_compare").set_value([f"job:{auto}", f"job:{listed}"]).run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("conversion")
    assert table.loc[f"#{auto} auto", "softmax layers"] == "0"
    assert table.loc[f"#{listed} listed", "softmax layers"] == "1"
    assert table.loc[f"#{auto} auto", "mean layer MSE"] == pytest.approx(0.375)  # the converted layer only
    assert table.loc[f"#{listed} listed", "mean layer MSE"] == pytest.approx(0.25)
    (grouped,) = [f for f in plotly_figures(at)
                  if "Final per-layer attention MSE" in f["layout"]["title"]["text"] and len(f["data"]) == 2]
    assert [list(t["text"]) for t in grouped["data"]] == [["softmax", ""], ["", "softmax"]]


def test_empty_state(fresh_ws):
    at = open_page("views/layers.py")
    assert "needs a finished conversion, and there is none yet" in texts(at)
    assert any(b.key == "layers_demo" for b in at.button)


def _training_heartbeats(db, job_id: int, attempt: int, layers: int, steps: list[int]) -> dict[int, dict[int, float]]:
    """Stage-1 training reports of ``steps``, each with every layer's ``train_mse`` (and no
    validation yet); returns step -> layer -> value."""
    values = {}
    for step in steps:
        values[step] = {i: 10.0 ** (-1 - i / 10) / step for i in range(layers)}
        store.heartbeat(db, job_id, attempt, stage="stage1", step=step, total=240,
                        metrics={"loss": 1.0 / step, "mse": 0.01 / step, "lr": 1e-3},
                        layer_metrics={i: {"train_mse": v} for i, v in values[step].items()})
    return values


def test_heatmap_of_every_layer_from_the_first_training_steps(fresh_ws):
    db = open_db(fresh_ws)
    from app import forms

    job = api.submit_job("convert", forms.preset_config("tiny-test"), name="live", workspace=fresh_ws)
    claim = store.claim_next_job(db, "otherhost:1:1")
    values = _training_heartbeats(db, job.id, claim.attempt, layers=30, steps=[1, 2])
    at = open_page("views/layers.py")
    assert not at.exception
    (heat,) = _figure(at, "Stage 1 training: attention MSE by layer and step")["data"]
    assert heat["type"] == "heatmap" and list(heat["x"]) == [1, 2]
    assert list(heat["y"]) == [f"layer {i}" for i in range(30)]
    assert heat["z"] == [pytest.approx([math.log10(values[s][i]) for s in (1, 2)]) for i in range(30)]
    _training_heartbeats(db, job.id, claim.attempt, layers=30, steps=[3])
    at.run()
    (heat,) = _figure(at, "Stage 1 training: attention MSE by layer and step")["data"]
    assert list(heat["x"]) == [1, 2, 3]


def test_the_layer_picker_draws_the_chosen_layers_curves(fresh_ws):
    db = open_db(fresh_ws)
    from app import forms

    job = api.submit_job("convert", forms.preset_config("tiny-test"), name="live", workspace=fresh_ws)
    claim = store.claim_next_job(db, "otherhost:1:1")
    values = _training_heartbeats(db, job.id, claim.attempt, layers=30, steps=[1, 2, 3])
    at = open_page("views/layers.py")
    widget(at, "multiselect", f"layers_pick_{job.id}").set_value([4, 17]).run()
    assert not at.exception
    curves = _figure(at, "Chosen layers: attention MSE during stage 1")["data"]
    assert [t["name"] for t in curves] == ["layer 4 (training)", "layer 17 (training)"]
    assert curves[1]["y"] == pytest.approx([values[s][17] for s in (1, 2, 3)])
    assert curves[0]["line"]["color"] != curves[1]["line"]["color"]


@pytest.mark.parametrize("log_scale", [True, False])
def test_the_final_mse_is_no_bar_chart_on_a_log_axis(fresh_ws, log_scale):
    _succeeded_conversion(fresh_ws, {"softmax_layers": "auto", "softmax_budget": 1}, AUTO_REPORT, "auto")
    at = open_page("views/layers.py")
    widget(at, "toggle", "layers_log").set_value(log_scale).run()
    final = _figure(at, "Final per-layer attention MSE")
    log_axis = final["layout"].get("yaxis", {}).get("type") == "log"
    assert log_axis == log_scale
    assert not (log_axis and any(t.get("type") == "bar" for t in final["data"]))
    assert final["data"][0]["y"] == pytest.approx([None, 0.375])


def test_runs_and_exports_made_outside_the_workbench_show_their_final_per_layer_mse(fresh_ws):
    import json

    config = {"model": {"source": "tiny-random-llama"}, "attention": {"kind": "terraced", "feature_map": "hedgehog",
                                                                     "softmax_layers": [1]}}
    run = fresh_ws / "runs" / "demo"
    (run / "stage1").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config))
    (run / "report.json").write_text(json.dumps({"per_layer_mse": [0.02, None, 0.05]}))
    export = fresh_ws / "exports" / "demo-export"
    export.mkdir(parents=True)
    (export / "lolcats.json").write_text(json.dumps({"config": config}))
    at = open_page("views/layers.py")
    picker = widget(at, "selectbox", "layers_job")
    assert sorted(picker.options) == ["exports/demo-export (export) · tiny-random-llama · terraced/hedgehog",
                                      "runs/demo (run) · tiny-random-llama · terraced/hedgehog"]
    picker.set_value("runs/demo").run()
    assert not at.exception
    assert "Highest final MSE: layer 2 (0.05)" in texts(at)
    widget(at, "selectbox", "layers_job").set_value("exports/demo-export").run()
    assert any("has no per-layer MSE" in i.value for i in at.info)
    assert "Comparing conversions needs at least two finished ones." not in texts(at)  # two folders, no job
    table = at.dataframe[0].value.set_index("conversion")
    assert sorted(table.index) == ["exports/demo-export (export)", "runs/demo (run)"]
    assert table.loc["runs/demo (run)", "mean layer MSE"] == pytest.approx(0.035)  # layer 1 kept softmax
