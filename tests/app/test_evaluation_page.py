"""Evaluation page: teacher vs student bars with error bars, the retention ratio and the table
show the reports' numbers, for eval jobs and conversions side by side; the empty state
queues an evaluation of a finished conversion; a conversion's long-context section (from its
report, eval.json or an eval job) shows as charts, tables and its verdicts, the frontier with
the conversion and the others as points."""

from __future__ import annotations

import json

import pytest

from jobs import api, store
from jobs.db import open_db
from tests.app.apptest import button, column_format, open_page, plotly_figures, texts, widget
from tests.app.seed import finished_job
from tests.long_context_report import MATCHED_LABEL, WINDOW_LABEL, long_context_section

PAGE = "views/evaluation.py"


def entry(teacher: float, student: float, stderr: float, n: int = 20) -> dict:
    """One task of a harness result (core.eval.harness), headline metric acc."""
    diff = student - teacher
    return {"n": n, "metric": "acc", "teacher": {"acc": teacher, "acc_stderr": stderr, "acc_norm": teacher / 2},
            "student": {"acc": student, "acc_stderr": stderr * 1.5, "acc_norm": student / 2}, "diff": diff,
            "diff_ci95": [diff - 0.1, diff + 0.1], "paired": {}}


EVAL_RESULTS = {"lolcats_kjv_next": entry(0.5, 0.4, 0.11), "lolcats_gsm8k_answer": entry(0.25, 0.3, 0.1)}
CONVERSION_RESULTS = {"lolcats_kjv_next": entry(0.5, 0.45, 0.11, n=5), "lolcats_gsm8k_answer": entry(0.2, 0.1, 0.09, n=5)}


@pytest.fixture
def evaluated_ws(fresh_ws):
    conversion = finished_job(fresh_ws, "convert", {"seed": 0}, "tiny-test",
                              {"student_ppl": 10.0, "tasks": {"results": CONVERSION_RESULTS}})
    evaluation = finished_job(fresh_ws, "eval", {"run": f"runs/{conversion}", "tasks": "offline", "limit": 20},
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


def test_a_retention_near_1_shows_its_difference_from_1(evaluated_ws):
    at = open_page(PAGE)
    assert column_format(at.dataframe[0], "retention") % 1.0012 == "1.001"


def test_a_task_the_teacher_scores_0_shows_no_retention_rather_than_none(fresh_ws):
    finished_job(fresh_ws, "convert", {"seed": 0}, "tiny-test",
                 {"student_ppl": 10.0, "tasks": {"results": {"lolcats_kjv_next": entry(0.0, 0.2, 0.05)}}})
    at = open_page(PAGE)
    assert not at.exception
    assert at.dataframe[0].value["retention"].isna().all()
    assert at.dataframe[0].proto.placeholder == "–"  # the cell's text: a dash, not "None"


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
    assert widget(at, "selectbox", "eval_conversion").value == f"job:{conversion}"
    widget(at, "number_input", "eval_limit").set_value(5).run()
    button(at, "eval_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    queued = api.list_jobs(kind="eval", workspace=fresh_ws)
    assert [(j.status, j.name) for j in queued] == [("queued", f"eval-{conversion}")]
    assert queued[0].config == {"run": f"runs/{conversion}", "tasks": "offline", "num_fewshot": None, "limit": 5,
                                "batch_size": 1, "lengths": None, "sequences": None}
    assert f"Queued evaluation job #{queued[0].id} of conversion #{conversion}." in texts(at)


def test_the_form_queues_a_long_context_evaluation_and_refuses_an_empty_one(fresh_ws):
    conversion = finished_job(fresh_ws, "convert", {"seed": 0}, "tiny-test", None)
    at = open_page(PAGE)
    widget(at, "text_input", "eval_tasks").set_value("")
    button(at, "eval_submit").click().run()
    assert [e.value for e in at.error] == ["invalid eval config: tasks: nothing to evaluate: give tasks (offline, "
                                           "paper or lm-eval task names), lengths (auto or token counts such as "
                                           "256,1024,2048,4096), or both"]
    assert api.list_jobs(kind="eval", workspace=fresh_ws) == []
    widget(at, "text_input", "eval_lengths").set_value("1024, 256")
    button(at, "eval_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    [queued] = api.list_jobs(kind="eval", workspace=fresh_ws)
    assert queued.config["tasks"] is None and queued.config["lengths"] == [256, 1024]
    assert queued.config["run"] == f"runs/{conversion}"


def test_without_any_conversion_the_page_offers_the_demo(fresh_ws):
    at = open_page(PAGE)
    assert "The Evaluation view needs a finished conversion" in texts(at)
    assert button(at, "eval_demo")


def test_a_running_evaluation_shows_items_done_of_total(evaluated_ws):
    ws, conversion, _ = evaluated_ws
    db = open_db(ws)
    job_id = store.insert_job(db, "eval", {"run": f"runs/{conversion}", "tasks": "offline", "limit": 3},
                              name="live")
    claim = store.claim_next_job(db, "otherhost:1:1")
    store.heartbeat(db, job_id, claim.attempt, stage="teacher_tasks", step=4, total=9, metrics={"requests": 16.0})
    at = open_page(PAGE)
    [bar] = at.get("progress")
    assert bar.proto.text == f"#{job_id} live on offline: teacher tasks 4/9 items"
    assert bar.proto.value == 44  # percent


def _rows(table) -> list[list[float]]:
    return [[float(v) for v in row] for row in table.values.tolist()]


def test_long_context_of_a_conversion_shows_positions_lengths_verdicts_and_the_passkey_grid(fresh_ws):
    section = long_context_section()
    finished_job(fresh_ws, "convert", {"seed": 0}, "long", {"student_ppl": 10.0, "long_context": section})
    at = open_page(PAGE)
    assert not at.exception
    positions = figure(at, "by position")
    assert [t["name"] for t in positions["data"]] == ["student", WINDOW_LABEL, MATCHED_LABEL]
    for trace, key in zip(positions["data"], ("student", "window", "memory_matched")):
        assert trace["x"] == ["0-64", "64-256", "256-1k", "1k-2k", "2k-4k"]
        assert trace["y"] == pytest.approx([row[key] for row in section["by_position"]])
    assert [t["line"].get("dash") for t in positions["data"]] == [None, "dash", "dash"]  # baselines dashed
    [teacher] = positions["layout"]["shapes"]
    assert (teacher["y0"], teacher["y1"]) == (1.0, 1.0)
    table = at.dataframe[1].value
    assert list(table.columns) == ["length", "teacher ppl", "student", WINDOW_LABEL, MATCHED_LABEL, "top-1 agreement"]
    assert _rows(table) == [pytest.approx([r["length"], r["teacher_ppl"], r["student"]["ratio"], r["window"]["ratio"],
                                           r["memory_matched"]["ratio"], r["student"]["top1_agreement"]])
                            for r in section["by_length"]]
    # 1.0012 against 1.01 and 1.05 against 1.04 lie within the 0.01 margin: level, not worse
    assert [e.value for e in at.error] == [
        f"The student is worse than the untrained {MATCHED_LABEL} at 4096 tokens.",
        "The student is worse than the training-free frontier (read at the student's own bytes) at 4096 tokens."]
    assert [i.value for i in at.info if i.value.startswith("The student")] == [
        f"The student is level with the untrained {MATCHED_LABEL} at 256, 1024 tokens.",
        "The student is level with the training-free frontier (read at the student's own bytes) at 256, 1024 tokens."]
    assert [s.value for s in at.success] == [f"The student is better than the untrained {WINDOW_LABEL} at every length."]
    grid = figure(at, "Passkey")
    assert grid["layout"]["title"]["text"] == "Passkey retrieval: 4 keys a cell"
    assert [a["text"] for a in grid["layout"]["annotations"]] == ["teacher", "student", WINDOW_LABEL, MATCHED_LABEL]
    for trace, key in zip(grid["data"], ("teacher", "student", "window", "memory_matched")):
        assert trace["type"] == "heatmap" and trace["z"] == section["passkey"]["accuracy"][key]
        assert trace["x"] == ["0.1", "0.5", "0.9"] and trace["y"] == ["512", "1024"]  # x depth, y length
    assert grid["data"][1]["text"] == [["4/4", "2/4", "3/4"], ["2/4", "1/4", "3/4"]]
    lo, hi = grid["data"][1]["customdata"][1][1]  # 1 of 4: the 95 % Wilson interval
    assert (lo, hi) == pytest.approx((0.0456, 0.6994), abs=1e-4)
    coloraxis = grid["layout"]["coloraxis"]
    assert (coloraxis["cmin"], coloraxis["cmax"], coloraxis["colorbar"]["tickformat"]) == (0, 1, ".0%")
    assert any(c.value.startswith("Each cell hides 4 keys at a depth (0: the prompt's start, 1: its end)") and
               "2/4 found means 95 % between 15% and 85%" in c.value for c in at.caption)


def test_the_frontier_draws_the_curve_the_conversion_and_the_others_at_a_chosen_length(fresh_ws):
    section = long_context_section()
    finished_job(fresh_ws, "convert", {"seed": 0}, "long", {"student_ppl": 10.0, "long_context": section})
    other = {**long_context_section(), "state_bytes_per_layer": 250000,
             "by_length": [{**row, "student": {**row["student"], "ratio": 1.1}} for row in section["by_length"]]}
    finished_job(fresh_ws, "convert", {"seed": 1}, "smaller", {"student_ppl": 10.0, "long_context": other})
    at = open_page(PAGE)
    assert not at.exception
    widget(at, "selectbox", "long_conversion").set_value(widget(at, "selectbox", "long_conversion").options[-1]).run()
    chart = figure(at, "Quality against memory at 4096 tokens")
    curve, mine, others = chart["data"]
    assert curve["x"] == [(w + 4) * 1536 for w in (32, 128, 323, 512)] and curve["y"] == [1.6, 1.3, 1.02, 1.01]
    assert "window 323 + 4 sinks (memory-matched)" in curve["text"]
    assert (mine["x"], mine["y"]) == ([502272], [1.18])
    assert (others["x"], others["y"]) == ([250000], [1.1])
    assert chart["layout"]["xaxis"]["type"] == "log"
    widget(at, "select_slider", "frontier_length").set_value(256).run()
    chart = figure(at, "Quality against memory at 256 tokens")
    assert chart["data"][0]["y"] == [1.1, 1.03, 1.01, 1.0] and chart["data"][1]["y"] == [1.0012]
    frontier = at.dataframe[0].value
    assert frontier["verdict"].tolist() == ["level", "level", "worse"]
    assert frontier["window bytes for the student's quality"].round().tolist() == [750178, 460724, 291253]


def test_an_evaluation_stored_before_the_frontier_shows_its_verdicts_without_one(fresh_ws):
    finished_job(fresh_ws, "convert", {"seed": 0}, "old", {"student_ppl": 10.0,
                                                            "long_context": long_context_section(older=True)})
    at = open_page(PAGE)
    assert not at.exception
    assert [e.value for e in at.error] == [f"The student is worse than the untrained {MATCHED_LABEL} at 1024, 4096 "
                                           "tokens."]
    assert any(c.value.startswith("No frontier: this evaluation was made before the frontier") for c in at.caption)
    assert any("A difference within 0.5% of perplexity is called level" in c.value for c in at.caption)
    assert [a["text"] for a in figure(at, "Passkey")["layout"]["annotations"]] == ["teacher", "student", WINDOW_LABEL]


def test_eval_json_and_evaluate_jobs_on_the_run_supply_its_long_context(fresh_ws):
    conversion = finished_job(fresh_ws, "convert", {"seed": 0}, "long", {"student_ppl": 10.0})
    from_cli = {**long_context_section(), "train_seq_len": 256}
    run = api.get_job(conversion, workspace=fresh_ws).run_dir
    (run / "eval.json").write_text(json.dumps({"student_ppl": 10.0, "long_context": from_cli}))
    at = open_page(PAGE)
    assert figure(at, "by position")["layout"]["title"]["text"].endswith("(trained on 256 tokens)")
    assert "From `lolcats eval` (eval.json)" in texts(at)
    evaluation = finished_job(fresh_ws, "eval", {"run": f"runs/{conversion}", "lengths": [256, 1024, 4096]},
                              "eval-long", {"long_context": long_context_section(worse_than_window=True)})
    at.run()
    source = widget(at, "selectbox", "long_source")
    assert source.options == [f"eval job #{evaluation}", "`lolcats eval` (eval.json)"]
    assert f"The student is worse than the untrained {WINDOW_LABEL} at 4096 tokens." in [e.value for e in at.error]
    source.set_value("`lolcats eval` (eval.json)").run()
    assert not any(WINDOW_LABEL in e.value for e in at.error)


def test_positions_in_one_bucket_have_no_chart_by_position(fresh_ws):
    section = {**long_context_section(), "by_position": long_context_section()["by_position"][:1]}
    finished_job(fresh_ws, "convert", {"seed": 0}, "short", {"student_ppl": 10.0, "long_context": section})
    at = open_page(PAGE)
    assert not at.exception
    assert not [f for f in plotly_figures(at) if "by position" in f["layout"]["title"]["text"]]
    assert ("No chart by position: every evaluated position (0-64) falls in one bucket of the chart, which needs two "
            "or more; the table below has the ratios.") in [c.value for c in at.caption]
    assert len(at.dataframe[1].value) == len(section["by_length"])


def test_a_run_without_long_context_says_how_to_get_one(fresh_ws):
    conversion = finished_job(fresh_ws, "convert", {"seed": 0}, "short", {"student_ppl": 10.0, "long_context": None})
    at = open_page(PAGE)
    assert not at.exception
    assert (f"This run has no long-context evaluation: `lolcats eval runs/{conversion} --lengths 256,1024,2048,4096` "
            "measures one (or queue one above with context lengths).") in [i.value for i in at.info]
    assert not [f for f in plotly_figures(at) if "by position" in f["layout"]["title"]["text"]]
