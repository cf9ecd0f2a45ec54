"""``lolcats convert`` and ``lolcats eval`` on the tiny-test preset, through the command line."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from core.cli import register

runner = CliRunner()


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def converted(cli, workspace, tmp_path_factory):
    """A tiny-test run written to an absolute folder outside the workspace."""
    out = tmp_path_factory.mktemp("elsewhere") / "tiny"
    result = runner.invoke(cli, ["convert", "--preset", "tiny-test", "-o", str(out), "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_convert_writes_to_an_absolute_folder_outside_the_workspace(converted, workspace):
    out, output = converted
    assert (out / "report.json").is_file() and "report:" in output
    assert not (workspace / "runs" / "tiny").exists()


def test_convert_refuses_a_relative_folder_that_leaves_the_workspace(cli, workspace):
    result = runner.invoke(cli, ["convert", "--preset", "tiny-test", "-o", "../../outside",
                                 "--workspace", str(workspace)])
    assert result.exit_code == 1
    assert "escapes the workspace" in result.output and "Traceback" not in result.output


def test_eval_prints_a_summary_and_writes_the_report(cli, converted, workspace, tmp_path):
    out, _ = converted
    result = runner.invoke(cli, ["eval", str(out), "--blocks", "2", "--seq-len", "64", "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    for row in ("held-out perplexity", "ppl ratio", "passkey accuracy"):
        assert row in result.output
    assert "per_layer_mse" not in result.output  # the per-layer values go to the file only
    report = json.loads((out / "eval.json").read_text())
    assert {"teacher_ppl", "student_ppl", "ppl_ratio", "per_layer_mse", "passkey"} <= set(report)
    assert len(report["per_layer_mse"]) == 2 and report["passkey"]["student"]  # the run's passkey settings
    assert report["ppl_ratio"] == pytest.approx(report["student_ppl"] / report["teacher_ppl"])

    chosen = tmp_path / "eval-no-passkey.json"
    result = runner.invoke(cli, ["eval", str(out), "--blocks", "2", "--seq-len", "64", "--passkey-trials", "0",
                                 "-o", str(chosen), "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    assert json.loads(chosen.read_text())["passkey"] is None
    assert json.loads(chosen.read_text())["student_ppl"] == pytest.approx(report["student_ppl"])


def test_eval_has_no_preset_option(cli, converted):
    out, _ = converted
    result = runner.invoke(cli, ["eval", str(out), "--preset", "tiny-test"])
    assert result.exit_code == 2 and "No such option" in result.output
