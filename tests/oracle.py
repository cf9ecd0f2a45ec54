"""Naive quadratic oracle for LoLCATs attention, in float64, written from the paper's equations.

Builds the full L x L score matrices and the window / history masks explicitly; only for tests.
Positions count from each row's first real token.
"""

from __future__ import annotations

import torch


def positions(mask: torch.Tensor) -> torch.Tensor:
    """[B, L] -> position of each index relative to the row's first real token."""
    first = (mask.long().cumsum(-1) == 0).sum(-1)
    return torch.arange(mask.shape[1])[None, :] - first[:, None]


def naive_masks(kind: str, w: int, mask: torch.Tensor):
    """Window and history masks [B, 1, L, L] (query rows, key columns)."""
    pos = positions(mask)
    pn, pj = pos[:, :, None], pos[:, None, :]
    valid = mask.bool()[:, None, :]
    causal = pj <= pn
    if kind == "linear":
        win = torch.zeros_like(causal)
        hist = causal
    elif kind == "sliding_window":
        win = causal & (pj > pn - w)
        hist = pj <= pn - w
    elif kind == "terraced":
        tn, tj = torch.div(pn, w, rounding_mode="floor"), torch.div(pj, w, rounding_mode="floor")
        win = causal & (tj >= tn - 1)
        hist = tj < tn - 1
    else:
        raise ValueError(kind)
    return (win & valid)[:, None], (hist & valid)[:, None]


def naive_hybrid_attention(q, k, v, q_feat, k_feat, mix, kind, window_size=64, attention_mask=None, scale=None):
    B, H, L, d = q.shape
    G = H // k.shape[1]
    scale = d**-0.5 if scale is None else scale
    q, k, v, qf, kf = (t.double() for t in (q, k, v, q_feat, k_feat))
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    mask = torch.ones(B, L, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    win, hist = naive_masks(kind, window_size, mask)
    s = q @ k.transpose(-1, -2) * scale
    s_win = s.masked_fill(~win, float("-inf"))
    c = s_win.amax(-1, keepdim=True)
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    g = torch.sigmoid(mix.double()).view(1, H, 1, 1)
    a_win = g * torch.exp(s_win - c)
    a_lin = (qf @ kf.transpose(-1, -2)) * hist
    a = a_win + a_lin
    den = a.sum(-1, keepdim=True)
    return (a @ v) / torch.where(den > 0, den, torch.ones_like(den))  # padded queries: 0


def naive_softmax_attention(q, k, v, attention_mask=None, scale=None):
    """Causal softmax attention with GQA and key padding, float64."""
    B, H, L, d = q.shape
    G = H // k.shape[1]
    scale = d**-0.5 if scale is None else scale
    q, k, v = q.double(), k.double().repeat_interleave(G, dim=1), v.double().repeat_interleave(G, dim=1)
    mask = torch.ones(B, L, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    allowed = torch.ones(L, L, dtype=torch.bool).tril()[None, None] & mask[:, None, None, :]
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, -1) @ v
