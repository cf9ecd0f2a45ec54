"""The two training stages on several devices: block-wise stage 1 and data-parallel stage 2.

Launch one process per device (``N`` = number of GPUs; on CPU, ``N`` processes with gloo) with the
command line :mod:`core.cli.distributed`::

    python -m torch.distributed.run --standalone --nproc_per_node N -m core.cli.distributed stage1 --config my.yaml --output my-run
    accelerate launch --num_processes N -m core.cli.distributed stage2 --config my.yaml --output my-run
    lolcats convert my.yaml --output my-run --resume     # both stages found finished: evaluation, report.json

Stage 1 (attention transfer) needs ``stage1.layers_per_block``. With teacher forcing, every block
of layers trains only on the teacher's hidden states entering it, so blocks are independent: the
trainable blocks are dealt out round-robin (block ``i`` of the list to process ``i % N``), each
process caches the teacher inputs of its own blocks under ``<run>/stage1/cache`` and trains them
exactly as the single-process block-wise run does, and rank 0 gathers every block's best tensors
into ``<run>/stage1/best`` (:func:`core.train.distill_attention.gather_blocks`). The result
equals the single-process block-wise run's, tensor for tensor. No gradient ever crosses processes.

Stage 2 (LoRA) is data-parallel. Every process sees the whole model; of each optimizer step's
``grad_accum`` micro-batches, process ``r`` takes ``r, r + N, ...``; gradients are averaged across
processes before the step, so a step equals the single-process step with the same global batch
(``batch_size x grad_accum``, which must be a multiple of ``N``). Rank 0 reports progress and
writes the checkpoints. Two strategies (``strategy``, ``--strategy`` on the command line):

- ``ddp`` (default): accelerate's DDP (gloo on CPU, NCCL on GPUs); every process holds a full copy.
- ``fsdp``, for models that do not fit one device: torch's ``fully_shard`` (FSDP2) shards each
  decoder layer and the rest of the model across the processes, so each holds about 1/N of the
  weights and gathers one layer at a time. The model is loaded on the CPU (each process needs the
  host memory for one copy) and moved to its device shard by shard. Chosen also when
  ``accelerate launch`` is configured for FSDP. accelerate's own FSDP wrapper is not used: it
  refuses CPU processes, and the sharding here is the same ``fully_shard`` it calls.

Both commands continue whatever the run folder already holds (each block and stage resumes from
its last checkpoint) after checking that the folder's ``config.json`` matches the config. All
processes must see the same run folder (one machine, or a shared filesystem). Precision is the
run config's ``model.dtype``; accelerate's own mixed precision is not used.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from core.config import ConfigError, ConvertConfig
from core.pipeline.prelude import save_stage_summary, stage_finished, start_run
from core.progress import ProgressCallback
from core.run_folder import STAGE1, STAGE2


# ---------------------------------------------------------------------------------------------
# Process group
# ---------------------------------------------------------------------------------------------


@dataclass
class Group:
    """This process's place in the launch: rank, world size, and the device it trains on."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    owns_group: bool = False  # this object initialised the default process group (and closes it)

    @classmethod
    def start(cls, device: str = "auto") -> "Group":
        """Join the launch described by torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
        MASTER_ADDR/PORT); a plain ``python`` start is a group of one with no collectives."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        device = rank_device(device, local)
        owns = False
        if world > 1 and not dist.is_initialized():
            if device.startswith("cuda"):
                torch.cuda.set_device(torch.device(device))
            dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
            owns = True
        return cls(rank, world, local, device, owns)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            if self.device.startswith("cuda"):
                dist.barrier(device_ids=[torch.device(self.device).index or 0])
            else:
                dist.barrier()

    def gather(self, obj) -> list | None:
        """Every process's ``obj`` on rank 0 (a list in rank order), None elsewhere."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size if self.main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def rank_device(device: str, local_rank: int) -> str:
    """The device of local process ``local_rank``: ``auto``/``cuda`` become ``cuda:<local_rank>``
    when GPUs are visible, ``cpu`` stays ``cpu``; an explicit ``cuda:N`` is refused (one device per process)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"process {local_rank} needs GPU {local_rank} but only {torch.cuda.device_count()} are "
                              "visible; launch at most that many processes per machine")
        return f"cuda:{local_rank}"
    if device.startswith("cuda:"):
        raise ConfigError(f"model.device {device!r} pins one GPU; multi-device runs need 'auto' or 'cuda' "
                          "(each process takes the GPU of its local rank)")
    return device


# ---------------------------------------------------------------------------------------------
# Stage 2 strategy
# ---------------------------------------------------------------------------------------------


STRATEGIES = ("ddp", "fsdp")


def stage2_strategy(requested: str | None, distributed_type) -> str:
    """``ddp`` or ``fsdp``: the one asked for, else FSDP when accelerate is configured for it, else DDP.
    accelerate modes this module does not drive (DeepSpeed, Megatron-LM, XLA, ...) are refused."""
    from accelerate.utils import DistributedType

    if requested is not None and requested not in STRATEGIES:
        raise ConfigError(f"unknown stage 2 strategy {requested!r}; choose one of {', '.join(STRATEGIES)}")
    if distributed_type == DistributedType.FSDP:
        if requested == "ddp":
            raise ConfigError("accelerate is configured for FSDP but --strategy ddp was given; drop one of the two")
        return "fsdp"
    if distributed_type not in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        raise ConfigError(
            f"stage 2 runs with DDP or FSDP; accelerate is configured for {distributed_type.value}, which is not "
            "supported here. Launch with `accelerate launch --multi_gpu --num_processes N` or torchrun, and pass "
            "--strategy fsdp to shard the model"
        )
    return requested or "ddp"


# ---------------------------------------------------------------------------------------------
# Progress of one process
# ---------------------------------------------------------------------------------------------


class RankProgress:
    """Prints one line per validation and per log message, prefixed with the rank."""

    def __init__(self, rank: int, stream=None):
        self.rank, self.stream = rank, stream or sys.stdout

    def on_step(self, stage, step, total, metrics, layer_metrics=None) -> None:
        if "val_loss" in metrics or step == total:
            shown = " ".join(f"{k}={v:.5g}" for k, v in metrics.items())
            print(f"[rank {self.rank}] {stage} step {step}/{total} {shown}", file=self.stream, flush=True)

    def on_log(self, message: str) -> None:
        print(f"[rank {self.rank}] {message}", file=self.stream, flush=True)

    def should_stop(self) -> bool:
        return False


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------


def run_stage1(config: ConvertConfig, output: str | os.PathLike, workspace: str | os.PathLike | None = None,
               progress: ProgressCallback | None = None) -> dict:
    """This process's share of block-wise attention transfer; rank 0 gathers ``stage1/best``.

    Returns ``{"blocks": {...}, "ranks": {rank: [block, ...]}}`` on rank 0 (its own share elsewhere)."""
    from core.attention.surgery import linearize
    from core.pipeline.softmax_choice import check_budget
    from core.train.distill_attention import gather_blocks, train_stage1_blockwise, trainable_blocks

    spec = config.stage1
    if not spec.enabled:
        raise ConfigError("stage1.enabled is false: there is no attention transfer to run")
    if spec.layers_per_block is None:
        raise ConfigError("multi-device stage 1 is block-wise: set stage1.layers_per_block (for example 1, or the "
                          "layer count divided by the number of devices)")
    output = Path(output)
    group = Group.start(config.model.device)
    progress = progress or RankProgress(group.rank)
    dumped = config.model_dump()
    try:
        run = start_run(config, output, resume=True, workspace=workspace, device=group.device, progress=progress,
                        main=group.main, barrier=group.barrier)
        model, train, val = linearize(run.model, config.attention), run.train, run.val
        check_budget(model, config.attention)
        blocks = sorted(trainable_blocks(model, spec.layers_per_block))
        shares = {r: blocks[r :: group.world_size] for r in range(group.world_size)}
        if stage_finished(output, STAGE1, spec.steps):
            progress.on_log(f"stage1: already finished in {output}")
            return {"blocks": {}, "ranks": shares, "finished": True}
        mine = shares[group.rank]
        if group.main and group.world_size > len(blocks):
            progress.on_log(f"stage1: {len(blocks)} trainable blocks for {group.world_size} processes; "
                            f"{group.world_size - len(blocks)} process(es) stay idle")
        result = {"blocks": {}}
        if mine:
            result = train_stage1_blockwise(model, spec, train, val, output, progress, config.seed, dumped, blocks=mine)
        everyone = group.gather(result["blocks"])  # also waits until every block checkpoint is written
        if group.main:
            gather_blocks(model, output, spec.steps, dumped)
            result = {"blocks": {name: r for part in everyone for name, r in part.items()}, "ranks": shares}
            save_stage_summary(output, STAGE1, {"blocks": result["blocks"]})
            progress.on_log(f"stage1: {len(result['blocks'])} blocks from {group.world_size} process(es) gathered "
                            f"into {output / STAGE1 / 'best'}")
        group.barrier()  # nobody leaves before stage1/best exists
        return result
    finally:
        group.close()  # no collective here: after an error in one process the others are stopped by the launcher


def run_stage2(config: ConvertConfig, output: str | os.PathLike, workspace: str | os.PathLike | None = None,
               progress: ProgressCallback | None = None, strategy: str | None = None) -> dict:
    """Data-parallel LoRA fine-tuning of a run whose stage 1 is finished (or disabled).

    One process (no launcher) runs the ordinary single-process loop; under ``accelerate launch``
    or torchrun every process takes its share of each step's micro-batches, with the model
    replicated (``strategy="ddp"``) or sharded (``"fsdp"``); ``None`` picks from accelerate's config."""
    from accelerate import Accelerator

    from core.attention.surgery import linearize
    from core.load import apply_saved_choice
    from core.pipeline.softmax_choice import choose_softmax_layers
    from core.train.finetune_lora import train_stage2, wrap_for_stage2
    from core.train.loop import load_best
    from core.train.parallel import ONE_PROCESS, DataParallel, ShardedDataParallel, held_fraction

    spec = config.stage2
    if not spec.enabled:
        raise ConfigError("stage2.enabled is false: there is no LoRA fine-tuning to run")
    output = Path(output)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = rank_device(config.model.device, int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1 and spec.grad_accum % world:
        raise ConfigError(f"stage2.grad_accum ({spec.grad_accum}) must be a multiple of the number of processes "
                          f"({world}): each process takes grad_accum / {world} micro-batches of every step")
    accelerator = Accelerator(cpu=device == "cpu", mixed_precision="no")
    strategy = stage2_strategy(strategy, accelerator.distributed_type)
    sharded = strategy == "fsdp" and accelerator.num_processes > 1
    rank = accelerator.process_index
    progress = progress or RankProgress(rank)
    main = accelerator.is_main_process
    try:
        load_on = "cpu" if sharded else str(accelerator.device)  # sharding moves each shard to the device
        run = start_run(config, output, resume=True, workspace=workspace, device=load_on, progress=progress, main=main,
                        barrier=accelerator.wait_for_everyone)
        model, train, val = linearize(run.model, config.attention), run.train, run.val
        if config.stage1.enabled:
            if not stage_finished(output, STAGE1, config.stage1.steps):
                raise ConfigError(f"stage 1 is not finished in {output}; run `python -m core.cli.distributed stage1` (or "
                                  "`lolcats convert`) on this run folder first")
            load_best(model, output, STAGE1)
        if main:  # softmax_layers "auto": the main process chooses (or reads its choice), then the others read it
            choose_softmax_layers(model, config, val, output, progress)
        accelerator.wait_for_everyone()
        if not main:
            apply_saved_choice(model, config, output)
        torch.manual_seed(config.seed)  # the same LoRA initialisation on every process
        model = wrap_for_stage2(model, spec)
        if stage_finished(output, STAGE2, spec.steps):
            progress.on_log(f"stage2: already finished in {output}")
            return {"finished": True}
        if accelerator.num_processes == 1:
            parallel, wrapped = ONE_PROCESS, model
        else:
            parallel = (ShardedDataParallel if sharded else DataParallel)(accelerator)
            wrapped = parallel.prepare(model)  # FSDP shards in place: the same module
            held, total = held_fraction(wrapped)
            progress.on_log(f"stage2: {'sharded (FSDP)' if sharded else 'data-parallel (DDP)'} over "
                            f"{parallel.world_size} processes on {accelerator.device.type}, "
                            f"{spec.grad_accum // parallel.world_size} micro-batches per process and step; this "
                            f"process holds {held:,} of {total:,} parameter elements")
        summary = train_stage2(model, spec, train, val, output, progress, config.seed, config.model_dump(),
                               parallel=parallel, forward_model=wrapped)
        if main:
            save_stage_summary(output, STAGE2, summary)
        return summary
    finally:
        if dist.is_initialized():  # no collective here: after an error the launcher stops the other processes
            dist.destroy_process_group()
