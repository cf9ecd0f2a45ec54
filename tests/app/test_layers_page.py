"""Layers page: per-layer MSE curves from the metric rows, final bars from report.json, comparisons."""

from __future__ import annotations

import pytest

from jobs import api, store
from jobs.db import open_db
from tests.app.apptest import open_page, plotly_figures, texts, widget


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


def test_final_bars_are_the_report_per_layer_mse(seeded_ws):
    at = open_page("views/layers.py")
    widget(at, "selectbox", "layers_job").set_value(seeded_ws.conversion).run()
    report = api.job_report(seeded_ws.conversion, workspace=seeded_ws.workspace)
    fig = _figure(at, "Final per-layer attention MSE")
    assert fig["data"][0]["y"] == pytest.approx(report["per_layer_mse"])
    assert "Highest final MSE: layer" in texts(at)


def test_compare_two_conversions(seeded_ws):
    at = open_page("views/layers.py")
    chosen = [seeded_ws.conversion, seeded_ws.conversion_sw]
    widget(at, "multiselect", "layers_compare").set_value(chosen).run()
    assert not at.exception
    fig = plotly_figures(at)
    bars = [f for f in fig if f["data"] and f["data"][0].get("type") == "bar" and len(f["data"]) == 2]
    assert bars, "one grouped bar chart with a bar series per conversion"
    table = at.dataframe[0].value
    assert sorted(table["attention"]) == ["sliding_window/hedgehog", "terraced/hedgehog"]
    for job_id, name in ((seeded_ws.conversion, "tiny-test"), (seeded_ws.conversion_sw, "tiny-sw")):
        report = api.job_report(job_id, workspace=seeded_ws.workspace)
        row = table[table["job"] == f"#{job_id} {name}"].iloc[0]
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


def test_empty_state(fresh_ws):
    at = open_page("views/layers.py")
    assert "needs a finished conversion, and there is none yet" in texts(at)
    assert any(b.key == "layers_demo" for b in at.button)
