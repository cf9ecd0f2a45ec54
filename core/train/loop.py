"""The optimisation loop both stages share: accumulation, validation, checkpoints, resume, stop.

A recipe supplies ``loss_fn(batch) -> (loss, metrics, layer_metrics)`` and ``eval_fn() -> (val_loss,
metrics, layer_metrics)`` (``layer_metrics``: layer index -> its metrics, or None); the loop owns
AdamW, ReduceLROnPlateau, the deterministic batch order, and the checkpoints ``<run>/<stage>/last``
(resume point, with optimizer state) and ``<run>/<stage>/best`` (lowest validation loss). Batch
order depends only on (seed, step), so a resumed run sees the same batches, and with the restored
optimizer and RNG state gives the same losses, as one that never stopped.

Every run goes through a :class:`core.train.parallel.Parallel` (one process, DDP or FSDP): every
process runs the same loop on the same parameters; process ``r`` of ``N`` takes micro-batches
``r, r + N, ...`` of each accumulation group, gradients are averaged across processes before the
optimizer step (so the step equals the single-process step with the same global batch), stop
requests and checkpoint writes belong to rank 0 (every process takes part in gathering sharded
parameters for a checkpoint), and metrics are summed across processes.

Training metrics are reported after every step; the per-layer ones of ``loss_fn`` (the metric rows
of a job grow with layers x reports) at the steps :func:`layer_report_due` names, each one the mean
over the steps since the previous report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from core.train.checkpoint import (has_checkpoint, load_checkpoint, load_optimizer_state, load_trainable, local,
                                   optimizer_state, restore_rng, save_checkpoint, trainable_state)
from core.io import is_oom
from core.progress import ProgressCallback, StopRequested
from core.run_folder import CONFIG_FILE, check_intact
from core.train.parallel import Parallel

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


LAYER_REPORTS = 100  # per-layer training reports of a stage: about this many, wherever it has more steps


def layer_report_due(step: int, steps: int) -> bool:
    """Whether the per-layer training metrics are reported after ``step`` of ``steps``: after the
    first and the last step, and every ``ceil(steps / LAYER_REPORTS)`` steps (every step of a stage
    of at most LAYER_REPORTS steps)."""
    return step in (1, steps) or step % math.ceil(steps / LAYER_REPORTS) == 0


class LayerMeans:
    """Per-layer metrics summed step by step; taken as their mean over the steps added since the last take."""

    def __init__(self) -> None:
        self.sums: dict[int, dict[str, float]] = {}
        self.steps = 0

    def add(self, layer_metrics: dict[int, dict[str, float]]) -> None:
        """Add one step's metrics (nothing when the recipe reports none)."""
        if layer_metrics:
            for layer, values in layer_metrics.items():
                _accumulate(self.sums.setdefault(layer, {}), values, 1.0)
            self.steps += 1

    def take(self) -> dict[int, dict[str, float]] | None:
        """The means since the last take (None when no step was added), and start over."""
        means = {layer: {k: v / self.steps for k, v in values.items()} for layer, values in self.sums.items()}
        self.sums, self.steps = {}, 0
        return means or None


def _accumulate(into: dict[str, float], values: dict[str, float], weight: float) -> None:
    for k, v in values.items():
        into[k] = into.get(k, 0.0) + v * weight


def _sum_layers(parallel: Parallel, layer_metrics: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """``layer_metrics`` summed over all processes (through one ``all_sum``)."""
    keys = [(layer, k) for layer, values in layer_metrics.items() for k in values]
    summed = parallel.all_sum({f"{layer}/{k}": layer_metrics[layer][k] for layer, k in keys})
    out: dict[int, dict[str, float]] = {}
    for layer, k in keys:
        out.setdefault(layer, {})[k] = summed[f"{layer}/{k}"]
    return out


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


def oom_message(stage: str, step: int, spec: LoopSpec) -> str:
    return (
        f"out of memory in {stage} at step {step} (batch_size={spec.batch_size}); lower batch_size or "
        "data.seq_len, raise grad_accum instead, or use a smaller dtype"
    )


def run_loop(
    spec: LoopSpec,
    model: nn.Module,
    blocks: Batch,
    loss_fn: Callable[[Batch], tuple[torch.Tensor, dict[str, float], dict[int, dict[str, float]] | None]],
    eval_fn: Callable[[], tuple[float, dict[str, float], dict[int, dict[str, float]] | None]],
    run_dir: Path,
    progress: ProgressCallback,
    config: dict,
    parallel: Parallel,
) -> dict:
    """Train the model's trainable parameters; returns {"best_val_loss", "steps", "resumed_from"}.

    ``model`` is the unwrapped model (its parameters, checkpoint names); ``loss_fn`` runs the one
    ``parallel`` wrapped; ``spec.grad_accum`` must be a multiple of ``parallel.world_size``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{spec.stage}: the model has no trainable parameters")
    device = params[0].device
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, factor=spec.plateau_factor, patience=spec.plateau_patience, min_lr=spec.min_lr
    )
    last_dir, best_dir = run_dir / spec.stage / "last", run_dir / spec.stage / "best"
    main = parallel.rank == 0  # the process that reports progress and writes checkpoints
    if spec.grad_accum % parallel.world_size:
        raise ValueError(
            f"{spec.stage}: grad_accum ({spec.grad_accum}) must be a multiple of the number of processes "
            f"({parallel.world_size}): each process takes grad_accum / processes micro-batches of every step"
        )
    mine = range(parallel.rank, spec.grad_accum, parallel.world_size)
    start, best_val = 0, math.inf
    if has_checkpoint(last_dir):
        tensors, state = load_checkpoint(last_dir)
        load_trainable(model, tensors, f"{spec.stage} checkpoint {last_dir}")
        load_optimizer_state(opt, state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start, best_val = state["step"], state["best_val_loss"]
        restore_rng(state)
        progress.on_log(f"{spec.stage}: resuming after step {start} from {last_dir}")

    in_run_folder = (run_dir / CONFIG_FILE).is_file()  # a conversion's run folder, not a bare output folder

    def write(path: Path, tensors: dict, state: dict, opt_state: dict | None = None) -> None:  # rank 0 only
        if not in_run_folder:
            save_checkpoint(path, tensors, state, opt_state)
            return
        check_intact(run_dir)  # never recreate a deleted run folder with checkpoints alone
        try:
            save_checkpoint(path, tensors, state, opt_state, parents=False)
        except FileNotFoundError:
            check_intact(run_dir)  # deleted while this checkpoint was being written: say so
            raise

    def save(step: int) -> None:  # every process gathers (sharded models), rank 0 writes
        tensors, opt_state = trainable_state(model), optimizer_state(opt)
        if main:
            state = {"stage": spec.stage, "step": step, "best_val_loss": best_val, "scheduler": sched.state_dict(),
                     "config": config}
            write(last_dir, tensors, state, opt_state)

    step = start
    layer_means = LayerMeans()
    try:
        for step in range(start + 1, spec.steps + 1):
            if parallel.main_decides(progress.should_stop() if main else False):
                save(step - 1)
                progress.on_log(f"{spec.stage}: stopped after step {step - 1}; checkpoint in {last_dir}")
                raise StopRequested(f"{spec.stage} stopped after step {step - 1}")
            model.train()
            opt.zero_grad(set_to_none=True)
            totals: dict[str, float] = {}
            step_layers: dict[int, dict[str, float]] = {}
            for j, m in enumerate(mine):
                batch = batch_at(blocks, (step - 1) * spec.grad_accum + m, spec.batch_size, spec.seed)
                batch = {k: v.to(device) for k, v in batch.items()}
                loss, metrics, layer_metrics = loss_fn(batch)
                # the gradient average over processes turns world_size / grad_accum into 1 / grad_accum
                parallel.backward(loss * parallel.world_size / spec.grad_accum, sync=j == len(mine) - 1)
                _accumulate(totals, {"loss": loss.item(), **metrics}, 1 / spec.grad_accum)
                for layer, values in (layer_metrics or {}).items():
                    _accumulate(step_layers.setdefault(layer, {}), values, 1 / spec.grad_accum)
            grads_finite = all(torch.isfinite(local(p.grad)).all() for p in params if p.grad is not None)
            totals = parallel.all_sum(totals)  # every process must take the same decisions
            layer_means.add(_sum_layers(parallel, step_layers))
            if not math.isfinite(totals["loss"]):
                raise NonFiniteLossError(_non_finite(spec.stage, totals["loss"], step, last_dir))
            grads_finite = parallel.all_sum({"bad": float(not grads_finite)})["bad"] == 0
            if not grads_finite:
                raise NonFiniteLossError(f"{spec.stage}: non-finite gradients at step {step}; lower the learning rate")
            opt.step()
            totals["lr"] = opt.param_groups[0]["lr"]
            per_layer = layer_means.take() if layer_report_due(step, spec.steps) else None
            if main:
                progress.on_step(spec.stage, step, spec.steps, totals, per_layer)
            if step % spec.eval_every == 0 or step == spec.steps:
                model.eval()
                val, val_metrics, layer_metrics = eval_fn()
                # the mean over processes: the same number everywhere, so the schedules agree
                mean = parallel.all_sum({"val_loss": val, **val_metrics})
                val = mean.pop("val_loss") / parallel.world_size
                val_metrics = {k: v / parallel.world_size for k, v in mean.items()}
                sched.step(val)
                if main:
                    progress.on_step(spec.stage, step, spec.steps, {"val_loss": val, **val_metrics}, layer_metrics)
                if val < best_val:
                    best_val = val
                    tensors = trainable_state(model)
                    if main:
                        write(best_dir, tensors, {"stage": spec.stage, "step": step, "val_loss": val, "config": config})
                save(step)
    except RuntimeError as e:
        if is_oom(e) and not isinstance(e, NonFiniteLossError):
            raise OutOfMemory(oom_message(spec.stage, step, spec)) from e
        raise
    except MemoryError as e:
        raise OutOfMemory(oom_message(spec.stage, step, spec)) from e
    parallel.barrier()  # rank 0's last checkpoints are written before anyone reads them
    model.eval()
    return {"best_val_loss": best_val, "steps": spec.steps, "resumed_from": start}


def _non_finite(stage: str, value: float, step: int, last_dir: Path) -> str:
    return (f"{stage}: non-finite loss ({value}) at step {step}; training stopped and the last good checkpoint is "
            f"kept ({last_dir if last_dir.exists() else 'none yet'}). Lower the learning rate or check the data.")


def load_best(model: nn.Module, run_dir: Path, stage: str) -> dict:
    """Load ``<run>/<stage>/best`` into the model; returns its state."""
    tensors, state = load_checkpoint(run_dir / stage / "best")
    load_trainable(model, tensors, f"{stage} checkpoint")
    return state
