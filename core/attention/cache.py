"""A transformers cache layer that holds the recurrent state of one converted attention layer.

Converted layers swap their slot in the model's ``DynamicCache`` for a :class:`HybridCacheLayer`
on first use, so ``model.generate`` and manual prefill / decode loops work unchanged while
softmax layers keep their usual key/value cache. The layer reports the number of tokens seen
as its sequence length, which transformers uses for positions and mask sizes.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from kernels.hybrid.recurrent_torch import HybridState


class HybridCacheLayer(CacheLayerMixin):
    is_compileable = False
    is_croppable = False
    supports_early_init = False
    is_sliding = False

    def __init__(self, state: HybridState | None = None):
        super().__init__()
        self.state = state
        self.is_initialized = state is not None

    def lazy_initialization(self, key_states, value_states) -> None:  # state is built by prefill
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        raise RuntimeError("a LoLCATs attention layer keeps a recurrent state, not a key/value cache")

    def get_seq_length(self) -> int:
        return 0 if self.state is None else self.state.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def offload(self):
        pass

    def prefetch(self):
        pass

    def reset(self) -> None:
        self.state = None
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.state is not None:
            self.state = self.state.select(beam_idx.to(self.state.S.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is not None:
            idx = torch.arange(self.state.S.shape[0], device=self.state.S.device).repeat_interleave(repeats)
            self.state = self.state.select(idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.state is not None:
            self.state = self.state.select(indices)

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("a recurrent LoLCATs state cannot be cropped (assisted decoding is not supported)")


def hybrid_cache_layer(cache: Cache, layer_idx: int) -> HybridCacheLayer:
    """The :class:`HybridCacheLayer` in slot ``layer_idx`` of ``cache``, installing it if needed."""
    while len(cache.layers) <= layer_idx:  # a cache that grows its layers lazily
        cache.layers.append((cache.layer_class_to_replicate or DynamicLayer)())
    layer = cache.layers[layer_idx]
    if not isinstance(layer, HybridCacheLayer):
        if layer.get_seq_length() > 0:
            raise RuntimeError(
                f"layer {layer_idx}: the cache already holds softmax keys/values for this layer; "
                "use a fresh cache for a converted model"
            )
        layer = HybridCacheLayer()
        cache.layers[layer_idx] = layer
    return layer
