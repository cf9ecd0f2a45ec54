"""The optimisation loop both stages share: accumulation, validation, checkpoints, resume, stop.

A recipe supplies ``loss_fn(batch) -> (loss, metrics)`` and ``eval_fn() -> (val_loss, metrics,
layer_metrics)``; the loop owns AdamW, ReduceLROnPlateau, the deterministic batch order, and the
checkpoints ``<run>/<stage>/last`` (resume point, with optimizer state) and ``<run>/<stage>/best``
(lowest validation loss). Batch order depends only on (seed, step), so a resumed run sees the
same batches, and with the restored optimizer and RNG state gives the same losses, as one that
never stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from core.checkpoint import load_checkpoint, load_trainable, restore_rng, save_checkpoint, trainable_state
from core.progress import ProgressCallback, StopRequested

Batch = dict[str, torch.Tensor]


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss."""


class OutOfMemory(RuntimeError):
    """Training ran out of (device or host) memory."""


@dataclass
class LoopSpec:
    stage: str
    steps: int
    lr: float
    weight_decay: float
    batch_size: int
    grad_accum: int
    eval_every: int
    seed: int
    plateau_patience: int = 10
    plateau_factor: float = 0.1
    min_lr: float = 0.0


def batch_at(blocks: Batch, index: int, batch_size: int, seed: int) -> Batch:
    """Micro-batch number ``index`` of an endless shuffled pass over ``blocks`` (epoch by epoch)."""
    n = next(iter(blocks.values())).shape[0]
    start = index * batch_size
    rows = []
    for pos in range(start, start + batch_size):
        epoch, offset = divmod(pos, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        rows.append(int(perm[offset]))
    return {k: v[rows] for k, v in blocks.items()}


def is_oom(err: BaseException) -> bool:
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(err).lower()


def oom_message(stage: str, step: int, spec: LoopSpec) -> str:
    return (
        f"out of memory in {stage} at step {step} (batch_size={spec.batch_size}); lower batch_size or "
        "data.seq_len, raise grad_accum instead, or use a smaller dtype"
    )


def run_loop(
    spec: LoopSpec,
    model: nn.Module,
    blocks: Batch,
    loss_fn: Callable[[Batch], tuple[torch.Tensor, dict[str, float]]],
    eval_fn: Callable[[], tuple[float, dict[str, float], dict[int, dict[str, float]] | None]],
    run_dir: Path,
    progress: ProgressCallback,
    config: dict,
) -> dict:
    """Train the model's trainable parameters; returns {"best_val_loss", "steps", "resumed_from"}."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{spec.stage}: the model has no trainable parameters")
    device = params[0].device
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, factor=spec.plateau_factor, patience=spec.plateau_patience, min_lr=spec.min_lr
    )
    last_dir, best_dir = run_dir / spec.stage / "last", run_dir / spec.stage / "best"
    start, best_val = 0, math.inf
    if last_dir.exists():
        tensors, state = load_checkpoint(last_dir)
        load_trainable(model, tensors, f"{spec.stage} checkpoint {last_dir}")
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start, best_val = state["step"], state["best_val_loss"]
        restore_rng(state)
        progress.on_log(f"{spec.stage}: resuming after step {start} from {last_dir}")

    def save(step: int) -> None:
        state = {"stage": spec.stage, "step": step, "best_val_loss": best_val, "scheduler": sched.state_dict(),
                 "config": config}
        save_checkpoint(last_dir, trainable_state(model), state, opt)

    step = start
    try:
        for step in range(start + 1, spec.steps + 1):
            if progress.should_stop():
                save(step - 1)
                progress.on_log(f"{spec.stage}: stopped after step {step - 1}; checkpoint in {last_dir}")
                raise StopRequested(f"{spec.stage} stopped after step {step - 1}")
            model.train()
            opt.zero_grad(set_to_none=True)
            totals: dict[str, float] = {}
            for m in range(spec.grad_accum):
                batch = batch_at(blocks, (step - 1) * spec.grad_accum + m, spec.batch_size, spec.seed)
                batch = {k: v.to(device) for k, v in batch.items()}
                loss, metrics = loss_fn(batch)
                if not torch.isfinite(loss):
                    raise NonFiniteLossError(
                        f"{spec.stage}: non-finite loss ({loss.item()}) at step {step}; training stopped and the "
                        f"last good checkpoint is kept ({last_dir if last_dir.exists() else 'none yet'}). "
                        "Lower the learning rate or check the data."
                    )
                (loss / spec.grad_accum).backward()
                for k, v in {"loss": loss.item(), **metrics}.items():
                    totals[k] = totals.get(k, 0.0) + v / spec.grad_accum
            grads_finite = all(torch.isfinite(p.grad).all() for p in params if p.grad is not None)
            if not grads_finite:
                raise NonFiniteLossError(f"{spec.stage}: non-finite gradients at step {step}; lower the learning rate")
            opt.step()
            totals["lr"] = opt.param_groups[0]["lr"]
            progress.on_step(spec.stage, step, spec.steps, totals)
            if step % spec.eval_every == 0 or step == spec.steps:
                model.eval()
                val, val_metrics, layer_metrics = eval_fn()
                sched.step(val)
                progress.on_step(spec.stage, step, spec.steps, {"val_loss": val, **val_metrics}, layer_metrics)
                if val < best_val:
                    best_val = val
                    save_checkpoint(best_dir, trainable_state(model), {"stage": spec.stage, "step": step,
                                                                        "val_loss": val, "config": config})
                save(step)
    except RuntimeError as e:
        if is_oom(e) and not isinstance(e, NonFiniteLossError):
            raise OutOfMemory(oom_message(spec.stage, step, spec)) from e
        raise
    except MemoryError as e:
        raise OutOfMemory(oom_message(spec.stage, step, spec)) from e
    model.eval()
    return {"best_val_loss": best_val, "steps": spec.steps, "resumed_from": start}


def load_best(model: nn.Module, run_dir: Path, stage: str) -> dict:
    """Load ``<run>/<stage>/best`` into the model; returns its state."""
    tensors, state = load_checkpoint(run_dir / stage / "best")
    load_trainable(model, tensors, f"{stage} checkpoint")
    return state
