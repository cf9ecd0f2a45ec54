"""The ``eval`` job kind: task accuracy of a tiny-test run through a real worker, its progress
rows, quality by context length with task accuracy in one job, the checks at submit, and a cancelled
evaluation that resumes at its first unfinished task."""

from __future__ import annotations

import json
import math

import pytest

from jobs import api
from jobs.errors import ConfigError
from jobs_testutil import run_dir, stop_and_resume, wait_for, wait_status

pytestmark = pytest.mark.slow  # a tiny conversion, then lm-eval jobs through a real worker

OFFLINE = ["lolcats_gsm8k_answer", "lolcats_kjv_lastword", "lolcats_kjv_next"]
LIMIT = 5
CONFIG = {"run": "runs/tiny", "tasks": "offline", "limit": LIMIT}


def test_an_evaluation_job_succeeds_with_the_report_and_progress_rows(tiny_ws, start_worker):
    job_id = api.submit_job("eval", CONFIG, workspace=tiny_ws).id
    worker = start_worker("--exit-when-idle")
    assert worker.wait(600) == 0, worker.output()
    info = api.get_job(job_id, workspace=tiny_ws)
    assert info.status == "succeeded", (info.error, info.log_tail)
    report = json.loads((run_dir(tiny_ws, job_id) / "report.json").read_text())
    assert info.result == report
    assert set(report["results"]) == set(OFFLINE) and report["config"]["limit"] == LIMIT
    assert report["config"]["run"] == str((tiny_ws / "runs" / "tiny").resolve())
    for entry in report["results"].values():
        assert entry["n"] == LIMIT and entry["metric"] == "acc"
        for role in ("teacher", "student"):
            assert {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"} <= set(entry[role])
        lo, hi = entry["diff_ci95"]
        assert lo <= entry["diff"] <= hi
    assert sorted(p.stem for p in (run_dir(tiny_ws, job_id) / "tasks").glob("*.json")) == OFFLINE
    rows = api.job_metrics(job_id, name="requests", workspace=tiny_ws)
    for stage in ("teacher_tasks", "student_tasks"):
        steps = [(m.step, m.value) for m in rows if m.stage == stage]
        assert steps == [(LIMIT, LIMIT * 4.0)] * len(OFFLINE)  # one chunk per task, 4 choices an item
    assert (info.progress_stage, info.progress_step, info.progress_total) == ("student_tasks", LIMIT, LIMIT)


def test_an_evaluation_job_measures_tasks_and_quality_by_context_length(tiny_ws, start_worker):
    config = {"run": "runs/tiny", "tasks": "lolcats_kjv_next", "limit": 2, "lengths": "128, 64", "sequences": 1}
    job = api.submit_job("eval", config, workspace=tiny_ws)
    assert (job.config["lengths"], job.config["sequences"]) == ([64, 128], 1)  # text read as a sorted list
    worker = start_worker("--exit-when-idle")
    assert worker.wait(600) == 0, worker.output()
    info = api.get_job(job.id, workspace=tiny_ws)
    assert info.status == "succeeded", (info.error, info.log_tail)
    report = json.loads((run_dir(tiny_ws, job.id) / "report.json").read_text())
    assert list(report["results"]) == ["lolcats_kjv_next"] and report["results"]["lolcats_kjv_next"]["n"] == 2
    long = report["long_context"]
    assert (long["lengths"], long["sequences"], long["train_seq_len"]) == ([64, 128], 1, 64)  # the run's data.seq_len
    assert set(long["baselines"]) == {"window", "memory_matched"}
    assert {(v["against"], v["length"]) for v in long["verdicts"]} == {
        (name, n) for name in ("window", "memory_matched", "frontier") for n in (64, 128)}
    assert report["student_ppl"] > 0 and report["teacher_ppl"] > 0  # the run's evaluation step, as lolcats eval
    assert [row["length"] for row in long["by_length"]] == [64, 128]
    for row in long["by_length"]:
        for name in ("student", *long["baselines"]):
            assert row[name]["ratio"] == pytest.approx(row[name]["ppl"] / row["teacher_ppl"])
            assert 0.0 <= row[name]["top1_agreement"] <= 1.0
    assert math.isfinite(long["by_position"][-1]["student"]) and long["by_position"][-1]["end"] == 127
    assert info.progress_stage in ("long_context", "long_context_passkey")


def test_submit_refuses_a_run_outside_the_workspace_or_without_a_model(tiny_ws):
    with pytest.raises(ConfigError, match="run"):
        api.submit_job("eval", {**CONFIG, "run": "../elsewhere"}, workspace=tiny_ws)
    with pytest.raises(ConfigError, match="'runs/missing' is not a converted run folder"):
        api.submit_job("eval", {**CONFIG, "run": "runs/missing"}, workspace=tiny_ws)
    with pytest.raises(ConfigError, match="limit"):
        api.submit_job("eval", {**CONFIG, "limit": 0}, workspace=tiny_ws)
    with pytest.raises(ConfigError, match="^invalid eval config: tasks: nothing to evaluate: give tasks"):
        api.submit_job("eval", {"run": "runs/tiny"}, workspace=tiny_ws)
    with pytest.raises(ConfigError, match=r"lengths: .*lengths must be 'auto' or a non-empty list of lengths >= 16"):
        api.submit_job("eval", {**CONFIG, "lengths": [8, 64]}, workspace=tiny_ws)
    with pytest.raises(ConfigError, match=r"^invalid eval config: lengths: Value error, lengths takes whole numbers separated by commas, "
                       r"such as 256,1024 \(or auto\); got '1k'$"):
        api.submit_job("eval", {**CONFIG, "lengths": "1k"}, workspace=tiny_ws)
    assert api.list_jobs(workspace=tiny_ws) == []


@pytest.mark.parametrize("how", ["cancel", pytest.param("kill", marks=pytest.mark.slow)])
def test_a_stopped_evaluation_resumes_at_its_first_unfinished_task(tiny_ws, start_worker, how):
    """Cancelled (a cooperative stop) or killed with SIGKILL once a task is saved: resumed without
    evaluating that task again."""
    job_id = api.submit_job("eval", CONFIG, workspace=tiny_ws).id
    start_worker()
    first = run_dir(tiny_ws, job_id) / "tasks" / f"{OFFLINE[0]}.json"
    wait_for(first.is_file, 300, what="the first task to finish")
    info, _ = stop_and_resume(tiny_ws, job_id, how, timeout=300)
    saved = json.loads(first.read_text())
    events = [e.message for e in api.job_events(job_id, workspace=tiny_ws) if e.attempt == 2]
    assert any(m.startswith(f"lm-eval: {OFFLINE[0]} already evaluated") for m in events), events
    assert f"lm-eval: teacher on {OFFLINE[0]}" not in events
    assert info.result["results"][OFFLINE[0]] == saved["results"][OFFLINE[0]]
    assert set(info.result["results"]) == set(OFFLINE)
