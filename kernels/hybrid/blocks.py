"""Cache blocking for the PyTorch forms at inference on CPU.

The PyTorch forms of hybrid attention and of the feature maps are chains of whole-tensor ops:
each op reads and writes its full operand before the next starts. With a batch of 8 prompts of 1k
tokens the score tensor of one layer is 38 MB, far past a core's cache, and every op of the chain
streams it from memory; the same chain over one prompt (4.7 MB) runs almost three times faster
per token on a current x86 CPU. So inference on CPU runs the ops over independent pieces (batch
rows, then key/value heads or tokens), each small enough to stay in cache, and writes each
piece's result into the output. Autograd and CUDA tensors take the whole tensors (one graph, one
launch per op).

A hand-written rule because no library does this for a chain of PyTorch ops: ``torch.compile``
fuses elementwise ops but does not tile across the matrix products between them.
"""

from __future__ import annotations

import torch

BLOCK_BYTES = 8 << 20  # a piece's working set; measured best between 4 and 16 MiB on a 2 MiB-L2 CPU


def recorded(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an op on ``tensors`` (gradient mode on and one of them needs a gradient)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def cpu_inference(*tensors: torch.Tensor) -> bool:
    """Whether an op on ``tensors`` may run in pieces: they are on the CPU and autograd records
    nothing for them."""
    return tensors[0].device.type == "cpu" and not recorded(*tensors)


def blocks(outer: int, inner: int, unit_bytes: int, budget: int | None = None) -> list[tuple[slice, slice]]:
    """Pieces ``(outer slice, inner slice)`` covering ``outer x inner`` units of ``unit_bytes``
    each: whole inner ranges for as many outer indices as fit ``budget`` bytes (at least one),
    and when one outer index alone is too large, one outer index and as many inner units as fit."""
    budget = BLOCK_BYTES if budget is None else budget
    unit_bytes = max(1, int(unit_bytes))
    rows = budget // (unit_bytes * inner)
    if rows >= 1:
        return [(slice(b, min(b + rows, outer)), slice(0, inner)) for b in range(0, outer, rows)]
    per = max(1, budget // unit_bytes)
    return [(slice(b, b + 1), slice(i, min(i + per, inner))) for b in range(outer) for i in range(0, inner, per)]
