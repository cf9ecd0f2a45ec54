"""Stage 2, LoRA: next-token cross-entropy through the converted model, prompt tokens masked, or
distillation from the teacher.

Base weights are frozen; peft LoRA adapters on the target projections train (with
``train_feature_maps``, the feature maps, mixing factors and history parameters too; with no target,
only those: :func:`core.train.lora.add_lora`).
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
from core.attention.layer import teacher_attention
from core.attention.surgery import lolcats_modules
from core.train.lora import adapters_off, add_lora, base_model
from core.progress import ProgressCallback
from core.train.loop import Batch, LoopSpec, load_best, run_loop
from core.train.parallel import ONE_PROCESS, Parallel
from core.run_folder import STAGE2


def _logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False).logits


def logits_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(sum of next-token NLL, count)`` over the supervised tokens: the logits at position ``t``
    score ``labels[t + 1]`` (see :func:`core.data.supervised_mask`); labels -100 are skipped."""
    targets = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]  # [B, L]: the token each position predicts
    nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                          ignore_index=IGNORE_INDEX, reduction="sum")
    return nll, int(supervised_mask(labels).sum())


def label_nll(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
    """:func:`logits_nll` of ``model`` on ``batch``. A batch with no supervised token gives ``(0, 0)``,
    the zero still attached to the graph so that its backward is a zero gradient."""
    return logits_nll(_logits(model, batch), batch["labels"])


def token_kl(teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(p_teacher || p_student) at every position, [B, L], from log-probabilities [B, L, V]."""
    return (teacher_logprobs.exp() * (teacher_logprobs - student_logprobs)).sum(-1)


def kl_and_logits(model: nn.Module, batch: Batch, forward: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over real tokens of KL(p_teacher || p_student) at every position (see the module
    docstring), and the student's logits; ``forward`` (default ``model``) computes the student,
    e.g. a data-parallel wrapper of ``model``."""
    with torch.no_grad(), adapters_off(model), teacher_attention(lolcats_modules(base_model(model)).values()):
        teacher = F.log_softmax(_logits(model, batch).float(), dim=-1)
    logits = _logits(forward or model, batch)
    kl = token_kl(teacher, F.log_softmax(logits.float(), dim=-1))  # [B, L]
    mask = batch.get("attention_mask")
    if mask is None:
        return kl.mean(), logits
    m = mask.to(kl.dtype)
    return (kl * m).sum() / m.sum().clamp(min=1), logits


def teacher_kl(model: nn.Module, batch: Batch, forward: nn.Module | None = None) -> torch.Tensor:
    """The KL of :func:`kl_and_logits`."""
    return kl_and_logits(model, batch, forward)[0]


def lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the supervised tokens; 0 (zero gradient) when there are none."""
    nll, count = label_nll(model, batch)
    return nll / max(count, 1)


def _rows(blocks: Batch, n_blocks: int, device):
    n = min(n_blocks, blocks["input_ids"].shape[0])
    return n, ({k: v[i : i + 1].to(device) for k, v in blocks.items()} for i in range(n))


def _mean_loss(losses: list[float], n: int, n_blocks: int) -> float:
    if not losses:
        raise ValueError(
            f"stage2 validation: none of the first {n} blocks (eval_blocks={n_blocks}) has a supervised token "
            "(a label after position 0); raise eval_blocks or use validation data with non-empty outputs"
        )
    return sum(losses) / len(losses)


@torch.no_grad()
def validation_loss(model: nn.Module, blocks: Batch, n_blocks: int) -> float:
    """Mean over the first ``n_blocks`` blocks of each block's :func:`lm_loss`; blocks without a
    supervised token have no loss and are left out of the mean."""
    n, rows = _rows(blocks, n_blocks, next(model.parameters()).device)
    losses = []
    for batch in rows:
        nll, count = label_nll(model, batch)
        if count:
            losses.append(nll.item() / count)
    return _mean_loss(losses, n, n_blocks)


@torch.no_grad()
def validation_kl(model: nn.Module, blocks: Batch, n_blocks: int) -> tuple[float, float]:
    """``(mean KL, mean cross-entropy)`` over the first ``n_blocks`` blocks, from one student forward
    per block: each block's :func:`teacher_kl`, and its :func:`lm_loss` as in :func:`validation_loss`."""
    n, rows = _rows(blocks, n_blocks, next(model.parameters()).device)
    kls, losses = [], []
    for batch in rows:
        kl, logits = kl_and_logits(model, batch)
        kls.append(kl.item())
        nll, count = logits_nll(logits, batch["labels"])
        if count:
            losses.append(nll.item() / count)
    return sum(kls) / max(n, 1), _mean_loss(losses, n, n_blocks)


def wrap_for_stage2(model: nn.Module, spec: Stage2Spec) -> nn.Module:
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
            return teacher_kl(model, batch, forward), {}, None
        return lm_loss(forward, batch), {}, None

    def eval_fn():
        if spec.loss == "kl":  # the best checkpoint is the one closest to the teacher
            val_kl, val_xent = validation_kl(model, val, spec.eval_blocks)
            return val_kl, {"val_xent": val_xent, "val_ppl": math.exp(min(val_xent, 50.0))}, None
        val_loss = validation_loss(forward, val, spec.eval_blocks)
        return val_loss, {"val_ppl": math.exp(min(val_loss, 50.0))}, None

    loop = LoopSpec(
        stage=STAGE2, steps=spec.steps, lr=spec.lr, weight_decay=spec.weight_decay, batch_size=spec.batch_size,
        grad_accum=spec.grad_accum, eval_every=spec.eval_every, seed=seed, plateau_patience=10 ** 9,
    )
    result = run_loop(loop, model, train, loss_fn, eval_fn, run_dir, progress, config, parallel)
    load_best(model, run_dir, STAGE2)
    return result
