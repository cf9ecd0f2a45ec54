"""A conversion that cannot run on its model or its data is refused at submit, from the model's
config.json and the data's first rows alone."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from jobs import api
from jobs.cli import register
from jobs.errors import ConfigError


@pytest.fixture
def submit(ws):
    app = typer.Typer()
    register(app)

    def invoke(*sets: str):
        args = ["jobs", "submit", "--preset", "tiny-test", "--workspace", str(ws)]
        for item in sets:
            args += ["--set", item]
        return CliRunner().invoke(app, args)

    return invoke


def _gpt2_folder(tmp_path):
    folder = tmp_path / "gpt2-like"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_positions": 1024}))
    return folder


@pytest.mark.parametrize("sets, words", [
    (["attention.softmax_layers=[1, 5]"],
     "attention.softmax_layers: [5] out of range: model 'tiny-random-llama' has 2 layers; use layer indices 0..1"),
    (["data.seq_len=4096"], "data.seq_len: 4096 is above the model's maximum positions (2048"),
    (["model.source=/no/such/model-folder"], "model.source: model path '/no/such/model-folder' does not exist"),
    (["data.source=/no/such/rows.jsonl"], "data.source: dataset file '/no/such/rows.jsonl' does not exist"),
    (["data.eval_text=held-out/missing.txt"], "data.eval_text: dataset file "),
])
def test_submit_refuses_a_config_that_cannot_run(submit, ws, sets, words):
    result = submit(*sets)
    assert result.exit_code == 1, result.output
    assert words in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) == 1
    assert api.list_jobs(workspace=ws) == []


def test_submit_reads_a_relative_data_path_from_the_workspace(submit, ws):
    (ws / "data").mkdir()
    (ws / "data" / "rows.jsonl").write_text(json.dumps({"prompt": "2 + 2?", "answer": "4"}) + "\n", encoding="utf-8")
    result = submit("data.source=data/rows.jsonl")
    assert result.exit_code == 1 and "data.source:" in result.output and "'instruction', 'output'" in result.output
    result = submit("data.source=data/rows.jsonl", "data.instruction_field=prompt", "data.output_field=answer")
    assert result.exit_code == 0, result.output
    assert api.list_jobs(workspace=ws)[0].config["data"]["source"] == "data/rows.jsonl"


def test_submit_refuses_an_unsupported_architecture(submit, ws, tmp_path):
    result = submit(f"model.source={_gpt2_folder(tmp_path)}")
    assert result.exit_code == 1
    assert "model.source:" in result.output and "gpt2" in result.output
    assert api.list_jobs(workspace=ws) == []


def test_the_api_names_the_field_and_a_fitting_config_is_queued(ws):
    config = {"model": {"source": "tiny-random-llama"}, "attention": {"feature_dim": 8, "window_size": 16,
                                                                      "softmax_layers": [2]},
              "data": {"seq_len": 64}}
    with pytest.raises(ConfigError) as err:
        api.submit_job("convert", config, workspace=ws)
    assert [field for field, _ in err.value.problems] == ["attention.softmax_layers"]
    config["attention"]["softmax_layers"] = [1]
    assert api.submit_job("convert", config, workspace=ws).config["attention"]["softmax_layers"] == [1]
