"""The workbench's pure helpers: launch form <-> config, benchmark reports, charts, chat prompts."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from app import bench_results, charts, common, forms
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


def test_throughput_figure_one_line_per_model():
    pts = bench_results.normalise({"points": [
        {"model": m, "batch_size": b, "prompt_length": 64, "gen_length": 4, "tokens_per_second": t * b,
         "peak_memory_bytes": 2**30 * b}
        for m, t in (("teacher", 10.0), ("student", 20.0)) for b in (1, 2, 4)]
        + [{"model": "teacher", "batch_size": 8, "prompt_length": 64, "gen_length": 4, "status": "oom"}]})
    fig = charts.throughput_figure(pts, "batch_size", "tokens_per_second")
    lines = {t.name: (list(t.x), list(t.y)) for t in fig.data}
    assert lines == {"teacher (context=64, gen=4)": ([1, 2, 4], [10.0, 20.0, 40.0]),
                     "student (context=64, gen=4)": ([1, 2, 4], [20.0, 40.0, 80.0])}
    mem = charts.throughput_figure(pts, "batch_size", "peak_memory_bytes")
    assert list(mem.data[0].y) == [1.0, 2.0, 4.0]  # GiB
    assert mem.layout.yaxis.title.text.endswith("(GiB)")


# ---------------------------------------------------------------------------------------------- heatmaps


def test_causal_mask_blanks_future_keys():
    m = charts.causal(np.ones((4, 4)))
    assert np.isnan(m[np.triu_indices(4, k=1)]).all()
    assert (m[np.tril_indices(4)] == 1).all()


def test_heatmaps_share_one_colour_scale():
    rng = np.random.default_rng(0)
    t = np.tril(rng.random((5, 5)))
    t /= t.sum(-1, keepdims=True)
    s = np.tril(rng.random((5, 5)))
    s /= s.sum(-1, keepdims=True)
    fig = charts.attention_heatmaps(t, s, ["<s>", " a", " a", "\n", "b"])
    assert [tr.coloraxis for tr in fig.data] == ["coloraxis"] * 3
    assert fig.layout.coloraxis.cmin == 0 and fig.layout.coloraxis.cmax == pytest.approx(max(t.max(), s.max()))
    assert list(fig.data[0].x) == ["0 <s>", "1 ␣a", "2 ␣a", "3 \\n", "4 b"]  # unique labels
    diff = np.array(fig.data[2].z, dtype=float)
    assert np.allclose(diff[np.tril_indices(5)], np.abs(s - t)[np.tril_indices(5)])
    log = charts.attention_heatmaps(t, s, list("abcde"), log=True)
    assert log.layout.coloraxis.cmin == pytest.approx(math.log10(charts.LOG_FLOOR))
    assert np.array(log.data[0].z, dtype=float)[0, 0] == pytest.approx(0.0)  # log10(1)


def test_heatmap_axes_show_each_tokens_text(tmp_path):
    from core.models import bundled_tokenizer, token_texts

    tokenizer = bundled_tokenizer(tmp_path)
    ids = tokenizer("é🐈 sat\ton\nthe  mat")["input_ids"]
    m = np.tril(np.ones((len(ids), len(ids))))
    fig = charts.attention_heatmaps(m, m, token_texts(tokenizer, ids))
    assert list(fig.data[0].x) == list(fig.data[0].y) == [
        "0 é", "1 <0xF0><0x9F>", "2 <0x90>", "3 <0x88>", "4 ␣sat", "5 \\t", "6 on", "7 \\n", "8 the", "9 ␣",
        "10 ␣mat"]


def test_layer_curves_and_bars():
    rows = [{"layer": layer, "step": step, "value": 1.0 / (step + layer)} for layer in (0, 1) for step in (2, 4)]
    fig = charts.layer_curves(rows)
    assert [t.name for t in fig.data] == ["layer 0", "layer 1"] and list(fig.data[1].y) == [1 / 3, 1 / 5]
    bars = charts.layer_bars({"#1": [0.5, 0.0, 0.25]}, {"#1": [1]})
    assert list(bars.data[0].y) == [0.5, None, 0.25] and list(bars.data[0].text) == ["", "softmax", ""]
    nulls = charts.layer_bars({"#1": [0.5, None, 0.0, 0.25]}, {"#1": [1, 2]})
    assert list(nulls.data[0].y) == [0.5, None, None, 0.25]


def test_layer_step_heatmap_labels_every_layer_and_leaves_missing_cells_blank():
    rows = [{"layer": layer, "step": step, "value": 10.0 ** -(layer + step)} for layer in range(40) for step in (1, 3)]
    rows[1]["value"] = 0.0  # layer 0, step 3: no log
    fig = charts.layer_step_heatmap(rows[:-1], title="t")  # layer 39 has no step 3
    (heat,) = fig.data
    assert list(heat.y) == list(fig.layout.yaxis.tickvals) == [f"layer {i}" for i in range(40)]
    assert list(heat.x) == [1, 3] and list(heat.z[0]) == [-1.0, None] and list(heat.z[39]) == [-40.0, None]
    assert list(heat.z[5]) == pytest.approx([-6.0, -8.0]) and heat.customdata[5][0] == pytest.approx(1e-6)


def test_final_layer_mse_draws_points_on_a_log_axis_and_bars_on_a_linear_one():
    log = charts.final_layer_mse({"#1": [0.5, None, 0.25]}, {"#1": [1]})
    assert log.data[0].type == "scatter" and log.layout.yaxis.type == "log"
    assert list(log.data[0].y) == [0.5, None, 0.25] and list(log.data[0].text) == ["", "softmax", ""]
    linear = charts.final_layer_mse({"#1": [0.5, None, 0.25]}, {"#1": [1]}, log_y=False)
    assert linear.data[0].type == "bar" and linear.layout.yaxis.type != "log"


def test_chosen_layer_curves_pair_training_and_validation_in_one_colour_per_layer():
    train = [{"layer": layer, "step": step, "value": 1.0 / step} for layer in (2, 5) for step in (1, 2, 3)]
    val = [{"layer": 5, "step": 2, "value": 0.75}]
    fig = charts.chosen_layer_curves(train, val, [2, 5])
    assert [t.name for t in fig.data] == ["layer 2 (training)", "layer 5 (training)", "layer 5 (validation)"]
    assert fig.data[1].line.color == fig.data[2].line.color != fig.data[0].line.color
    assert list(fig.data[2].y) == [0.75] and fig.layout.yaxis.type == "log"


def test_layer_score_bars_mark_the_kept_layers_and_skip_null_scores():
    fig = charts.layer_score_bars([0.125, None, 0.5, 0.03125], [2], "kl")
    (bars,) = fig.data
    assert list(bars.x) == [0, 2, 3] and list(bars.y) == [0.125, 0.5, 0.03125]
    assert list(bars.text) == ["", "kept softmax", ""]
    converted, kept = charts.SCORE_COLORS["converted"], charts.SCORE_COLORS["kept"]
    assert converted != kept and list(bars.marker.color) == [converted, kept, converted]
    assert "next-token KL" in fig.layout.title.text and fig.layout.yaxis.type == "log"
    linear = charts.layer_score_bars([0.25, 0.5], [], "mse", log_y=False)
    assert linear.layout.yaxis.type != "log" and "normalised attention-output MSE" in linear.layout.yaxis.title.text
    assert list(linear.data[0].text) == ["", ""]


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


def test_token_labels_of_position_buckets():
    assert [charts.tokens_label(n) for n in (0, 64, 256, 1024, 2048, 4095, 1536)] == ["0", "64", "256", "1k", "2k",
                                                                                       "4k", "1.5k"]


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
