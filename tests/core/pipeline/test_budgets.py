"""The softmax-budget sweep on the tiny-test preset: one attention transfer for every budget, the
chosen layers, the cost columns, the written table and plot, the CLI and the job kind."""

import json

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from core.config import ConfigError, preset
from core.pipeline.budget_spec import BudgetSweepConfig
from core.pipeline.budgets import run_budget_sweep
from core.progress import RecordingProgress

pytestmark = pytest.mark.slow  # a conversion per softmax budget

CONTEXT = 64


@pytest.fixture(scope="module")
def sweep(workspace):
    config = BudgetSweepConfig(base=preset("tiny-test"), budgets=[1, 0], context=CONTEXT, decode_steps=2)
    out = workspace / "runs" / "budgets"
    progress = RecordingProgress()
    return out, run_budget_sweep(config, out, progress, workspace=workspace), progress


def test_one_attention_transfer_serves_every_budget(sweep):
    out, result, progress = sweep
    assert [r["budget"] for r in result["rows"]] == [0, 1]
    stage1_runs = {step[0] for step in progress.steps if step[0] == "stage1"}
    assert stage1_runs == {"stage1"}
    trained = [s for s in progress.steps if s[0] == "stage1" and s[2] is not None]
    assert max(s[1] for s in trained) == preset("tiny-test").stage1.steps
    assert len([s for s in trained if s[1] == 1]) == 1  # stage 1 ran once, not once per budget
    first = load_file(str(out / "budget-0" / "stage1" / "best" / "tensors.safetensors"))
    copied = load_file(str(out / "budget-1" / "stage1" / "best" / "tensors.safetensors"))
    assert first.keys() == copied.keys() and all((first[k] == copied[k]).all() for k in first)


def test_each_budget_keeps_its_worst_layers_by_the_shared_scores(sweep):
    out, result, _ = sweep
    scores = result["layer_scores"]
    assert result["softmax_score"] == "kl" and len(scores) == 2 and all(s > 0 for s in scores)
    rows = {r["budget"]: r for r in result["rows"]}
    assert rows[0]["softmax_layers"] == []
    assert rows[1]["softmax_layers"] == [max(range(2), key=lambda i: scores[i])]
    for k, row in rows.items():
        report = json.loads((out / f"budget-{k}" / "report.json").read_text())
        assert report["softmax_layers"] == row["softmax_layers"] and report["student_ppl"] == row["student_ppl"]
        assert row["ppl_ratio"] == pytest.approx(row["student_ppl"] / result["teacher_ppl"])


def test_cost_columns_are_measured_per_budget(sweep):
    out, result, _ = sweep
    rows = {r["budget"]: r for r in result["rows"]}
    teacher = result["teacher"]
    assert teacher["decode_ms_per_step"] > 0 and all(r["decode_ms_per_step"] > 0 for r in rows.values())
    # one softmax layer holds half the teacher's key/value cache, one converted layer half the all-converted state
    assert rows[1]["cache_bytes"] == teacher["cache_bytes"] // 2 + rows[0]["cache_bytes"] // 2
    text = (out / "budgets.md").read_text()
    assert "| 1 |" in text and "teacher" in text
    html = (out / "budgets.html").read_text()
    assert "K=0" in html and "K=1" in html


def test_cli_runs_the_sweep_and_refuses_bad_budgets(cli, workspace, sweep):
    runner = CliRunner()
    bad = runner.invoke(cli, ["ablate", "--preset", "tiny-test", "--softmax-budgets", "0,x", "-w", str(workspace)])
    assert bad.exit_code != 0 and "--budgets takes whole numbers separated by commas, such as 0,1,2,4,8" in bad.output
    neg = runner.invoke(cli, ["ablate", "--preset", "tiny-test", "--softmax-budgets", "-1", "-w", str(workspace)])
    assert neg.exit_code != 0 and "budgets must be >= 0" in neg.output
    out = workspace / "runs" / "budgets-cli"
    ok = runner.invoke(cli, ["ablate", "--preset", "tiny-test", "--softmax-budgets", "1", "--context", "32",
                             "-o", str(out), "-w", str(workspace)])
    assert ok.exit_code == 0, ok.output
    result = json.loads((out / "budgets.json").read_text())
    assert result["context"] == 32 and [r["budget"] for r in result["rows"]] == [1]


def test_the_job_kind_checks_the_largest_budget_against_the_model(workspace):
    from jobs.errors import ConfigError
    from jobs.kinds import get_kind

    kind = get_kind("budgets")
    ok = kind.normalize({"base": preset("tiny-test").model_dump(), "budgets": [0, 1]}, workspace)
    assert ok["budgets"] == [0, 1]
    with pytest.raises(ConfigError, match=r"budgets: budget 2 would keep every layer of model .tiny-random-llama. softmax \(2 layers\); use at most 1"):
        kind.validate({"base": preset("tiny-test").model_dump(), "budgets": [0, 2]}, workspace)


def test_a_resumed_sweep_reads_finished_budgets_back(sweep, workspace):
    out, result, _ = sweep
    config = BudgetSweepConfig(base=preset("tiny-test"), budgets=[0, 1], context=CONTEXT, decode_steps=2)
    progress = RecordingProgress()
    again = run_budget_sweep(config, out, progress, resume=True, workspace=workspace)
    assert not [s for s in progress.steps if s[0] in ("stage1", "stage2", "student_eval")]  # nothing re-run
    assert [r["student_ppl"] for r in again["rows"]] == [r["student_ppl"] for r in result["rows"]]
    changed = BudgetSweepConfig(base=preset("tiny-test", stage2={"lr": 0.5}), budgets=[0, 1], context=CONTEXT)
    with pytest.raises(ConfigError, match="config changed what was trained"):
        run_budget_sweep(changed, out, RecordingProgress(), resume=True, workspace=workspace)
