"""A converted attention layer inside vLLM: the workbench's own layer, holding its state in vLLM's pages.

:class:`LolcatsServingAttention` is :class:`core.attention.layer.LolcatsAttention` (same feature
maps, mixing factors, decay or history scale, window rule and code path: ``student``) given
vLLM's fused projections and rotary embedding, and a vLLM state layer (``MambaBase``): vLLM keeps
one page per running request (a "slot") holding that request's :class:`HybridState` without its
batch dimension, and the layer reads and writes it around each call.

vLLM flattens a step's requests into one token axis, decodes first (``LinearAttentionMetadata``:
``query_start_loc``, ``seq_lens``, ``state_indices_tensor``). For request r with C new tokens after
P = seq_len - C already processed:

* P = 0, a new request: the prompt runs from an empty state (the slot's old contents are never
  read: that is the slot reset), ``LolcatsAttention.prefill``;
* P > 0: the state is read from the slot and the C tokens run from it, through the carried chunk
  (``kernels.dispatch.prefill_chunk``, chunked prefill) or the decode step
  (``kernels.dispatch.decode_step``), exactly as the workbench's model continues a prompt.

The page holds every tensor of the state (its fields and shapes are read from a state the layer's
own prefill builds, so a change of the state's layout needs no change here) except ``first``,
the row's first real token, which is 0 for every vLLM request (no padding), ``seen``, which is P,
and empty tensors (linear attention's ring).
The computation is the project's PyTorch forms on CPU; on CUDA, ``kernels.dispatch`` picks the
Triton kernels where they exist.

Notation: T tokens of the step, H query heads, H_kv key/value heads, d head dim.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from core.attention.cache import HybridCacheLayer
from core.attention.layer import LolcatsAttention, PaddingMask
from kernels.hybrid.recurrent_torch import HybridState

OP_NAME = "lolcats_attention"
NOT_PAGED = ("first", "seen")  # HybridState fields the page does not hold (module docstring)


def base_stand_in(config, hidden_size: int, num_heads: int) -> SimpleNamespace:
    """What ``LolcatsAttention`` reads from the base layer it replaces, for a layer whose projections
    are vLLM's (built by the caller): the config, head dim and score scale."""
    head_dim = getattr(config, "head_dim", None) or hidden_size // num_heads
    return SimpleNamespace(config=config, layer_idx=0, head_dim=head_dim, scaling=head_dim**-0.5,
                           q_proj=SimpleNamespace(weight=torch.empty(0, device="cpu")))


def state_layout(layer: LolcatsAttention, dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """``(field, shape without the batch dim, dtype)`` of each state tensor the page of ``layer``
    holds (keys and values in ``dtype``), widest dtype first (each view of the page's bytes stays
    aligned): read from the state a one-token prefill of the layer leaves."""
    H, Hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    device = layer.mix.device
    q, k = torch.zeros(1, H, 1, d, dtype=dtype, device=device), torch.zeros(1, Hkv, 1, d, dtype=dtype, device=device)
    with torch.no_grad():
        _, state = layer.prefill(q, k, k, None, True, q, k)
    fields = [(f.name, getattr(state, f.name)) for f in dataclasses.fields(HybridState) if f.name not in NOT_PAGED]
    fields = [(name, tuple(t.shape[1:]), t.dtype) for name, t in fields if t is not None]
    return sorted(fields, key=lambda f: -f[2].itemsize)


def paged(layout: list[tuple[str, tuple[int, ...], torch.dtype]]) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The tensors of ``layout`` that hold something (linear attention's window ring holds no slot)."""
    return [field for field in layout if math.prod(field[1])]


def config_state_layout(text_config, options: dict, dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """:func:`state_layout` of a converted layer of the model ``text_config`` describes (a throwaway
    layer on the CPU: vLLM asks for the page size before it builds the model)."""
    num_heads = text_config.num_attention_heads
    num_kv_heads = getattr(text_config, "num_key_value_heads", None) or num_heads
    with torch.device("cpu"):
        layer = LolcatsAttention(base_stand_in(text_config, text_config.hidden_size, num_heads), num_heads=num_heads,
                                 num_kv_heads=num_kv_heads, padding=PaddingMask(), **options)
    return state_layout(layer.to(dtype), dtype)


class VllmRotary:
    """:class:`core.attention.rotary.Rotary`'s contract over vLLM's rotary embedding (neox style):
    ``(cos, sin)`` ``[B, L, d]`` at position ids ``[B, L]``, each half's angles repeated as
    transformers lays them out. The layer rotates a key leaving its window back with them
    (:meth:`LolcatsAttention.cached_key_features`)."""

    def __init__(self, rope):
        self.rope = rope

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        table = self.rope.cos_sin_cache.to(x.device).index_select(0, position_ids.flatten().clamp(min=0))
        cos, sin = table.to(x.dtype).chunk(2, dim=-1)
        shape = (*position_ids.shape, -1)
        return torch.cat([cos, cos], dim=-1).view(shape), torch.cat([sin, sin], dim=-1).view(shape)


class LolcatsServingAttention(LolcatsAttention, MambaBase):
    """A converted decoder layer's attention for vLLM's Llama decoder layer (``attn_layer_type``).

    ``options``: the layer's attention options, the keyword arguments of ``LolcatsAttention``
    (:meth:`serving.spec.ServingPlan.layer_options`); the other arguments are those vLLM's
    ``LlamaDecoderLayer`` passes to its attention class."""

    def __init__(self, *, config, hidden_size: int, num_heads: int, num_kv_heads: int, max_position_embeddings: int,
                 quant_config=None, bias: bool = False, bias_o_proj: bool = False, cache_config=None,
                 prefix: str = "", attn_type=None, options: dict):
        base = base_stand_in(config, hidden_size, num_heads)
        super().__init__(base, num_heads=num_heads, num_kv_heads=num_kv_heads, padding=PaddingMask(), **options)
        head_dim = base.head_dim
        self.prefix = prefix
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_kv_heads, bias=bias,
                                          quant_config=quant_config, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, bias=bias_o_proj,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(head_dim, max_position=max_position_embeddings,
                                   rope_parameters=getattr(config, "rope_parameters", None), is_neox_style=True)
        self.rotary = VllmRotary(self.rotary_emb)
        vllm_config = get_current_vllm_config()
        context = vllm_config.compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"duplicate layer name: {prefix}")
        context[prefix] = self
        self._layout = state_layout(self, vllm_config.model_config.dtype)

    # ---- the state page ----

    def get_state_shape(self):
        return tuple(shape for _, shape, _ in paged(self._layout))

    def get_state_dtype(self):
        return tuple(dtype for _, _, dtype in paged(self._layout))

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.LINEAR  # vLLM's linear-attention metadata: what the op reads

    def read_state(self, slot: int, seen: int) -> HybridState:
        """The state of the request in page ``slot`` after ``seen`` tokens (views of the page; empty
        tensors for those :func:`paged` leaves out)."""
        device = self.kv_cache[0].device
        fields = {name: torch.empty(1, *shape, dtype=dtype, device=device) for name, shape, dtype in self._layout}
        fields.update({name: page[slot][None] for (name, _, _), page in zip(paged(self._layout), self.kv_cache)})
        return HybridState(first=torch.zeros(1, dtype=torch.long, device=device), seen=seen, **fields)

    def write_state(self, slot: int, state: HybridState) -> None:
        for (name, _, _), page in zip(paged(self._layout), self.kv_cache):
            page[slot].copy_(getattr(state, name)[0])

    # ---- forward ----

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        before_rope = self.feature_positions != "rotary"
        q_in, k_in = (q.clone(), k.clone()) if before_rope else (None, None)
        q, k = self.rotary_emb(positions, q, k)
        if not before_rope:
            q_in, k_in = q, k
        output = torch.zeros_like(q)
        torch.ops.vllm.lolcats_attention(q, k, v, q_in, k_in, output, self.prefix)
        out, _ = self.o_proj(output)
        return out

    def attend(self, q, k, v, q_in, k_in, output) -> None:
        """Head outputs ``[T, H d]`` of the step's tokens into ``output``, one request at a time
        (q, q_in ``[T, H d]``; k, v, k_in ``[T, H_kv d]``; module docstring). Without metadata
        (vLLM's profiling run) the output stays zero."""
        metadata = get_forward_context().attn_metadata
        metadata = metadata.get(self.prefix) if isinstance(metadata, dict) else None
        if metadata is None:
            return
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
        slots = metadata.state_indices_tensor.tolist()
        d = self.head_dim
        for r in range(metadata.num_decodes + metadata.num_prefills):
            a, b = starts[r], starts[r + 1]
            C, slot = b - a, slots[r]
            seen = seq_lens[r] - C
            heads = lambda x: x[a:b].view(C, -1, d).transpose(0, 1)[None]  # [1, heads, C, d]
            cache = SimpleNamespace(layers=[HybridCacheLayer(self.read_state(slot, seen) if seen else None)])
            y = self.student(heads(q), heads(k), heads(v), None, cache, heads(q_in), heads(k_in))
            self.write_state(slot, cache.layers[0].state)
            output[a:b] = y[0].transpose(0, 1).reshape(C, -1).to(output.dtype)


def lolcats_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_in: torch.Tensor, k_in: torch.Tensor,
                      output: torch.Tensor, layer_name: str) -> None:
    """The custom op vLLM's compiled graph calls: :meth:`LolcatsServingAttention.attend` of layer ``layer_name``."""
    get_forward_context().no_compile_layers[layer_name].attend(q, k, v, q_in, k_in, output)


def _lolcats_attention_fake(q, k, v, q_in, k_in, output, layer_name) -> None:
    return None


direct_register_custom_op(op_name=OP_NAME, op_func=lolcats_attention, mutates_args=["output"],
                          fake_impl=_lolcats_attention_fake)
