"""Evaluation page: teacher vs student bars with error bars, the retention ratio and the table
show the reports' numbers, for evaluate jobs and conversions side by side; the empty state
queues an evaluation of a finished conversion."""

from __future__ import annotations

import json

import pytest

from jobs import api, store
from jobs.db import open_db
from tests.app.apptest import button, open_page, plotly_figures, texts, widget

PAGE = "views/evaluation.py"


def entry(teacher: float, student: float, stderr: float, n: int = 20) -> dict:
    """One task of a harness result (core.eval.harness), headline metric acc."""
    diff = student - teacher
    return {"n": n, "metric": "acc", "teacher": {"acc": teacher, "acc_stderr": stderr, "acc_norm": teacher / 2},
            "student": {"acc": student, "acc_stderr": stderr * 1.5, "acc_norm": student / 2}, "diff": diff,
            "diff_ci95": [diff - 0.1, diff + 0.1], "paired": {}}


EVAL_RESULTS = {"lolcats_kjv_next": entry(0.5, 0.4, 0.11), "lolcats_gsm8k_answer": entry(0.25, 0.3, 0.1)}
CONVERSION_RESULTS = {"lolcats_kjv_next": entry(0.5, 0.45, 0.11, n=5), "lolcats_gsm8k_answer": entry(0.2, 0.1, 0.09, n=5)}


def finished_job(ws, kind: str, config: dict, name: str, report: dict | None) -> int:
    """A succeeded job row whose run folder holds a loadable-looking conversion (config.json, stage1/)."""
    db = open_db(ws)
    job_id = store.insert_job(db, kind, config, name=name)
    claim = store.claim_next_job(db, "otherhost:1:1")
    run_dir = ws / claim.run_dir
    (run_dir / "stage1").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    store.mark_succeeded(db, job_id, claim.attempt, report or {"student_ppl": 10.0})
    return job_id


@pytest.fixture
def evaluated_ws(fresh_ws):
    conversion = finished_job(fresh_ws, "convert", {"seed": 0}, "tiny-test",
                              {"student_ppl": 10.0, "tasks": {"results": CONVERSION_RESULTS}})
    evaluation = finished_job(fresh_ws, "evaluate", {"run": f"runs/{conversion}", "tasks": "offline", "limit": 20},
                              "eval-1", {"results": EVAL_RESULTS, "config": {}})
    return fresh_ws, conversion, evaluation


def figure(at, title_part: str) -> dict:
    for fig in plotly_figures(at):
        if title_part in fig["layout"]["title"]["text"]:
            return fig
    raise AssertionError(f"no figure titled {title_part!r}")


def test_bars_retention_and_table_show_the_reports_numbers(evaluated_ws):
    ws, conversion, evaluation = evaluated_ws
    at = open_page(PAGE)
    assert not at.exception
    assert widget(at, "multiselect", "eval_runs").value == [evaluation, conversion]
    labels = {evaluation: f"#{evaluation} eval-1", conversion: f"#{conversion} tiny-test"}
    reports = {evaluation: EVAL_RESULTS, conversion: CONVERSION_RESULTS}
    bars = {t["name"]: t for t in figure(at, "Task accuracy")["data"]}
    retention = {t["name"]: t for t in figure(at, "Retention")["data"]}
    table = at.dataframe[0].value
    for job_id, results in reports.items():
        tasks = list(results)
        for role in ("teacher", "student"):
            trace = bars[f"{labels[job_id]} · {role}"]
            assert list(trace["x"]) == tasks
            assert trace["y"] == pytest.approx([results[t][role]["acc"] for t in tasks])
            assert trace["error_y"]["array"] == pytest.approx([results[t][role]["acc_stderr"] for t in tasks])
        assert retention[labels[job_id]]["y"] == pytest.approx(
            [results[t]["student"]["acc"] / results[t]["teacher"]["acc"] for t in tasks])
        for task, expected in results.items():
            row = table[(table["run"] == labels[job_id]) & (table["task"] == task)].iloc[0]
            assert (row["n"], row["metric"]) == (expected["n"], "acc")
            assert [row["teacher"], row["student"], row["diff"], row["CI low"], row["CI high"]] == pytest.approx(
                [expected["teacher"]["acc"], expected["student"]["acc"], expected["diff"], *expected["diff_ci95"]])
            assert row["retention"] == pytest.approx(expected["student"]["acc"] / expected["teacher"]["acc"])


def test_one_run_alone_names_the_bars_teacher_and_student(evaluated_ws):
    ws, conversion, evaluation = evaluated_ws
    at = open_page(PAGE)
    widget(at, "multiselect", "eval_runs").set_value([evaluation]).run()
    assert not at.exception
    fig = figure(at, "Task accuracy")
    assert [t["name"] for t in fig["data"]] == ["teacher", "student"]
    assert fig["data"][0]["y"] == pytest.approx([e["teacher"]["acc"] for e in EVAL_RESULTS.values()])


def test_the_empty_state_queues_an_evaluation_of_a_finished_conversion(fresh_ws):
    conversion = finished_job(fresh_ws, "convert", {"seed": 0}, "tiny-test", None)
    at = open_page(PAGE)
    assert "No task accuracy yet" in texts(at)
    assert widget(at, "selectbox", "eval_conversion").value == conversion
    widget(at, "number_input", "eval_limit").set_value(5).run()
    button(at, "eval_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    queued = api.list_jobs(kind="evaluate", workspace=fresh_ws)
    assert [(j.status, j.name) for j in queued] == [("queued", f"eval-{conversion}")]
    assert queued[0].config == {"run": f"runs/{conversion}", "tasks": "offline", "num_fewshot": None, "limit": 5,
                                "batch_size": 1}
    assert f"Queued evaluation job #{queued[0].id} of conversion #{conversion}." in texts(at)


def test_without_any_conversion_the_page_offers_the_demo(fresh_ws):
    at = open_page(PAGE)
    assert "The Evaluation view needs a finished conversion" in texts(at)
    assert button(at, "eval_demo")


def test_a_running_evaluation_shows_items_done_of_total(evaluated_ws):
    ws, conversion, _ = evaluated_ws
    db = open_db(ws)
    job_id = store.insert_job(db, "evaluate", {"run": f"runs/{conversion}", "tasks": "offline", "limit": 3},
                              name="live")
    claim = store.claim_next_job(db, "otherhost:1:1")
    store.heartbeat(db, job_id, claim.attempt, stage="teacher_tasks", step=4, total=9, metrics={"requests": 16.0})
    at = open_page(PAGE)
    [bar] = at.get("progress")
    assert bar.proto.text == f"#{job_id} live on offline: teacher tasks 4/9 items"
    assert bar.proto.value == 44  # percent
