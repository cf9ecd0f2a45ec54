"""The core commands through the command line on the tiny-test preset: convert, eval, export, chat, bench, ablate."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from core.cli.evaluate import summary_table
from core.eval.long_context_result import LongContextResult, passkey_accuracy
from tests.long_context_report import FORMER_PASSKEY

runner = CliRunner()


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
    assert {"teacher_ppl", "student_ppl", "ppl_ratio", "per_layer_mse", "long_context"} <= set(report)
    assert "passkey" not in report  # the one passkey measurement is the long-context grid
    grid = report["long_context"]["passkey"]
    assert len(report["per_layer_mse"]) == 2 and grid["trials"] == 1  # the run's passkey settings
    key = passkey_accuracy(report)
    assert re.search(rf"passkey accuracy\W+{key['teacher']:.0%}\W+{key['student']:.0%}", result.output)
    assert report["ppl_ratio"] == pytest.approx(report["student_ppl"] / report["teacher_ppl"])

    chosen = tmp_path / "eval-no-passkey.json"
    result = runner.invoke(cli, ["eval", str(out), "--blocks", "2", "--seq-len", "64", "--passkey-trials", "0",
                                 "-o", str(chosen), "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    assert json.loads(chosen.read_text())["long_context"]["passkey"] is None
    assert re.search(r"passkey accuracy\W+-\W+-", result.output)
    assert json.loads(chosen.read_text())["student_ppl"] == pytest.approx(report["student_ppl"])


def test_eval_lengths_print_the_table_with_both_baselines_and_the_verdicts(cli, converted, workspace, tmp_path):
    out, _ = converted
    path = tmp_path / "long.json"
    result = runner.invoke(cli, ["eval", str(out), "--blocks", "1", "--seq-len", "64", "--lengths", "128,64",
                                 "--sequences", "1", "--passkey-grid-trials", "1",  # the former --passkey-trials
                                 "-o", str(path), "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    section = json.loads(path.read_text())["long_context"]
    assert section["lengths"] == [64, 128] and section["sequences"] == 1
    result_ = LongContextResult.model_validate(section)
    labels = [b.label for b in result_.baselines.values()]
    verdicts = [f"{line[:1].upper()}{line[1:]}." for _, line in result_.verdict_lines()]
    assert any("training-free frontier" in line for line in verdicts)
    text = " ".join(result.output.split())
    for needle in ("by context length", "against the training-free frontier", "by position",
                   "passkey keys found of 1 a cell", *labels, *verdicts):
        assert needle in text, needle
    assert "WORSE" not in text
    ratio = f"{section['by_length'][-1]['student']['ratio']:.3f}"
    assert ratio in result.output

    off = runner.invoke(cli, ["eval", str(out), "--blocks", "1", "--seq-len", "64", "--passkey-trials", "0",
                              "--lengths", "off", "-o", str(path), "--workspace", str(workspace)])
    assert off.exit_code == 0 and json.loads(path.read_text())["long_context"] is None
    bad = runner.invoke(cli, ["eval", str(out), "--lengths", "1k", "--workspace", str(workspace)])
    assert bad.exit_code == 2 and "--lengths takes whole numbers separated by commas" in " ".join(bad.output.split())


def test_eval_flags_are_named_after_the_config_fields(cli):
    result = runner.invoke(cli, ["eval", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--ppl-blocks" in result.output and "--blocks" in result.output
    help_text = " ".join(result.output.replace("│", " ").split())  # one line, the help box's borders out
    assert "default: the run's eval.ppl_blocks" in help_text
    assert "default: the run's eval.long_context.passkey_trials" in help_text
    assert "--passkey-grid-trials" not in help_text  # still read, under --passkey-trials' name only


def test_the_summary_of_a_report_with_the_passkey_section_of_its_own():
    """A report written when the evaluation measured a short passkey grid of its own."""
    report = {"teacher_ppl": 7.0, "student_ppl": 7.5, "ppl_ratio": 7.5 / 7.0, "passkey": FORMER_PASSKEY}
    console = Console(width=120)
    with console.capture() as shown:
        console.print(summary_table(report))
    assert re.search(r"passkey accuracy\W+100%\W+50%", shown.get())


def test_eval_has_no_preset_option(cli, converted):
    out, _ = converted
    result = runner.invoke(cli, ["eval", str(out), "--preset", "tiny-test"])
    assert result.exit_code == 2 and "No such option" in result.output


def test_export_then_chat_on_the_run_and_on_the_export(cli, converted, workspace, tmp_path):
    out, _ = converted
    exported = tmp_path / "export"
    result = runner.invoke(cli, ["export", str(out), str(exported), "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    assert f"exported to {exported}" in result.output.replace("\n", "")
    assert (exported / "config.json").is_file() and list(exported.glob("*.safetensors"))
    for folder in (out, exported):
        result = runner.invoke(cli, ["chat", str(folder), "--max-new-tokens", "3", "--workspace", str(workspace)],
                               input="What is two plus two?\nAnd three?\n\n")
        assert result.exit_code == 0, result.output
        for name in ("teacher", "student"):  # one answer of each per message
            assert len(re.findall(rf"\b{name} \(\d+\.\ds\): ", result.output)) == 2, result.output


def test_chat_ends_at_end_of_input(cli, converted, workspace):
    out, _ = converted
    result = runner.invoke(cli, ["chat", str(out), "--max-new-tokens", "2", "--workspace", str(workspace)], input="hi\n")
    assert result.exit_code == 0, result.output
    assert result.output.count("student (") == 1


def test_chat_answers_text_that_is_not_utf8(cli, converted, workspace, monkeypatch):
    """Under a C locale Python reads stray bytes as lone surrogates, which the tokenizer refuses;
    chat replaces them and answers. Read strictly, such a line is refused and the next one read."""
    out, _ = converted
    lines = iter(["caf\udce9 \udcff hello", ""])
    monkeypatch.setattr("rich.console.Console.input", lambda self, prompt="": next(lines))
    result = runner.invoke(cli, ["chat", str(out), "--max-new-tokens", "2", "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    assert "replaced" in result.output and result.output.count("student (") == 1
    monkeypatch.undo()  # standard input again, decoded strictly by the runner
    result = runner.invoke(cli, ["chat", str(out), "--max-new-tokens", "2", "--workspace", str(workspace)],
                           input=b"caf\xe9 \xff hello\nhi\n\n")
    assert result.exit_code == 0, result.output
    assert "not UTF-8" in result.output


def test_bench_measures_teacher_and_student_at_the_given_points(cli, converted, workspace, tmp_path):
    out, _ = converted
    target = tmp_path / "bench.json"
    result = runner.invoke(cli, ["bench", "--model", "tiny-random-llama", "--checkpoint", str(out),
                                 "--batch-sizes", "1,2", "--prompt-lengths", "16", "--gen-lengths", "3",
                                 "--threads", "1", "-o", str(target), "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    assert f"written: {target}" in result.output.replace("\n", "")
    points = json.loads(target.read_text())["points"]
    measured = sorted((p["model"], p["batch_size"], p["prompt_length"], p["gen_length"]) for p in points)
    assert measured == [(m, b, 16, 3) for m in ("floor", "student", "teacher") for b in (1, 2)]
    assert all(p["status"] == "ok" for p in points), points


def test_bench_refuses_a_generation_length_below_two(cli, workspace, tmp_path):
    result = runner.invoke(cli, ["bench", "--model", "tiny-random-llama", "--gen-lengths", "1",
                                 "-o", str(tmp_path / "b.json"), "--workspace", str(workspace)])
    assert result.exit_code == 1 and "gen_lengths must be >= 2" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_ablate_runs_the_four_variants_and_prints_the_table(cli, workspace, tmp_path):
    out = tmp_path / "ablation"
    result = runner.invoke(cli, ["ablate", "--preset", "tiny-test", "--steps", "2", "--kinds", "linear",
                                 "-o", str(out), "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "ablation.json").read_text())["rows"]
    assert [(r["attention"], r["variant"]) for r in rows] == [("linear", v) for v in ("swap", "transfer", "lora", "both")]
    table = (out / "ablation.md").read_text()
    assert table.splitlines()[0] in result.output
    for row in table.splitlines()[2:6]:
        assert row in result.output


def test_chat_and_bench_run_in_bfloat16(cli, converted, workspace, tmp_path):
    out, _ = converted
    result = runner.invoke(cli, ["chat", str(out), "--dtype", "bfloat16", "--max-new-tokens", "2",
                                 "--workspace", str(workspace)], input="hi\n")
    assert result.exit_code == 0, result.output
    assert result.output.count("teacher (") == result.output.count("student (") == 1
    target = tmp_path / "bench-bf16.json"
    result = runner.invoke(cli, ["bench", "--model", "tiny-random-llama", "--checkpoint", str(out), "--dtype", "bfloat16",
                                 "--batch-sizes", "1", "--prompt-lengths", "16", "--gen-lengths", "3", "--threads", "1",
                                 "-o", str(target), "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    bench = json.loads(target.read_text())
    assert bench["config"]["dtype"] == "bfloat16" and all(p["status"] == "ok" for p in bench["points"])
    n = bench["model"]["num_parameters"]
    assert 2 * n <= bench["model"]["weight_bytes"]["teacher"] < 2.1 * n  # 2 bytes a weight (and a few buffers)


def test_chat_refuses_an_unknown_dtype(cli, converted, workspace):
    result = runner.invoke(cli, ["chat", str(converted[0]), "--dtype", "float8", "--workspace", str(workspace)], input="")
    assert result.exit_code == 1 and "dtype must be one of float32, bfloat16, float16" in result.output
