"""``attention.softmax_layers: auto`` through the pipeline on the tiny-test preset: the choice, its
record in the run folder and report, resume, loading back and export."""

import json

import pytest
import torch

import core
from core.config import ConfigError, preset
from core.pipeline.convert import run_convert
from core.export.folder import export
from core.load import load_converted
from core.run_folder import CHOICE_FILE
from core.progress import RecordingProgress, StopRequested
from tests.tiny_runs import convert_tiny

AUTO = {"softmax_layers": "auto", "softmax_budget": 1}
IDS = torch.randint(5, 1000, (1, 48), generator=torch.Generator().manual_seed(3))


def logits_of(model):
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits


class StopInStage2(RecordingProgress):
    def should_stop(self) -> bool:
        return any(step[0] == "stage2" for step in self.steps)


@pytest.fixture(scope="module")
def auto_run(workspace):
    return convert_tiny(workspace, "auto-kl", attention=AUTO)


def test_the_choice_is_recorded_in_the_run_and_the_report(auto_run):
    out, report = auto_run
    choice = json.loads((out / CHOICE_FILE).read_text())
    scores = choice["layer_scores"]
    assert choice["softmax_score"] == "kl" and choice["budget"] == 1 and len(scores) == 2 and all(s > 0 for s in scores)
    worst = max(range(2), key=lambda i: scores[i])
    assert choice["softmax_layers"] == [worst] == report["softmax_layers"]
    assert report["softmax_score"] == "kl" and report["layer_scores"] == scores
    mse = report["per_layer_mse"]
    assert mse[worst] is None and mse[1 - worst] > 0  # a softmax layer has no attention error to report
    assert json.loads((out / "config.json").read_text())["attention"]["softmax_layers"] == "auto"


def test_a_loaded_run_and_its_export_keep_the_chosen_layer_softmax(auto_run, workspace, tmp_path):
    out, report = auto_run
    model, _, _ = load_converted(out, device="cpu", workspace=workspace)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    assert sorted(core.lolcats_modules(inner)) == [i for i in range(2) if i not in report["softmax_layers"]]
    merged, _, meta = load_converted(export(out, tmp_path / "export", workspace=workspace), device="cpu",
                                     workspace=workspace)
    assert meta["attention"]["softmax_layers"] == report["softmax_layers"]
    assert meta["attention"]["softmax_budget"] is None
    ref, got = logits_of(model), logits_of(merged)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5


def test_a_run_stopped_in_stage_2_resumes_with_the_same_choice(auto_run, workspace):
    out_full, report_full = auto_run
    config = preset("tiny-test", attention=AUTO)
    out = workspace / "runs" / "auto-stopped"
    with pytest.raises(StopRequested):  # stage 1 finished and the choice made, then stopped in stage 2
        run_convert(config, out, StopInStage2(), workspace=workspace)
    first = json.loads((out / CHOICE_FILE).read_text())
    (out / CHOICE_FILE).write_text(json.dumps({**first, "softmax_layers": [1 - first["softmax_layers"][0]]}))
    report = run_convert(config, out, resume=True, workspace=workspace)
    assert report["softmax_layers"] == [1 - first["softmax_layers"][0]]  # read back, not scored again
    assert first == json.loads((out_full / CHOICE_FILE).read_text())


def test_a_run_killed_while_it_scores_its_layers_resumes_to_the_same_result(auto_run, workspace):
    """What a kill during layer scoring leaves: stage 1 finished, no choice saved (it is written
    whole once scored), stage 2 not started. The resumed run scores again and ends as the
    uninterrupted run did."""
    import shutil

    out_full, report_full = auto_run
    config = preset("tiny-test", attention=AUTO)
    out = workspace / "runs" / "auto-killed-scoring"
    with pytest.raises(StopRequested):
        run_convert(config, out, StopInStage2(), workspace=workspace)
    (out / CHOICE_FILE).unlink()
    shutil.rmtree(out / "stage2")
    report = run_convert(config, out, resume=True, workspace=workspace)
    assert json.loads((out / CHOICE_FILE).read_text()) == json.loads((out_full / CHOICE_FILE).read_text())
    for key in ("teacher_ppl", "student_ppl", "val_ppl"):
        assert report[key] == pytest.approx(report_full[key], rel=1e-5), key


def test_mse_score_and_a_budget_that_keeps_everything(workspace):
    out, report = convert_tiny(workspace, "auto-mse", attention={**AUTO, "softmax_score": "mse"},
                               stage2={"enabled": False})
    assert report["softmax_score"] == "mse" and len(report["softmax_layers"]) == 1
    with pytest.raises(ConfigError, match="softmax_budget 2 would keep all 2 converted layers softmax; use at most 1"):
        convert_tiny(workspace, "auto-all", attention={**AUTO, "softmax_budget": 2})
    assert not (workspace / "runs" / "auto-all" / "stage1").exists()  # refused before training


def test_explicit_layers_are_reported_without_scores(finished_run):
    _, report, _ = finished_run
    assert report["softmax_layers"] == [] and "layer_scores" not in report


def test_older_files_name_the_score_method_score_or_layer_score(tmp_path):
    from core.pipeline.budget_table import score_name
    from core.load import saved_choice

    (tmp_path / CHOICE_FILE).write_text(json.dumps({"score": "mse", "budget": 1, "softmax_layers": [0],
                                                    "layer_scores": [0.5, 0.25]}))
    assert saved_choice(tmp_path)["softmax_score"] == "mse"
    assert [score_name(r) for r in ({"score": "kl"}, {"layer_score": "mse"}, {"softmax_score": "kl"}, {})] == \
        ["kl", "mse", "kl", None]
