"""Effective attention matrices, for inspection (quadratic: short prompts only).

For a LoLCATs layer, the weight of key j in the output of query n is

    a_nj = g_h exp(s_nj - c_n) / Z_n          for j in W(n)   (window, softmax)
    a_nj = phi_q(q_n).phi_k(k_j) / Z_n        for j in Hist(n) (linear)
    Z_n  = sum over both,

so rows sum to 1 and ``a @ v`` equals :func:`core.attention.hybrid_attention`. The teacher's
matrix is causal softmax(q k^T * scale).
"""

from __future__ import annotations

import torch


def _masks(kind: str, w: int, L: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    n = torch.arange(L, device=device)[:, None]
    j = torch.arange(L, device=device)[None, :]
    causal = j <= n
    if kind == "linear":
        return torch.zeros_like(causal), causal
    if kind == "sliding_window":
        return causal & (j > n - w), j <= n - w
    tn, tj = n // w, j // w
    return causal & (tj >= tn - 1), tj < tn - 1


def softmax_attention_matrix(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax weights [B, H, L, L]; k may have fewer (KV) heads."""
    G = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(G, dim=1).float()
    L = q.shape[2]
    s = q.float() @ k.transpose(-1, -2) * scale
    s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(s, dim=-1)


def hybrid_attention_matrix(q, k, q_feat, k_feat, mix, kind: str, window_size: int, scale: float) -> torch.Tensor:
    """Effective LoLCATs weights [B, H, L, L] (no padding), see the module docstring."""
    G = q.shape[1] // k.shape[1]
    L = q.shape[2]
    k = k.repeat_interleave(G, dim=1).float()
    win, hist = _masks(kind, window_size, L, q.device)
    s = (q.float() @ k.transpose(-1, -2) * scale).masked_fill(~win, float("-inf"))
    c = s.amax(-1, keepdim=True)
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    a = torch.sigmoid(mix.float()).view(1, -1, 1, 1) * torch.exp(s - c)
    a = a + (q_feat.float() @ k_feat.float().transpose(-1, -2)) * hist
    return a / a.sum(-1, keepdim=True)
