"""Attention page: teacher / student / |difference| heatmaps of a finished conversion."""

from __future__ import annotations

import numpy as np
import pytest

from tests.app.apptest import open_page, plotly_figures, texts, widget


def _heatmaps(at):
    figs = [f for f in plotly_figures(at) if len(f["data"]) == 3 and f["data"][0]["type"] == "heatmap"]
    assert len(figs) == 1, [f["layout"].get("title") for f in plotly_figures(at)]
    return figs[0]


def _z(trace) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in trace["z"]], dtype=float)


def test_heatmaps_of_a_finished_conversion(seeded_ws):
    at = open_page("views/attention.py")
    assert not at.exception
    assert widget(at, "selectbox", "attention_conversion").value in (f"job:{seeded_ws.conversion}",
                                                                     f"job:{seeded_ws.conversion_sw}")
    widget(at, "selectbox", "attention_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "selectbox", "attention_layer").set_value(1).run()
    widget(at, "selectbox", "attention_head").set_value(2).run()
    assert not at.exception
    fig = _heatmaps(at)
    teacher, student, diff = (_z(t) for t in fig["data"])
    n = teacher.shape[0]
    labels = fig["data"][0]["x"]
    assert len(labels) == n and labels[0].startswith("0 ") and len(set(labels)) == n  # token labels, unique
    upper = np.triu_indices(n, k=1)
    assert np.isnan(teacher[upper]).all() and np.isnan(student[upper]).all()  # causal mask
    lower = np.tril_indices(n)
    assert np.nansum(teacher, axis=1) == pytest.approx(np.ones(n), abs=1e-4)  # softmax rows
    assert np.nansum(student, axis=1) == pytest.approx(np.ones(n), abs=1e-3)  # LoLCATs rows are normalised too
    assert diff[lower] == pytest.approx(np.abs(student - teacher)[lower], abs=1e-6)
    assert [t["coloraxis"] for t in fig["data"]] == ["coloraxis", "coloraxis", "coloraxis2"]  # weights, difference
    # terraced window of 16 (tiny-test): queries before 2 tiles see every key through exact softmax, so
    # teacher and student agree there; later queries give older keys to the linear part and differ
    assert n > 32
    assert np.nanmax(diff[:32]) < 1e-5 and np.nanmax(diff[32:]) > 1e-4
    assert "differ only from query 32 on" in texts(at)
    assert fig["layout"]["title"]["text"] == "Layer 1, head 2"
    assert "Mean |difference|" in texts(at)


def test_opens_on_the_layer_with_the_highest_final_mse(seeded_ws):
    from jobs import api

    mse = api.job_report(seeded_ws.conversion_sw, workspace=seeded_ws.workspace)["per_layer_mse"]
    worst = max(i for i, v in enumerate(mse) if v == max(v for v in mse if v is not None))
    at = open_page("views/attention.py")
    widget(at, "selectbox", "attention_conversion").set_value(f"job:{seeded_ws.conversion_sw}").run()
    assert not at.exception
    layer = widget(at, "selectbox", "attention_layer")
    assert layer.value == worst and layer.format_func(worst).endswith("(highest final MSE)")
    assert _heatmaps(at)["layout"]["title"]["text"].startswith(f"Layer {worst},")


def test_log_scale_and_all_heads(seeded_ws):
    at = open_page("views/attention.py")
    widget(at, "selectbox", "attention_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "radio", "attention_scale").set_value("log").run()
    fig = _heatmaps(at)
    assert fig["layout"]["coloraxis"]["cmin"] == pytest.approx(-6.0)
    assert fig["layout"]["coloraxis"]["colorbar"]["title"]["text"] == "log10 weight"
    assert _z(fig["data"][0])[0, 0] == pytest.approx(0.0)  # the first query attends only to itself: log10(1)
    grids = [f for f in plotly_figures(at) if len(f["data"]) == 4]  # the tiny model has 4 heads
    assert grids and "|difference| per head" in grids[0]["layout"]["title"]["text"]


def test_long_prompt_is_cut_with_a_notice(seeded_ws):
    at = open_page("views/attention.py")
    widget(at, "text_area", "attention_prompt").set_value("word " * 400).run()
    assert not at.exception
    assert any("only its first 256 tokens are used" in w.value for w in at.warning)
    assert len(_heatmaps(at)["data"][0]["x"]) == 256


def test_axes_show_each_tokens_text(seeded_ws):
    at = open_page("views/attention.py")
    widget(at, "text_area", "attention_prompt").set_value("猫は🐈 sat on the mat").run()
    assert not at.exception
    # the bundled byte-level tokenizer splits 猫, は and 🐈 across tokens: those tokens show their bytes
    assert _heatmaps(at)["data"][0]["x"] == ["0 <0xE7>", "1 <0x8C>", "2 <0xAB>", "3 <0xE3><0x81>", "4 <0xAF>",
                                             "5 <0xF0><0x9F>", "6 <0x90>", "7 <0x88>", "8 ␣sat", "9 ␣on", "10 ␣the",
                                             "11 ␣mat"]


def test_short_prompt_explains_the_window(seeded_ws):
    at = open_page("views/attention.py")
    widget(at, "selectbox", "attention_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "text_area", "attention_prompt").set_value("Hello there").run()
    assert any("all inside the window" in i.value and "more than 32 tokens" in i.value for i in at.info)


def test_empty_state(fresh_ws):
    at = open_page("views/attention.py")
    assert "needs a finished conversion" in texts(at)
    assert any(b.key == "attention_demo" for b in at.button)


def test_runs_and_exports_made_outside_the_workbench_are_listed_and_open(seeded_ws, fresh_ws):
    """A run folder written by ``lolcats convert -o runs/demo`` and an export in exports/: listed by
    origin beside the jobs' conversions, and the CLI run opens with readable token labels."""
    import shutil

    from core.export.folder import export

    shutil.copytree(seeded_ws.workspace / "models", fresh_ws / "models")
    shutil.copytree(seeded_ws.workspace / "runs" / str(seeded_ws.conversion), fresh_ws / "runs" / "demo")
    export(fresh_ws / "runs" / "demo", fresh_ws / "exports" / "demo-export", workspace=fresh_ws)
    (fresh_ws / "runs" / "unfinished").mkdir()  # a run folder without its config: not a conversion
    at = open_page("views/attention.py")
    picker = widget(at, "selectbox", "attention_conversion")
    assert sorted(picker.options) == sorted(["exports/demo-export (export) · tiny-random-llama · terraced/hedgehog",
                                             "runs/demo (run) · tiny-random-llama · terraced/hedgehog"])
    picker.set_value("runs/demo").run()
    widget(at, "text_area", "attention_prompt").set_value("猫は🐈 sat on the mat").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert _heatmaps(at)["data"][0]["x"][-4:] == ["8 ␣sat", "9 ␣on", "10 ␣the", "11 ␣mat"]
    picker = widget(at, "selectbox", "attention_conversion")
    picker.set_value("exports/demo-export").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert len(_heatmaps(at)["data"][0]["x"]) == 12
