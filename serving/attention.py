"""A converted attention layer inside vLLM: the workbench's own layer, holding its state in vLLM's pages.

:class:`LolcatsServingAttention` is :class:`core.attention.layer.LolcatsAttention` (same feature
maps, mixing factors, decay or history scale, window rule and code path: ``student``) given the
fused projections, q/k norms, rotary embedding and score scale of the attention module vLLM built
for the layer, and a vLLM state layer (``MambaBase``): vLLM keeps
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
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from core.attention.cache import HybridCacheLayer
from core.attention.layer import LolcatsAttention, PaddingMask
from kernels.hybrid.recurrent_torch import HybridState

OP_NAME = "lolcats_attention"
NOT_PAGED = ("first", "seen")  # HybridState fields the page does not hold (module docstring)
RING_AXES = {"win_k": 1, "win_v": 1, "win_pos": 0, "win_valid": 0}  # the window ring's fields: their slot axis in a page
ADOPTED = ("o_proj", "q_norm", "k_norm")  # modules of vLLM's attention that LolcatsAttention adopts by name


def base_stand_in(config, head_dim: int, scaling: float, **modules: nn.Module) -> SimpleNamespace:
    """What ``LolcatsAttention`` reads from the base layer it replaces, for a layer whose q, k, v
    projection is vLLM's fused ``qkv_proj`` (kept by the caller): the config, head dim and score
    scale, and ``modules`` (:data:`ADOPTED`), which it adopts under their names."""
    return SimpleNamespace(config=config, layer_idx=0, head_dim=head_dim, scaling=scaling,
                           q_proj=SimpleNamespace(weight=torch.empty(0, device="cpu")), **modules)


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


def page_layout(layout: list[tuple[str, tuple[int, ...], torch.dtype]]) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The tensors vLLM pages for a layer: :func:`paged`'s, then as many bytes of padding as make the
    page a multiple of its widest element. vLLM views each tensor through the page's byte stride,
    which must divide by the tensor's element size (a window's int64 positions after its boolean
    flags would not otherwise)."""
    fields = paged(layout)
    widest = max(dtype.itemsize for _, _, dtype in fields)
    pad = -sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in fields) % widest
    return fields + ([("padding", (pad,), torch.uint8)] if pad else [])


def roll_rows(x: torch.Tensor, shifts: torch.Tensor, dim: int) -> torch.Tensor:
    """Row b of ``x`` rolled by ``shifts[b]`` along ``dim``, as ``torch.roll`` rolls one tensor:
    ``out[b, ..., j] = x[b, ..., (j - shifts[b]) % K]``."""
    K = x.shape[dim]
    index = (torch.arange(K, device=x.device)[None] - shifts[:, None].to(x.device)) % K  # [B, K]
    shape = [1] * x.dim()
    shape[0], shape[dim] = x.shape[0], K
    return x.gather(dim, index.view(shape).expand_as(x))


def config_state_layout(text_config, options: dict, dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """:func:`state_layout` of a converted layer of the model ``text_config`` describes (a throwaway
    layer on the CPU: vLLM asks for the page size before it builds the model)."""
    num_heads = text_config.num_attention_heads
    num_kv_heads = getattr(text_config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // num_heads
    with torch.device("cpu"):
        layer = LolcatsAttention(base_stand_in(text_config, head_dim, head_dim**-0.5), num_heads=num_heads,
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
    """A converted decoder layer's attention in vLLM, in place of ``base``: the attention module
    vLLM built for that layer, of any served family (its fused ``qkv_proj``, ``o_proj``,
    ``rotary_emb`` and ``scaling``; Qwen3's and Gemma 3's per-head ``q_norm`` and ``k_norm``; Gemma 3's
    rotary of the layer's type and its ``query_pre_attn_scalar`` scale; ``attn``, its softmax
    kernel). The layer adopts all of it but the kernel, under the same names, so the export's
    weights load into it as into ``base``, and takes the kernel's name in vLLM's forward context:
    vLLM pages a state for the layer instead of a key/value cache.

    ``config``: the model's text config; ``options``: the layer's attention options, the keyword
    arguments of ``LolcatsAttention`` (:meth:`serving.spec.ServingPlan.layer_options`)."""

    def __init__(self, base: nn.Module, config, options: dict):
        adopted = {name: getattr(base, name) for name in ADOPTED if hasattr(base, name)}
        super().__init__(base_stand_in(config, base.head_dim, base.scaling, **adopted), num_heads=base.num_heads,
                         num_kv_heads=base.num_kv_heads, padding=PaddingMask(), **options)
        self.qkv_proj, self.rotary_emb = base.qkv_proj, base.rotary_emb
        self.q_size, self.kv_size = base.q_size, base.kv_size
        self.rotary = VllmRotary(self.rotary_emb)
        vllm_config = get_current_vllm_config()
        self.prefix = base.attn.layer_name
        vllm_config.compilation_config.static_forward_context[self.prefix] = self
        self._layout = state_layout(self, vllm_config.model_config.dtype)

    # ---- the state page ----

    def get_state_shape(self):
        return tuple(shape for _, shape, _ in page_layout(self._layout))

    def get_state_dtype(self):
        return tuple(dtype for _, _, dtype in page_layout(self._layout))

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.LINEAR  # vLLM's linear-attention metadata: what the op reads

    def read_states(self, slots: torch.Tensor, seen: torch.Tensor) -> HybridState:
        """The states of the requests in pages ``slots`` after ``seen`` [N] tokens each, as one batch
        on the longest one's count: a request that has seen fewer tokens reads as left-padded by the
        difference (``first``), its window ring rolled by it, so that its token of index j sits in slot
        (j + difference) % K as the common count places it (``kernels.hybrid.ring``). Copies of the
        pages (empty tensors for those :func:`paged` leaves out; the padding page, last, is never
        read), written back by :meth:`write_states`."""
        top = int(seen.max())
        shifts = top - seen
        device = self.kv_cache[0].device
        fields = {name: torch.empty(len(slots), *shape, dtype=dtype, device=device) for name, shape, dtype in self._layout}
        for (name, _, _), page in zip(paged(self._layout), self.kv_cache):
            rows = page[slots]
            fields[name] = roll_rows(rows, shifts, RING_AXES[name] + 1) if name in RING_AXES else rows
        return HybridState(first=shifts.to(device), seen=top, **fields)

    def write_states(self, slots: torch.Tensor, state: HybridState) -> None:
        """Each row of a batch :meth:`read_states` read back into its page, its ring rolled back."""
        for (name, _, _), page in zip(paged(self._layout), self.kv_cache):
            rows = getattr(state, name)
            page[slots] = roll_rows(rows, -state.first, RING_AXES[name] + 1) if name in RING_AXES else rows

    # ---- forward ----

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if hasattr(self, "q_norm"):  # each head's query and key normalised before RoPE
            d = self.head_dim
            q, k = self.q_norm(q.unflatten(-1, (-1, d))).flatten(-2), self.k_norm(k.unflatten(-1, (-1, d))).flatten(-2)
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
        """Head outputs ``[T, H d]`` of the step's tokens into ``output`` (q, q_in ``[T, H d]``; k, v,
        k_in ``[T, H_kv d]``; module docstring): the requests that decode one token from a state in
        one batched step (:meth:`read_states`), the others (prompts, chunks) one at a time. Without
        metadata (vLLM's profiling run) the output stays zero."""
        metadata = get_forward_context().attn_metadata
        metadata = metadata.get(self.prefix) if isinstance(metadata, dict) else None
        if metadata is None:
            return
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
        slots = metadata.state_indices_tensor.tolist()
        steps, chunks = [], []  # (first token, last token + 1, slot, tokens before): one-token decodes; the others
        for r in range(metadata.num_decodes + metadata.num_prefills):
            a, b = starts[r], starts[r + 1]
            seen = seq_lens[r] - (b - a)
            (steps if b - a == 1 and seen else chunks).append((a, b, slots[r], seen))
        if steps:
            tokens, _, step_slots, seen = (torch.tensor(column) for column in zip(*steps))
            tokens = tokens.to(q.device)
            rows = lambda x: x[tokens].unflatten(-1, (-1, 1, self.head_dim))  # [N, heads, 1, d]
            y = self.student_rows(step_slots, seen, q, k, v, q_in, k_in, rows)
            output[tokens] = y.flatten(1).to(output.dtype)
        for a, b, slot, seen in chunks:
            heads = lambda x: x[a:b].unflatten(-1, (-1, self.head_dim)).transpose(0, 1)[None]  # [1, heads, C, d]
            y = self.student_rows(torch.tensor([slot]), torch.tensor([seen]), q, k, v, q_in, k_in, heads)
            output[a:b] = y[0].transpose(0, 1).flatten(1).to(output.dtype)

    def student_rows(self, slots, seen, q, k, v, q_in, k_in, rows) -> torch.Tensor:
        """The workbench's ``student`` on ``rows(x)`` ``[N, heads, C, d]`` of the step's q, k, v, q_in,
        k_in: the C new tokens of N requests whose states are in pages ``slots`` [N] after ``seen`` [N]
        tokens each (an empty state where none came before; vLLM numbers a request's tokens, its
        RoPE position ids, from 0). The states are written back; the head outputs ``[N, H, C, d]``."""
        index = slots.to(self.kv_cache[0].device)
        cache = SimpleNamespace(layers=[HybridCacheLayer(self.read_states(index, seen) if seen.any() else None)])
        q_rows = rows(q)
        positions = (seen[:, None] + torch.arange(q_rows.shape[2])).to(q.device)
        y = self.student(q_rows, rows(k), rows(v), None, cache, rows(q_in), rows(k_in), position_ids=positions)
        self.write_states(index, cache.layers[0].state)
        return y


def lolcats_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_in: torch.Tensor, k_in: torch.Tensor,
                      output: torch.Tensor, layer_name: str) -> None:
    """The custom op vLLM's compiled graph calls: :meth:`LolcatsServingAttention.attend` of layer ``layer_name``."""
    get_forward_context().no_compile_layers[layer_name].attend(q, k, v, q_in, k_in, output)


def _lolcats_attention_fake(q, k, v, q_in, k_in, output, layer_name) -> None:
    return None


direct_register_custom_op(op_name=OP_NAME, op_func=lolcats_attention, mutates_args=["output"],
                          fake_impl=_lolcats_attention_fake)
