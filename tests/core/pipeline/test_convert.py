"""The conversion pipeline end to end on the tiny-test preset, and its user-facing errors."""

import json

import pytest
import torch

import core
from core.config import ConfigError, build_config, preset
from core.data import DataError
from core.models import ModelLoadError
from core.pipeline.convert import run_convert
from core.export.card import CARD_FILE
from core.export.folder import export
from core.load import is_lolcats_tensor, load_converted
from core.progress import RecordingProgress, StopRequested
from core.train.checkpoint import CheckpointError, load_checkpoint
from core.train.loop import OutOfMemory
from core.train.lora import LoraTargetError
from core.eval.metrics import teacher_context
from tests.tiny_runs import convert_tiny


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


IDS = torch.randint(5, 1000, (2, 40), generator=torch.Generator().manual_seed(0))


def test_report_and_checkpoints(finished_run):
    out, report, progress = finished_run
    saved = json.loads((out / "report.json").read_text())
    for key in ("teacher_ppl", "student_ppl", "ppl_ratio", "val_ppl"):
        assert saved[key] > 0 and saved[key] == pytest.approx(report[key])
    assert len(saved["per_layer_mse"]) == 2 and all(v > 0 for v in saved["per_layer_mse"])
    assert {"load_s", "stage1_s", "stage2_s", "eval_s", "total_s"} <= set(saved["timings"])
    assert saved["samples"] and set(saved["samples"][0]) == {"prompt", "teacher", "student"}
    for stage in ("stage1", "stage2"):
        assert (out / stage / "best" / "tensors.safetensors").is_file()
    stages = {s[0] for s in progress.steps}
    assert {"stage1", "stage2", "teacher_eval", "student_eval"} <= stages
    layer_reports = [s for s in progress.steps if s[0] == "stage1" and s[4]]
    assert layer_reports and set(layer_reports[-1][4]) == {0, 1}


def test_load_converted_and_export_round_trip(finished_run, workspace, tmp_path):
    out, _, _ = finished_run
    model, tokenizer, info = load_converted(out, device="cpu", workspace=workspace)
    assert info["kind"] == "run"
    ref = logits_of(model, IDS)
    assert torch.equal(ref, logits_of(load_converted(out, device="cpu", workspace=workspace)[0], IDS))
    exported = export(out, tmp_path / "export", workspace=workspace)
    merged, _, meta = load_converted(exported, device="cpu", workspace=workspace)
    assert meta["kind"] == "export" and core.lolcats_modules(merged)
    got = logits_of(merged, IDS)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5


def test_existing_run_needs_resume_and_changed_config_is_refused(finished_run, workspace):
    out, _, _ = finished_run
    with pytest.raises(ConfigError, match="already holds a run; pass --resume"):
        run_convert(preset("tiny-test"), out, workspace=workspace)
    changed = preset("tiny-test", stage1={"lr": 0.5})
    with pytest.raises(ConfigError, match=r"config changed what was trained:\n  stage1.lr: 0.01 -> 0.5"):
        run_convert(changed, out, resume=True, workspace=workspace)


def test_stopped_run_resumes_to_the_end(workspace, finished_run):
    """Stopped in stage 1 and resumed, a run ends where the uninterrupted run of the same seed ends."""
    out = workspace / "runs" / "stopped"
    with pytest.raises(StopRequested):
        run_convert(preset("tiny-test"), out, RecordingProgress(stop_after=4), workspace=workspace)
    assert not (out / "report.json").exists() and (out / "stage1" / "last").exists()
    progress = RecordingProgress()
    report = run_convert(preset("tiny-test"), out, progress, resume=True, workspace=workspace)
    assert any("resuming after step" in line for line in progress.logs)
    _, uninterrupted, first = finished_run
    resumed_from = report["training"]["stage1"]["resumed_from"]
    assert 0 < resumed_from < preset("tiny-test").stage1.steps
    for key in ("teacher_ppl", "student_ppl", "val_ppl"):
        assert report[key] == pytest.approx(uninterrupted[key], rel=1e-5), key
    assert report["per_layer_mse"] == pytest.approx(uninterrupted["per_layer_mse"], rel=1e-5)
    for stage in ("stage1", "stage2"):
        assert report["training"][stage]["best_val_loss"] == pytest.approx(
            uninterrupted["training"][stage]["best_val_loss"], rel=1e-5)
    # the steps trained after the resume have the losses the uninterrupted run had at those steps
    def losses(steps, stage):
        return {s[1]: s[3]["loss"] for s in steps if s[0] == stage and "loss" in s[3]}
    after = losses(progress.steps, "stage1")
    assert after and min(after) == resumed_from + 1
    assert after == pytest.approx({step: losses(first.steps, "stage1")[step] for step in after}, rel=1e-5)
    assert losses(progress.steps, "stage2") == pytest.approx(losses(first.steps, "stage2"), rel=1e-5)


def test_resuming_a_finished_run_keeps_the_training_summaries(finished_run, workspace):
    import shutil

    out, report, _ = finished_run
    again = workspace / "runs" / "finished-again"
    shutil.copytree(out, again)
    progress = RecordingProgress()
    resumed = run_convert(preset("tiny-test"), again, progress, resume=True, workspace=workspace)
    assert not [s for s in progress.steps if s[0] in ("stage1", "stage2")]  # nothing left to train
    assert set(resumed["training"]) == {"stage1", "stage2"}
    assert resumed["training"] == report["training"]  # best val loss, steps, resumed_from of the first run
    assert json.loads((again / "report.json").read_text())["training"] == report["training"]


def test_checkpoint_for_a_different_attention_config_is_named(finished_run, workspace):
    out, _, _ = finished_run
    cfg = json.loads((out / "config.json").read_text())
    cfg["attention"]["feature_dim"] = 4
    (out.parent / "mismatch").mkdir(exist_ok=True)
    (out.parent / "mismatch" / "config.json").write_text(json.dumps(cfg))
    import shutil

    shutil.copytree(out / "stage1", out.parent / "mismatch" / "stage1", dirs_exist_ok=True)
    with pytest.raises(CheckpointError, match="does not match this model.*shape"):
        load_converted(out.parent / "mismatch", device="cpu", workspace=workspace)


def test_pickle_checkpoint_is_refused(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointError, match="pickle"):
        load_converted(tmp_path / "model.pt")


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"model": {"source": "/no/such/folder"}}, ModelLoadError, "does not exist"),
        ({"data": {"source": "/no/such/data.jsonl"}}, DataError, "not found|does not exist"),
        ({"stage2": {"target_modules": ["qkv_proj"]}}, LoraTargetError, r"\['qkv_proj'\] not found"),
        ({"data": {"seq_len": 4096}}, ValueError, "4096.*2048"),
    ],
)
def test_bad_inputs_give_one_clear_error(workspace, tmp_path, overrides, error, message):
    with pytest.raises(error, match=message):
        run_convert(preset("tiny-test", **overrides), tmp_path / "run", workspace=workspace)


def test_dataset_without_needed_fields_and_empty_dataset(workspace, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n' * 20)
    with pytest.raises(DataError, match="instruction"):
        run_convert(preset("tiny-test", data={"source": str(bad)}), tmp_path / "r1", workspace=workspace)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty|no rows"):
        run_convert(preset("tiny-test", data={"source": str(empty)}), tmp_path / "r2", workspace=workspace)


def test_unsupported_architecture_folder(workspace, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises((ModelLoadError, core.UnsupportedModelError), match="gpt2.*llama, mistral, qwen2, qwen3"):
        run_convert(preset("tiny-test", model={"source": str(tmp_path / "gpt2")}), tmp_path / "run", workspace=workspace)


def test_out_of_memory_is_reported_with_a_hint(workspace, tmp_path, monkeypatch):
    import core.train.distill_attention as d

    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(d, "layer_losses", boom)
    with pytest.raises(OutOfMemory, match="out of memory in stage1 at step 1.*lower batch_size or data.seq_len"):
        run_convert(preset("tiny-test"), tmp_path / "run", workspace=workspace)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"attention": {"kind": "softmax"}}, "unknown attention kind 'softmax'"),
        ({"data": {"seq_len": 32}}, r"data.seq_len \(32\) is smaller than attention.window_size \(64\)"),
        ({"stage1": {"lr": 0}}, "stage1.lr must be a finite number > 0"),
        ({"stage2": {"steps": 0}}, "stage2.steps: Input should be greater than or equal to 1"),
        ({"stage2": {"rank": 0}}, "stage2.rank"),
        ({"attention": {"window_size": 0}}, "window_size must be an integer >= 1"),
        ({"stage1": {"learning_rate": 1}}, "stage1.learning_rate: Extra inputs are not permitted"),
        ({"stage2": {"target_modules": []}}, "stage2 trains nothing"),
    ],
)
def test_config_errors_name_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        build_config(data)


def _maps(named) -> dict[str, torch.Tensor]:
    """Feature-map and mixing tensors keyed from ``layers.`` on, whatever wrapper prefixes the names."""
    return {name[name.index("layers."):]: t.detach().clone() for name, t in named if is_lolcats_tensor(name)}


def test_stage2_trains_mlp_adapters_and_feature_maps_and_keeps_them(workspace, tmp_path):
    """Stage 2 with LoRA on the MLPs too and the feature maps trained (distilled from the teacher): the
    trained maps are what a loaded run and its export compute with."""
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    out, _ = convert_tiny(workspace, "stage2-maps", stage2={"loss": "kl", "train_feature_maps": True,
                                                            "target_modules": targets, "lr": 1e-2})
    stage2 = load_checkpoint(out / "stage2" / "best")[0]
    assert any("gate_proj.lora_A" in k for k in stage2) and any("down_proj.lora_B" in k for k in stage2)
    after_stage1 = _maps(load_checkpoint(out / "stage1" / "best")[0].items())
    model, _, _ = load_converted(out, device="cpu", workspace=workspace)
    loaded = _maps(model.named_parameters())
    assert set(loaded) == set(after_stage1) and loaded
    moved = [k for k in loaded if not torch.equal(loaded[k], after_stage1[k])]
    assert moved, "stage 2 left every feature map as stage 1 trained it"
    merged, _, _ = load_converted(export(out, tmp_path / "export", workspace=workspace), device="cpu",
                                  workspace=workspace)
    exported_maps = _maps(merged.named_parameters())
    assert set(exported_maps) == set(loaded) and all(torch.equal(v, loaded[k]) for k, v in exported_maps.items())
    ref, got = logits_of(model, IDS), logits_of(merged, IDS)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5


def test_stage2_without_lora_trains_the_history_and_leaves_the_window_as_the_teacher_has_it(workspace, tmp_path):
    """Stage 2 with no LoRA target trains only what conversion added: the model is not wrapped, its
    checkpoint holds only conversion tensors, the maps move, and a query whose keys all sit in its
    sliding window (the first 16 positions) computes exactly the teacher's logits, later ones not."""
    out, _ = convert_tiny(workspace, "stage2-history", attention={"kind": "sliding_window"},
                          stage2={"loss": "kl", "train_feature_maps": True, "target_modules": [], "lr": 1e-2})
    stage2 = load_checkpoint(out / "stage2" / "best")[0]
    assert stage2 and all(is_lolcats_tensor(k) and "lora" not in k for k in stage2)
    after_stage1 = _maps(load_checkpoint(out / "stage1" / "best")[0].items())
    model, _, _ = load_converted(out, device="cpu", workspace=workspace)
    assert not hasattr(model, "disable_adapter")
    loaded = _maps(model.named_parameters())
    assert any(not torch.equal(loaded[k], after_stage1[k]) for k in loaded), "stage 2 trained nothing"
    student = logits_of(model, IDS)
    with teacher_context(model):
        teacher = logits_of(model, IDS)
    torch.testing.assert_close(student[:, :16], teacher[:, :16], rtol=1e-5, atol=1e-5)
    assert (student[:, 16:] - teacher[:, 16:]).abs().max() > 1e-3
    card = (export(out, tmp_path / "export", workspace=workspace) / CARD_FILE).read_text()
    assert "targets none (feature maps and history only)" in card
