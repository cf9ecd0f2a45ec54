"""The training-free baseline a converted model must beat: the teacher's own softmax attention
restricted to a sliding window plus sink tokens.

In every converted layer, query n attends with the original (frozen) q, k, v and RoPE to

    W(n) ∪ {j <= n : j < s}        y_n = sum_{j in W(n)} softmax_j(q_n.k_j / sqrt(d)) v_j

and to nothing else, where W(n) is a sliding window {j : n - w < j <= n} or, to match a terraced
student key for key, its terraced window (the previous tile of w and the current one up to n); layers the conversion kept softmax keep their full attention, so the
baseline and the student differ only where the student has a linear history. Nothing is trained.
Its memory is a key/value cache of ``w + s`` tokens per layer, constant in the context length,
like the student's state; :func:`memory_matched_window` sizes ``w`` so that the two hold the same
bytes.

The window is computed by the hybrid op itself (:func:`core.attention.hybrid_attention`) with
an all-zero linear part: phi = 0 makes the history term vanish and the
window weight g cancels in the joint normaliser, leaving exactly the softmax over W(n) in the
op's banded O(L w) form, so the baseline runs at any length the student does.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from torch import nn

from core.attention.functional import hybrid_attention
from core.attention.layer import LolcatsAttention
from core.attention.surgery import decoder_layers, lolcats_modules
from core.eval.metrics import teacher_context
from core.train.lora import base_model
from kernels.hybrid.window import WindowRule, window_capacity


@dataclass(frozen=True)
class WindowBaseline:
    """A window (``kind`` sliding_window or terraced) of ``window`` keys plus the first ``sinks``
    keys, untrained."""

    name: str  # "window" (the student's own window and sinks) or "memory_matched"
    kind: str
    window: int
    sinks: int

    @property
    def label(self) -> str:
        shape = "sliding window" if self.kind == "sliding_window" else "terraced window"
        return f"{shape} {self.window} + {self.sinks} sinks"


class WindowSoftmaxAttention(nn.Module):
    """A converted layer's teacher attention over :class:`WindowBaseline`'s keys only, for whole
    sequences: it reads and writes no cache, and refuses one that already holds tokens."""

    def __init__(self, attn: LolcatsAttention, baseline: WindowBaseline):
        super().__init__()
        self.attn, self.baseline = attn, baseline

    def forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_values=None, **kwargs):
        if past_key_values is not None and past_key_values.get_seq_length() > 0:
            raise ValueError("the sliding-window baseline scores whole sequences; call the model with use_cache=False")
        B, L, _ = hidden_states.shape
        a = self.attn
        q, k, v = a.project(hidden_states, position_embeddings)[:3]
        none = q.new_zeros(B, q.shape[1], L, 1)  # phi = 0: no linear history
        b = self.baseline
        y = hybrid_attention(q, k, v, none, none, q.new_zeros(q.shape[1]), WindowRule(b.kind, b.window, b.sinks),
                             a.padding.current(L), a.scaling)
        return a.o_proj(y.transpose(1, 2).reshape(B, L, -1)), None


@contextlib.contextmanager
def window_softmax(model: nn.Module, baseline: WindowBaseline, trained: bool = False):
    """Inside the block ``model`` is the teacher with every converted layer's attention restricted
    to ``baseline``'s window and sinks (LoRA disabled, an export's teacher weights swapped in); with
    ``trained``, the model's own weights, LoRA on: the student with its window and no history."""
    with contextlib.nullcontext() if trained else teacher_context(model):
        layers = decoder_layers(base_model(model))
        converted = lolcats_modules(base_model(model))
        for i, attn in converted.items():
            layers[i].self_attn = WindowSoftmaxAttention(attn, baseline)
        try:
            yield model
        finally:
            for i, attn in converted.items():
                layers[i].self_attn = attn


def state_bytes(attn: LolcatsAttention, dtype_bytes: int) -> dict[str, int]:
    """Bytes one converted layer holds per sequence at decode, and one key/value token's bytes:

    S [H_s, F, d] and z [H_s, F] in float32 (H_s: the key feature map's heads, H or H_kv), the window
    cache of window_capacity(kind, w) keys and values [H_kv, d] and the sink cache of s keys and
    values in the model's dtype."""
    H, Hkv, d = attn.state_heads, attn.num_kv_heads, attn.head_dim
    F = attn.feature_map_q.output_dim
    kv_token = 2 * Hkv * d * dtype_bytes
    ring = window_capacity(attn.kind, attn.window_size)
    state = 4 * H * F * (d + 1) + (ring + attn.sink_tokens) * kv_token
    return {"state_bytes": state, "kv_bytes_per_token": kv_token}


def baselines(model: nn.Module) -> tuple[list[WindowBaseline], dict[str, int]]:
    """The two baselines for a converted model, and the byte counts that size the second:

    * ``window``: the student's own window (kind, w) and sinks s: exactly the keys the student
      treats with softmax, so it is the student with the linear history taken out (a linear
      student's: a sliding window of w);
    * ``memory_matched``: s sinks and the sliding window whose key/value cache plus sinks take
      the student's per-layer state bytes: w_mem = floor(state_bytes / kv_bytes_per_token) - s."""
    converted = lolcats_modules(base_model(model))
    if not converted:
        raise ValueError("the model has no converted attention layer: nothing to compare with a window baseline")
    attn = next(iter(converted.values()))
    dtype_bytes = next(model.parameters()).element_size()
    sizes = state_bytes(attn, dtype_bytes)
    sinks = attn.sink_tokens
    matched = max(sizes["state_bytes"] // sizes["kv_bytes_per_token"] - sinks, 1)
    own = "sliding_window" if attn.kind == "linear" else attn.kind
    return [WindowBaseline("window", own, attn.window_size, sinks),
            WindowBaseline("memory_matched", "sliding_window", matched, sinks)], sizes


__all__ = ["WindowBaseline", "WindowSoftmaxAttention", "baselines", "state_bytes", "window_softmax"]
