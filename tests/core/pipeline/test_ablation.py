"""The Table 2 protocol on the tiny-test preset: four variants per attention kind at equal total steps."""

import json

import pytest

from core.config import preset
from core.pipeline.ablation import (
    VARIANTS,
    markdown_table,
    run_ablation,
    variant_config,
)
from core.progress import RecordingProgress

pytestmark = pytest.mark.slow  # four conversions per ablation

BASE = preset("tiny-test")
KINDS = ("linear", "terraced")
TOTAL = 2


def trained_steps(config) -> tuple[int, int]:
    return (config.stage1.steps if config.stage1.enabled else 0, config.stage2.steps if config.stage2.enabled else 0)


@pytest.mark.parametrize("total", [1, 2, 5, 8])
def test_variants_train_the_same_total_steps(total):
    steps = {v: trained_steps(variant_config(BASE, "linear", v, total)) for v in VARIANTS}
    assert steps["swap"] == (0, 0)
    assert steps["transfer"] == (total, 0) and steps["lora"] == (0, total)
    if total > 1:  # one step cannot be split: "both" then trains stage 1 only
        assert steps["both"] == (total // 2, total - total // 2)


def test_variant_config_keeps_the_base_and_skips_passkey_and_samples():
    config = variant_config(BASE, "terraced", "both", 8)
    assert config.attention.kind == "terraced" and config.attention.feature_dim == BASE.attention.feature_dim
    assert config.eval.long_context.passkey_trials == 0 and config.eval.samples == 0
    assert config.eval.ppl_blocks == BASE.eval.ppl_blocks and config.data == BASE.data and config.seed == BASE.seed
    assert config.stage1.eval_every <= config.stage1.steps and config.stage2.eval_every <= config.stage2.steps
    assert config.stage1.lr == BASE.stage1.lr and config.stage2.rank == BASE.stage2.rank


@pytest.fixture(scope="module")
def ablation(workspace):
    out = workspace / "ablation"
    progress = RecordingProgress()
    return out, run_ablation(BASE, out, kinds=KINDS, total_steps=TOTAL, progress=progress, workspace=workspace), progress


def test_ablation_runs_every_variant_with_its_stages(ablation):
    out, result, progress = ablation
    assert result == json.loads((out / "ablation.json").read_text()) and result["total_steps"] == TOTAL
    rows = result["rows"]
    assert [(r["attention"], r["variant"]) for r in rows] == [(k, v) for k in KINDS for v in VARIANTS]
    for r in rows:
        run = out / f"{r['attention']}-{r['variant']}"
        config = json.loads((run / "config.json").read_text())
        assert config["attention"]["kind"] == r["attention"]
        assert (r["stage1_steps"] > 0) == (run / "stage1" / "best").is_dir()
        assert (r["stage2_steps"] > 0) == (run / "stage2" / "best").is_dir()
        assert r["variant"] == "swap" or r["stage1_steps"] + r["stage2_steps"] == TOTAL
        report = json.loads((run / "report.json").read_text())
        assert (r["val_ppl"], r["heldout_ppl"]) == (report["val_ppl"], report["student_ppl"])
    # stage totals reported while training: N (transfer, lora) and N/2 (both)
    assert {(s[0], s[2]) for s in progress.steps if s[0] in ("stage1", "stage2")} == {
        ("stage1", TOTAL), ("stage1", TOTAL // 2), ("stage2", TOTAL), ("stage2", TOTAL - TOTAL // 2)}


def test_every_variant_is_compared_with_the_same_teacher(ablation, finished_run):
    _, result, _ = ablation
    _, report, _ = finished_run
    assert {r["teacher_heldout_ppl"] for r in result["rows"]} == {report["teacher_ppl"]}
    for kind in KINDS:  # training changes the student: no two variants of a kind measure the same
        heldout = [r["heldout_ppl"] for r in result["rows"] if r["attention"] == kind]
        assert len(set(heldout)) == len(VARIANTS)


def test_the_table_lists_every_row(ablation):
    out, result, _ = ablation
    table = (out / "ablation.md").read_text()
    assert table == markdown_table(result["rows"])
    lines = table.splitlines()
    for line, r in zip(lines[2:], result["rows"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells == [r["attention"], r["variant"], str(r["stage1_steps"]), str(r["stage2_steps"]),
                         f"{r['val_ppl']:.2f}", f"{r['heldout_ppl']:.2f}"]
    assert f"Teacher held-out perplexity: {result['rows'][0]['teacher_heldout_ppl']:.2f}" in table


def test_resumed_ablation_trains_nothing_again(ablation, workspace):
    out, result, _ = ablation
    progress = RecordingProgress()
    again = run_ablation(BASE, out, kinds=KINDS, total_steps=TOTAL, progress=progress, resume=True, workspace=workspace)
    assert not [s for s in progress.steps if s[0] in ("stage1", "stage2")]
    assert again == result


def test_table_formats_a_diverged_perplexity():
    row = {"attention": "linear", "variant": "swap", "stage1_steps": 0, "stage2_steps": 0,
           "val_ppl": float("inf"), "heldout_ppl": 2.5e7, "teacher_heldout_ppl": 3.0}
    lines = markdown_table([row]).splitlines()
    assert lines[2] == "| linear | swap | 0 | 0 | inf | 2.5e+07 |"
    assert lines[-1] == "Teacher held-out perplexity: 3.00"
