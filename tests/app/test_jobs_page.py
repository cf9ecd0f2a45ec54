"""Jobs page: live table from the database, details, the error that ended a job, cancel and resume."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from streamlit.util import calc_hash

from app import forms
from app.common import fmt_duration
from core.config import PRESETS
from core.eval.long_context_result import passkey_accuracy
from jobs import api, store
from jobs.db import open_db
from jobs.errors import JobsError
from tests.app.apptest import button, open_page, texts, widget
from tests.app.seed import finished_job
from tests.long_context_report import FORMER_PASSKEY, long_context_section


def _table(at):
    df = at.dataframe[0].value
    return {int(r["id"]): r for r in df.to_dict("records")}


def test_the_reason_column_is_wide_only_when_a_job_has_a_reason(fresh_ws):
    import json

    finished_job(fresh_ws, "convert", {"data": {"seq_len": 64}}, "done", None)
    at = open_page("views/jobs.py")
    assert json.loads(at.dataframe[0].proto.columns)["error / reason"]["width"] == "small"
    failed = _failed_job(fresh_ws, {"data": {"seq_len": 64}}, "broken")
    at = open_page("views/jobs.py")
    assert _table(at)[failed]["error / reason"] == "RuntimeError: boom"
    assert json.loads(at.dataframe[0].proto.columns)["error / reason"]["width"] == "large"


def test_table_shows_every_seeded_job(seeded_ws):
    at = open_page("views/jobs.py")
    rows = _table(at)
    s = seeded_ws
    assert rows[s.conversion]["status"].endswith("succeeded") and rows[s.conversion]["kind"] == "convert"
    assert rows[s.conversion]["progress"] == 1.0
    assert rows[s.benchmark]["kind"] == "bench"
    assert rows[s.failed]["status"].endswith("failed")
    assert "injected failure at step 2" in rows[s.failed]["error / reason"]


def test_failed_job_shows_why_and_offers_resume(seeded_ws):
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(seeded_ws.failed).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any("Why it failed" in e and "injected failure at step 2" in e for e in errors), errors
    assert not button(at, f"resume_{seeded_ws.failed}").disabled
    assert button(at, f"cancel_{seeded_ws.failed}").disabled
    assert "RuntimeError" in texts(at)  # the traceback tail, under "Error details"
    assert [t.label for t in at.tabs] == ["Log", "Error details", "Result", "Config", "Info"]


def test_succeeded_conversion_shows_its_report(seeded_ws):
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(seeded_ws.conversion).run()
    report = api.job_report(seeded_ws.conversion, workspace=seeded_ws.workspace)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Teacher perplexity"] == f"{report['teacher_ppl']:.4g}"
    assert metrics["Student perplexity"] == f"{report['student_ppl']:.4g}"
    log = texts(at)
    assert "succeeded" in log and "teacher held-out perplexity" in log  # the job's own log lines
    assert ", attempt 1] " in log and "#1] " not in log  # an attempt is not a job number


def test_export_queues_an_export_job_of_a_finished_conversion(fresh_ws):
    done = finished_job(fresh_ws, "convert", {"data": {"seq_len": 64}}, "done", None)
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(done).run()
    button(at, f"export_{done}").click().run()
    assert not at.exception and not at.error
    jobs = api.list_jobs(workspace=fresh_ws)
    assert [(j.kind, j.config["run"], j.config["output"]) for j in jobs if j.id != done] == [
        ("export", f"runs/{done}", f"exports/{done}")]
    export = max(j.id for j in jobs)
    assert button(at, f"export_{done}").disabled  # no second export while this one waits
    assert f"Export job #{export} is queued, into `exports/{done}`" in texts(at)
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(export).run()
    assert button(at, f"export_{export}").disabled  # an export job is not a conversion


def test_an_export_job_shows_its_folder_size_snippet_and_card(fresh_ws):
    report = {"folder": "exports/7", "files": {"model.safetensors": 3 * 2**20, "README.md": 2048},
              "bytes": 3 * 2**20 + 2048, "card": "---\nlibrary_name: transformers\ntags:\n- lolcats\n---\n\n"
                                                 "# tiny-test, linearized\n\nA card line.",
              "load": "model = AutoModelForCausalLM.from_pretrained('/ws/exports/7', trust_remote_code=True)",
              "pushed": None}
    job = finished_job(fresh_ws, "export", {"run": "runs/7", "output": "exports/7"}, "export", report)
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(job).run()
    shown = texts(at)
    assert "exports/7" in shown and "3.0 MiB in 2 files" in shown and "A card line." in shown
    assert report["load"] in [c.value for c in at.code]
    assert "library_name: transformers\ntags:\n- lolcats" in [c.value for c in at.code]  # the front matter as YAML
    assert not any("library_name" in m.value for m in at.markdown)


def test_succeeded_conversion_has_its_figures_on_top_and_no_error_tab(seeded_ws):
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(seeded_ws.conversion).run()
    report = api.job_report(seeded_ws.conversion, workspace=seeded_ws.workspace)
    assert [t.label for t in at.tabs] == ["Log", "Result", "Config", "Info"]
    assert not any(tab.get("metric") for tab in at.tabs)  # the figures are not a click away
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Ratio"] == f"{report['ppl_ratio']:.3f}"
    passkey = passkey_accuracy(report)  # over the long-context section's grid
    assert report["long_context"]["passkey"] and "passkey" not in report
    assert metrics["Passkey (student / teacher)"] == f"{passkey['student']:.2g} / {passkey['teacher']:.2g}"
    assert metrics["Time"] == fmt_duration(report["timings"]["total_s"]) and metrics["Time"].endswith("s")


@pytest.mark.parametrize("section, headline, warning", [
    (long_context_section(worse_than_window=True), "ppl ratio 1.001 at 512 · 1.180 at 4096 (window 64+4: 1.100)",
     "Long context: the student is worse than the untrained terraced window 64 + 4 sinks at 4096 tokens."),
    (long_context_section(), "ppl ratio 1.001 at 512 · 1.180 at 4096 (window 64+4: 1.450)", None),
    (None, "ppl ratio 1.001 at 512", None),
], ids=["worse-than-window", "beats-window", "no-long-context"])
def test_conversion_headline_adds_the_longest_length_and_warns_when_the_window_wins(fresh_ws, section, headline,
                                                                                    warning):
    report = {"teacher_ppl": 7.0, "student_ppl": 7.0084, "ppl_ratio": 1.0012, "long_context": section}
    job_id = finished_job(fresh_ws, "convert", {"data": {"seq_len": 512}}, "long", report)
    at = open_page("views/jobs.py")
    assert widget(at, "selectbox", "jobs_selected").value == job_id
    assert {m.label: m.value for m in at.metric}["Ratio"] == "1.001"  # 3 decimals, never "1"
    assert headline in [m.value for m in at.markdown]
    assert [w.value for w in at.warning] == ([warning] if warning else [])


def test_a_report_with_the_passkey_section_of_its_own_shows_it_in_the_headline(fresh_ws):
    """A report written when the evaluation measured a short passkey grid of its own."""
    report = {"teacher_ppl": 7.0, "student_ppl": 7.0084, "ppl_ratio": 1.0012, "passkey": FORMER_PASSKEY,
              "long_context": long_context_section(older=True) | {"passkey": None}}
    finished_job(fresh_ws, "convert", {"data": {"seq_len": 512}}, "older", report)
    at = open_page("views/jobs.py")
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Passkey (student / teacher)"] == "0.5 / 1"


def test_empty_state_launches_the_demo(fresh_ws):
    at = open_page("views/jobs.py")
    assert "No jobs yet" in texts(at)
    button(at, "jobs_demo").click().run()
    assert not at.exception
    jobs = api.list_jobs(workspace=fresh_ws)
    assert [(j.kind, j.name, j.status) for j in jobs] == [("convert", "cpu-demo", "queued")]
    assert jobs[0].config["stage1"]["steps"] == PRESETS["cpu-demo"]["stage1"]["steps"]  # the cpu-demo preset
    assert f"Queued the demo conversion as job #{jobs[0].id}" in texts(at)


def test_cancel_and_resume(fresh_ws):
    job = api.submit_job("selftest", {"steps": 3}, name="waiting", workspace=fresh_ws)
    at = open_page("views/jobs.py")
    assert _table(at)[job.id]["status"].endswith("queued")
    button(at, f"cancel_{job.id}").click().run()
    assert api.get_job(job.id, workspace=fresh_ws).status == "cancelled"
    at.run()
    assert _table(at)[job.id]["status"].endswith("cancelled")
    button(at, f"resume_{job.id}").click().run()
    info = api.get_job(job.id, workspace=fresh_ws)
    assert (info.status, info.attempt) == ("queued", 2)


def _seconds(duration: str) -> int:
    """The seconds of an ``app.common.fmt_duration`` text under an hour ("7s", "1m 05s")."""
    match = re.fullmatch(r"(?:(\d+)m )?(\d+)s", duration)
    assert match, duration
    return int(match.group(1) or 0) * 60 + int(match.group(2))


def test_a_running_job_looks_the_same_from_two_browsers(fresh_ws, monkeypatch):
    """State lives in the database: a second session (or a reload) sees the same running job."""
    db = open_db(fresh_ws)
    job = api.submit_job("selftest", {"steps": 10}, name="long", workspace=fresh_ws)
    claim = store.claim_next_job(db, "otherhost:1:1")
    started, now, real_utcnow = time.monotonic(), store.utcnow(), store.utcnow
    for step in (1, 2, 3):  # recorded as one step every 10 s, the third 10 s ago
        monkeypatch.setattr(store, "utcnow", lambda at=now - timedelta(seconds=10 * (4 - step)): at)
        store.heartbeat(db, job.id, claim.attempt, stage="selftest", step=step, total=10, metrics={"loss": 1.0 / step})
    monkeypatch.setattr(store, "utcnow", real_utcnow)
    first, second = open_page("views/jobs.py"), open_page("views/jobs.py")
    rendered = time.monotonic() - started
    for at in (first, second):
        row = _table(at)[job.id]
        assert row["status"].endswith("running")
        assert (row["stage"], row["step"]) == ("selftest", "3/10")
        assert row["progress"] == 0.3
        # 7 steps left at 10 s a step, less the 10 s since the third and the time the pages took to draw
        assert 60 - rendered - 1 <= _seconds(row["ETA"]) <= 60
        assert widget(at, "selectbox", "jobs_selected").value == job.id  # the running job is shown first
    button(first, f"cancel_{job.id}").click().run()
    second.run()
    assert "Cancel requested" in texts(second)


def test_a_running_conversion_shows_one_overall_bar_with_the_time_left(fresh_ws, monkeypatch):
    """tiny-test: 2 teacher blocks measured at 1 s, stage 1 (4 steps of cost 3) at step 2 of 4, 3 s a
    step, the last just now: 6 s of stage 1 left, stage 2 (cost 3) at the same 1 s per cost unit for
    4 steps, then 2 + 2 evaluation blocks at 1 s."""
    db = open_db(fresh_ws)
    job = api.submit_job("convert", forms.preset_config("tiny-test"), name="live", workspace=fresh_ws)
    claim = store.claim_next_job(db, "otherhost:1:1")
    now, real_utcnow = store.utcnow(), store.utcnow
    beats = [("teacher_eval", 1, 2, "nll", 9), ("teacher_eval", 2, 2, "nll", 8),
             ("stage1", 1, 4, "loss", 3), ("stage1", 2, 4, "loss", 0)]
    for stage, step, total, name, ago in beats:
        monkeypatch.setattr(store, "utcnow", lambda at=now - timedelta(seconds=ago): at)
        store.heartbeat(db, job.id, claim.attempt, stage=stage, step=step, total=total, metrics={name: 1.0})
    monkeypatch.setattr(store, "utcnow", real_utcnow)
    at = open_page("views/jobs.py")
    row = _table(at)[job.id]
    left = 2 * 3 + 4 * 3 + 4 * 1
    assert left - 3 <= _seconds(row["ETA"]) <= left
    assert row["progress"] == pytest.approx((2 + 6) / (2 + 12 + 12 + 4), abs=0.01)
    bars = [b.proto.text for b in at.get("progress")]
    assert bars[0].startswith("**Overall 27%** · about") and bars[0].endswith("left, then long-context evaluation")
    assert bars[1].startswith("stage 1: attention transfer: step 2/4")


def _failed_job(ws, config: dict, name: str) -> int:
    db = open_db(ws)
    job_id = store.insert_job(db, "convert", config, name=name)
    claim = store.claim_next_job(db, "otherhost:1:1")
    store.mark_failed(db, job_id, claim.attempt, "RuntimeError: boom")
    return job_id


def _link(at, label: str):
    links = [el.proto for el in at.get("page_link") if el.proto.label == label]
    assert len(links) == 1, [el.proto.label for el in at.get("page_link")]
    return links[0]


@pytest.mark.parametrize("status, label", [("succeeded", "New conversion from this job"),
                                           ("failed", "Edit and relaunch")])
def test_a_conversion_opens_in_the_launch_form(fresh_ws, status, label):
    config = forms.preset_config("tiny-test")
    config["attention"].update(window_size=8, history_norm="power")  # history_norm: not in the form
    if status == "succeeded":
        job = finished_job(fresh_ws, "convert", config, "old", None)
    else:
        job = _failed_job(fresh_ws, config, "old")
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(job).run()
    # a link to the Launch page naming the job, followed as the browser follows it
    link = _link(at, label)
    assert link.page_script_hash == calc_hash("launch") and link.query_string == f"from_job={job}"
    at.query_params["from_job"] = str(job)
    at.switch_page("views/launch.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Launch a conversion" in texts(at) and f"Based on job #{job} old" in texts(at).replace("**", "")
    assert "from_job" not in at.query_params  # read once: a rerun keeps what the user edits since
    assert widget(at, "number_input", "launch_attention.window_size").value == 8
    at.run()
    assert widget(at, "number_input", "launch_attention.window_size").value == 8
    assert [s.value for s in at.selectbox if (s.key or "").startswith("launchpreset_")] == ["tiny-test"]
    button(at, "launch_submit").click().run()
    queued = max(api.list_jobs(workspace=fresh_ws), key=lambda j: j.id)
    assert queued.id != job and queued.config == config


@pytest.mark.parametrize("raw", ["999", "x"])
def test_a_link_to_a_missing_job_leaves_the_form_as_it_was(fresh_ws, raw):
    at = open_page()
    at.query_params["from_job"] = raw
    at.switch_page("views/launch.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(f"no job '{raw}'" in w.value for w in at.warning), [w.value for w in at.warning]
    assert "Based on job" not in texts(at)


def test_the_page_refreshes_by_itself_only_while_a_job_is_queued_or_running(fresh_ws, monkeypatch):
    import streamlit

    timers = []
    fragment = streamlit.fragment

    def recording(func=None, *, run_every=None):  # the Jobs page's own fragment, not one an import decorates
        def decorate(f):
            if f.__name__ == "live":
                timers.append(run_every)
            return fragment(f, run_every=run_every)
        return decorate if func is None else decorate(func)

    monkeypatch.setattr(streamlit, "fragment", recording)
    done = finished_job(fresh_ws, "convert", {"data": {"seq_len": 64}}, "done", None)
    at = open_page("views/jobs.py")
    assert timers == [None] and "no job is queued or running" in texts(at)
    queued = api.submit_job("convert", forms.preset_config("tiny-test"), workspace=fresh_ws)
    at.run()
    assert timers == [None, 2.0] and "refreshes every 2 s while a job is queued or running" in texts(at)
    assert set(_table(at)) == {done, queued.id}
    api.cancel_job(queued.id, workspace=fresh_ws)
    at.run()
    assert timers == [None, 2.0, None] and "no job is queued or running" in texts(at)


def test_a_blank_generated_sample_reads_empty(fresh_ws):
    report = {"student_ppl": 10.0, "samples": [{"prompt": "2 + 2?", "teacher": "4", "student": " \n "}]}
    job = finished_job(fresh_ws, "convert", {"data": {"seq_len": 64}}, "blank", report)
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(job).run()
    assert [t.value for t in at.text] == ["4", "(empty)"]


def test_filters_rename_and_delete_with_its_folder(fresh_ws):
    done = finished_job(fresh_ws, "convert", {"data": {"seq_len": 64}}, "first", None)
    queued = api.submit_job("selftest", {"steps": 3}, name="waiting", workspace=fresh_ws).id
    at = open_page("views/jobs.py")
    widget(at, "multiselect", "jobs_kinds").set_value(["selftest"]).run()
    assert list(_table(at)) == [queued]
    widget(at, "multiselect", "jobs_statuses").set_value(["succeeded"]).run()
    assert "No job matches the filters." in texts(at)
    widget(at, "multiselect", "jobs_kinds").set_value([]).run()
    assert list(_table(at)) == [done]

    widget(at, "selectbox", "jobs_selected").set_value(done).run()
    widget(at, "text_input", f"name_{done}").set_value("renamed").run()
    button(at, f"rename_{done}").click().run()
    assert api.get_job(done, workspace=fresh_ws).name == "renamed"
    folder = fresh_ws / "runs" / str(done)
    assert folder.is_dir()
    button(at, f"delete_{done}").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [j.id for j in api.list_jobs(workspace=fresh_ws)] == [queued] and not folder.exists()
    assert f"Deleted job #{done}." in texts(at)


def test_an_active_job_cannot_be_deleted(fresh_ws):
    queued = api.submit_job("selftest", {"steps": 3}, workspace=fresh_ws).id
    with pytest.raises(JobsError, match="cancel it before deleting it"):
        api.delete_job(queued, workspace=fresh_ws)
    at = open_page("views/jobs.py")
    assert [p.proto.popover.disabled for p in at.get("popover")] == [True]
    api.cancel_job(queued, workspace=fresh_ws)
    api.delete_job(queued, keep_files=True, workspace=fresh_ws)
    assert api.list_jobs(workspace=fresh_ws) == [] and api.job_events(queued, workspace=fresh_ws) == []


def test_a_damaged_database_is_shown_not_a_traceback(fresh_ws):
    (fresh_ws / "workbench.db").write_bytes(bytes(range(256)) * 20)
    at = open_page("views/jobs.py")
    assert not at.exception
    assert any("the job database" in e.value and "is damaged" in e.value for e in at.error), [e.value for e in at.error]


def test_a_run_folder_deleted_under_the_app_is_said_not_crashed(fresh_ws):
    """The run folder of a finished conversion removed by hand: the Jobs page still shows the job and
    its stored report, and the pages that open conversions no longer offer it."""
    import shutil

    report = {"teacher_ppl": 5.0, "student_ppl": 5.5, "ppl_ratio": 1.1}
    job = finished_job(fresh_ws, "convert", {"data": {"seq_len": 64}}, "gone", report)
    shutil.rmtree(fresh_ws / "runs" / str(job))
    at = open_page("views/jobs.py")
    widget(at, "selectbox", "jobs_selected").set_value(job).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Ratio"] == "1.100"
    at.switch_page("views/attention.py").run()
    assert not at.exception and "needs a finished conversion" in texts(at)


def _cli_run(ws, config: dict, report: dict | None = None):
    """A finished run folder as ``lolcats convert -o runs/demo`` leaves it (no job row)."""
    import json

    run = ws / "runs" / "demo"
    (run / "stage1").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config))
    (run / "report.json").write_text(json.dumps(report or {"ppl_ratio": 1.25}))
    return run


def test_a_run_folder_no_job_made_can_be_exported_relaunched_evaluated_and_deleted(fresh_ws):
    config = forms.preset_config("tiny-test")
    run = _cli_run(fresh_ws, config)
    at = open_page("views/jobs.py")
    assert not at.exception
    assert "No jobs yet: the conversions below were made outside the workbench." in [i.value for i in at.info]
    table = at.dataframe[0].value
    assert table.to_dict("records")[0] | {"modified": None} == {
        "folder": "runs/demo", "origin": "run folder (lolcats convert, or copied in)", "model": "tiny-random-llama",
        "attention": "terraced/hedgehog", "ppl ratio": 1.25, "modified": None}

    button(at, "folder_export_runs-demo").click().run()
    assert not at.exception and not at.error
    (export,) = api.list_jobs(workspace=fresh_ws)
    assert (export.kind, export.config["run"], export.config["output"]) == ("export", "runs/demo", "exports/demo")

    at = open_page("views/jobs.py")
    button(at, "folder_evaluate_runs-demo").click().run()
    assert not at.exception
    at.switch_page("views/evaluation.py").run()
    assert not at.exception and widget(at, "selectbox", "eval_conversion").value == "runs/demo"

    at = open_page("views/jobs.py")
    button(at, "folder_relaunch_runs-demo").click().run()
    assert not at.exception and "Based on runs/demo (run)" in texts(at).replace("**", "")
    at.switch_page("views/launch.py").run()
    button(at, "launch_submit").click().run()
    queued = max(api.list_jobs(workspace=fresh_ws), key=lambda j: j.id)
    assert queued.kind == "convert" and queued.config == config

    at = open_page("views/jobs.py")
    button(at, "folder_delete_runs-demo").click().run()
    assert not at.exception and not run.exists() and "Deleted runs/demo." in texts(at)


def test_an_export_no_job_made_is_listed_with_its_origin_and_cannot_be_exported_again(fresh_ws):
    import json

    export = fresh_ws / "exports" / "demo"
    export.mkdir(parents=True)
    (export / "lolcats.json").write_text(json.dumps({"config": forms.preset_config("tiny-test")}))
    finished_job(fresh_ws, "convert", {"data": {"seq_len": 64}}, "done", None)
    at = open_page("views/jobs.py")
    assert not at.exception
    rows = at.dataframe[1].value.to_dict("records")
    assert [(r["folder"], r["origin"]) for r in rows] == [("exports/demo", "export (lolcats export, or copied in)")]
    assert button(at, "folder_export_exports-demo").disabled
    assert not button(at, "folder_relaunch_exports-demo").disabled
