"""One process's part in training: :class:`Parallel`, the interface the loop drives, and its three forms.

* :class:`SingleProcess`: the whole batch in this process; no collectives.
* :class:`DataParallel`: DDP over an ``accelerate.Accelerator``'s processes; every process holds
  the whole model.
* :class:`ShardedDataParallel`: FSDP2 (torch's ``fully_shard``); every process holds about
  ``1 / world_size`` of the parameters.

In every form, of each optimizer step's ``grad_accum`` micro-batches process ``r`` of ``N`` takes
``r, r + N, ...``, and after the step's last ``backward(..., sync=True)`` each parameter's
gradient is the average over processes of their accumulated gradients.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from core.train.checkpoint import local


class Parallel(Protocol):
    """One process's part in training, as :func:`core.train.loop.run_loop` drives it."""

    rank: int
    world_size: int

    def backward(self, loss: torch.Tensor, sync: bool) -> None:
        """Backward of ``loss``; ``sync=False`` keeps the gradients local (more micro-batches follow),
        ``sync=True`` averages the accumulated gradients across processes."""
        ...

    def all_sum(self, values: dict[str, float]) -> dict[str, float]:
        """Each value summed over all processes."""
        ...

    def main_decides(self, flag: bool) -> bool:
        """Rank 0's ``flag``, on every process."""
        ...

    def barrier(self) -> None:
        """Return once every process got here."""
        ...


class SingleProcess:
    """:class:`Parallel` for a process that trains alone: rank 0 of 1, every collective the identity."""

    rank = 0
    world_size = 1

    def backward(self, loss: torch.Tensor, sync: bool) -> None:
        loss.backward()

    def all_sum(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def main_decides(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        pass


ONE_PROCESS = SingleProcess()  # stateless: one instance serves every single-process run


class DataParallel:
    """:class:`Parallel` over an ``accelerate.Accelerator``'s processes, DDP.

    ``prepare(model)`` wraps the model; the training loop calls ``backward(loss, sync)`` per
    micro-batch, with gradient sync only on a process's last one."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.rank, self.world_size = accelerator.process_index, accelerator.num_processes
        self.wrapped: nn.Module | None = None

    def prepare(self, model: nn.Module) -> nn.Module:
        self.wrapped = self.accelerator.prepare_model(model)
        return self.wrapped

    def backward(self, loss: torch.Tensor, sync: bool) -> None:
        if sync or self.wrapped is None:
            self.accelerator.backward(loss)
        else:
            with self.accelerator.no_sync(self.wrapped):
                self.accelerator.backward(loss)

    def all_sum(self, values: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1 or not values:
            return dict(values)
        keys = list(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.accelerator.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return {k: float(v) for k, v in zip(keys, t.tolist(), strict=True)}

    def main_decides(self, flag: bool) -> bool:
        if self.world_size == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.accelerator.device)
        dist.broadcast(t, src=0)
        return bool(t.item())

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()


class ShardedDataParallel(DataParallel):
    """FSDP: parameters sharded across the processes with torch's ``fully_shard`` (FSDP2).

    Each decoder layer is one sharding unit (gathered for its forward and backward, then freed);
    the root unit holds embeddings, final norm and head. Frozen and LoRA parameters shard alike;
    gradients exist only for the LoRA ones and are reduce-scattered (averaged) across processes
    on a process's last micro-batch of a step. Parameters become ``DTensor`` shards; checkpoints
    gather them whole (:mod:`core.train.checkpoint`)."""

    def prepare(self, model: nn.Module) -> nn.Module:
        """Shard ``model`` in place onto this process's device; returns it."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from core.attention.surgery import decoder_layers
        from core.train.lora import base_model

        mesh = init_device_mesh(self.accelerator.device.type, (self.world_size,))
        for layer in decoder_layers(base_model(model)):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.wrapped = model
        return model

    def backward(self, loss: torch.Tensor, sync: bool) -> None:
        self.wrapped.set_requires_gradient_sync(sync)
        loss.backward()


def held_fraction(model: nn.Module) -> tuple[int, int]:
    """(parameter elements this process holds, parameter elements of the whole model)."""
    params = list(model.parameters())
    return sum(local(p).numel() for p in params), sum(p.numel() for p in params)


__all__ = ["Parallel", "SingleProcess", "ONE_PROCESS", "DataParallel", "ShardedDataParallel", "held_fraction"]
