"""The attention-free floor: the teacher with an attention that costs nothing.

Projections, MLPs, norms and the LM head are shared by teacher and student; only attention
differs. The floor is the teacher whose attention function returns zeros of the right shape
(``[B, L, H, d]``), registered as :data:`FLOOR_ATTENTION` through transformers'
``AttentionInterface``, and whose cache stores no keys or values (it only counts tokens, so
positions advance as in a real run). Its speed is the limit of any attention replacement, so
``student / floor`` says how much of the remaining gap is attention.

The floor shares the teacher's weights (no copy): it switches the teacher's attention
implementation for the length of each call and restores it afterwards.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin

FLOOR_ATTENTION = "lolcats_attention_free"


def attention_free(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask, **kwargs) -> tuple[torch.Tensor, None]:
    """The attention interface's contract with no attention: query ``[B, H, L, d]`` -> zeros ``[B, L, H, d]``.

    Registered without a mask function, so transformers builds no attention mask for it either."""
    B, H, L, _ = query.shape
    return query.new_zeros(B, L, H, value.shape[-1]), None


AttentionInterface.register(FLOOR_ATTENTION, attention_free)


class CountingLayer(CacheLayerMixin):
    """A cache layer that keeps no keys or values: it returns the new ones and counts the tokens."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self):
        super().__init__()
        self.seen = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.is_initialized = True
        self.seen += key_states.shape[-2]
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.seen = 0

    def offload(self):
        pass

    def prefetch(self):
        pass


class AttentionFreeFloor(nn.Module):
    """``teacher`` run with :func:`attention_free` attention and a :class:`CountingLayer` cache.

    Called like the teacher (``floor(input_ids=..., past_key_values=floor.new_cache(), ...)``);
    its parameters are the teacher's."""

    def __init__(self, teacher: nn.Module):
        super().__init__()
        self.teacher = teacher
        self.config = teacher.config

    def new_cache(self) -> Cache:
        layers = self.config.get_text_config(decoder=True).num_hidden_layers
        return Cache(layers=[CountingLayer() for _ in range(layers)])

    def forward(self, *args, **kwargs):
        config = self.teacher.config
        before = config._attn_implementation
        config._attn_implementation = FLOOR_ATTENTION
        try:
            return self.teacher(*args, **kwargs)
        finally:
            config._attn_implementation = before
