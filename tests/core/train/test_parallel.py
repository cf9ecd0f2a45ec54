"""The single-process form of the loop's Parallel interface: rank 0 of 1, collectives are the identity."""

from __future__ import annotations

import torch

from core.train.parallel import ONE_PROCESS, Parallel, SingleProcess


def test_single_process_is_rank_zero_of_one_with_identity_collectives():
    p: Parallel = SingleProcess()
    assert (p.rank, p.world_size) == (0, 1) and (ONE_PROCESS.rank, ONE_PROCESS.world_size) == (0, 1)
    values = {"loss": 1.5, "mse": 0.25}
    summed = p.all_sum(values)
    assert summed == values and summed is not values  # the loop may change its copy
    assert p.main_decides(True) is True and p.main_decides(False) is False
    p.barrier()


def test_single_process_backward_accumulates_like_plain_backward():
    w = torch.tensor([2.0, -1.0], requires_grad=True)
    ref = torch.tensor([2.0, -1.0], requires_grad=True)
    for i, x in enumerate((torch.tensor([1.0, 3.0]), torch.tensor([0.5, -2.0]))):
        ONE_PROCESS.backward((w * x).sum() / 2, sync=i == 1)
        ((ref * x).sum() / 2).backward()
    assert torch.equal(w.grad, ref.grad)
