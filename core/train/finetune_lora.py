"""Stage 2, LoRA: next-token cross-entropy through the converted model, prompt tokens masked, or
distillation from the teacher.

Feature maps and base weights are frozen; peft LoRA adapters on the target projections train.
The student supplies every hidden state. ``stage2.loss``:

* ``xent`` (the paper's): mean next-token cross-entropy on the supervised (answer) tokens;
* ``kl``: mean over every real token of KL(p_teacher || p_student), the teacher being the same
  model with softmax attention and the adapters off (no second copy of the weights). It keeps the
  student close to the teacher on everything rather than adapting it to the training answers.

Validation reports the cross-entropy loss and perplexity exp(loss) either way; with ``kl`` the
validation loss (which picks the best checkpoint) is the KL and the cross-entropy is ``val_xent``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from core.config import Stage2Spec
from core.data import IGNORE_INDEX, supervised_mask
from core.attention.surgery import set_mode
from core.train.lora import add_lora, base_model
from core.progress import ProgressCallback
from core.train.loop import Batch, LoopSpec, load_best, run_loop
from core.train.parallel import ONE_PROCESS, Parallel


def label_nll(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
    """``(sum of next-token NLL, count)`` over the supervised tokens of ``batch``.

    The logits at position ``t`` score ``labels[t + 1]`` (see :func:`core.data.supervised_mask`);
    labels -100 are skipped. A batch with no supervised token gives ``(0, 0)``, the zero still
    attached to the graph so that its backward is a zero gradient.
    """
    labels = batch["labels"]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False).logits
    targets = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]  # [B, L]: the token each position predicts
    nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                          ignore_index=IGNORE_INDEX, reduction="sum")
    return nll, int(supervised_mask(labels).sum())


def teacher_kl(model: nn.Module, batch: Batch, forward: nn.Module | None = None) -> torch.Tensor:
    """Mean over real tokens of KL(p_teacher || p_student) at every position (see the module docstring);
    ``forward`` (default ``model``) computes the student, e.g. a data-parallel wrapper of ``model``."""
    inner = base_model(model)
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_mask"), "use_cache": False}
    with torch.no_grad():
        set_mode(inner, "teacher")
        try:
            with model.disable_adapter():
                teacher = F.log_softmax(model(**kwargs).logits.float(), dim=-1)
        finally:
            set_mode(inner, "student")
    student = F.log_softmax((forward or model)(**kwargs).logits.float(), dim=-1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # [B, L]
    mask = batch.get("attention_mask")
    if mask is None:
        return kl.mean()
    m = mask.to(kl.dtype)
    return (kl * m).sum() / m.sum().clamp(min=1)


def lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the supervised tokens; 0 (zero gradient) when there are none."""
    nll, count = label_nll(model, batch)
    return nll / max(count, 1)


@torch.no_grad()
def validation_loss(model: nn.Module, blocks: Batch, n_blocks: int) -> float:
    """Mean over the first ``n_blocks`` blocks of each block's :func:`lm_loss`; blocks without a
    supervised token have no loss and are left out of the mean."""
    device = next(model.parameters()).device
    n = min(n_blocks, blocks["input_ids"].shape[0])
    losses = []
    for i in range(n):
        nll, count = label_nll(model, {k: v[i : i + 1].to(device) for k, v in blocks.items()})
        if count:
            losses.append(nll.item() / count)
    if not losses:
        raise ValueError(
            f"stage2 validation: none of the first {n} blocks (eval_blocks={n_blocks}) has a supervised token "
            "(a label after position 0); raise eval_blocks or use validation data with non-empty outputs"
        )
    return sum(losses) / len(losses)


@torch.no_grad()
def validation_kl(model: nn.Module, blocks: Batch, n_blocks: int) -> float:
    """Mean over the first ``n_blocks`` blocks of each block's :func:`teacher_kl`."""
    device = next(model.parameters()).device
    n = min(n_blocks, blocks["input_ids"].shape[0])
    return sum(teacher_kl(model, {k: v[i : i + 1].to(device) for k, v in blocks.items()}).item() for i in range(n)) / n


def wrap_for_stage2(model: nn.Module, spec: Stage2Spec) -> nn.Module:
    set_mode(base_model(model), "student")
    return add_lora(model, spec.rank, spec.alpha, spec.dropout, spec.target_modules, spec.train_feature_maps)


def train_stage2(
    model: nn.Module, spec: Stage2Spec, train: Batch, val: Batch, run_dir: Path, progress: ProgressCallback,
    seed: int, config: dict, parallel: Parallel = ONE_PROCESS, forward_model: nn.Module | None = None,
) -> dict:
    """LoRA fine-tuning of a model already wrapped by :func:`wrap_for_stage2`; loads the best adapters.

    ``parallel`` is this process's part (:mod:`core.train.parallel`) and ``forward_model`` the model
    it wrapped (DDP; None: ``model`` itself); ``model`` stays the unwrapped one."""
    forward = forward_model if forward_model is not None else model

    def loss_fn(batch):
        if spec.loss == "kl":
            return teacher_kl(model, batch, forward), {}
        return lm_loss(forward, batch), {}

    def eval_fn():
        val_loss = validation_loss(forward, val, spec.eval_blocks)
        metrics = {"val_ppl": math.exp(min(val_loss, 50.0))}
        if spec.loss == "kl":  # the best checkpoint is the one closest to the teacher
            metrics["val_xent"] = val_loss
            val_loss = validation_kl(model, val, spec.eval_blocks)
        return val_loss, metrics, None

    loop = LoopSpec(
        stage="stage2", steps=spec.steps, lr=spec.lr, weight_decay=spec.weight_decay, batch_size=spec.batch_size,
        grad_accum=spec.grad_accum, eval_every=spec.eval_every, seed=seed, plateau_patience=10 ** 9,
    )
    result = run_loop(loop, model, train, loss_fn, eval_fn, run_dir, progress, config, parallel)
    load_best(model, run_dir, "stage2")
    return result
