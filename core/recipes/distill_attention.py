"""Stage 1, attention transfer: train feature maps and window factors to mimic softmax attention.

Every pretrained weight is frozen. Each converted layer computes teacher (softmax) and student
(LoLCATs) head outputs from the same q, k, v and passes the teacher's on (teacher forcing), so
layers train jointly without gradients crossing layers. Per batch:

    loss = mse_factor * mean_layers MSE(y_student, y_teacher) + xent_factor * mean_layers CE(A_teacher, A_student)

with MSE over real tokens, heads and head dims (outputs before o_proj) and CE the cross-entropy
between the teacher's softmax rows and the student's effective attention rows (quadratic in
length, so only computed when xent_factor > 0).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from core.attention.effective import hybrid_attention_matrix, softmax_attention_matrix
from core.config import Stage1Spec
from core.linearize import lolcats_modules, set_mode
from core.progress import ProgressCallback
from core.recipes.loop import Batch, LoopSpec, batch_at, load_best, run_loop


def freeze_for_stage1(model: nn.Module) -> None:
    """Only feature maps and mixing factors train."""
    trainable = set()
    for module in lolcats_modules(model).values():
        trainable.update(id(p) for p in (*module.feature_map_q.parameters(), *module.feature_map_k.parameters(), module.mix))
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)


def _masked_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    err = (student.float() - teacher.float()).pow(2).mean(dim=(1, 3))  # [B, L]
    if mask is None:
        return err.mean()
    m = mask.float()
    return (err * m).sum() / m.sum().clamp(min=1)


def _xent(module, mask) -> torch.Tensor:
    q, k, qf, kf = module.distill_qk
    teacher = softmax_attention_matrix(q, k, module.scaling)
    student = hybrid_attention_matrix(q, k, qf, kf, module.mix, module.kind, module.window_size, module.scaling)
    ce = -(teacher * student.clamp(min=1e-12).log()).sum(-1).mean(1)  # [B, L]
    if mask is None:
        return ce.mean()
    return (ce * mask.float()).sum() / mask.float().sum().clamp(min=1)


def layer_losses(model: nn.Module, batch: Batch, xent: bool = False) -> dict[int, dict[str, torch.Tensor]]:
    """Run the decoder in distill mode; per converted layer {"mse": ..., ["xent": ...]}."""
    modules = lolcats_modules(model)
    set_mode(model, "distill")
    for m in modules.values():
        m.keep_qk = xent
    try:
        decoder = model.get_decoder()
        decoder(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False)
        mask = batch.get("attention_mask")
        out = {}
        for i, m in modules.items():
            student, teacher = m.distill_outputs
            out[i] = {"mse": _masked_mse(student, teacher, mask)}
            if xent:
                out[i]["xent"] = _xent(m, mask)
        return out
    finally:
        set_mode(model, "student")
        for m in modules.values():
            m.distill_outputs = None
            m.keep_qk = False
            m.distill_qk = None


def combine(losses: dict[int, dict[str, torch.Tensor]], spec: Stage1Spec) -> torch.Tensor:
    mse = torch.stack([v["mse"] for v in losses.values()]).mean()
    loss = spec.mse_factor * mse
    if spec.xent_factor > 0:
        loss = loss + spec.xent_factor * torch.stack([v["xent"] for v in losses.values()]).mean()
    return loss


@torch.no_grad()
def evaluate_layers(model: nn.Module, blocks: Batch, n_blocks: int, spec: Stage1Spec) -> tuple[float, dict[int, float]]:
    """Mean stage-1 loss and per-layer MSE over the first ``n_blocks`` validation blocks."""
    device = next(model.parameters()).device
    n = min(n_blocks, blocks["input_ids"].shape[0])
    per_layer: dict[int, float] = {}
    total = 0.0
    for i in range(n):
        batch = {k: v[i : i + 1].to(device) for k, v in blocks.items()}
        losses = layer_losses(model, batch, xent=spec.xent_factor > 0)
        total += combine(losses, spec).item() / n
        for layer, v in losses.items():
            per_layer[layer] = per_layer.get(layer, 0.0) + v["mse"].item() / n
    return total, per_layer


def train_stage1(
    model: nn.Module, spec: Stage1Spec, train: Batch, val: Batch, run_dir: Path, progress: ProgressCallback,
    seed: int, config: dict,
) -> dict:
    """Attention transfer; leaves the best (lowest validation loss) weights loaded."""
    freeze_for_stage1(model)

    def loss_fn(batch):
        losses = layer_losses(model, batch, xent=spec.xent_factor > 0)
        mse = sum(v["mse"].item() for v in losses.values()) / len(losses)
        return combine(losses, spec), {"mse": mse}

    def eval_fn():
        val_loss, per_layer = evaluate_layers(model, val, spec.eval_blocks, spec)
        return val_loss, {"val_mse": sum(per_layer.values()) / len(per_layer)}, {i: {"mse": v} for i, v in per_layer.items()}

    loop = LoopSpec(
        stage="stage1", steps=spec.steps, lr=spec.lr, weight_decay=spec.weight_decay, batch_size=spec.batch_size,
        grad_accum=spec.grad_accum, eval_every=spec.eval_every, seed=seed, plateau_patience=spec.plateau_patience,
        plateau_factor=spec.plateau_factor, min_lr=spec.min_lr,
    )
    result = run_loop(loop, model, train, loss_fn, eval_fn, run_dir, progress, config)
    load_best(model, run_dir, "stage1")
    return result


__all__ = ["freeze_for_stage1", "layer_losses", "evaluate_layers", "train_stage1", "batch_at"]
