"""The converted attention module that replaces a Hugging Face decoder's ``self_attn``.

It reuses the pretrained (frozen) q/k/v/o projections (and q/k norms where the architecture has
them), applies RoPE exactly as the original layer does, and replaces softmax attention with
LoLCATs attention (see :func:`core.attention.hybrid_attention`):

    y_n = (sum_{j in W(n)} g_h exp(q_n.k_j/sqrt(d) - c_n) v_j + phi_q(q_n)^T sum_{j in Hist(n)} phi_k(k_j) v_j^T)
          / (sum_{j in W(n)} g_h exp(q_n.k_j/sqrt(d) - c_n)  + phi_q(q_n)^T sum_{j in Hist(n)} phi_k(k_j))

(W(n) holds the first ``sink_tokens`` keys as well, for every later query.)

History normalisation (``history_norm``, a deviation from the paper, off with ``"none"``): with
``"power"`` the history term of query n, numerator and denominator alike, is scaled by

    r_h(n) = N(n)^(-alpha_h),   N(n) = max(window_start(p_n) - sink_tokens, 1),   alpha_h = sigmoid(a_h)

where p_n is the query's position from its row's first real token and N(n) the number of history
positions (``kernels.hybrid.window``). Unscaled, the history's mass phi_q^T z grows with the number
of history tokens while the max-normalised window's is bounded by its size, so a mixing learned on
short blocks lets the history swamp the window on long inputs; alpha_h (one per head, learned in
stage 1 from ``init_history_power``) sets how fast the history's mass may grow: N^(1 - alpha_h). r_h(n) depends
on the query's position only, so it multiplies phi_q(q_n) before the attention op, and every form
of the op (chunked, Triton, recurrent decode, carried chunk) computes the same thing.

With ``"decay"`` instead, history key j of query n is weighted by gamma_h^(window_start(p_n) - 1 - p_j),
gamma_h = sigmoid(d_h) learned per head from ``init_history_decay``: the history forgets at a
fixed rate past the window's edge, so its mass and its make-up are the same at any length once
the input is longer than about 1 / (1 - gamma_h) history keys (``kernels.hybrid.decay``); the op
takes log gamma_h and every form of it (chunked, recurrent decode, carried chunk) applies it.

What the feature maps read (``feature_positions``, a deviation from the paper with ``"none"``):
``"rotary"``, the paper's, applies phi_q, phi_k to q and k after RoPE, so the history term
phi_q(q_n)^T phi_k(k_j) depends on the absolute positions n and j, not on n - j alone: at
positions past the training blocks the maps meet RoPE phases they never saw, and the history
drifts however it is normalised (shifting every position id of a 512-token text by 1536 takes a
converted model from 1.17x to 3.9x its teacher's perplexity, while the teacher is unchanged).
``"none"`` applies them to q and k before RoPE: the softmax window keeps RoPE's relative
positions, the history carries none, and the student, like the teacher, depends on relative
positions only. The recurrent state keeps the window's keys once, after RoPE, as the softmax reads
them; a key leaving the window is rotated back (:func:`core.attention.rotary.unrotate`, at its
RoPE position id: its window position plus the row's offset, ``HybridState.key_offset``) before
phi_k reads it, so the folded features equal those the parallel form computed from the key before
RoPE. This takes RoPE position ids that advance with the window positions in each row (left padding,
as generation and every HF position-id convention give); a row with padding inside it would fold
keys rotated back by other angles.

Where the key feature map lives (``key_map_heads``, a deviation from the paper with ``"kv"``):
``"query"``, the paper's, one phi_k per query head (the G query heads of a key/value head map the
same keys G ways, and the decode state keeps S, z per query head); ``"kv"``, one phi_k per
key/value head, shared by its G query heads, whose own phi_q read one S, z per key/value head: G
times fewer state bytes (``kernels.hybrid.heads``). A decay then decays that shared state, so its
rates come per key/value head too.

How much of the history each query reads (``history_gate``, a deviation from the paper with
``"query"``): a factor g_h(q_n) of phi_q(q_n) learned from the query itself (:mod:`core.attention.gate`),
so a query can turn the history down where its window holds the answer; like r_h(n) it multiplies
phi_q before the op and adds nothing to the decode state.

Modes (``module.mode``, read-only):
  * ``"student"``: LoLCATs attention (the converted model), everywhere outside a teacher block;
  * ``"teacher"``: inside ``with teacher_attention(modules):``, in that thread (context) only, the
    original softmax attention through the model's attention interface (with an ordinary
    key/value cache when one is passed, so the teacher can generate too). The block sets a
    context variable the forward reads; nothing on the module changes, so a teacher forward in
    one thread leaves another thread's forward of the same model a student forward.

The layer holds no training state: stage 1 records its (student, teacher) pairs through
:func:`core.train.teacher_forcing.teacher_forcing`, which calls the pure methods below
(:meth:`project`, :meth:`teacher`, :meth:`student`, :meth:`features`).

Notation: B batch, L new tokens, H query heads, H_kv key/value heads, d head dim, F features.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from contextvars import ContextVar

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward, repeat_kv

from core.attention.cache import hybrid_cache_layer
from core.attention.feature_maps import build_feature_map
from core.attention.functional import hybrid_attention
from core.attention.gate import build_history_gate
from core.attention.history import build_history
from core.attention.rotary import Rotary, unrotate
from kernels import dispatch
from kernels.hybrid.blocks import blocks, cpu_inference
from kernels.hybrid.recurrent_torch import HybridState
from kernels.hybrid.window import WindowRule, window_start

MODES = ("student", "teacher")
FEATURE_POSITIONS = ("rotary", "none")
KEY_MAP_HEADS = ("query", "kv")


def query_positions(mask: torch.Tensor | None, state: HybridState | None, B: int, L: int, device) -> torch.Tensor:
    """[B, L] positions of L new tokens from each row's first real token (negative before it),
    after the tokens a decode ``state`` has seen (None: a prompt from its start)."""
    seen = 0 if state is None else state.seen
    return seen + torch.arange(L, device=device)[None, :] - first_tokens(mask, state, B, device)[:, None]


def first_tokens(mask: torch.Tensor | None, state: HybridState | None, B: int, device) -> torch.Tensor:
    """[B] index of each row's first real token among all tokens so far (:func:`query_positions`)."""
    seen = 0 if state is None else state.seen
    if mask is None:  # every token is real: the chunk's first
        first = torch.full((B,), seen, dtype=torch.long, device=device) if state is None else seen
    else:  # the chunk's first real token (L when none)
        first = seen + (mask.long().cumsum(-1) == 0).sum(-1)
    if state is not None:
        first = torch.where(state.first >= 0, state.first, first)
    return first


# Ids of the converted layers computing softmax attention in the current context (thread or task),
# set for a block by teacher_attention; a new thread starts with none (every layer a student).
_TEACHER_LAYERS: ContextVar[frozenset[int]] = ContextVar("lolcats_teacher_layers", default=frozenset())


@contextlib.contextmanager
def teacher_attention(modules: Iterable[nn.Module]):
    """Inside the block, in this thread (context) only, the converted layers ``modules`` compute the
    original softmax attention (``mode`` ``"teacher"``); the others, and every layer in other threads,
    stay students. Blocks nest; nothing on the modules changes."""
    modules = list(modules)  # held for the block, so no other object takes their ids
    token = _TEACHER_LAYERS.set(_TEACHER_LAYERS.get() | {id(m) for m in modules})
    try:
        yield
    finally:
        _TEACHER_LAYERS.reset(token)


class PaddingMask:
    """The 2-D padding mask of the forward call in progress, shared by a model's converted layers.

    Transformers turns the ``[B, past + L]`` mask into a 4-D softmax mask before the layers run;
    LoLCATs layers need the 2-D one, so a pre-hook on the decoder stores it here."""

    def __init__(self):
        self.mask: torch.Tensor | None = None

    def hook(self, module, args, kwargs):
        mask = kwargs.get("attention_mask")
        self.mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None

    def clear(self, module, args, kwargs, output):
        self.mask = None

    def current(self, length: int) -> torch.Tensor | None:
        """Mask of the last ``length`` tokens ([B, length] bool) or None when there is no padding."""
        if self.mask is None or self.mask.shape[1] < length:
            return None
        return self.mask[:, -length:].bool()


class LolcatsAttention(nn.Module):
    def __init__(
        self,
        base: nn.Module,
        *,
        kind: str,
        feature_map: str,
        feature_dim: int,
        window_size: int,
        init_mix: float,
        feature_init: str,
        num_heads: int,
        num_kv_heads: int,
        padding: PaddingMask,
        sink_tokens: int,
        history_norm: str,
        init_history_power: float,
        init_history_decay: float,
        feature_positions: str,
        key_map_heads: str,
        history_gate: str,
    ):
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            if hasattr(base, name):
                setattr(self, name, getattr(base, name))  # the pretrained modules, same parameter names
        self.config = base.config
        self.layer_idx = base.layer_idx
        self.head_dim = base.head_dim
        self.scaling = base.scaling
        self.sliding_window = getattr(base, "sliding_window", None)  # the teacher's own window, if any
        self.num_key_value_groups = num_heads // num_kv_heads
        self.attention_dropout = 0.0
        self.is_causal = True
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.kind, self.window_size, self.sink_tokens = kind, window_size, sink_tokens
        device = base.q_proj.weight.device
        if key_map_heads not in KEY_MAP_HEADS:
            raise ValueError(f"unknown key_map_heads {key_map_heads!r}; valid: {', '.join(KEY_MAP_HEADS)}")
        self.key_map_heads = key_map_heads
        self.state_heads = num_kv_heads if key_map_heads == "kv" else num_heads  # H_s: heads of phi_k and of S, z
        self.feature_map_q = build_feature_map(feature_map, num_heads, self.head_dim, feature_dim, feature_init).to(device)
        self.feature_map_k = build_feature_map(feature_map, self.state_heads, self.head_dim, feature_dim,
                                               feature_init).to(device)
        self.mix = nn.Parameter(torch.full((num_heads,), math.log(init_mix / (1 - init_mix)), device=device))
        self.history = build_history(history_norm, init_history_power, init_history_decay)  # its variant (core.attention.history)
        if feature_positions not in FEATURE_POSITIONS:
            raise ValueError(f"unknown feature_positions {feature_positions!r}; valid: {', '.join(FEATURE_POSITIONS)}")
        self.feature_positions = feature_positions
        if self.history.parameter:  # history_power or history_decay, named as checkpoints name them
            setattr(self, self.history.parameter, self.history.make_parameter(num_heads, self.state_heads, device))
        self.history_gate = build_history_gate(history_gate, num_heads, self.head_dim, device)  # None: ungated
        self.padding = padding
        self.rotary: Rotary | None = None  # the decoder's rotary embedding for this layer (set by surgery)

    @property
    def mode(self) -> str:
        """``"teacher"`` inside a :func:`teacher_attention` block naming this layer (this thread only), else ``"student"``."""
        return "teacher" if id(self) in _TEACHER_LAYERS.get() else "student"

    @property
    def history_norm(self) -> str:
        """The history variant's name (``attention.history_norm``)."""
        return self.history.name

    @property
    def rule(self) -> WindowRule:
        """The layer's window rule (kind, window, sink tokens), as every form of the op takes it."""
        return WindowRule(self.kind, self.window_size, self.sink_tokens)

    def extra_repr(self) -> str:
        sinks = f", sink_tokens={self.sink_tokens}" if self.sink_tokens else ""
        norm = f", history_norm={self.history_norm}" if self.history_norm != "none" else ""
        gate = ", history_gate=query" if self.history_gate is not None else ""
        return (f"kind={self.kind}, window_size={self.window_size}{sinks}{norm}{gate}, "
                f"heads={self.num_heads}/{self.num_kv_heads}, key_map_heads={self.key_map_heads}")

    def trained_parameters(self) -> list[nn.Parameter]:
        """What conversion adds to the layer and trains: feature maps, mixing factors, the
        history exponents (``history_norm="power"``) or decay rates (``"decay"``) and the history
        gate (``history_gate="query"``)."""
        gate = [] if self.history_gate is None else list(self.history_gate.parameters())
        return [*self.feature_map_q.parameters(), *self.feature_map_k.parameters(), self.mix,
                *self.history.parameters(self), *gate]

    def log_decay(self) -> torch.Tensor | None:
        """log gamma_h ``[H_s]`` of the decaying history, one per state head (None unless
        ``history_norm`` is ``"decay"``)."""
        return self.history.log_decay(self)

    def project(self, hidden_states, position_embeddings):
        """q [B, H, L, d], k and v [B, H_kv, L, d], after the optional q/k norms and RoPE, and the
        queries and keys the feature maps read: q and k themselves with ``feature_positions``
        ``"rotary"``, the same before RoPE with ``"none"``."""
        B, L, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(B, L, -1, self.head_dim)
        k = self.k_proj(hidden_states).view(B, L, -1, self.head_dim)
        v = self.v_proj(hidden_states).view(B, L, -1, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = position_embeddings
        q_in, k_in = q.transpose(1, 2), k.transpose(1, 2)
        q, k = apply_rotary_pos_emb(q_in, k_in, cos, sin)
        if getattr(self, "feature_positions", "rotary") == "rotary":  # also called on unconverted layers (inspection)
            q_in, k_in = q, k
        return q, k, v, q_in, k_in

    def features(self, q, k, mask: torch.Tensor | None = None, state: HybridState | None = None):
        """phi_q(q) (times the history scale r(n), :meth:`query_features`) [B, H, L, F] and phi_k(k)
        [B, H_s, L, F] (:meth:`key_features`)."""
        return self.query_features(q, mask, state), self.key_features(k)

    def key_features(self, k):
        """phi_k(k) [B, H_s, L, F] of keys k [B, H_kv, L, d]: per query head (the keys repeated for the
        map only) or, with ``key_map_heads`` ``"kv"``, per key/value head (``kernels.hybrid.heads``)."""
        return self.feature_map_k(repeat_kv(k, self.state_heads // self.num_kv_heads))

    def query_features(self, q, mask: torch.Tensor | None = None, state: HybridState | None = None):
        """r_h(n) g_h(q_n) phi_q(q_n): [B, H, L, F], the queries at the positions :func:`query_positions`
        gives for ``mask`` and ``state`` (r = 1 unless ``history_norm`` is ``"power"``, g the history
        gate, :mod:`core.attention.gate`, 1 without one)."""
        qf = self.feature_map_q(q)
        if self.history_gate is not None:
            qf = qf * self.history_gate(q)
        if not self.history.scales_queries:
            return qf
        pos = query_positions(mask, state, q.shape[0], q.shape[2], q.device)
        n = (window_start(self.kind, self.window_size, pos) - self.sink_tokens).clamp(min=1)
        return qf * self.history.query_scale(self, n)

    def key_offsets(self, mask: torch.Tensor | None, state: HybridState | None, position_ids: torch.Tensor | None,
                    B: int, L: int, device) -> torch.Tensor | None:
        """``[B]`` RoPE position id minus window position of each row's keys (None when the feature
        maps read keys after RoPE, which need no rotating back): from the last real token among the
        L new ones, the state's where a row has none. Position ids default to the tokens' indices
        (transformers' cache positions)."""
        if self.feature_positions == "rotary":
            return None
        seen = 0 if state is None else state.seen
        if mask is None:  # every token is real: the last one's, its id minus seen + L - 1 - first
            first = first_tokens(None, state, B, device)
            return first if position_ids is None else position_ids[:, -1] - (seen + L - 1) + first
        ids = seen + torch.arange(L, device=device)[None] if position_ids is None else position_ids
        offset = ids.expand(B, L) - query_positions(mask, state, B, L, device)
        last = (mask.long() * torch.arange(1, L + 1, device=device)).argmax(-1, keepdim=True)  # the last real token
        held = state.key_offset if state is not None and state.key_offset is not None else torch.zeros_like(offset[:, 0])
        return torch.where(mask.any(-1), offset.gather(1, last)[:, 0], held)

    def cached_key_features(self, offset: torch.Tensor | None):
        """phi_k of keys the recurrent state cached after RoPE, ``(keys [B, H_kv, K, d], window
        positions [B, K]) -> [B, H_s, K, F]``: rotated back at position id ``positions + offset``
        first when the maps read keys before RoPE (module docstring)."""
        if offset is None:
            return lambda keys, positions: self.key_features(keys)

        def features(keys, positions):
            cos, sin = self.rotary(keys.float(), positions + offset[:, None])
            return self.key_features(unrotate(keys.float(), cos, sin))
        return features

    def row_pieces(self, q) -> list[slice]:
        """Row ranges of a prompt's batch for :meth:`student`: one piece when autograd records the
        call (the feature maps train in stage 1 even where q needs no gradient) or on a GPU, else
        pieces whose features and scores fit in cache (``kernels.hybrid.blocks``)."""
        B, H, L, _ = q.shape
        if not cpu_inference(q, self.feature_map_q.weight, self.feature_map_k.weight, self.mix):
            return [slice(0, B)]
        F = self.feature_map_q.output_dim
        return [rows for rows, _ in blocks(B, 1, 4 * H * L * (2 * F + 2 * self.window_size))]  # q, k features, scores

    def prefill(self, q, k, v, mask, keep_state: bool, q_in, k_in):
        """Outputs of a whole prompt from an empty state, and the state it leaves (None unless
        ``keep_state``; its ``key_offset`` unset); ``q_in``, ``k_in``: what the feature maps read
        (:meth:`project`)."""
        qf, kf = self.features(q_in, k_in, mask)
        rule = self.rule
        y = hybrid_attention(q, k, v, qf, kf, self.mix, rule, mask, self.scaling, decay=self.log_decay())
        if not keep_state:
            return y, None
        B, L = q.shape[0], q.shape[2]
        m = mask if mask is not None else torch.ones(B, L, dtype=torch.bool, device=q.device)
        return y, dispatch.prefill_state(rule, k, v, kf, m, self.log_decay())

    def student(self, q, k, v, mask, past_key_values, q_in, k_in, position_ids: torch.Tensor | None = None):
        """LoLCATs attention for the new tokens, reading and updating the recurrent state
        (``q_in``, ``k_in``: what the feature maps read, :meth:`project`; ``position_ids`` [B, L]
        or [1, L]: the tokens' RoPE position ids, for the keys the state folds later)."""
        layer = hybrid_cache_layer(past_key_values, self.layer_idx) if past_key_values is not None else None
        B, L = q.shape[0], q.shape[2]
        if layer is None or layer.state is None:
            pieces = self.row_pieces(q)
            if len(pieces) == 1:
                y, state = self.prefill(q, k, v, mask, layer is not None, q_in, k_in)
            else:  # rows one piece at a time, every temporary in cache
                y = q.new_empty(q.shape)
                states = []
                for rows in pieces:
                    y[rows], state = self.prefill(q[rows], k[rows], v[rows], None if mask is None else mask[rows],
                                                  layer is not None, q_in[rows], k_in[rows])
                    states.append(state)
                state = HybridState.concat(states) if layer is not None else None
            if layer is not None:
                state.key_offset = self.key_offsets(mask, None, position_ids, B, L, q.device)
                layer.state, layer.is_initialized = state, True
            return y
        # state present. A chunk of several tokens (a prompt prefilled in chunks) goes through the
        # parallel form from the carried state where it applies; otherwise, and when decoding, one
        # token at a time, computing key features only for the keys that leave the window.
        valid = mask if mask is not None else torch.ones(B, L, dtype=torch.bool, device=q.device)
        offset = self.key_offsets(mask, layer.state, position_ids, B, L, q.device)
        key_features = self.cached_key_features(offset)
        if L > 1:
            qf, kf = self.features(q_in, k_in, valid, layer.state)
            out = dispatch.prefill_chunk(layer.state, self.rule, q, k, v, qf, kf, self.mix, valid, key_features,
                                         self.scaling, self.log_decay())
            if out is not None:
                y, layer.state = out
                layer.state.key_offset = offset
                return y
        else:
            qf = self.query_features(q_in, valid, layer.state)
        outs = []
        decay, rule = self.log_decay(), self.rule
        for t in range(L):
            y, layer.state = dispatch.decode_step(
                layer.state, rule, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], qf[:, :, t : t + 1],
                self.mix, valid[:, t], key_features, self.scaling, decay,
            )
            outs.append(y)
        layer.state.key_offset = offset
        return outs[0] if L == 1 else torch.cat(outs, dim=2)

    def token_mask(self, padding_mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
        """[B, length] bool padding mask of the new tokens: the decoder layer's ``padding_mask`` if
        given, else the model's 2-D mask (:class:`PaddingMask`); None when there is no padding."""
        return padding_mask.bool() if padding_mask is not None else self.padding.current(length)

    def merge_heads(self, y: torch.Tensor) -> torch.Tensor:
        """The layer's output [B, L, D] from head outputs y [B, H, L, d], through ``o_proj``."""
        B, _, L, _ = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(B, L, -1))

    def teacher(self, q, k, v, attention_mask, **kwargs):
        """The original softmax attention of the new queries over keys k, v: [B, H, L, d]
        (``kwargs``: the decoder layer's, passed on to the attention interface)."""
        kwargs.pop("position_ids", None)
        kwargs.pop("use_cache", None)
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, _ = interface(
            self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, sliding_window=self.sliding_window, **kwargs
        )
        return out.transpose(1, 2)  # interfaces return [B, L, H, d]

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        padding_mask: torch.Tensor | None = None,
        **kwargs,
    ):
        q, k, v, q_in, k_in = self.project(hidden_states, position_embeddings)
        if self.mode == "teacher":
            if past_key_values is not None:  # an ordinary softmax key/value cache
                k, v = past_key_values.update(k, v, self.layer_idx)
            y = self.teacher(q, k, v, attention_mask, **kwargs)
        else:
            mask = self.token_mask(padding_mask, hidden_states.shape[1])
            y = self.student(q, k, v, mask, past_key_values, q_in, k_in, kwargs.get("position_ids"))
        return self.merge_heads(y), None
