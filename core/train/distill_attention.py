"""Stage 1, attention transfer: train feature maps and window factors to mimic softmax attention.

Every pretrained weight is frozen. Each converted layer computes teacher (softmax) and student
(LoLCATs) head outputs from the same q, k, v and passes the teacher's on (teacher forcing,
recorded by :func:`core.train.teacher_forcing.teacher_forcing`), so layers train jointly without
gradients crossing layers. Per batch:

    loss = mse_factor * mean_layers MSE(y_student, y_teacher) + xent_factor * mean_layers CE(A_teacher, A_student)

with MSE over real tokens, heads and head dims (outputs before o_proj) and CE the cross-entropy
between the teacher's softmax rows and the student's effective attention rows (quadratic in
length, so only computed when xent_factor > 0).

Reported metrics: the training ``loss`` and ``mse`` (mean over layers) of every step, each layer's
training ``train_mse`` every few steps (:func:`core.train.loop.layer_report_due`), and at each
validation ``val_loss``, ``val_mse`` and each layer's ``mse``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from safetensors.torch import load_file, save_file
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from kernels.hybrid.naive import hybrid_attention_matrix, softmax_attention_matrix
from core.train.checkpoint import load_checkpoint, save_checkpoint
from core.config import Stage1Spec
from core.attention.layer import teacher_attention
from core.attention.rotary import layer_rotary
from core.attention.surgery import lolcats_modules, sliding_layers
from core.progress import ProgressCallback
from core.train.loop import Batch, LoopSpec, load_best, run_loop
from core.train.parallel import ONE_PROCESS
from core.train.teacher_forcing import teacher_forcing
from core.run_folder import STAGE1


def freeze_for_stage1(model: nn.Module, layers: range | None = None) -> None:
    """Only what conversion adds (feature maps, mixing factors, history exponents) of ``layers``
    (default all converted layers) trains."""
    trainable = set()
    for i, module in lolcats_modules(model).items():
        if layers is None or i in layers:
            trainable.update(id(p) for p in module.trained_parameters())
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)


def _masked_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    err = (student.float() - teacher.float()).pow(2).mean(dim=(1, 3))  # [B, L]
    if mask is None:
        return err.mean()
    m = mask.float()
    return (err * m).sum() / m.sum().clamp(min=1)


def _xent(module, qk: tuple[torch.Tensor, ...], mask) -> torch.Tensor:
    q, k, qf, kf = qk
    teacher = softmax_attention_matrix(q, k, module.scaling)
    student = hybrid_attention_matrix(q, k, qf, kf, module.mix, module.kind, module.window_size, module.scaling,
                                       sinks=module.sink_tokens, decay=module.log_decay())
    ce = -(teacher * student.clamp(min=1e-12).log()).sum(-1).mean(1)  # [B, L]
    if mask is None:
        return ce.mean()
    return (ce * mask.float()).sum() / mask.float().sum().clamp(min=1)


def _run_layers(model: nn.Module, batch: Batch, layers: range) -> None:
    """Decoder layers ``layers`` on cached teacher inputs ``batch["hidden"]`` [B, L, D] (no padding)."""
    decoder = model.get_decoder()
    h = batch["hidden"]
    pos = torch.arange(h.shape[1], device=h.device)[None]
    # what the decoder gives each layer: its rotary table (Gemma 3: one per layer type) and its causal
    # mask, a sliding window for the model's own sliding-window layers (their teacher attends to it)
    rotary = {i: layer_rotary(model, i) for i in layers}
    tables = {r.layer_type: r(h, pos) for r in rotary.values()}
    sliding = sliding_layers(model.config.get_text_config(decoder=True), len(decoder.layers))
    mask_args = dict(config=decoder.config, inputs_embeds=h, attention_mask=None, past_key_values=None, position_ids=pos)
    masks = {False: create_causal_mask(**mask_args)}
    if sliding & set(layers):
        masks[True] = create_sliding_window_causal_mask(**mask_args)
    for i in layers:
        h = decoder.layers[i](h, attention_mask=masks[i in sliding], position_embeddings=tables[rotary[i].layer_type],
                              position_ids=pos, use_cache=False)


def layer_losses(model: nn.Module, batch: Batch, xent: bool = False, layers: range | None = None
                 ) -> dict[int, dict[str, torch.Tensor]]:
    """Run the decoder (or ``layers`` on cached inputs) under teacher forcing; per converted layer
    {"mse": ..., ["xent": ...]}."""
    modules = {i: m for i, m in lolcats_modules(model).items() if layers is None or i in layers}
    mask = batch.get("attention_mask")
    with teacher_forcing(modules, keep_qk=xent) as record:
        if layers is None:
            model.get_decoder()(input_ids=batch["input_ids"], attention_mask=mask, use_cache=False)
        else:
            _run_layers(model, batch, layers)
    out = {}
    for i, m in modules.items():
        student, teacher = record.pairs[i]
        out[i] = {"mse": _masked_mse(student, teacher, mask)}
        if xent:
            out[i]["xent"] = _xent(m, record.qk[i], mask)
    return out


def combine(losses: dict[int, dict[str, torch.Tensor]], spec: Stage1Spec, n_layers: int | None = None) -> torch.Tensor:
    """mse_factor * mean MSE (+ xent_factor * mean CE) over layers. A block passes the model's
    converted-layer count as ``n_layers`` so each layer's loss (and gradient) has the same scale
    as in joint training."""
    n = n_layers or len(losses)
    loss = spec.mse_factor * torch.stack([v["mse"] for v in losses.values()]).sum() / n
    if spec.xent_factor > 0:
        loss = loss + spec.xent_factor * torch.stack([v["xent"] for v in losses.values()]).sum() / n
    return loss


@torch.no_grad()
def evaluate_layers(model: nn.Module, blocks: Batch, n_blocks: int, spec: Stage1Spec, layers: range | None = None
                    ) -> tuple[float, dict[int, float]]:
    """Mean stage-1 loss and per-layer MSE over the first ``n_blocks`` validation blocks."""
    device = next(model.parameters()).device
    n = min(n_blocks, blocks["input_ids"].shape[0] if "input_ids" in blocks else blocks["hidden"].shape[0])
    per_layer: dict[int, float] = {}
    total = 0.0
    for i in range(n):
        batch = {k: v[i : i + 1].to(device) for k, v in blocks.items()}
        losses = layer_losses(model, batch, xent=spec.xent_factor > 0, layers=layers)
        total += combine(losses, spec, len(lolcats_modules(model))).item() / n
        for layer, v in losses.items():
            per_layer[layer] = per_layer.get(layer, 0.0) + v["mse"].item() / n
    return total, per_layer


def _train(model, spec: Stage1Spec, train: Batch, val: Batch, run_dir: Path, progress: ProgressCallback, seed: int,
           config: dict, stage: str, layers: range | None) -> dict:
    freeze_for_stage1(model, layers)
    xent = spec.xent_factor > 0
    n_converted = len(lolcats_modules(model))

    def loss_fn(batch):
        losses = layer_losses(model, batch, xent=xent, layers=layers)
        mse = {i: v["mse"].item() for i, v in losses.items()}
        per_layer = {i: {"train_mse": v} for i, v in mse.items()}
        return combine(losses, spec, n_converted), {"mse": sum(mse.values()) / len(mse)}, per_layer

    def eval_fn():
        val_loss, per_layer = evaluate_layers(model, val, spec.eval_blocks, spec, layers)
        return val_loss, {"val_mse": sum(per_layer.values()) / len(per_layer)}, {i: {"mse": v} for i, v in per_layer.items()}

    loop = LoopSpec(
        stage=stage, steps=spec.steps, lr=spec.lr, weight_decay=spec.weight_decay, batch_size=spec.batch_size,
        grad_accum=spec.grad_accum, eval_every=spec.eval_every, seed=seed, plateau_patience=spec.plateau_patience,
        plateau_factor=spec.plateau_factor, min_lr=spec.min_lr,
    )
    result = run_loop(loop, model, train, loss_fn, eval_fn, run_dir, progress, config, ONE_PROCESS)
    load_best(model, run_dir, stage)
    return result


def train_stage1(
    model: nn.Module, spec: Stage1Spec, train: Batch, val: Batch, run_dir: Path, progress: ProgressCallback,
    seed: int, config: dict,
) -> dict:
    """Attention transfer (joint, or block-wise when ``spec.layers_per_block`` is set); leaves the
    best (lowest validation loss) weights loaded and in ``<run>/stage1/best``."""
    if spec.layers_per_block is None:
        return _train(model, spec, train, val, run_dir, progress, seed, config, STAGE1, None)
    return train_stage1_blockwise(model, spec, train, val, run_dir, progress, seed, config)


def layer_blocks(n_layers: int, layers_per_block: int) -> list[range]:
    return [range(s, min(s + layers_per_block, n_layers)) for s in range(0, n_layers, layers_per_block)]


@torch.no_grad()
def teacher_inputs(model: nn.Module, blocks: Batch, starts: list[int], folder: Path, rows: int | None = None
                   ) -> dict[int, torch.Tensor]:
    """Hidden states entering layers ``starts`` under the teacher, [N, L, D] each, cached on disk.

    With teacher forcing every layer sees the teacher's hidden states, so these are exactly the
    inputs the joint run gives each block. Files: ``folder/layer<s>.safetensors`` (atomic writes)."""
    files = {s: folder / f"layer{s}.safetensors" for s in starts}
    if all(f.is_file() for f in files.values()):
        return {s: load_file(str(f))["hidden"] for s, f in files.items()}
    mask = blocks.get("attention_mask")
    if mask is not None and not bool(mask.bool().all()):
        raise ValueError("block-wise attention transfer needs unpadded (packed) blocks; use packed data")
    device = next(model.parameters()).device
    n = blocks["input_ids"].shape[0] if rows is None else min(rows, blocks["input_ids"].shape[0])
    outs: dict[int, list[torch.Tensor]] = {s: [] for s in starts}
    with teacher_attention(lolcats_modules(model).values()):
        for i in range(n):
            # the decoder alone: the LM head's logits are not needed (Gemma 3's 262k-token head would be the slow part)
            hs = model.get_decoder()(input_ids=blocks["input_ids"][i : i + 1].to(device), use_cache=False,
                                     output_hidden_states=True).hidden_states
            for s in starts:
                outs[s].append(hs[s].float().cpu())
    folder.mkdir(parents=True, exist_ok=True)
    cached = {}
    for s, f in files.items():
        cached[s] = torch.cat(outs[s])
        tmp = f.with_name(f".{f.name}.tmp")
        save_file({"hidden": cached[s].contiguous()}, str(tmp))
        os.replace(tmp, f)
    return cached


def trainable_blocks(model: nn.Module, layers_per_block: int) -> dict[int, range]:
    """Block index -> its layers, for the blocks holding at least one converted layer (a block of
    softmax layers only has nothing to train)."""
    converted = lolcats_modules(model)
    ranges = layer_blocks(len(model.get_decoder().layers), layers_per_block)
    return {b: layers for b, layers in enumerate(ranges) if any(i in layers for i in converted)}


def train_stage1_blockwise(model, spec: Stage1Spec, train: Batch, val: Batch, run_dir: Path,
                           progress: ProgressCallback, seed: int, config: dict, blocks: list[int] | None = None) -> dict:
    """Split the layers into blocks of ``spec.layers_per_block``; cache each block's teacher inputs
    to disk; train blocks one after another (independently, so they could run on separate devices);
    gather every block's best tensors into one ``stage1/best`` checkpoint.

    ``blocks``: train only these block indices (one process's share of a multi-device run, see
    :mod:`core.pipeline.distributed`); their teacher inputs alone are cached, and the caller gathers."""
    plan = trainable_blocks(model, spec.layers_per_block)
    if blocks is not None:
        plan = {b: layers for b, layers in plan.items() if b in set(blocks)}
    starts = [layers.start for layers in plan.values()]
    cache = run_dir / STAGE1 / "cache"
    progress.on_log(f"stage1: block-wise, {len(plan)} blocks of up to {spec.layers_per_block} layers"
                    + ("" if blocks is None else f" (blocks {sorted(plan)})"))
    train_in = teacher_inputs(model, train, starts, cache / "train")
    val_in = teacher_inputs(model, val, starts, cache / "val", rows=spec.eval_blocks)
    results = {}
    dtype = next(model.parameters()).dtype
    for b, layers in plan.items():
        results[f"block{b}"] = _train(
            model, spec, {"hidden": train_in[layers.start].to(dtype)}, {"hidden": val_in[layers.start].to(dtype)},
            run_dir, progress, seed, config, f"stage1/block{b}", layers,
        )
    if blocks is None:
        gather_blocks(model, run_dir, spec.steps, config)
        freeze_for_stage1(model)
    return {"blocks": results}


def gather_blocks(model: nn.Module, run_dir: Path, steps: int, config: dict) -> None:
    """One ``stage1/best`` (and a finished ``stage1/last``) from the per-block best checkpoints."""
    tensors = {}
    for block in sorted((run_dir / STAGE1).glob("block*")):
        tensors.update(load_checkpoint(block / "best")[0])
    state = {"stage": STAGE1, "step": steps, "blocks": len(list((run_dir / STAGE1).glob("block*"))),
             "config": config}
    save_checkpoint(run_dir / STAGE1 / "best", tensors, state)
    save_checkpoint(run_dir / STAGE1 / "last", tensors, state)


__all__ = ["freeze_for_stage1", "layer_losses", "evaluate_layers", "train_stage1", "train_stage1_blockwise",
           "teacher_inputs", "layer_blocks", "trainable_blocks", "gather_blocks"]
