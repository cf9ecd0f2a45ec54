"""``lolcats eval RUN --tasks``: task accuracy of teacher and student through the command line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from core.eval.harness import offline_tasks

pytestmark = pytest.mark.slow  # lm-evaluation-harness through the CLI

runner = CliRunner()
LIMIT = 3


def test_tasks_print_a_table_and_write_the_report(cli, tiny_run, workspace, tmp_path):
    path = tmp_path / "tasks.json"
    result = runner.invoke(cli, ["eval", str(tiny_run), "--tasks", "offline", "--limit", str(LIMIT), "-o", str(path),
                                 "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    assert set(report["results"]) == set(offline_tasks())
    assert report["config"]["limit"] == LIMIT and report["config"]["batch_size"] == 1
    assert "task scores (%)" in result.output and "diff [95% CI]" in result.output
    assert f"report:{path}" in "".join(result.output.split())  # rich wraps a long path onto the next line
    for task, entry in report["results"].items():
        assert entry["n"] == LIMIT
        lo, hi = entry["diff_ci95"]
        row = next(line for line in result.output.splitlines() if line.startswith(f"│ {task} "))
        assert f"{100 * entry['teacher']['acc']:.1f}" in row and f"{100 * entry['student']['acc']:.1f}" in row
        assert f"{100 * entry['diff']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" in row, result.output
    assert not (tiny_run / "eval.json").exists()  # the perplexity report is not written with --tasks


def test_an_unknown_task_is_one_line_naming_the_closest_names(cli, tiny_run, workspace):
    result = runner.invoke(cli, ["eval", str(tiny_run), "--tasks", "lolcats_kjv_nxt", "--workspace", str(workspace)])
    assert result.exit_code == 1
    assert "unknown lm-eval task(s): lolcats_kjv_nxt (did you mean lolcats_kjv_next" in result.output
    assert "Traceback" not in result.output
