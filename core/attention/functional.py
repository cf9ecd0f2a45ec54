"""Functional LoLCATs attention: validation and dispatch to an implementation.

``hybrid_attention`` is the one entry point used by the attention layers, the stage-1 loss and
the tests; for query n (``kernels/hybrid/chunk_torch.py``, docs/kernels.md)

    y_n = (sum_{j in W(n)} g_h exp(q_n.k_j/sqrt(d) - c_n) v_j + phi_q(q_n)^T S_hist(n))
          / (sum_{j in W(n)} g_h exp(q_n.k_j/sqrt(d) - c_n)   + phi_q(q_n)^T z_hist(n))

with g_h = sigmoid(mix_h), c_n the window max, one joint normaliser and the linear term not
rescaled by exp(-c_n) (paper Eq. 6). Optional sink tokens: the first s keys stay in W(n) for every
later query and out of the history (``kernels/hybrid/window.py``). Optional decay: each history
term weighted by gamma_h^(its age past the window's edge) (``kernels/hybrid/decay.py``).

Implementation: ``kernels.dispatch.hybrid_attention`` (the Triton kernels for CUDA tensors, the
PyTorch form elsewhere; ``LOLCATS_KERNELS`` = ``auto``, ``triton`` or ``torch`` forces either).
"""

from __future__ import annotations

import torch

from kernels import dispatch
from kernels.hybrid.window import KINDS, check_sinks

__all__ = ["KINDS", "hybrid_attention", "check_kind"]


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    return kind


def hybrid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    mix: torch.Tensor,
    kind: str,
    window_size: int = 64,
    attention_mask: torch.Tensor | None = None,
    scale: float | None = None,
    sinks: int = 0,
    decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """LoLCATs linear / sliding-window / terraced hybrid attention (causal).

    Args:
        q: ``[B, H, L, d]`` queries after RoPE.
        k, v: ``[B, H_kv, L, d]`` keys (after RoPE) and values; H must be a multiple of H_kv
            (grouped-query attention; do not repeat them).
        q_feat, k_feat: ``[B, H, L, F]`` feature maps phi_q(q), phi_k(k) per query head; must be
            non-negative.
        mix: ``[H]`` mixing logits; the window weight is sigmoid(mix). Ignored by ``linear``.
        kind: ``linear``, ``sliding_window`` or ``terraced``.
        window_size: w, the window (sliding) or tile (terraced) length. Default: 64.
        attention_mask: ``[B, L]``, 1 for tokens and 0 for padding. Padded keys contribute
            nothing; outputs at padded queries are unspecified (finite). Window and tile
            positions count from each row's first real token. Default: ``None`` (no padding).
        scale: score scale; default ``d ** -0.5``.
        sinks: s, the sink tokens: keys at positions < s stay in the softmax part for every later
            query and never enter the linear history (not with ``linear``). Default: 0.
        decay: ``[H]`` log gamma_h <= 0: history key j of query n weighted by
            gamma_h^(window_start(p_n) - 1 - p_j). Default: ``None`` (no decay, the paper's).

    Returns:
        ``[B, H, L, d]`` in the dtype of ``q`` (accumulation in float32).
    """
    check_kind(kind)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, L, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, L, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != L or k.shape[3] != d:
        raise ValueError(f"k and v must be [B, H_kv, L, d] = [{B}, H_kv, {L}, {d}]; got {tuple(k.shape)}, {tuple(v.shape)}")
    if H % k.shape[1] != 0:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({k.shape[1]})")
    if q_feat.shape[:3] != (B, H, L) or k_feat.shape != q_feat.shape:
        raise ValueError(
            f"q_feat and k_feat must be [B, H, L, F] with B, H, L = {B}, {H}, {L}; "
            f"got {tuple(q_feat.shape)}, {tuple(k_feat.shape)}"
        )
    if mix.shape != (H,):
        raise ValueError(f"mix must have shape [H] = [{H}]; got {tuple(mix.shape)}")
    if window_size < 1:
        raise ValueError(f"window_size must be >= 1, got {window_size}")
    if attention_mask is not None and attention_mask.shape != (B, L):
        raise ValueError(f"attention_mask must be [B, L] = [{B}, {L}]; got {tuple(attention_mask.shape)}")
    check_sinks(kind, sinks)
    if decay is not None and decay.shape != (H,):
        raise ValueError(f"decay must have shape [H] = [{H}]; got {tuple(decay.shape)}")
    return dispatch.hybrid_attention(q, k, v, q_feat, k_feat, mix, kind, window_size, attention_mask, scale, sinks,
                                     decay=decay)
