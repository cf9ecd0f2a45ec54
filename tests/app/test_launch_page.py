"""Launch page: presets fill the form, invalid values are shown next to it, a valid config queues a job."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app import forms
from core.config import PRESET_DESCRIPTIONS
from jobs import api, store
from jobs.db import open_db
from tests.app.apptest import button, open_page, texts, widget


def _preset_box(at):
    return next(box for box in at.selectbox if box.label == "Preset")


def _select_preset(at, name):
    _preset_box(at).set_value(name).run()
    assert not at.exception


def test_preset_fills_the_form_and_the_config_is_valid(fresh_ws):
    at = open_page()
    assert "Launch a conversion" in texts(at)
    _select_preset(at, "tiny-test")
    assert widget(at, "radio", "launch_model_choice").value == "tiny"
    assert widget(at, "number_input", "launch_attention.feature_dim").value == 8
    assert widget(at, "number_input", "launch_attention.window_size").value == 16
    assert widget(at, "number_input", "launch_attention.sink_tokens").value == 0
    assert widget(at, "number_input", "launch_stage1.steps").value == 4
    assert "The config is valid." in texts(at)
    assert not button(at, "launch_submit").disabled
    _select_preset(at, "paper-8b")
    assert widget(at, "radio", "launch_model_choice").value == "hub"
    assert widget(at, "text_input", "launch_model_path").value == "meta-llama/Meta-Llama-3-8B"
    assert widget(at, "selectbox", "launch_model.dtype").value == "bfloat16"


@pytest.mark.parametrize("kind, key, value, message", [
    ("number_input", "launch_attention.window_size", 0, "window_size must be an integer >= 1, got 0"),
    ("text_input", "launch_stage1.lr", "0", "stage1.lr must be a finite number > 0"),
    ("text_input", "launch_attention.softmax_layers", "1, 1", "more than once"),
    ("text_input", "launch_attention.softmax_layers", "auto, 3", "must be auto alone, or layer numbers"),
    ("number_input", "launch_data.seq_len", 8, "data.seq_len (8) is smaller than attention.window_size (16)"),
])
def test_invalid_values_are_shown_inline_and_block_the_launch(fresh_ws, kind, key, value, message):
    at = open_page()
    _select_preset(at, "tiny-test")
    widget(at, kind, key).set_value(value).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(message in e for e in errors), errors
    assert any("problem(s): fix them to launch" in e for e in errors)
    assert button(at, "launch_submit").disabled
    assert api.list_jobs(workspace=fresh_ws) == []


def test_hub_model_needs_an_id(fresh_ws):
    at = open_page()
    widget(at, "radio", "launch_model_choice").set_value("hub").run()
    assert any("model.source" in e.value and "hub id" in e.value for e in at.error)
    widget(at, "text_input", "launch_model_path").set_value("HuggingFaceTB/SmolLM2-360M-Instruct").run()
    assert not at.error and not button(at, "launch_submit").disabled


def test_launch_queues_a_convert_job_with_the_form_config(fresh_ws):
    at = open_page()
    _select_preset(at, "tiny-test")
    widget(at, "selectbox", "launch_attention.kind").set_value("sliding_window").run()
    widget(at, "text_input", "launch_submit_name").set_value("my-run").run()
    button(at, "launch_submit").click().run()
    assert not at.exception and not at.error
    jobs = api.list_jobs(workspace=fresh_ws)
    assert len(jobs) == 1
    job = jobs[0]
    assert (job.kind, job.name, job.status) == ("convert", "my-run", "queued")
    expected = forms.preset_config("tiny-test")
    expected["attention"]["kind"] = "sliding_window"
    assert job.config == expected
    assert f"Queued conversion job #{job.id}." in texts(at) and "Jobs" in [t.value for t in at.title]  # on the Jobs page


def test_launch_error_from_the_job_system_is_shown(fresh_ws):
    at = open_page()
    _select_preset(at, "tiny-test")
    widget(at, "text_input", "launch_submit_name").set_value("../outside").run()
    button(at, "launch_submit").click().run()
    assert any("escapes the workspace" in e.value for e in at.error), [e.value for e in at.error]
    assert api.list_jobs(workspace=fresh_ws) == []


def test_form_survives_a_page_switch(fresh_ws):
    at = open_page()
    _select_preset(at, "tiny-test")
    widget(at, "number_input", "launch_stage1.steps").set_value(7).run()
    at.switch_page("views/jobs.py").run()
    at.switch_page("views/launch.py").run()
    assert _preset_box(at).value == "tiny-test"
    assert widget(at, "number_input", "launch_stage1.steps").value == 7


def test_check_panel_refuses_softmax_layers_the_model_does_not_have(fresh_ws):
    at = open_page()
    _select_preset(at, "tiny-test")
    widget(at, "text_input", "launch_attention.softmax_layers").set_value("0, 7").run()
    shown = texts(at)
    assert "attention.softmax_layers" in shown and "[7] out of range" in shown and "has 2 layers" in shown
    assert button(at, "launch_submit").disabled
    widget(at, "text_input", "launch_attention.softmax_layers").set_value("1").run()
    assert "The config is valid." in texts(at)


def _widget_keys(at, kind):
    return {w.key for w in getattr(at, kind)}


def test_auto_softmax_layers_with_a_budget_and_a_score(fresh_ws):
    at = open_page()
    _select_preset(at, "tiny-test")
    assert "launch_attention.softmax_budget" not in _widget_keys(at, "number_input")
    widget(at, "text_input", "launch_attention.softmax_layers").set_value("AUTO").run()
    assert not at.exception
    assert widget(at, "number_input", "launch_attention.softmax_budget").value == forms.DEFAULT_BUDGET
    score = widget(at, "selectbox", "launch_attention.softmax_score")
    assert score.value == "kl" and list(score.options) == ["kl", "mse"]
    assert "attention-output MSE normalised by the teacher output's variance" in score.help
    shown = texts(at)  # the default budget of 2 would keep both layers of the tiny model softmax
    assert "attention.softmax_budget" in shown and "use at most 1" in shown
    assert button(at, "launch_submit").disabled
    widget(at, "number_input", "launch_attention.softmax_budget").set_value(1).run()
    widget(at, "selectbox", "launch_attention.softmax_score").set_value("mse").run()
    assert "softmax layers: auto (budget 1, by mse)" in texts(at)
    button(at, "launch_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (job,) = api.list_jobs(workspace=fresh_ws)
    attention = job.config["attention"]
    assert (attention["softmax_layers"], attention["softmax_budget"], attention["softmax_score"]) == ("auto", 1, "mse")
    at.switch_page("views/launch.py").run()  # the launch went to the Jobs page; the form is kept
    widget(at, "text_input", "launch_attention.softmax_layers").set_value("1").run()
    assert "launch_attention.softmax_budget" not in _widget_keys(at, "number_input")
    assert "The config is valid." in texts(at)
    widget(at, "text_input", "launch_attention.softmax_layers").set_value("auto").run()  # hidden, the values were kept
    assert widget(at, "number_input", "launch_attention.softmax_budget").value == 1
    assert widget(at, "selectbox", "launch_attention.softmax_score").value == "mse"


PASTED = "preset: tiny-test\nattention:\n  window_size: 8\n  history_norm: power\neval:\n  samples: 0\n"


def _load_yaml(at, text):
    widget(at, "text_area", "launchyaml_text").set_value(text).run()
    button(at, "launchyaml_load").click().run()
    assert not at.exception, [e.value for e in at.exception]


def test_a_pasted_yaml_config_fills_the_form_and_keeps_the_fields_outside_it(fresh_ws):
    at = open_page()
    _load_yaml(at, PASTED)
    assert widget(at, "radio", "launch_model_choice").value == "tiny"
    assert widget(at, "number_input", "launch_attention.window_size").value == 8
    assert "Based on pasted config" in texts(at).replace("**", "") and "The config is valid." in texts(at)
    assert not any(c.value in PRESET_DESCRIPTIONS.values() for c in at.caption)  # the preset is not what is shown
    widget(at, "number_input", "launch_stage1.steps").set_value(6).run()
    assert [b.key for b in at.get("download_button")] == ["launchyaml_download"]
    button(at, "launch_submit").click().run()
    job = api.list_jobs(workspace=fresh_ws)[0]
    expected = forms.from_yaml(PASTED, "the pasted config")[0]
    expected["stage1"]["steps"] = 6
    assert job.config == expected
    assert job.config["attention"]["history_norm"] == "power" and job.config["eval"]["samples"] == 0  # not in the form


@pytest.mark.parametrize("text, message", [
    ("attention: {window_size: [1,\n", "the pasted config is not valid YAML"),
    ("preset: nope\n", "unknown preset 'nope'"),
    ("preset: tiny-test\nattention: {kind: quadratic}\n", "unknown attention kind 'quadratic'"),
    ("preset: tiny-test\ndata: {source: /no/such/rows.jsonl}\n", "'/no/such/rows.jsonl' does not exist"),
])
def test_a_bad_yaml_config_is_refused_with_one_line_and_the_form_is_kept(fresh_ws, text, message):
    at = open_page()
    _select_preset(at, "tiny-test")
    _load_yaml(at, text)
    assert any(message in e.value and "\n" not in e.value for e in at.error), [e.value for e in at.error]
    assert widget(at, "number_input", "launch_attention.window_size").value == 16  # still the preset's
    assert "Based on" not in texts(at)


def test_back_to_the_preset_drops_the_loaded_config(fresh_ws):
    at = open_page()
    _select_preset(at, "tiny-test")
    _load_yaml(at, PASTED)
    button(at, "launchyaml_base_clear").click().run()
    assert widget(at, "number_input", "launch_attention.window_size").value == 16 and "Based on" not in texts(at)


def test_the_preset_is_described_and_no_estimate_before_a_conversion_ran(fresh_ws):
    at = open_page()
    _select_preset(at, "tiny-test")
    assert PRESET_DESCRIPTIONS["tiny-test"] in [c.value for c in at.caption]
    assert "wall time: no estimate yet (no conversion of tiny-random-llama in float32" in texts(at)


def test_the_wall_time_is_estimated_from_a_finished_conversion_here(fresh_ws, monkeypatch):
    """A finished tiny-test conversion measured 1 s per cost unit (2 teacher blocks 1 s apart, stage-1
    steps of cost 3 at 3 s); the same config costs 2 + 12 + 12 + 2 + 2 units, twice that with blocks
    twice as long."""
    db = open_db(fresh_ws)
    config = forms.preset_config("tiny-test")
    job = api.submit_job("convert", config, workspace=fresh_ws)
    claim = store.claim_next_job(db, "otherhost:1:1")
    now, real = store.utcnow(), store.utcnow
    for stage, step, name, ago in (("teacher_eval", 1, "nll", 9), ("teacher_eval", 2, "nll", 8),
                                   ("stage1", 1, "loss", 3), ("stage1", 2, "loss", 0)):
        monkeypatch.setattr(store, "utcnow", lambda at=now - timedelta(seconds=ago): at)
        store.heartbeat(db, job.id, claim.attempt, stage=stage, step=step, total=4, metrics={name: 1.0})
    monkeypatch.setattr(store, "utcnow", real)
    store.mark_succeeded(db, job.id, claim.attempt, {"student_ppl": 10.0})
    at = open_page()
    _select_preset(at, "tiny-test")
    assert f"wall time: about 30s for the training and perplexity phases (model loading aside) at the pace job #{job.id}" \
        in texts(at).replace("**", "")
    widget(at, "number_input", "launch_data.seq_len").set_value(128).run()
    assert "wall time: about 1m 00s" in texts(at).replace("**", "")


def test_the_wall_time_is_estimated_from_a_run_folder_made_outside_the_workbench(fresh_ws):
    """``lolcats convert -o runs/demo`` leaves no step times in the database, only its report's
    timings: 1 s per cost unit for the teacher's 2 blocks and stage 1's 12 units, 2 s for stage 2's
    (the median is 1 s); the same config costs 30 units."""
    import json

    config = forms.preset_config("tiny-test")
    run = fresh_ws / "runs" / "demo"
    (run / "stage1").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config))
    (run / "report.json").write_text(json.dumps({"timings": {"teacher_eval_s": 2.0, "stage1_s": 12.0,
                                                             "stage2_s": 24.0, "total_s": 60.0}}))
    at = open_page()
    _select_preset(at, "tiny-test")
    assert ("wall time: about 30s for the training and perplexity phases (model loading aside) at the pace "
            "runs/demo (run) measured here") in texts(at).replace("**", "")
