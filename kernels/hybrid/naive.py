"""The quadratic reference form of hybrid attention: full L x L weight matrices (short inputs only).

For query n with s_nj = q_n.k_j * scale, g_h = sigmoid(mix_h), window W(n) and history Hist(n)
(``window_masks``, from :func:`kernels.hybrid.window.window_start`; W(n) also holds the sink
tokens at positions < s, which Hist(n) never does), the weight of key j is

    a_nj = g_h exp(s_nj - c_n) / Z_n          for j in W(n)    (softmax; c_n = max_{j in W(n)} s_nj)
    a_nj = phi_q(q_n).phi_k(k_j) / Z_n        for j in Hist(n) (linear)
    Z_n  = sum over both (rows with Z_n = 0, which attend to nothing, are 0),

so rows sum to 1 and ``a @ v`` is the hybrid attention output. With a decay (log gamma_h per head)
the linear weights are multiplied by gamma_h^(window_start(p_n) - 1 - p_j) (``kernels.hybrid.decay``). The teacher's matrix is causal
softmax(q k^T * scale). Positions count from each row's first real token; padded keys get weight 0.
The matrices are computed in float32 (float64 for float64 inputs); the ``naive_*`` outputs, which
the other forms are tested against, in float64.
"""

from __future__ import annotations

import torch

from kernels.hybrid.decay import history_weights
from kernels.hybrid.heads import query_heads
from kernels.hybrid.window import WindowRule, window_start


def positions(mask: torch.Tensor) -> torch.Tensor:
    """[B, L] key mask -> [B, L] position of each index relative to the row's first real token."""
    first = (mask.long().cumsum(-1) == 0).sum(-1)
    return torch.arange(mask.shape[1], device=mask.device)[None, :] - first[:, None]


def window_masks(kind: str, w: int, mask: torch.Tensor, sinks: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Window and history masks [B, 1, L, L] (query rows, key columns) for the [B, L] key mask:
    key j is in W(n) when p_j <= p_n and (p_j >= window_start(p_n) or p_j < sinks), and in Hist(n)
    when sinks <= p_j < window_start(p_n)."""
    pos = positions(mask)
    pn, pj = pos[:, :, None], pos[:, None, :]
    start = window_start(kind, w, pn)
    valid = mask.bool()[:, None, :]
    sink = pj < sinks
    win = (pj <= pn) & ((pj >= start) | sink) & valid
    hist = (pj < start) & ~sink & valid
    return win[:, None], hist[:, None]


def _key_mask(q: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    B, _, L, _ = q.shape
    if attention_mask is None:
        return torch.ones(B, L, dtype=torch.bool, device=q.device)
    return attention_mask.to(q.device).bool()


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.promote_types(q.dtype, torch.float32)


def _per_query_head(k: torch.Tensor, H: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, H_kv, L, d] -> [B, H, L, d] (query head h reads KV head h // G)."""
    return query_heads(k, H).to(dtype)


def softmax_attention_matrix(q, k, scale: float, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal softmax weights [B, H, L, L] over the real keys; k may have fewer (KV) heads."""
    dtype = _compute_dtype(q)
    L = q.shape[2]
    k = _per_query_head(k, q.shape[1], dtype)
    allowed = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    if attention_mask is not None:
        allowed = allowed[None, None] & _key_mask(q, attention_mask)[:, None, None, :]
    s = (q.to(dtype) @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1)


def hybrid_attention_matrix(
    q, k, q_feat, k_feat, mix, kind: str, window_size: int, scale: float, attention_mask: torch.Tensor | None = None,
    sinks: int = 0, decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """Effective hybrid weights a [B, H, L, L] (see the module docstring)."""
    dtype = _compute_dtype(q)
    k = _per_query_head(k, q.shape[1], dtype)
    mask = _key_mask(q, attention_mask)
    win, hist = window_masks(kind, window_size, mask, sinks)
    pos = positions(mask)
    H = q.shape[1]
    hist = hist * history_weights(query_heads(decay, H, dim=0), kind, window_size, pos, pos).to(dtype)
    s = (q.to(dtype) @ k.transpose(-1, -2) * scale).masked_fill(~win, float("-inf"))
    c = s.amax(-1, keepdim=True)
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    a = torch.sigmoid(mix.to(dtype)).view(1, -1, 1, 1) * torch.exp(s - c)
    a = a + (q_feat.to(dtype) @ _per_query_head(k_feat, H, dtype).transpose(-1, -2)) * hist
    den = a.sum(-1, keepdim=True)
    return a / torch.where(den > 0, den, torch.ones_like(den))


def naive_hybrid_attention(q, k, v, q_feat, k_feat, mix, rule: WindowRule, attention_mask=None, scale=None, *,
                           decay=None):
    """Hybrid attention [B, H, L, d] in float64 as ``hybrid_attention_matrix @ v`` (0 at queries
    that attend to nothing); arguments as ``kernels.hybrid.chunk_torch.hybrid_attention_torch``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, qf, kf = (t.double() for t in (q, k, v, q_feat, k_feat))
    a = hybrid_attention_matrix(q, k, qf, kf, mix.double(), rule.kind, rule.window_size, scale, attention_mask, rule.sinks,
                                decay)
    return a @ _per_query_head(v, q.shape[1], torch.float64)


def naive_softmax_attention(q, k, v, attention_mask=None, scale=None):
    """Causal softmax attention [B, H, L, d] with GQA and key padding, in float64."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    a = softmax_attention_matrix(q.double(), k.double(), scale, attention_mask)
    return a @ _per_query_head(v, q.shape[1], torch.float64)


__all__ = [
    "hybrid_attention_matrix",
    "naive_hybrid_attention",
    "naive_softmax_attention",
    "positions",
    "softmax_attention_matrix",
    "window_masks",
]
