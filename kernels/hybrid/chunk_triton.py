"""The chunked form of hybrid attention as Triton kernels: forward and backward, all three kinds.

Same contract as :func:`kernels.hybrid.chunk_torch.hybrid_attention_torch` (equation there):
q ``[B, H, L, d]``, k and v ``[B, H_kv, L, d]`` (query head h reads KV head ``h // G``; K/V are
never repeated), q_feat and k_feat ``[B, H, L, F]``, mix ``[H]``, key mask ``[B, L]``. Query n
attends with softmax to the real keys ``lb(n) <= j <= n`` and linearly to the real keys
``j < lb(n)``, with lb = ``kernels.hybrid.window.window_start`` (its jit copy: ``_window_start``);
with s sink tokens the keys ``j < s`` are softmax keys of every query ``n >= j`` and never linear.
A query block whose key loop starts past them reads them beside it, as blocks of SB keys
(:func:`sink_block`); its backward program writes their dk, dv parts, which the host sums.
With ``decay`` (log gamma_h, ``[H]``) history key j of query n is weighted by
gamma_h^(lb(n) - 1 - j) (``kernels.hybrid.decay``): the prefix state of a chunk is decayed to the
chunk's last key, and a query reading it scales it by gamma^(lb(n) - chunk start).

Kernels: ``hybrid_chunk_state_kernel`` (per-chunk state increments; PyTorch sums them into prefix
states), ``hybrid_fwd_kernel`` (window max, then window and history in one accumulator),
``hybrid_bwd_dq_kernel`` and ``hybrid_bwd_dkv_kernel`` (scores recomputed; per query only the
window max, its argmax and the normaliser are saved; the dkv kernel covers the key blocks in a
query block's loop, the dq kernel the sinks beside it), ``decayed_scan_kernel`` (prefix states
from the increments, and their gradients, in chunk order). Accumulation is float32. What is fused, the
tilings and the precision rules: docs/kernels.md.
"""

from __future__ import annotations

import torch

from kernels._triton import INTERPRETER, tl, triton
from kernels.hybrid.chunk_torch import left_align, restore_rows
from kernels.hybrid.window import WindowRule, window_start

KIND_IDS = {"linear": 0, "sliding_window": 1, "terraced": 2}  # the KIND constexpr of the kernels (_window_start)
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_DIM = 256  # head dim and feature dim; larger blocks would not fit on chip


# --------------------------------------------------------------------------------------------
# device helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _window_start(n, w, KIND: tl.constexpr):
    """lb(n): first key position inside the window of query n (n >= 0); kernels.hybrid.window.window_start."""
    if KIND == 0:
        return n + 1
    elif KIND == 1:
        return n - w + 1
    else:
        return w * (n // w - 1)


@triton.jit
def _last_query_block(X, w, BT: tl.constexpr, KIND: tl.constexpr):
    """Largest query block i with lb(i * BT) < X (X > 0): the last block whose key loop starts at
    or before the state chunk that ends at X."""
    if KIND == 0:
        return (X - 2) // BT
    elif KIND == 1:
        return (X + w - 2) // BT
    else:
        return (((X + w - 1) // w + 1) * w - 1) // BT


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    """Matrix product with float32 accumulation. DOT = 0: the operands' own precision (half
    inputs; float32 operands in tf32), 1: exact float32, 2: operands upcast to float32 first (the
    CPU interpreter multiplies bfloat16 operands wrongly)."""
    if DOT == 1:
        return tl.dot(a, b, input_precision="ieee")
    elif DOT == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def head_indices(i_bh, H, G):
    """(batch row, query head, KV head) of the flat index i_bh = b * H + h."""
    i_h = i_bh % H
    return i_bh // H, i_h, i_h // G


@triton.jit
def head_ptr(x, i_b, i_h, s_b, s_h):
    """Pointer to head i_h of batch row i_b of a [B, heads, L, D] tensor with strides s_b, s_h."""
    return x + i_b * s_b + i_h * s_h


@triton.jit
def load_rows(p, o_r, s_r, o_c, m_r, m_c):
    """Block [rows o_r, columns o_c] of the head at p (row stride s_r, unit column stride); 0 where masked."""
    return tl.load(p + o_r[:, None].to(tl.int64) * s_r + o_c[None, :], mask=m_r[:, None] & m_c[None, :], other=0)


@triton.jit
def _key_valid(kmask, i_b, o_k, L, HAS_MASK: tl.constexpr):
    """Keys o_k that exist and are not padding."""
    m_k = o_k < L
    if HAS_MASK:
        m_k = m_k & (tl.load(kmask + i_b * L + o_k, mask=m_k, other=0) != 0)
    return m_k


@triton.jit
def _query_block(i_t, L, w, BT: tl.constexpr, KIND: tl.constexpr):
    """Rows of query block i_t: (o_t, m_t, lb(o_t), lb of the first and last row, k0, k_end). The
    block's key loop runs over [k0, k_end); keys before k0 (a state-chunk boundary) are history for
    every row and come from the prefix state of chunk k0 // BT."""
    o_t = i_t * BT + tl.arange(0, BT)
    t_first = i_t * BT
    t_last = tl.minimum(t_first + BT, L) - 1
    lb_first = _window_start(t_first, w, KIND)
    k0 = tl.maximum(lb_first, 0) // BT * BT
    return o_t, o_t < L, _window_start(o_t, w, KIND), lb_first, _window_start(t_last, w, KIND), k0, t_last + 1


@triton.jit
def _window_mask(o_t, o_k, lb_q, m_k, sinks):
    """[rows, keys]: real keys with j <= n and lb(n) <= j or j < s (softmax)."""
    m_in = (o_k[None, :] >= lb_q[:, None]) | (o_k[None, :] < sinks)
    return (o_k[None, :] <= o_t[:, None]) & m_in & m_k[None, :]


@triton.jit
def _history_mask(o_k, lb_q, m_k, sinks):
    """[rows, keys]: real keys with s <= j < lb(n) (linear)."""
    return (o_k[None, :] < lb_q[:, None]) & (o_k[None, :] >= sinks) & m_k[None, :]


@triton.jit
def _sink_block(kmask, i_b, ss, L, sinks, limit, SB: tl.constexpr, HAS_MASK: tl.constexpr):
    """Keys ss + [0, SB) of the sink blocks, which a query block reads beside its key loop:
    (o_s, m_s) with m_s the real sink keys j < min(s, limit) (``limit``: where the loop starts)."""
    o_s = ss + tl.arange(0, SB)
    return o_s, _key_valid(kmask, i_b, o_s, L, HAS_MASK) & (o_s < sinks) & (o_s < limit)


@triton.jit
def _sink_end(sinks, limit, SB: tl.constexpr):
    """End of the sink-block loop: the blocks of SB keys holding the sink keys before ``limit``."""
    return tl.minimum(tl.cdiv(sinks, SB) * SB, limit)


@triton.jit
def _max_update(b_q, b_k, o_t, ks, o_k, lb_q, m_k, sinks, scale, b_m, b_am, DOT: tl.constexpr):
    """(window max, argmax) of each row updated with the key block o_k = ks + [0, keys)."""
    b_s = _dot(b_q, tl.trans(b_k), DOT) * scale  # [BT, keys]
    b_s = tl.where(_window_mask(o_t, o_k, lb_q, m_k, sinks), b_s, float("-inf"))
    b_bm = tl.max(b_s, 1)
    b_ba = (tl.argmax(b_s, 1) + ks).to(tl.int32)
    upd = b_bm > b_m
    return tl.where(upd, b_bm, b_m), tl.where(upd, b_ba, b_am)


@triton.jit
def _history_decay(o_k, lb_q, m_h, lg):
    """[rows, keys]: (gamma^(lb(n) - 1 - j), lb(n) - 1 - j) on the history m_h, (1, 0) elsewhere
    (lg = log gamma of the head)."""
    age = tl.where(m_h, lb_q[:, None] - 1 - o_k[None, :], 0).to(tl.float32)
    return tl.exp(lg * age), age


@triton.jit
def _chunk_end_ages(o_k, BT: tl.constexpr):
    """Age of keys o_k at the last key of their chunk of BT: (o_k // BT + 1) BT - 1 - o_k."""
    return ((o_k // BT + 1) * BT - 1 - o_k).to(tl.float32)


@triton.jit
def _window_weights(b_q, b_k, b_c, b_g, m_w, scale, DOT: tl.constexpr):
    """g exp(q k^T scale - c) on the window, 0 elsewhere."""
    b_s = _dot(b_q, tl.trans(b_k), DOT) * scale
    return b_g * tl.exp(tl.where(m_w, b_s - b_c[:, None], float("-inf")))


@triton.jit
def _state_offsets(i_bh, chunk, NC, o_f, o_d, D: tl.constexpr, FD: tl.constexpr):
    """Offsets of the [F, d] and [F] state of ``chunk`` in buffers [B * H, NC, F, d] and [B * H, NC, F]."""
    o_z = (i_bh * NC + chunk) * FD + o_f
    return o_z[:, None] * D + o_d[None, :], o_z


@triton.jit
def load_state(S, z, i_bh, chunk, NC, o_f, o_d, m_f, m_d, D: tl.constexpr, FD: tl.constexpr):
    o_S, o_z = _state_offsets(i_bh, chunk, NC, o_f, o_d, D, FD)
    return tl.load(S + o_S, mask=m_f[:, None] & m_d[None, :], other=0), tl.load(z + o_z, mask=m_f, other=0)


@triton.jit
def store_state(S, z, b_S, b_z, i_bh, chunk, NC, o_f, o_d, m_f, m_d, D: tl.constexpr, FD: tl.constexpr):
    o_S, o_z = _state_offsets(i_bh, chunk, NC, o_f, o_d, D, FD)
    tl.store(S + o_S, b_S, mask=m_f[:, None] & m_d[None, :])
    tl.store(z + o_z, b_z, mask=m_f)


# --------------------------------------------------------------------------------------------
# kernels (program ids are cast to int64 once: every offset derived from them is 64-bit)
# --------------------------------------------------------------------------------------------


@triton.jit
def hybrid_chunk_state_kernel(
    kf, v, kmask, decay, dS, dz,
    s_fb, s_fh, s_fl, s_vb, s_vh, s_vl,
    L, H, G, NC, sinks,
    HAS_MASK: tl.constexpr, DECAY: tl.constexpr, DOT: tl.constexpr,
    D: tl.constexpr, FD: tl.constexpr, BD: tl.constexpr, BF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
    SB: tl.constexpr,
):
    """Per chunk of BT keys: dS = sum_j a_j phi_k(k_j) v_j^T [F, d], dz = sum_j a_j phi_k(k_j) [F],
    a_j = gamma^(the key's age at the chunk's last key) with a decay, else 1, over the keys j >= s
    (sink keys never enter the history)."""
    i_bh, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h, i_kh = head_indices(i_bh, H, G)
    o_d, o_f = tl.arange(0, BD), tl.arange(0, BF)
    m_d, m_f = o_d < D, o_f < FD
    p_kf0 = head_ptr(kf, i_b, i_h, s_fb, s_fh)
    p_v0 = head_ptr(v, i_b, i_kh, s_vb, s_vh)
    b_S = tl.zeros([BF, BD], dtype=tl.float32)
    b_z = tl.zeros([BF], dtype=tl.float32)
    for s0 in range(0, BT, BS):
        o_k = i_c * BT + s0 + tl.arange(0, BS)
        m_k = _key_valid(kmask, i_b, o_k, L, HAS_MASK) & (o_k >= sinks)
        b_kf = load_rows(p_kf0, o_k, s_fl, o_f, m_k, m_f).to(tl.float32)  # [BS, BF]
        if DECAY:
            b_kf *= tl.exp(tl.load(decay + i_h) * _chunk_end_ages(o_k, BT))[:, None]
        b_v = load_rows(p_v0, o_k, s_vl, o_d, m_k, m_d)  # [BS, BD]
        b_S += _dot(tl.trans(b_kf), b_v.to(tl.float32), DOT)  # [BF, BD]
        b_z += tl.sum(b_kf, 0)
    store_state(dS, dz, b_S, b_z, i_bh, i_c, NC, o_f, o_d, m_f, m_d, D, FD)


@triton.jit
def decayed_scan_kernel(x, y, ya, decay, NC, N, H, step, REVERSE: tl.constexpr, AGES: tl.constexpr, BN: tl.constexpr):
    """Exclusive scan over the NC chunks of x [B * H, NC, N] with r = gamma_h^step (1 without a
    decay): y_c = sum_{m < c} r^(c - 1 - m) x_m, or with REVERSE y_m = sum_{c > m} r^(c - m - 1) x_c
    and, with AGES, ya_m = sum_{c > m} (c - m - 1) step r^(c - m - 1) x_c (its derivative in log gamma)."""
    i_bh, i_n = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    r = tl.exp(tl.load(decay + i_bh % H) * step)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    acc = tl.zeros([BN], dtype=tl.float32)
    acc_a = tl.zeros([BN], dtype=tl.float32)
    for t in range(0, NC):
        c = NC - 1 - t if REVERSE else t
        p = (i_bh * NC + c) * N + o_n
        tl.store(y + p, acc, mask=m_n)
        if AGES:
            tl.store(ya + p, acc_a, mask=m_n)
            acc_a = r * (acc_a + step * acc)
        acc = acc * r + tl.load(x + p, mask=m_n, other=0)


@triton.jit
def hybrid_fwd_kernel(
    q, k, v, qf, kf, kmask, gate, decay, S, z, o, cmax, amax, den,
    s_qb, s_qh, s_ql, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_qfb, s_qfh, s_qfl, s_kfb, s_kfh, s_kfl,
    L, H, G, NC, w, scale, sinks,
    KIND: tl.constexpr, HAS_MASK: tl.constexpr, DECAY: tl.constexpr, DOT: tl.constexpr,
    D: tl.constexpr, FD: tl.constexpr, BD: tl.constexpr, BF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
    SB: tl.constexpr,
):
    i_bh, i_t = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h, i_kh = head_indices(i_bh, H, G)
    o_t, m_t, lb_q, lb_first, lb_last, k0, k_end = _query_block(i_t, L, w, BT, KIND)
    o_d, o_f = tl.arange(0, BD), tl.arange(0, BF)
    m_d, m_f = o_d < D, o_f < FD
    p_k0 = head_ptr(k, i_b, i_kh, s_kb, s_kh)
    p_v0 = head_ptr(v, i_b, i_kh, s_vb, s_vh)
    p_kf0 = head_ptr(kf, i_b, i_h, s_kfb, s_kfh)
    b_q = load_rows(head_ptr(q, i_b, i_h, s_qb, s_qh), o_t, s_ql, o_d, m_t, m_d)  # [BT, BD]
    b_qf = load_rows(head_ptr(qf, i_b, i_h, s_qfb, s_qfh), o_t, s_qfl, o_f, m_t, m_f)  # [BT, BF]
    b_g = tl.load(gate + i_h)
    b_lg = tl.load(decay + i_h)

    # pass 1: the window max c_n and its argmax
    b_m = tl.full([BT], float("-inf"), dtype=tl.float32)
    b_am = tl.zeros([BT], dtype=tl.int32)
    if KIND != 0:
        k1 = tl.maximum(lb_first, 0) // BS * BS
        for ks in range(k1, k_end, BS):
            o_k = ks + tl.arange(0, BS)
            m_k = _key_valid(kmask, i_b, o_k, L, HAS_MASK)
            b_k = load_rows(p_k0, o_k, s_kl, o_d, m_k, m_d)
            b_m, b_am = _max_update(b_q, b_k, o_t, ks, o_k, lb_q, m_k, sinks, scale, b_m, b_am, DOT)
        if SB > 0:  # the sink keys before that loop
            for ss in range(0, _sink_end(sinks, k1, SB), SB):
                o_s, m_s = _sink_block(kmask, i_b, ss, L, sinks, k1, SB, HAS_MASK)
                b_k = load_rows(p_k0, o_s, s_kl, o_d, m_s, m_d)
                b_m, b_am = _max_update(b_q, b_k, o_t, ss, o_s, lb_q, m_s, sinks, scale, b_m, b_am, DOT)
    b_c = tl.where(b_m == float("-inf"), 0.0, b_m)

    # pass 2: window and history in one accumulator, plus the prefix state
    b_acc = tl.zeros([BT, BD], dtype=tl.float32)
    b_den = tl.zeros([BT], dtype=tl.float32)
    if k0 > 0:
        b_S, b_z = load_state(S, z, i_bh, k0 // BT, NC, o_f, o_d, m_f, m_d, D, FD)  # [BF, BD], [BF]
        b_qf32 = b_qf.to(tl.float32)
        if DECAY:  # the state is decayed to key k0 - 1; row n reads it gamma^(lb(n) - k0) later
            b_qf32 *= tl.exp(b_lg * (lb_q - k0).to(tl.float32))[:, None]
        b_acc += _dot(b_qf32, b_S, DOT)
        b_den += tl.sum(b_qf32 * b_z[None, :], 1)
    for ks in range(k0, k_end, BS):
        o_k = ks + tl.arange(0, BS)
        m_k = _key_valid(kmask, i_b, o_k, L, HAS_MASK)
        b_v = load_rows(p_v0, o_k, s_vl, o_d, m_k, m_d)
        b_p = tl.zeros([BT, BS], dtype=tl.float32)
        if KIND != 0:
            if (ks + BS > lb_first) | (ks < sinks):
                b_k = load_rows(p_k0, o_k, s_kl, o_d, m_k, m_d)
                b_p = _window_weights(b_q, b_k, b_c, b_g, _window_mask(o_t, o_k, lb_q, m_k, sinks), scale, DOT)
        if ks < lb_last:
            b_kf = load_rows(p_kf0, o_k, s_kfl, o_f, m_k, m_f)
            b_a = _dot(b_qf, tl.trans(b_kf), DOT)  # [BT, BS]
            m_h = _history_mask(o_k, lb_q, m_k, sinks)
            if DECAY:
                b_a *= _history_decay(o_k, lb_q, m_h, b_lg)[0]
            b_p += tl.where(m_h, b_a, 0.0)
        b_acc += _dot(b_p.to(b_v.dtype), b_v, DOT)
        b_den += tl.sum(b_p, 1)
    if SB > 0:  # the sink keys before the loop: window terms only
        for ss in range(0, _sink_end(sinks, k0, SB), SB):
            o_s, m_s = _sink_block(kmask, i_b, ss, L, sinks, k0, SB, HAS_MASK)
            b_k = load_rows(p_k0, o_s, s_kl, o_d, m_s, m_d)
            b_v = load_rows(p_v0, o_s, s_vl, o_d, m_s, m_d)
            b_p = _window_weights(b_q, b_k, b_c, b_g, _window_mask(o_t, o_s, lb_q, m_s, sinks), scale, DOT)  # [BT, SB]
            b_acc += _dot(b_p.to(b_v.dtype), b_v, DOT)
            b_den += tl.sum(b_p, 1)

    b_o = b_acc / tl.where(b_den > 0, b_den, 1.0)[:, None]
    o_row = i_bh * L + o_t
    tl.store(o + o_row[:, None] * D + o_d[None, :], b_o.to(o.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])
    tl.store(cmax + o_row, b_c, mask=m_t)
    tl.store(amax + o_row, b_am, mask=m_t)
    tl.store(den + o_row, b_den, mask=m_t)


@triton.jit
def hybrid_bwd_dq_kernel(
    q, k, v, qf, kf, kmask, gate, decay, S, z, dy, den, delta, cmax, amax,
    dq, dqf, dc, dSb, dzb, dlg, dks, dvs,
    s_qb, s_qh, s_ql, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_qfb, s_qfh, s_qfl, s_kfb, s_kfh, s_kfl,
    L, H, G, NC, w, scale, sinks,
    KIND: tl.constexpr, HAS_MASK: tl.constexpr, DECAY: tl.constexpr, DOT: tl.constexpr,
    D: tl.constexpr, FD: tl.constexpr, BD: tl.constexpr, BF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
    SB: tl.constexpr,
):
    i_bh, i_t = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h, i_kh = head_indices(i_bh, H, G)
    o_t, m_t, lb_q, lb_first, lb_last, k0, k_end = _query_block(i_t, L, w, BT, KIND)
    o_d, o_f = tl.arange(0, BD), tl.arange(0, BF)
    m_d, m_f = o_d < D, o_f < FD
    p_k0 = head_ptr(k, i_b, i_kh, s_kb, s_kh)
    p_v0 = head_ptr(v, i_b, i_kh, s_vb, s_vh)
    p_kf0 = head_ptr(kf, i_b, i_h, s_kfb, s_kfh)
    o_row = i_bh * L + o_t
    b_q = load_rows(head_ptr(q, i_b, i_h, s_qb, s_qh), o_t, s_ql, o_d, m_t, m_d)  # [BT, BD]
    b_qf = load_rows(head_ptr(qf, i_b, i_h, s_qfb, s_qfh), o_t, s_qfl, o_f, m_t, m_f)  # [BT, BF]
    b_dy = load_rows(dy + i_bh * L * D, o_t, D, o_d, m_t, m_d).to(tl.float32)
    b_den = tl.load(den + o_row, mask=m_t, other=1.0)
    b_delta = tl.load(delta + o_row, mask=m_t, other=0.0)
    b_c = tl.load(cmax + o_row, mask=m_t, other=0.0)
    b_am = tl.load(amax + o_row, mask=m_t, other=0)
    b_g = tl.load(gate + i_h)
    b_lg = tl.load(decay + i_h)
    b_fq = tl.full([BT], 1.0, dtype=tl.float32)  # the factor of the prefix state row n reads
    if DECAY:
        b_fq = tl.exp(b_lg * (lb_q - k0).to(tl.float32))
    # dL/dP_nj = dy_n.v_j / den_n - delta_n  with  delta_n = dy_n.y_n / den_n
    b_do = b_dy * (1.0 / tl.where(b_den > 0, b_den, 1.0))[:, None]  # [BT, BD] fp32
    b_doc = b_do.to(q.dtype.element_ty)

    b_dq = tl.zeros([BT, BD], dtype=tl.float32)
    b_dqf = tl.zeros([BT, BF], dtype=tl.float32)
    b_r = tl.zeros([BT], dtype=tl.float32)  # sum_j Pw_nj dP_nj = -dL/dc_n
    # dL/dlog gamma of row n's history pairs: sum_j age_nj A_nj dP_nj, A_nj = its weighted score
    # (the ages of the prefix pairs before the state's last key are added on the host)
    b_dlg = tl.zeros([BT], dtype=tl.float32)
    if k0 > 0:
        b_S, b_z = load_state(S, z, i_bh, k0 // BT, NC, o_f, o_d, m_f, m_d, D, FD)  # [BF, BD], [BF]
        b_dqs = (_dot(b_do, tl.trans(b_S), DOT) - b_delta[:, None] * b_z[None, :]) * b_fq[:, None]
        b_dqf += b_dqs
        if DECAY:
            b_dlg += (lb_q - k0).to(tl.float32) * tl.sum(b_qf.to(tl.float32) * b_dqs, 1)
    for ks in range(k0, k_end, BS):
        o_k = ks + tl.arange(0, BS)
        m_k = _key_valid(kmask, i_b, o_k, L, HAS_MASK)
        b_v = load_rows(p_v0, o_k, s_vl, o_d, m_k, m_d)
        b_dp = _dot(b_doc, tl.trans(b_v), DOT) - b_delta[:, None]  # [BT, BS]
        if KIND != 0:
            if (ks + BS > lb_first) | (ks < sinks):
                b_k = load_rows(p_k0, o_k, s_kl, o_d, m_k, m_d)
                b_ds = _window_weights(b_q, b_k, b_c, b_g, _window_mask(o_t, o_k, lb_q, m_k, sinks), scale, DOT) * b_dp
                b_r += tl.sum(b_ds, 1)
                b_dq += _dot(b_ds.to(b_k.dtype), b_k, DOT)
        if ks < lb_last:
            b_kf = load_rows(p_kf0, o_k, s_kfl, o_f, m_k, m_f)
            m_h = _history_mask(o_k, lb_q, m_k, sinks)
            b_da = tl.where(m_h, b_dp, 0.0)
            if DECAY:
                b_wh, b_age = _history_decay(o_k, lb_q, m_h, b_lg)
                b_da *= b_wh
                b_dlg += tl.sum(b_age * _dot(b_qf, tl.trans(b_kf), DOT) * b_da, 1)
            b_dqf += _dot(b_da.to(b_kf.dtype), b_kf, DOT)
    if SB > 0:  # the sink keys before the loop: window terms only
        for ss in range(0, _sink_end(sinks, k0, SB), SB):
            o_s, m_s = _sink_block(kmask, i_b, ss, L, sinks, k0, SB, HAS_MASK)
            b_k = load_rows(p_k0, o_s, s_kl, o_d, m_s, m_d)
            b_v = load_rows(p_v0, o_s, s_vl, o_d, m_s, m_d)
            b_dp = _dot(b_doc, tl.trans(b_v), DOT) - b_delta[:, None]  # [BT, SB]
            b_ds = _window_weights(b_q, b_k, b_c, b_g, _window_mask(o_t, o_s, lb_q, m_s, sinks), scale, DOT) * b_dp
            b_r += tl.sum(b_ds, 1)
            b_dq += _dot(b_ds.to(b_k.dtype), b_k, DOT)
    b_dc = -b_r
    if KIND != 0:
        # the window max c_n = s_{n, argmax}: its gradient reaches that one key
        b_ka = load_rows(p_k0, b_am, s_kl, o_d, m_t, m_d)
        b_dq += b_dc[:, None] * b_ka.to(tl.float32)
    b_dq *= scale
    # this block's part of the gradients of the sink keys it read beside its loop (the dkv kernel
    # covers the blocks whose loop holds them): dk_j = scale sum_n (dS_nj + [j = argmax_n] dc_n) q_n,
    # dv_j = sum_n P_nj dy_n / den_n, summed over the query blocks on the host
    if SB > 0:
        for ss in range(0, _sink_end(sinks, k0, SB), SB):
            o_s, m_s = _sink_block(kmask, i_b, ss, L, sinks, k0, SB, HAS_MASK)
            b_k = load_rows(p_k0, o_s, s_kl, o_d, m_s, m_d)
            b_v = load_rows(p_v0, o_s, s_vl, o_d, m_s, m_d)
            b_dp = _dot(b_doc, tl.trans(b_v), DOT) - b_delta[:, None]
            b_p = _window_weights(b_q, b_k, b_c, b_g, _window_mask(o_t, o_s, lb_q, m_s, sinks), scale, DOT)  # [BT, SB]
            b_ds = b_p * b_dp + tl.where((o_s[None, :] == b_am[:, None]) & m_s[None, :], b_dc[:, None], 0.0)
            o_sink = ((i_bh * tl.cdiv(L, BT) + i_t) * tl.cdiv(sinks, SB) * SB + o_s[:, None]) * D + o_d[None, :]
            tl.store(dks + o_sink, _dot(tl.trans(b_ds.to(b_q.dtype)), b_q, DOT) * scale, mask=m_d[None, :])
            tl.store(dvs + o_sink, _dot(tl.trans(b_p.to(b_doc.dtype)), b_doc, DOT), mask=m_d[None, :])

    tl.store(dq + o_row[:, None] * D + o_d[None, :], b_dq.to(dq.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])
    tl.store(dqf + o_row[:, None] * FD + o_f[None, :], b_dqf.to(dqf.dtype.element_ty), mask=m_t[:, None] & m_f[None, :])
    tl.store(dc + o_row, b_dc, mask=m_t)
    if DECAY:
        tl.store(dlg + o_row, b_dlg, mask=m_t)
    # gradient of the prefix state this block read: dS = (f phi_q)^T dy/den, dz = -(f phi_q)^T delta
    b_qfs = (b_qf.to(tl.float32) * b_fq[:, None]).to(b_qf.dtype)
    b_dSb = _dot(tl.trans(b_qfs), b_do.to(b_qf.dtype), DOT)  # [BF, BD]
    b_dzb = -tl.sum(b_qfs.to(tl.float32) * b_delta[:, None], 0)
    store_state(dSb, dzb, b_dSb, b_dzb, i_bh, i_t, tl.cdiv(L, BT), o_f, o_d, m_f, m_d, D, FD)


@triton.jit
def hybrid_bwd_dkv_kernel(
    q, k, v, qf, kf, kmask, gate, decay, dy, den, delta, cmax, amax, dc, dSr, dzr,
    dk, dv, dkf, dlg,
    s_qb, s_qh, s_ql, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_qfb, s_qfh, s_qfl, s_kfb, s_kfh, s_kfl,
    L, H, G, NC, w, scale, sinks,
    KIND: tl.constexpr, HAS_MASK: tl.constexpr, DECAY: tl.constexpr, DOT: tl.constexpr,
    D: tl.constexpr, FD: tl.constexpr, BD: tl.constexpr, BF: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
    SB: tl.constexpr,
):
    i_bk, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    Hkv = H // G
    i_b, i_kh = i_bk // Hkv, i_bk % Hkv
    ks = i_s * BS
    o_k = ks + tl.arange(0, BS)
    o_d, o_f = tl.arange(0, BD), tl.arange(0, BF)
    m_d, m_f = o_d < D, o_f < FD
    m_k = _key_valid(kmask, i_b, o_k, L, HAS_MASK)
    b_k = load_rows(head_ptr(k, i_b, i_kh, s_kb, s_kh), o_k, s_kl, o_d, m_k, m_d)  # [BS, BD]
    b_v = load_rows(head_ptr(v, i_b, i_kh, s_vb, s_vh), o_k, s_vl, o_d, m_k, m_d)  # [BS, BD]

    # query blocks whose key loop contains this key block: from the block holding key ks to the
    # last block whose loop starts at or before the state chunk of ks
    NT = tl.cdiv(L, BT)
    i_lo = ks // BT
    i_hi = tl.minimum(_last_query_block((ks // BT + 1) * BT, w, BT, KIND), NT - 1)

    b_dk = tl.zeros([BS, BD], dtype=tl.float32)
    b_dv = tl.zeros([BS, BD], dtype=tl.float32)
    for i_g in range(0, G):
        i_h = i_kh * G + i_g
        i_bh = i_b * H + i_h
        b_kf = load_rows(head_ptr(kf, i_b, i_h, s_kfb, s_kfh), o_k, s_kfl, o_f, m_k, m_f)  # [BS, BF]
        b_g = tl.load(gate + i_h)
        b_lg = tl.load(decay + i_h)
        p_q0 = head_ptr(q, i_b, i_h, s_qb, s_qh)
        p_qf0 = head_ptr(qf, i_b, i_h, s_qfb, s_qfh)
        b_dkf = tl.zeros([BS, BF], dtype=tl.float32)
        for i_t in range(i_lo, i_hi + 1):
            o_t, m_t, lb_q, lb_first, lb_last, _, _ = _query_block(i_t, L, w, BT, KIND)
            o_row = i_bh * L + o_t
            b_dy = load_rows(dy + i_bh * L * D, o_t, D, o_d, m_t, m_d).to(tl.float32)
            b_den = tl.load(den + o_row, mask=m_t, other=1.0)
            b_delta = tl.load(delta + o_row, mask=m_t, other=0.0)
            b_doc = (b_dy * (1.0 / tl.where(b_den > 0, b_den, 1.0))[:, None]).to(b_k.dtype)  # [BT, BD]
            b_dp = _dot(b_doc, tl.trans(b_v), DOT) - b_delta[:, None]  # [BT, BS]
            b_p = tl.zeros([BT, BS], dtype=tl.float32)
            if KIND != 0:
                if (ks + BS > lb_first) | (ks < sinks):
                    b_q = load_rows(p_q0, o_t, s_ql, o_d, m_t, m_d)
                    b_c = tl.load(cmax + o_row, mask=m_t, other=0.0)
                    b_am = tl.load(amax + o_row, mask=m_t, other=-1)
                    b_dc = tl.load(dc + o_row, mask=m_t, other=0.0)
                    b_p = _window_weights(b_q, b_k, b_c, b_g, _window_mask(o_t, o_k, lb_q, m_k, sinks), scale, DOT)
                    b_ds = b_p * b_dp + tl.where(o_k[None, :] == b_am[:, None], b_dc[:, None], 0.0)
                    b_dk += _dot(tl.trans(b_ds.to(b_q.dtype)), b_q, DOT)
            if ks < lb_last:
                b_qf = load_rows(p_qf0, o_t, s_qfl, o_f, m_t, m_f)
                m_h = _history_mask(o_k, lb_q, m_k, sinks)
                b_a = _dot(b_qf, tl.trans(b_kf), DOT)
                b_da = tl.where(m_h, b_dp, 0.0)
                if DECAY:
                    b_wh = _history_decay(o_k, lb_q, m_h, b_lg)[0]
                    b_a *= b_wh
                    b_da *= b_wh
                b_p += tl.where(m_h, b_a, 0.0)
                b_dkf += _dot(tl.trans(b_da.to(b_qf.dtype)), b_qf, DOT)
            b_dv += _dot(tl.trans(b_p.to(b_doc.dtype)), b_doc, DOT)
        # the keys of this block but the sinks sit in every prefix state after their chunk (weighted
        # by their decay to the chunk's last key; dSr holds the later states' gradients decayed to it)
        b_dS, b_dz = load_state(dSr, dzr, i_bh, ks // BT, NC, o_f, o_d, m_f, m_d, D, FD)  # [BF, BD], [BF]
        m_st = (o_k >= sinks)[:, None]
        b_dks = tl.where(m_st, _dot(b_v.to(tl.float32), tl.trans(b_dS), DOT) + b_dz[None, :], 0.0)
        b_dvs = tl.where(m_st, _dot(b_kf.to(tl.float32), b_dS, DOT), 0.0)
        if DECAY:
            b_age = _chunk_end_ages(o_k, BT)
            b_rho = tl.exp(b_lg * b_age)[:, None]
            b_dks *= b_rho
            b_dvs *= b_rho
            # dL/dlog gamma of the states' pairs: their age up to the chunk's last key
            tl.store(dlg + i_bh * tl.cdiv(L, BS) + i_s, tl.sum(b_age * tl.sum(b_kf.to(tl.float32) * b_dks, 1)))
        b_dkf += b_dks
        b_dv += b_dvs
        b_dkf = tl.where(m_k[:, None], b_dkf, 0.0)
        p_dkf = dkf + (i_bh * L + o_k[:, None]) * FD + o_f[None, :]
        tl.store(p_dkf, b_dkf.to(dkf.dtype.element_ty), mask=(o_k[:, None] < L) & m_f[None, :])
    b_dk = tl.where(m_k[:, None], b_dk * scale, 0.0)
    b_dv = tl.where(m_k[:, None], b_dv, 0.0)
    o_kv = (i_bk * L + o_k[:, None]) * D + o_d[None, :]
    tl.store(dk + o_kv, b_dk.to(dk.dtype.element_ty), mask=(o_k[:, None] < L) & m_d[None, :])
    tl.store(dv + o_kv, b_dv.to(dv.dtype.element_ty), mask=(o_k[:, None] < L) & m_d[None, :])


# --------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def block_config(d: int, Fd: int, block_t: int | None = None, block_s: int | None = None, num_warps: int | None = None):
    """(BT, BS, num_warps, num_stages) for head dim d and feature dim F: by default BT = 64, BS = 64
    (32 when d or F > 64), 4 warps (8 when d or F > 64), 2 stages; block sizes are powers of two >= 16."""
    big = max(_pow2(d), _pow2(Fd)) > 64
    BT = block_t or 64
    BS = block_s or (32 if big else 64)
    BS = min(BS, BT)
    for name, val in (("block_t", BT), ("block_s", BS)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {val}")
    return BT, BS, num_warps or (8 if big else 4), 2


def _smaller_configs(cfg):
    """The tiling, then smaller ones to fall back to when a GPU lacks the shared memory for it."""
    BT, BS, nw, ns = cfg
    yield cfg
    yield BT, min(BS, 32), nw, 1
    yield 32, 16, 4, 1


_WORKING: dict = {}  # (phase, shapes, dtypes, tiling asked for) -> tiling that compiled


def _with_fallback(key, cfg, fixed: bool, run):
    """run(cfg); on Triton's OutOfResources retry with smaller tilings (unless the caller fixed it).

    The tilings give the same results: the saved statistics (window max, its argmax, normaliser)
    are per query, so forward and backward need not share one."""
    if fixed:
        return run(cfg)
    start = _WORKING.get((key, cfg), cfg)
    error = None
    for c in _smaller_configs(start):
        try:
            out = run(c)
        except triton.runtime.errors.OutOfResources as exc:
            error = exc
            continue
        _WORKING[(key, cfg)] = c
        return out
    raise error


def _strides(*ts):
    out = []
    for t in ts:
        out += [t.stride(0), t.stride(1), t.stride(2)]
    return out


def _dot_mode(dtype: torch.dtype, fdtype: torch.dtype) -> int:
    if dtype == torch.float32:
        return 1
    return 2 if INTERPRETER and torch.bfloat16 in (dtype, fdtype) else 0


def sink_block(sinks: int, BS: int) -> int:
    """Keys per block of the sink keys a query block reads beside its key loop: the smallest power
    of two >= 16 holding them, at most BS (0 without sink tokens)."""
    return min(_pow2(sinks), BS) if sinks else 0


def _consts(kind, kmask, q, qf, decayed, sinks, cfg):
    BT, BS, nw, ns = cfg
    d, Fd = q.shape[-1], qf.shape[-1]
    out = dict(
        KIND=KIND_IDS[kind], HAS_MASK=kmask is not None, DECAY=decayed, DOT=_dot_mode(q.dtype, qf.dtype),
        D=d, FD=Fd, BD=_pow2(d), BF=_pow2(Fd), BT=BT, BS=BS, SB=sink_block(sinks, BS),
    )
    if not INTERPRETER:
        out.update(num_warps=nw, num_stages=ns)
    return out


SCAN_BLOCK = 1024  # elements of a state per program of the chunk scan


def _scan(x, lg, step: int, reverse: bool = False, ages: bool = False):
    """:func:`decayed_scan_kernel` over x [B * H, NC, ...] (float32, contiguous): y, or (y, ya) with ``ages``."""
    BH, NC = x.shape[:2]
    N = x[0, 0].numel()
    y = torch.empty_like(x)
    ya = torch.empty_like(x) if ages else y
    grid = (BH, triton.cdiv(N, SCAN_BLOCK))
    decayed_scan_kernel[grid](x, y, ya, lg, NC, N, lg.shape[0], step, REVERSE=reverse, AGES=ages, BN=SCAN_BLOCK)
    return (y, ya) if ages else y


def _chunk_states(kf, v, kmask, lg, G, NC, sinks, consts):
    """Per-chunk increments dS [B*H, NC, F, d], dz [B*H, NC, F] of :func:`hybrid_chunk_state_kernel`."""
    B, H, L, Fd = kf.shape
    d = v.shape[-1]
    dS = torch.empty(B * H, NC, Fd, d, device=kf.device, dtype=torch.float32)
    dz = torch.empty(B * H, NC, Fd, device=kf.device, dtype=torch.float32)
    c = {key: val for key, val in consts.items() if key != "KIND"}
    hybrid_chunk_state_kernel[(B * H, NC)](
        kf, v, kmask if kmask is not None else kf, lg, dS, dz, *_strides(kf, v), L, H, G, NC, sinks, **c,
    )
    return dS, dz


def _prefix_states(dS, dz, lg, BT: int):
    """Exclusive prefix states S [B*H, NC, F, d], z [B*H, NC, F] of all keys before each chunk, each
    key weighted by gamma^(its age at the chunk's first key - 1) (1 without a decay)."""
    return _scan(dS, lg, BT), _scan(dz, lg, BT)


def _state_chunk_of_block(kind: str, w: int, NT: int, BT: int, device) -> torch.Tensor:
    """Index of the prefix state each query block reads: max(lb(i BT), 0) // BT (as in the kernels)."""
    lb = window_start(kind, w, torch.arange(NT, device=device) * BT)
    return torch.div(lb.clamp(min=0), BT, rounding_mode="floor")


def _forward(q, k, v, qf, kf, gate, lg, decayed, kmask, kind, w, sinks, scale, cfg):
    B, H, L, d = q.shape
    G = H // k.shape[1]
    NC = triton.cdiv(L, cfg[0])
    consts = _consts(kind, kmask, q, qf, decayed, sinks, cfg)
    S, z = _prefix_states(*_chunk_states(kf, v, kmask, lg, G, NC, sinks, consts), lg, cfg[0])
    o = torch.empty(B, H, L, d, device=q.device, dtype=q.dtype)
    cmax = torch.empty(B, H, L, device=q.device, dtype=torch.float32)
    amax = torch.empty(B, H, L, device=q.device, dtype=torch.int32)
    den = torch.empty(B, H, L, device=q.device, dtype=torch.float32)
    hybrid_fwd_kernel[(B * H, NC)](
        q, k, v, qf, kf, kmask if kmask is not None else q, gate, lg, S, z, o, cmax, amax, den,
        *_strides(q, k, v, qf, kf), L, H, G, NC, w, scale, sinks, **consts,
    )
    return o, cmax, amax, den


def _backward(q, k, v, qf, kf, gate, lg, decayed, kmask, o, cmax, amax, den, dy, delta, kind, w, sinks, scale, cfg):
    """(dq, dk, dv, dqf, dkf, dc, dlg): dc the gradient of the window max per query (for the
    mixing gate), dlg [H] that of log gamma (None without a decay)."""
    B, H, L, d = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    Fd = qf.shape[-1]
    BT, BS = cfg[0], cfg[1]
    NC, NS = triton.cdiv(L, BT), triton.cdiv(L, BS)
    consts = _consts(kind, kmask, q, qf, decayed, sinks, cfg)
    mask_arg = kmask if kmask is not None else q
    dS_inc, dz_inc = _chunk_states(kf, v, kmask, lg, G, NC, sinks, consts)
    S, z = _prefix_states(dS_inc, dz_inc, lg, BT)
    if not decayed:
        del dS_inc, dz_inc
    dq = torch.empty(B, H, L, d, device=q.device, dtype=q.dtype)
    dqf = torch.empty(B, H, L, Fd, device=q.device, dtype=qf.dtype)
    dc = torch.empty(B, H, L, device=q.device, dtype=torch.float32)
    dSb = torch.empty(B * H, NC, Fd, d, device=q.device, dtype=torch.float32)
    dzb = torch.empty(B * H, NC, Fd, device=q.device, dtype=torch.float32)
    dlg_q = torch.empty(B, H, L, device=q.device, dtype=torch.float32) if decayed else dc
    # per query block, its part of the sink keys' gradients (those it reads beside its key loop)
    SB = consts["SB"]
    sink_rows = triton.cdiv(sinks, SB) * SB if SB else 0
    dks = torch.zeros(B * H, NC, sink_rows, d, device=q.device, dtype=torch.float32) if SB else dc
    dvs = torch.zeros_like(dks) if SB else dc
    hybrid_bwd_dq_kernel[(B * H, NC)](
        q, k, v, qf, kf, mask_arg, gate, lg, S, z, dy, den, delta, cmax, amax,
        dq, dqf, dc, dSb, dzb, dlg_q, dks, dvs,
        *_strides(q, k, v, qf, kf), L, H, G, NC, w, scale, sinks, **consts,
    )
    del S, z
    # prefix-state gradients: block i read the state of chunk c(i); the keys of chunk m are in
    # every state c > m, decayed by gamma^(BT (c - m - 1)) from chunk m's last key, so chunk m
    # receives the decayed sum over c > m (a reverse exclusive scan)
    cidx = _state_chunk_of_block(kind, w, NC, BT, q.device)
    dS = torch.zeros_like(dSb).index_add_(1, cidx, dSb)
    dz = torch.zeros_like(dzb).index_add_(1, cidx, dzb)
    del dSb, dzb
    dSr, dSa = _scan(dS, lg, BT, reverse=True, ages=True) if decayed else (_scan(dS, lg, BT, reverse=True), None)
    dzr, dza = _scan(dz, lg, BT, reverse=True, ages=True) if decayed else (_scan(dz, lg, BT, reverse=True), None)
    del dS, dz
    dk = torch.empty(B, Hkv, L, d, device=q.device, dtype=k.dtype)
    dv = torch.empty(B, Hkv, L, d, device=q.device, dtype=v.dtype)
    dkf = torch.empty(B, H, L, Fd, device=q.device, dtype=kf.dtype)
    dlg_k = torch.empty(B, H, NS, device=q.device, dtype=torch.float32) if decayed else dc
    hybrid_bwd_dkv_kernel[(B * Hkv, NS)](
        q, k, v, qf, kf, mask_arg, gate, lg, dy, den, delta, cmax, amax, dc, dSr, dzr,
        dk, dv, dkf, dlg_k,
        *_strides(q, k, v, qf, kf), L, H, G, NC, w, scale, sinks, **consts,
    )
    if SB:
        s = min(sinks, L)
        for grad, part in ((dk, dks), (dv, dvs)):
            part = part.view(B, Hkv, G * NC, sink_rows, d).sum(2)[:, :, :s]  # over query heads and blocks
            grad[:, :, :s] = (grad[:, :, :s].float() + part).to(grad.dtype)
    dlg = None
    if decayed:
        # dL/dlog gamma = sum over history pairs of age A dP: the pairs inside a query block's key
        # loop and the ages past the read state's last key (dq kernel), the keys' ages up to their
        # chunk's last key (dkv kernel), and the ages between that and the read state (here)
        between = (dSa * dS_inc).sum((1, 2, 3)) + (dza * dz_inc).sum((1, 2))
        dlg = dlg_q.sum((0, 2)) + dlg_k.sum((0, 2)) + between.view(B, H).sum(0)
    return dq, dk, dv, dqf, dkf, dc, dlg


def _key(q, k, qf, kind, decayed, sinks):
    return (kind, q.shape[-1], qf.shape[-1], q.dtype, qf.dtype, k.shape[1] == q.shape[1], decayed, sinks)


class HybridAttentionFunction(torch.autograd.Function):
    """Hybrid attention on rolled inputs with a [B, L] uint8 key mask (see :func:`hybrid_attention_triton`)."""

    @staticmethod
    def forward(ctx, q, k, v, qf, kf, mix, decay, kmask, kind, w, sinks, scale, cfg, fixed):
        gate = torch.sigmoid(mix.detach().float()).contiguous()
        decayed = decay is not None
        lg = decay.detach().float().contiguous() if decayed else gate.new_zeros(gate.shape)
        o, cmax, amax, den = _with_fallback(
            ("fwd",) + _key(q, k, qf, kind, decayed, sinks), cfg, fixed,
            lambda c: _forward(q, k, v, qf, kf, gate, lg, decayed, kmask, kind, w, sinks, scale, c),
        )
        ctx.save_for_backward(q, k, v, qf, kf, mix, lg, kmask, o, cmax, amax, den)
        ctx.kind, ctx.w, ctx.sinks, ctx.scale, ctx.cfg, ctx.fixed, ctx.decayed = kind, w, sinks, scale, cfg, fixed, decayed
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        q, k, v, qf, kf, mix, lg, kmask, o, cmax, amax, den = ctx.saved_tensors
        kind = ctx.kind
        gate = torch.sigmoid(mix.detach().float()).contiguous()
        dy = dy.contiguous()
        ok = den > 0
        # delta_n = dy_n . y_n / den_n: the gradient through the joint normaliser (0 where den = 0)
        delta = torch.where(ok, (dy.float() * o.float()).sum(-1) / torch.where(ok, den, torch.ones_like(den)), 0.0)
        dq, dk, dv, dqf, dkf, dc, dlg = _with_fallback(
            ("bwd",) + _key(q, k, qf, kind, ctx.decayed, ctx.sinks), ctx.cfg, ctx.fixed,
            lambda c: _backward(q, k, v, qf, kf, gate, lg, ctx.decayed, kmask, o, cmax, amax, den, dy, delta, kind,
                                ctx.w, ctx.sinks, ctx.scale, c),
        )
        dmix = None
        if kind == "linear":  # q, k and mix do not enter the linear kind
            dq = dk = None
        elif ctx.needs_input_grad[5]:
            # dy/dg has the form of dy/dc: dL/dg = -sum_n dc_n / g, and dg/dmix = g (1 - g)
            dmix = ((1 - gate.view(1, -1, 1)) * -dc).sum((0, 2)).to(mix.dtype)
        ddecay = dlg if ctx.needs_input_grad[6] else None
        return dq, dk, dv, dqf, dkf, dmix, ddecay, None, None, None, None, None, None, None


def hybrid_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    mix: torch.Tensor,
    rule: WindowRule,
    attention_mask: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    decay: torch.Tensor | None = None,
    block_t: int | None = None,
    block_s: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """LoLCATs hybrid attention through the Triton kernels (forward and backward).

    Same contract as :func:`kernels.hybrid.chunk_torch.hybrid_attention_torch` (inputs assumed
    validated by :func:`kernels.dispatch.hybrid_attention`).

    Args:
        q: ``[B, H, L, d]`` queries after RoPE. Any strides with a unit last stride.
        k, v: ``[B, H_kv, L, d]`` keys and values, H a multiple of H_kv (not repeated).
        q_feat, k_feat: ``[B, H, L, F]`` feature maps per query head.
        mix: ``[H]`` mixing logits (window weight sigmoid(mix)); unused by ``linear``.
        rule: the window rule, :class:`kernels.hybrid.window.WindowRule` (kind, w and s sink
            tokens).
        attention_mask: ``[B, L]``, 1 = token, 0 = padding. Default: ``None``.
        scale: score scale. Default: ``d ** -0.5``.
        decay: ``[H]`` log gamma_h <= 0 of a decaying history (module docstring). Default: ``None``.
        block_t, block_s, num_warps: kernel tiling (query block / state chunk, key block, warps).
            Default: ``None`` (see :func:`block_config`; smaller tilings are tried when a GPU
            lacks the shared memory for the default one; an explicit tiling is used as given).

    Returns:
        ``[B, H, L, d]`` in the dtype of ``q``.
    """
    kind = rule.kind
    B, H, L, d = q.shape
    Fd = q_feat.shape[-1]
    if d > MAX_DIM or Fd > MAX_DIM:
        raise ValueError(f"the Triton kernels support head dim and feature dim up to {MAX_DIM}; got d={d}, F={Fd}")
    out_dtype = q.dtype
    if L == 0 or B == 0:
        return q.new_zeros(q.shape)
    scale = d**-0.5 if scale is None else float(scale)
    # q, k, v share one dtype and the features another (the feature maps return float32 for a
    # half-precision model); float32 q, k, v make the whole computation float32
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    dtype = dtype if dtype in SUPPORTED_DTYPES else torch.float32
    fdtype = torch.promote_types(q_feat.dtype, k_feat.dtype)
    fdtype = torch.float32 if dtype == torch.float32 or fdtype not in SUPPORTED_DTYPES else fdtype
    q, k, v = (t.to(dtype) for t in (q, k, v))
    qf, kf = q_feat.to(fdtype), k_feat.to(fdtype)
    q, k, v, qf, kf = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, qf, kf))

    (q, k, v, qf, kf), mask, shift = left_align(q, k, v, qf, kf, attention_mask)
    kmask = None if mask is None else mask.to(torch.uint8).contiguous()
    cfg = block_config(d, Fd, block_t, block_s, num_warps)
    fixed = block_t is not None or block_s is not None or num_warps is not None
    y = HybridAttentionFunction.apply(q, k, v, qf, kf, mix, decay, kmask, kind, rule.window_size, rule.sinks, scale, cfg,
                                      fixed)
    return restore_rows(y, shift).to(out_dtype)


__all__ = ["HybridAttentionFunction", "block_config", "hybrid_attention_triton"]
