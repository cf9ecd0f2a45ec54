"""The decode step of hybrid attention as one Triton kernel: fold, window softmax and readout, fused.

Same state (:class:`kernels.hybrid.recurrent_torch.HybridState`) and contract as
:func:`kernels.hybrid.recurrent_torch.decode_step_torch`; the bookkeeping on ``[B, K]`` index
tensors and the key feature map of the leaving keys stay in PyTorch (``kernels.hybrid.ring``). One
program per (batch row, query head) computes, in float32:

    S' = S + sum_{leaving j} phi_k(k_j) v_j^T,   z' = z + sum_{leaving j} phi_k(k_j)

(with a decay, S and z are first carried by the window's advance and the leaving keys' features
weighted by their age, in PyTorch: ``kernels.hybrid.decay``)
    y  = (phi_q(q)^T S' + g sum_{j in window} exp(s_j - c) v_j) / (phi_q(q)^T z' + g sum exp(s_j - c))

with an online max over the window cache (read per KV head). See docs/kernels.md.
"""

from __future__ import annotations

import dataclasses

import torch

from kernels._triton import INTERPRETER, tl, triton
from kernels.hybrid.chunk_triton import head_indices, head_ptr, load_rows, load_state, store_state
from kernels.hybrid.decay import advance
from kernels.hybrid.recurrent_torch import HybridState, KeyFeatures, fold_weight, joined, sink_fields, step_window
from kernels.hybrid.ring import any_columns, leaving, leaving_columns, place_token, token_position
from kernels.hybrid.window import WindowRule


@triton.jit
def hybrid_decode_kernel(
    q, qf, S, z, kfold, vfold, wk, wv, wvalid, gate, y, S_out, z_out,
    s_qb, s_qh, s_qfb, s_qfh, s_kfb, s_kfh, s_kfc, s_vfb, s_vfh, s_vfc, s_wkb, s_wkh, s_wkc, s_wvb, s_wvh, s_wvc,
    H, G, SG, C, K, scale,
    HAS_WINDOW: tl.constexpr,
    D: tl.constexpr, FD: tl.constexpr, BD: tl.constexpr, BF: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
):
    """One program per (batch row, query head): fold, window softmax and readout of one token. The
    state has one head per SG query heads (SG = 1: per query head, G: per key/value head); the
    programs of one state head fold the same keys into it and store the same values."""
    i_bh = tl.program_id(0).to(tl.int64)
    i_b, i_h, i_kh = head_indices(i_bh, H, G)
    i_sh = i_h // SG
    i_bs = i_b * (H // SG) + i_sh  # the state head's flat index
    o_d, o_f = tl.arange(0, BD), tl.arange(0, BF)
    m_d, m_f = o_d < D, o_f < FD

    b_S, b_z = load_state(S, z, i_bs, 0, 1, o_f, o_d, m_f, m_d, D, FD)  # [BF, BD], [BF]
    # fold the keys leaving the window (their features already carry the 0/1 fold weight)
    p_kf0 = head_ptr(kfold, i_b, i_sh, s_kfb, s_kfh)
    p_vf0 = head_ptr(vfold, i_b, i_kh, s_vfb, s_vfh)
    for c0 in range(0, C, BC):
        o_c = c0 + tl.arange(0, BC)
        m_c = o_c < C
        b_kf = load_rows(p_kf0, o_c, s_kfc, o_f, m_c, m_f).to(tl.float32)
        b_v = load_rows(p_vf0, o_c, s_vfc, o_d, m_c, m_d).to(tl.float32)
        b_S += tl.dot(tl.trans(b_kf), b_v, input_precision="ieee")  # [BF, BD]
        b_z += tl.sum(b_kf, 0)
    store_state(S_out, z_out, b_S, b_z, i_bs, 0, 1, o_f, o_d, m_f, m_d, D, FD)

    b_q = tl.load(head_ptr(q, i_b, i_h, s_qb, s_qh) + o_d, mask=m_d, other=0).to(tl.float32)  # [BD]
    b_qf = tl.load(head_ptr(qf, i_b, i_h, s_qfb, s_qfh) + o_f, mask=m_f, other=0).to(tl.float32)  # [BF]
    b_num = tl.sum(b_qf[:, None] * b_S, 0)  # [BD]
    b_den = tl.sum(b_qf * b_z, 0)
    if HAS_WINDOW:
        p_wk0 = head_ptr(wk, i_b, i_kh, s_wkb, s_wkh)
        p_wv0 = head_ptr(wv, i_b, i_kh, s_wvb, s_wvh)
        b_m = tl.max(tl.full([BK], float("-inf"), dtype=tl.float32), 0)
        b_l = tl.sum(tl.zeros([BK], dtype=tl.float32), 0)
        b_acc = tl.zeros([BD], dtype=tl.float32)
        for c0 in range(0, K, BK):
            o_c = c0 + tl.arange(0, BK)
            m_c = o_c < K
            m_c = m_c & (tl.load(wvalid + i_b * K + o_c, mask=m_c, other=0) != 0)
            b_k = load_rows(p_wk0, o_c, s_wkc, o_d, m_c, m_d).to(tl.float32)
            b_v = load_rows(p_wv0, o_c, s_wvc, o_d, m_c, m_d).to(tl.float32)
            b_s = tl.where(m_c, tl.sum(b_q[None, :] * b_k, 1) * scale, float("-inf"))  # [BK]
            b_mn = tl.maximum(b_m, tl.max(b_s, 0))
            # -inf while no valid column has been seen: shift by 0 instead (everything is 0 then)
            b_shift = tl.where(b_mn == float("-inf"), 0.0, b_mn)
            b_alpha = tl.exp(b_m - b_shift)
            b_p = tl.where(m_c, tl.exp(b_s - b_shift), 0.0)
            b_acc = b_acc * b_alpha + tl.sum(b_p[:, None] * b_v, 0)
            b_l = b_l * b_alpha + tl.sum(b_p, 0)
            b_m = b_mn
        b_g = tl.load(gate + i_h)
        b_num += b_g * b_acc
        b_den += b_g * b_l
    b_y = b_num / tl.where(b_den > 0, b_den, 1.0)
    tl.store(y + i_bh * D + o_d, b_y.to(y.dtype.element_ty), mask=m_d)


def decode_step_triton(
    state: HybridState, rule: WindowRule, q, k, v, q_feat, mix, valid, key_features: KeyFeatures, scale: float,
    decay=None, *, inplace: bool = False,
) -> tuple[torch.Tensor, HybridState]:
    """One decode step through the Triton kernel; returns ``(y [B, H, 1, d], new_state)``.

    Args as :func:`kernels.hybrid.recurrent_torch.decode_step_torch`:
        state: the layer's :class:`HybridState`.
        rule: the window rule, :class:`kernels.hybrid.window.WindowRule` (its sink tokens are the state's).
        q: ``[B, H, 1, d]``; k, v: ``[B, H_kv, 1, d]``; q_feat: ``[B, H, 1, F]``.
        mix: ``[H]`` mixing logits.
        valid: ``[B]`` bool, False for a padding token.
        key_features: (keys ``[B, H_kv, C, d]``, their positions ``[B, C]``) -> ``[B, H_s, C, F]``
            (phi_k per state head, H_s = H or H_kv: ``kernels.hybrid.heads``).
        scale: score scale.
        decay: None or log gamma ``[H_s]`` (``kernels.hybrid.decay``).
        inplace: update ``state.S`` and ``state.z`` in place instead of allocating new ones
            (saves a copy per step; the old state object then shares them; a state per key/value
            head is never updated in place, since G programs read it). Default: ``False``.
            The window cache is always updated in place (one ring slot per step).
    """
    B, H, _, d = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    Fd = q_feat.shape[-1]
    Hs = state.S.shape[1]
    kind, w = rule.kind, rule.window_size
    first, pos = token_position(state, valid)
    if kind == "linear":  # no window: the key goes straight into the state
        kfold, vfold = key_features(k, pos[:, None]) * valid[:, None, None, None].to(q_feat.dtype), v
    else:
        fold = leaving(kind, w, state, pos)
        cols = leaving_columns(kind, state, fold)
        if any_columns(cols):
            weight = fold_weight(state, fold, cols, kind, w, pos, decay)
            weight = (weight[:, :, :, None] if weight.dim() == 3 else weight[:, None, :, None]).to(q_feat.dtype)
            kfold = key_features(state.win_k[:, :, cols], state.win_pos[:, cols]) * weight  # [B, H_s, C, F]
            vfold = state.win_v[:, :, cols].clone()  # [B, H_kv, C, d], a copy: place_token overwrites the slot
        else:
            kfold = q_feat.new_zeros(B, Hs, 0, Fd)
            vfold = v.new_zeros(B, Hkv, 0, d)
        place_token(state, k, v, pos, valid, fold)
    kfold = kfold if kfold.stride(-1) == 1 else kfold.contiguous()
    vfold = vfold if vfold.stride(-1) == 1 else vfold.contiguous()
    sink, ring, sinks = step_window(state, kind, w, k, v, pos, valid)
    win_k, win_v, win_valid = joined(ring, sinks)  # the ring (and sinks) as one key tensor

    S, z = advance(state.S, state.z, decay, kind, w, pos - 1, pos)
    if inplace and Hs == H and S.is_contiguous() and z.is_contiguous() and S.dtype == torch.float32 and z.dtype == torch.float32:
        S_out, z_out = S, z
    else:
        S, z = S.float().contiguous(), z.float().contiguous()
        S_out, z_out = torch.empty_like(S), torch.empty_like(z)
    K = win_k.shape[2]
    C = kfold.shape[2]
    # empty tensors may have no storage: hand the kernel another pointer it will not read
    if C == 0:
        kfold, vfold = q_feat, q
    wk = win_k if win_k.stride(-1) == 1 else win_k.contiguous()
    wv = win_v if win_v.stride(-1) == 1 else win_v.contiguous()
    wvalid = win_valid.to(torch.uint8).contiguous()
    if K == 0:
        wk, wv, wvalid = q, q, q
    qf = q_feat if q_feat.stride(-1) == 1 else q_feat.contiguous()
    qq = q if q.stride(-1) == 1 else q.contiguous()
    gate = torch.sigmoid(mix.detach().float()).contiguous()
    y = torch.empty(B, H, 1, d, device=q.device, dtype=q.dtype)
    BD = max(16, triton.next_power_of_2(d))
    BF = max(16, triton.next_power_of_2(Fd))
    BK = min(64, max(16, triton.next_power_of_2(max(K, 1))))
    launch = {} if INTERPRETER else {"num_warps": 4}
    hybrid_decode_kernel[(B * H,)](
        qq, qf, S, z, kfold, vfold, wk, wv, wvalid, gate, y, S_out, z_out,
        qq.stride(0), qq.stride(1), qf.stride(0), qf.stride(1),
        kfold.stride(0), kfold.stride(1), kfold.stride(2), vfold.stride(0), vfold.stride(1), vfold.stride(2),
        wk.stride(0), wk.stride(1), wk.stride(2), wv.stride(0), wv.stride(1), wv.stride(2),
        H, G, H // Hs, C, K, float(scale),
        HAS_WINDOW=kind != "linear" and K > 0,
        D=d, FD=Fd, BD=BD, BF=BF, BC=16, BK=BK, **launch,
    )
    return y, dataclasses.replace(state.stepped(S_out, z_out, first), **sink_fields(sink))


__all__ = ["decode_step_triton"]
