"""``lolcats bench --memory-budget``: a capacity run through the command line, and clear budget errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner


runner = CliRunner()


def test_capacity_run_writes_the_largest_batch_of_each_model(cli, tmp_path):
    target = tmp_path / "capacity.json"
    result = runner.invoke(cli, ["bench", "--model", "tiny-random-llama", "--prompt-lengths", "24",
                                 "--memory-budget", "40MiB", "--capacity-steps", "2", "--threads", "1",
                                 "-o", str(target), "--workspace", str(tmp_path / "ws")])
    assert result.exit_code == 0, result.output
    out = json.loads(target.read_text())
    assert out["points"] == [] and out["capacity"]["memory_budget_bytes"] == 40 * 2**20
    (context,) = out["capacity"]["contexts"]
    assert context["prompt_length"] == 24 and set(context["models"]) == {"teacher", "student"}
    for found in context["models"].values():
        ok = [t for t in found["trials"] if t["status"] == "ok"]
        assert found["largest_batch"] == max(t["batch_size"] for t in ok) >= 1
        assert all(t["peak_memory_bytes"] <= 40 * 2**20 and len(t["decode_step_times_s"]) == 2 for t in ok)


@pytest.mark.parametrize("budget", ["twelve", "12 parsecs", "-1GiB", "0MiB"])
def test_bad_budget_is_one_clear_line(cli, tmp_path, budget):
    result = runner.invoke(cli, ["bench", "--model", "tiny-random-llama", "--memory-budget", budget,
                                 "-o", str(tmp_path / "b.json"), "--workspace", str(tmp_path / "ws")])
    assert result.exit_code == 1 and "memory budget" in result.output and "Traceback" not in result.output
