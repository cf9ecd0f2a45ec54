"""What serving refuses before any engine starts: folders that are not LoLCATs exports, attention
options this version does not know, a missing serving environment (one line each, via the CLI)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from app.cli import app
from core.config import SUPPORTED_ARCHITECTURES, AttentionSpec
from serving.spec import SERVED_MODEL_TYPES, ExportError, check_export_config, serving_plan

runner = CliRunner()
EXPORT = {"architectures": ["LolcatsForCausalLM"], "model_type": "llama", "lolcats": {"kind": "terraced"}}


def refusal(config: dict) -> str:
    with pytest.raises(ExportError) as err:
        check_export_config(config, "FOLDER")
    return str(err.value)


def test_a_plain_model_folder_is_refused_naming_the_export_command():
    message = refusal({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    assert "FOLDER is not a LoLCATs export" in message and "lolcats export RUN OUT" in message


def test_an_attention_option_this_version_does_not_know_is_refused_by_name():
    message = refusal({**EXPORT, "lolcats": {"kind": "terraced", "key_cache_bits": 4}})
    assert "key_cache_bits" in message and "\n" not in message
    assert "window_size" in refusal({**EXPORT, "lolcats": {"kind": "terraced", "window_size": 0}})
    assert "unknown attention kind" in refusal({**EXPORT, "lolcats": {"kind": "sliding"}})


def test_an_architecture_the_plugin_does_not_build_is_refused():
    assert "not 'phi3'" in refusal({**EXPORT, "model_type": "phi3"})


def test_every_architecture_the_workbench_converts_is_served():
    assert set(SERVED_MODEL_TYPES) == set(SUPPORTED_ARCHITECTURES)
    for model_type in SERVED_MODEL_TYPES:
        check_export_config({**EXPORT, "model_type": model_type}, "FOLDER")


def test_the_plan_keeps_gemma3_local_layers_softmax_with_keep_sliding_layers():
    config = type("Config", (), {"num_hidden_layers": 3, "lolcats": {"keep_sliding_layers": True},
                                 "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})
    assert [serving_plan(config).is_converted(i) for i in range(3)] == [False, True, False]


def test_the_plan_keeps_the_listed_layers_softmax_and_passes_every_layer_option():
    from core.attention.layer import LolcatsAttention

    config = type("Config", (), {"num_hidden_layers": 4, "lolcats": {"kind": "sliding_window", "softmax_layers": [3, 0],
                                                                     "sink_tokens": 2, "feature_map": "t2r"}})
    plan = serving_plan(config)
    assert [plan.is_converted(i) for i in range(4)] == [False, True, True, False] and plan.hybrid
    options = plan.layer_options(LolcatsAttention)
    assert options["kind"] == "sliding_window" and options["sink_tokens"] == 2 and options["feature_map"] == "t2r"
    layer_fields = set(AttentionSpec.model_fields) - {"softmax_layers", "softmax_budget", "softmax_score",
                                                      "keep_sliding_layers"}
    assert set(options) == layer_fields  # every per-layer option reaches the layer
    config.lolcats = {"softmax_layers": [4]}
    with pytest.raises(ExportError, match=r"softmax_layers \[4\] out of range"):
        serving_plan(config)


def test_serve_says_in_one_line_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("LOLCATS_SERVING_PYTHON", str(tmp_path / "no-such-python"))
    result = runner.invoke(app, ["serve", str(tmp_path)])
    assert result.exit_code == 1 and "has no config.json" in result.output
    (tmp_path / "config.json").write_text(json.dumps(EXPORT))
    result = runner.invoke(app, ["serve", str(tmp_path), "--port", "8123"])
    assert result.exit_code == 1
    assert "the serving environment is missing" in result.output and "scripts/setup-serving.sh" in result.output
    assert "Traceback" not in result.output
