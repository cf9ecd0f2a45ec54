"""The workbench's pure helpers: launch form <-> config, benchmark reports, chat prompts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import bench_results, common, forms
from core.config import build_config
from tests.long_context_report import long_context_section


# ---------------------------------------------------------------------------------------------- forms


@pytest.mark.parametrize("preset", forms.preset_names())
def test_form_round_trip_keeps_every_preset_value(preset):
    config = forms.preset_config(preset)
    values = {"preset": preset, **forms.form_values(config)}
    built, problems = forms.build(preset, values)
    assert problems == []
    assert built == config
    validated, problems = forms.validate(built)
    assert problems == [] and validated.model_dump() == config


def _values(preset="tiny-test", **changes):
    values = {"preset": preset, **forms.form_values(forms.preset_config(preset))}
    values.update(changes)
    return values


def _problems(**changes):
    config, problems = forms.build("tiny-test", _values(**changes))
    return problems + forms.validate(config)[1]


def test_form_edits_reach_the_config():
    config, problems = forms.build("tiny-test", _values(**{
        "attention.kind": "sliding_window", "attention.window_size": 8, "attention.softmax_layers": "1",
        "stage1.lr": "3e-3", "stage2.enabled": False, "model_choice": "hub", "model_path": "org/model",
        "attention.sink_tokens": 4}))
    assert problems == []
    assert config["attention"]["kind"] == "sliding_window" and config["attention"]["window_size"] == 8
    assert config["attention"]["sink_tokens"] == 4
    assert config["attention"]["softmax_layers"] == [1]
    assert config["stage1"]["lr"] == pytest.approx(3e-3)
    assert config["stage2"]["enabled"] is False
    assert config["model"]["source"] == "org/model"
    assert config["eval"] == forms.preset_config("tiny-test")["eval"]  # fields outside the form keep the preset's


@pytest.mark.parametrize("changes, field, words", [
    ({"attention.window_size": 0}, "attention.window_size", "window_size must be an integer >= 1, got 0"),
    ({"attention.feature_dim": -2}, "attention.feature_dim", "feature_dim"),
    ({"attention.softmax_layers": "0, 0"}, "attention.softmax_layers", "more than once"),
    ({"attention.softmax_layers": "zero"}, "attention.softmax_layers", "layer numbers"),
    ({"attention.softmax_layers": "x"}, "attention.softmax_layers", "must be auto alone, or layer numbers"),
    ({"attention.softmax_layers": "auto, 3"}, "attention.softmax_layers", "must be auto alone, or layer numbers"),
    ({"attention.softmax_layers": "auto", "attention.softmax_budget": 2}, "attention.softmax_budget", "would keep every layer"),
    ({"stage1.lr": "0"}, "stage1.lr", "stage1.lr must be a finite number > 0, got 0.0"),
    ({"stage2.lr": "fast"}, "stage2.lr", "must be a number"),
    ({"stage1.steps": 0}, "stage1.steps", "greater than or equal to 1"),
    ({"stage2.rank": 0}, "stage2.rank", "greater than or equal to 1"),
    ({"data.seq_len": 8}, "config", "data.seq_len (8) is smaller than attention.window_size (16)"),
    ({"attention.kind": "linear", "attention.sink_tokens": 2}, "attention", "sink_tokens need a softmax part"),
    ({"model_choice": "hub", "model_path": " "}, "model.source", "hub id"),
    ({"data_choice": "local", "data_path": ""}, "data.source", "file path"),
    ({"data_choice": "local", "data_path": "/no/such/rows.jsonl"}, "data.source", "'/no/such/rows.jsonl' does not exist"),
    ({"data_choice": "local", "data_path": "README.md", "data.format": "instruction"}, "data.source",
     "instruction data needs field(s) 'instruction', 'output'; fields present: text"),
])
def test_form_problems_name_the_field(changes, field, words):
    problems = _problems(**changes)
    assert any(f == field and words in m for f, m in problems), problems


def test_auto_softmax_layers_round_trip():
    config, problems = forms.build("tiny-test", _values(**{"attention.softmax_layers": " Auto ",
                                                           "attention.softmax_budget": 1,
                                                           "attention.softmax_score": "mse"}))
    assert problems == []
    attention = config["attention"]
    assert (attention["softmax_layers"], attention["softmax_budget"], attention["softmax_score"]) == ("auto", 1, "mse")
    assert build_config(config).model_dump() == config
    values = forms.form_values(config)
    assert (values["attention.softmax_layers"], values["attention.softmax_budget"],
            values["attention.softmax_score"]) == ("auto", 1, "mse")
    assert forms.build("tiny-test", {"preset": "tiny-test", **values}) == (config, [])
    assert forms.validate(config) == (build_config(config), [])


def test_layer_list_after_auto_drops_the_budget():
    auto, _ = forms.build("tiny-test", _values(**{"attention.softmax_layers": "auto", "attention.softmax_budget": 1}))
    listed, problems = forms.build("tiny-test", {"preset": "tiny-test", **forms.form_values(auto),
                                                 "attention.softmax_layers": "1"})
    assert problems == []
    assert (listed["attention"]["softmax_layers"], listed["attention"]["softmax_budget"]) == ([1], None)
    assert build_config(listed).attention.softmax_layers == [1]


def test_form_shows_the_default_budget_of_a_config_without_one():
    values = forms.form_values(forms.preset_config("tiny-test"))
    assert (values["attention.softmax_layers"], values["attention.softmax_budget"],
            values["attention.softmax_score"]) == ("", 2, "kl")


def test_launch_form_validates_and_queues_without_importing_torch(tmp_path):
    code = """
import sys
from app import forms
from jobs import api
values = {"preset": "tiny-test", **forms.form_values(forms.preset_config("tiny-test"))}
config, problems = forms.build("tiny-test", {**values, "attention.window_size": 0})
assert forms.validate(config)[0] is None and not problems
config, problems = forms.build("tiny-test", values)
validated, problems = forms.validate(config)
assert validated is not None and not problems, problems
api.submit_job("convert", validated.model_dump(), workspace=sys.argv[1])
assert "torch" not in sys.modules and "transformers" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=Path(__file__).parents[2])


# ---------------------------------------------------------------------------------------------- benchmark reports


def test_normalise_reads_the_core_bench_schema_and_aliases():
    report = {"points": [
        {"model": "teacher", "batch_size": 2, "prompt_length": 128, "gen_length": 8, "status": "ok",
         "tokens_per_second": 10.0, "decode_tokens_per_second": 5.0, "prefill_tokens_per_second": 100.0,
         "peak_memory_bytes": 1024},
        {"variant": "Student", "batch": "4", "context_length": 256, "status": "OOM", "error": "out of memory"},
        {"model": "student", "batch_size": 1, "seq_len": 64, "tokens_per_second": float("nan"),
         "decode_tokens_per_second": "12.5"},
        {"model": "teacher"},  # no batch / context: dropped
        "garbage",
    ]}
    pts = bench_results.normalise(report)
    assert [(p["model"], p["batch_size"], p["context_length"], p["status"]) for p in pts] == [
        ("teacher", 2, 128, "ok"), ("student", 4, 256, "oom"), ("student", 1, 64, "ok")]
    assert pts[0]["peak_memory_bytes"] == 1024 and pts[0]["gen_length"] == 8
    assert pts[2]["tokens_per_second"] is None and pts[2]["decode_tokens_per_second"] == 12.5


@pytest.mark.parametrize("report", [None, [], {}, {"points": "x"}, {"points": [None, 1]}, {"result": {"points": []}}])
def test_normalise_survives_reports_of_any_shape(report):
    assert bench_results.normalise(report) == []


def test_native_figures_fall_back_on_foreign_reports():
    assert bench_results.native_figures({"points": [{"variant": "teacher", "batch": 1}]}) is None


# ---------------------------------------------------------------------------------------------- resolved softmax layers


def _job(softmax_layers, result=None, run_dir=None):
    """What :func:`app.common.softmax_layers` reads of a job: its config, result and run folder."""
    return SimpleNamespace(config={"attention": {"softmax_layers": softmax_layers}}, result=result, run_dir=run_dir)


@pytest.mark.parametrize("config_layers, result, expected", [
    ("auto", {"softmax_layers": [3, 27]}, [3, 27]),  # the choice of an auto run
    ([0, 5], {"softmax_layers": [0, 5, 9]}, [0, 5, 9]),  # the report also counts layers kept for other reasons
    ([0, 5], {"student_ppl": 2.0}, [0, 5]),  # a report older than the key
    ([0, 5], None, [0, 5]),
    ("auto", None, []),  # auto before the choice: never list("auto")
    ("auto", {"softmax_layers": "auto"}, []),
])
def test_softmax_layers_prefers_the_report(config_layers, result, expected):
    assert common.softmax_layers(_job(config_layers, result)) == expected


def test_softmax_layers_reads_report_json_and_an_explicit_result(tmp_path):
    (tmp_path / "report.json").write_text('{"softmax_layers": [1]}')
    assert common.softmax_layers(_job("auto", run_dir=tmp_path)) == [1]
    assert common.softmax_layers(_job([4], run_dir=tmp_path), {}) == [4]  # the result given wins over the file


# ---------------------------------------------------------------------------------------------- long context


@pytest.mark.parametrize("result, expected", [
    ({"ppl_ratio": 1.0012, "long_context": long_context_section()},
     "ppl ratio 1.001 at 512 · 1.180 at 4096 (window 64+4: 1.450)"),
    ({"ppl_ratio": 1.0012, "long_context": long_context_section(worse_than_window=True)},
     "ppl ratio 1.001 at 512 · 1.180 at 4096 (window 64+4: 1.100)"),
    ({"ppl_ratio": 1.0}, "ppl ratio 1.000 at 512"),  # a report older than the section
    ({"ppl_ratio": 1.25, "long_context": None}, "ppl ratio 1.250 at 512"),  # nothing was converted
], ids=["beats-window", "worse-than-window", "no-section", "null-section"])
def test_ratio_headline_adds_the_longest_length_and_the_window_baseline(result, expected):
    assert common.ratio_headline(result, 512) == expected


def test_window_worse_reads_the_window_baselines_verdict_only():
    assert common.window_worse(common.long_context({"long_context": long_context_section()})) is None
    worse = common.long_context({"long_context": long_context_section(worse_than_window=True)})
    assert common.window_worse(worse) == ("the student is worse than the untrained terraced window 64 + 4 sinks at "
                                          "4096 tokens")


# ---------------------------------------------------------------------------------------------- chat prompts


@pytest.fixture(scope="module")
def tokenizer(seeded):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(seeded.workspace / "models" / "tiny-random-llama")


def test_short_prompt_is_sent_whole(tokenizer):
    from app.generation import prepare_prompt
    from core.eval.metrics import chat_prompt

    p = prepare_prompt(tokenizer, "Hello!", 256, 32)
    assert p.notice is None
    assert p.input_ids[0].tolist() == tokenizer(chat_prompt(tokenizer, "Hello!"), add_special_tokens=False)["input_ids"]


def test_long_prompt_is_truncated_with_a_notice(tokenizer):
    from app.generation import prepare_prompt

    message = " ".join(f"w{i}" for i in range(400)) + " What is the answer?"
    p = prepare_prompt(tokenizer, message, 200, 40)
    assert p.prompt_tokens <= 160 and p.input_ids.shape == (1, p.prompt_tokens)
    assert "context is 200 tokens" in p.notice and "40 are kept for the answer" in p.notice
    assert tokenizer.decode(p.input_ids[0]).count("What is the answer?") == 1  # the end of the message is kept
    with pytest.raises(ValueError, match="lower max new tokens"):
        prepare_prompt(tokenizer, message, 64, 60)
