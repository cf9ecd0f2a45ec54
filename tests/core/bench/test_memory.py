"""Bytes a model and a cache hold: storages counted once, views counted by what they pin."""

from types import SimpleNamespace

import torch
from torch import nn

from core.bench import cache_bytes, weight_bytes


def test_weight_bytes_count_shared_tensors_once():
    model = nn.Linear(3, 2)
    model.register_buffer("alias", model.weight.detach()[:1])  # a view of the weight, not new memory
    assert weight_bytes(model) == (3 * 2 + 2) * 4


def test_cache_bytes_count_the_storage_a_view_pins():
    big = torch.zeros(100)
    cache = SimpleNamespace(layers=[SimpleNamespace(keys=big[:10], values=big[10:20]),
                                    SimpleNamespace(keys=torch.zeros(3, dtype=torch.float64), values=[])])
    assert cache_bytes(cache) == 100 * 4 + 3 * 8
