"""Stage 1 and stage 2 on a tiny random model: they learn, checkpoint, resume and fail clearly."""


import pytest
import torch

import core
from core.train.checkpoint import CheckpointError, load_checkpoint
from core.config import Stage1Spec, Stage2Spec
from core.load import is_lolcats_tensor
from core.progress import RecordingProgress, StopRequested
from core.train.distill_attention import evaluate_layers, layer_losses, train_stage1
from core.eval.metrics import teacher_context
from core.train.finetune_lora import teacher_kl, train_stage2, validation_kl, validation_loss, wrap_for_stage2
from core.train.loop import NonFiniteLossError
from kernels.hybrid.naive import hybrid_attention_matrix, softmax_attention_matrix
from tests.tiny_models import tiny_model


def blocks(n, L=48, seed=0):
    """Token blocks with structure (repeated motifs) so there is something to learn."""
    motifs = torch.randint(3, 100, (6, 8), generator=torch.Generator().manual_seed(0))  # shared by all splits
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([motifs[torch.randint(0, 6, (L // 8,), generator=g)].flatten() for _ in range(n)])
    labels = ids.clone()
    labels[:, :5] = -100  # a masked "prompt"
    return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def student(kind="terraced", seed=0, arch="llama"):
    model = tiny_model(arch, seed=seed)
    torch.manual_seed(seed)
    return core.linearize(model, core.AttentionSpec(kind=kind, window_size=8, feature_dim=8))


S1 = dict(steps=12, lr=5e-2, grad_accum=2, eval_every=4, eval_blocks=4, mse_factor=1000.0)


def test_stage1_lowers_per_layer_mse(tmp_path):
    model = student()
    train, val = blocks(16), blocks(4, seed=1)
    spec = Stage1Spec(**S1)
    _, before = evaluate_layers(model, val, 4, spec)
    progress = RecordingProgress()
    train_stage1(model, spec, train, val, tmp_path, progress, seed=0, config={})
    _, after = evaluate_layers(model, val, 4, spec)
    assert set(before) == set(after) == {0, 1, 2}
    assert all(after[i] < 0.7 * before[i] for i in before), (before, after)
    val_steps = [s for s in progress.steps if "val_loss" in s[3]]
    assert [s[1] for s in val_steps] == [4, 8, 12] and all(len(s[4]) == 3 for s in val_steps)
    tensors, state = load_checkpoint(tmp_path / "stage1" / "best")
    assert all(is_lolcats_tensor(n) for n in tensors) and state["stage"] == "stage1"
    assert any(n.endswith(".history_decay") for n in tensors)  # the default history norm's rates train


def attention_xent(model, batch) -> float:
    """Mean over converted layers of the stage-1 attention cross-entropy on ``batch``."""
    with torch.no_grad():
        losses = layer_losses(model, batch, xent=True)
    return torch.stack([v["xent"] for v in losses.values()]).mean().item()


def test_stage1_xent_term_is_the_cross_entropy_of_the_attention_rows():
    model = student("sliding_window")
    batch = blocks(2, seed=1)
    attn = core.lolcats_modules(model)[0]
    seen = {}
    attn.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    with torch.no_grad():
        losses = layer_losses(model, batch, xent=True)
        q, k, _, q_in, k_in = attn.project(seen["hidden_states"], seen["position_embeddings"])
        qf, kf = attn.features(q_in, k_in)
        teacher = softmax_attention_matrix(q, k, attn.scaling)
        student_rows = hybrid_attention_matrix(q, k, qf, kf, attn.mix, attn.kind, attn.window_size, attn.scaling,
                                               decay=attn.log_decay())
    want = -(teacher * student_rows.clamp(min=1e-12).log()).sum(-1).mean()
    assert losses[0]["xent"].item() == pytest.approx(want.item(), rel=1e-5) and want > 0.1


def test_stage1_xent_term_trains(tmp_path):
    """With the output MSE off, the attention cross-entropy alone moves the maps and lowers itself."""
    model = student("sliding_window")
    train, val = blocks(8), blocks(2, seed=1)
    before = attention_xent(model, val)
    spec = Stage1Spec(**{**S1, "steps": 8, "mse_factor": 0.0, "xent_factor": 1.0, "eval_every": 4})
    train_stage1(model, spec, train, val, tmp_path, RecordingProgress(), seed=0, config={})
    assert (tmp_path / "stage1" / "best" / "tensors.safetensors").is_file()
    after = attention_xent(model, val)
    assert after < before - 0.01, (before, after)


def test_stage2_lowers_lm_loss(tmp_path):
    model = student()
    train, val = blocks(16), blocks(4, seed=1)
    spec = Stage2Spec(steps=15, lr=3e-2, grad_accum=2, eval_every=5, eval_blocks=4)
    model = wrap_for_stage2(model, spec)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    before = validation_loss(model, val, 4)
    train_stage2(model, spec, train, val, tmp_path, RecordingProgress(), seed=0, config={})
    after = validation_loss(model, val, 4)
    assert after < before - 0.1, (before, after)


def teacher_student_kl(model, data):
    """KL(teacher || student) per real token, computed from two separate forwards."""
    with torch.no_grad(), teacher_context(model):
        teacher = torch.log_softmax(model(input_ids=data["input_ids"]).logits.float(), -1)
    with torch.no_grad():
        student = torch.log_softmax(model(input_ids=data["input_ids"]).logits.float(), -1)
    return torch.nn.functional.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True,
                                      reduction="batchmean").item()


def test_stage2_kl_is_the_divergence_from_the_teacher_and_its_gradient_lowers_it(tmp_path):
    model = tiny_model("llama")
    with torch.no_grad():  # sharp teacher attention, which a linear attention cannot match
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(40.0)
    torch.manual_seed(0)
    model = core.linearize(model, core.AttentionSpec(kind="linear", feature_dim=8))
    spec = Stage2Spec(steps=2, grad_accum=1, eval_every=1, eval_blocks=2, loss="kl")
    model = wrap_for_stage2(model, spec)
    val = blocks(2, seed=1)
    with torch.no_grad():
        assert teacher_kl(model, val).item() == pytest.approx(teacher_student_kl(model, val), rel=1e-5)
    padded = {**val, "attention_mask": val["attention_mask"].clone()}
    padded["attention_mask"][0, :6] = 0
    with torch.no_grad():  # padded positions do not count
        assert teacher_kl(model, padded).item() != pytest.approx(teacher_kl(model, val).item(), rel=1e-3)
    with torch.no_grad():  # one student forward gives both validation numbers
        assert validation_kl(model, val, 2) == pytest.approx((teacher_kl(model, val).item(),
                                                                 validation_loss(model, val, 2)), rel=1e-5)
    before = teacher_kl(model, val)
    before.backward()
    with torch.no_grad():  # a small step against the gradient of the LoRA weights lowers the divergence
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(0.5 * p.grad)
        assert teacher_kl(model, val).item() < before.item() - 1e-5
    progress = RecordingProgress()
    train_stage2(model, spec, blocks(4), val, tmp_path, progress, seed=0, config={})
    evals = [s[3] for s in progress.steps if "val_loss" in s[3]]
    assert evals and all(0 <= e["val_loss"] < e["val_xent"] for e in evals)  # the KL picks the best
    assert core.lolcats_modules(model.get_base_model())[0].mode == "student"


@pytest.mark.parametrize("stage", ["stage1", "stage2"])
def test_resume_gives_the_same_next_losses(tmp_path, stage):
    train, val = blocks(8), blocks(2, seed=1)

    def run(folder, stop_after=None):
        model = student(seed=3)
        progress = RecordingProgress(stop_after=stop_after)
        if stage == "stage1":
            spec = Stage1Spec(**{**S1, "steps": 8})
            fn = train_stage1
        else:
            spec = Stage2Spec(steps=8, lr=3e-3, grad_accum=2, eval_every=4, eval_blocks=2)
            model = wrap_for_stage2(model, spec)
            fn = train_stage2
        fn(model, spec, train, val, folder, progress, seed=0, config={})
        return [s[3]["loss"] for s in progress.steps if "loss" in s[3]]

    full = run(tmp_path / "full")
    with pytest.raises(StopRequested):
        run(tmp_path / "cut", stop_after=6)  # 5 train steps + 1 validation report, then a stop request
    torch.manual_seed(12345)  # a different global RNG state must not matter
    resumed = run(tmp_path / "cut")
    assert len(full) == 8 and len(resumed) == 3
    assert resumed == pytest.approx(full[5:], rel=1e-6)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    model = student()
    train, val = blocks(8), blocks(2, seed=1)
    spec = Stage1Spec(**{**S1, "steps": 6, "eval_every": 2})
    calls = {"n": 0}
    module = core.lolcats_modules(model)[1]
    original = module.feature_map_k.forward

    def poisoned(x):
        calls["n"] += 1
        out = original(x)
        return out * float("nan") if calls["n"] > 9 else out  # after a few good steps

    module.feature_map_k.forward = poisoned
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(nan\) at step \d+.*last good checkpoint is kept"):
        train_stage1(model, spec, train, val, tmp_path, RecordingProgress(), seed=0, config={})
    tensors, state = load_checkpoint(tmp_path / "stage1" / "last")
    assert state["step"] >= 2 and all(torch.isfinite(t).all() for t in tensors.values())


def test_corrupted_checkpoint_is_named(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "tensors.safetensors").write_bytes(b"\x00" * 20)
    (tmp_path / "ck" / "state.json").write_text("{}")
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(tmp_path / "ck")
    pickle = tmp_path / "model.bin"
    pickle.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="pickle"):
        load_checkpoint(pickle)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_blockwise_transfer_matches_joint_transfer(tmp_path, monkeypatch, arch):
    """Teacher forcing makes layers independent: blocks trained from cached teacher inputs end
    where joint training ends (AdamW is invariant to the per-block loss scale). Gemma 3: a rotary
    table per layer type and sliding-window layers (window 24 < 48 tokens) whose teacher keeps its
    window in a block too. Caching the teacher inputs never runs the LM head."""
    train, val = blocks(8), blocks(2, seed=1)
    spec = dict(S1, steps=6, eval_every=3, plateau_patience=1000)
    joint = student(seed=5, arch=arch)
    train_stage1(joint, Stage1Spec(**spec), train, val, tmp_path / "joint", RecordingProgress(), seed=0, config={})
    blockwise = student(seed=5, arch=arch)
    monkeypatch.setattr(blockwise.lm_head, "forward", lambda *a: pytest.fail("the LM head ran"))
    progress = RecordingProgress()
    train_stage1(blockwise, Stage1Spec(**spec, layers_per_block=2), train, val, tmp_path / "blocks", progress,
                 seed=0, config={})
    assert sorted(p.name for p in (tmp_path / "blocks" / "stage1" / "cache" / "train").iterdir()) == [
        "layer0.safetensors", "layer2.safetensors"]
    a = {n: p for n, p in joint.named_parameters() if is_lolcats_tensor(n)}
    b = dict(blockwise.named_parameters())
    assert a and all(b[n].requires_grad for n in a)
    for name, value in a.items():
        assert torch.allclose(value, b[name], rtol=1e-3, atol=1e-5), name
    tensors, state = load_checkpoint(tmp_path / "blocks" / "stage1" / "best")
    assert set(tensors) == set(a) and state["blocks"] == 2
