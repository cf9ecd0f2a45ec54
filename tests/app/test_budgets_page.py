"""Budgets page: a finished sweep's trade-off plot, table and layer scores show its result's numbers;
the form queues a budgets job, refusing budgets that are not numbers."""

from __future__ import annotations

import pytest

from jobs import api, store
from jobs.db import open_db
from tests.app.apptest import button, column_format, open_page, plotly_figures, texts, widget

PAGE = "views/budgets.py"

RESULT = {  # the shape core.pipeline.budgets.run_budget_sweep returns
    "score": "kl", "layer_scores": [0.01, 0.3, 0.02, 0.2], "context": 4096, "teacher_ppl": 7.0,
    "teacher": {"decode_ms_per_step": 90.0, "cache_bytes": 64 * 2**20},
    "rows": [
        {"budget": 0, "softmax_layers": [], "student_ppl": 9.1, "ppl_ratio": 1.3, "val_ppl": 6.0,
         "decode_ms_per_step": 40.0, "cache_bytes": 2 * 2**20, "run": "budget-0"},
        {"budget": 2, "softmax_layers": [1, 3], "student_ppl": 7.7, "ppl_ratio": 1.1, "val_ppl": 5.5,
         "decode_ms_per_step": 60.0, "cache_bytes": 33 * 2**20, "run": "budget-2"},
    ],
    "config": {},
}


def finished_sweep(ws) -> int:
    db = open_db(ws)
    job_id = store.insert_job(db, "budgets", {"budgets": [0, 2]}, name="budgets-cpu-demo")
    claim = store.claim_next_job(db, "otherhost:1:1")
    store.mark_succeeded(db, job_id, claim.attempt, RESULT)
    return job_id


def figure(at, title_part: str) -> dict:
    for fig in plotly_figures(at):
        if title_part in (fig["layout"].get("title") or {}).get("text", ""):
            return fig
    raise AssertionError(f"no figure titled {title_part!r}")


def test_a_finished_sweep_shows_its_numbers(fresh_ws):
    finished_sweep(fresh_ws)
    at = open_page(PAGE)
    trade = figure(at, "Quality vs decode cost")
    student, teacher = trade["data"]
    assert student["x"] == pytest.approx([40.0, 60.0]) and student["y"] == pytest.approx([1.3, 1.1])
    assert list(student["text"]) == ["K=0", "K=2"]
    assert teacher["x"] == pytest.approx([90.0]) and teacher["y"] == pytest.approx([1.0])
    table = at.dataframe[0].value
    assert list(table["layers kept softmax"]) == ["none", "1, 3", "teacher (all)"]
    assert list(table["cache MiB"]) == pytest.approx([2.0, 33.0, 64.0])
    bars = figure(at, "Layer scores")["data"][0]
    assert list(bars["x"]) == [0, 1, 2, 3] and bars["y"] == pytest.approx(RESULT["layer_scores"])
    assert list(bars["text"]) == ["", "kept softmax", "", "kept softmax"]  # the largest budget's layers
    assert "the layers the largest budget keeps softmax" in texts(at)


def test_a_ratio_near_1_shows_its_difference_from_1(fresh_ws):
    finished_sweep(fresh_ws)
    at = open_page(PAGE)
    table = at.dataframe[0]
    assert column_format(table, "ppl ratio") % 1.0012 == "1.001"
    assert column_format(table, "ppl ratio") % 1.0 == "1.000"  # the teacher's row


def test_the_form_queues_a_sweep_and_refuses_words(fresh_ws):
    at = open_page(PAGE)
    assert "No finished budget sweep yet" in texts(at)
    widget(at, "text_input", "budgets_values").set_value("0, two").run()
    button(at, "budgets_submit").click().run()
    assert "Budgets must be whole numbers" in texts(at)
    assert api.list_jobs(kind="budgets", workspace=fresh_ws) == []
    widget(at, "selectbox", "budgets_preset").set_value("tiny-test").run()
    widget(at, "text_input", "budgets_values").set_value("0, 1").run()
    button(at, "budgets_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    queued = api.list_jobs(kind="budgets", workspace=fresh_ws)
    assert [(j.status, j.name) for j in queued] == [("queued", "budgets-tiny-test")]
    assert queued[0].config["budgets"] == [0, 1] and queued[0].config["context"] == 4096
    assert queued[0].config["base"]["model"]["source"] == "tiny-random-llama"


def test_a_budget_the_model_cannot_take_is_refused_with_the_field(fresh_ws):
    at = open_page(PAGE)
    widget(at, "selectbox", "budgets_preset").set_value("tiny-test").run()
    widget(at, "text_input", "budgets_values").set_value("0, 2").run()
    button(at, "budgets_submit").click().run()
    assert "budget 2 would keep every layer" in texts(at)
    assert api.list_jobs(kind="budgets", workspace=fresh_ws) == []
