"""Efficient PyTorch form of LoLCATs hybrid attention (banded window + chunked linear).

This is the reference the Triton kernels are tested against and the path used on CPU.
Notation: B batch, H query heads, Hkv key/value heads (H = Hkv * G), L length, d head dim,
F feature dim, w window size. Inputs are ``[B, H, L, d]`` (q), ``[B, Hkv, L, d]`` (k, v),
``[B, H, L, F]`` (feature maps per query head), ``[H]`` (mix logits), ``[B, L]`` (key mask).

For query n, with s_nj = q_n.k_j * scale, g = sigmoid(mix), window W(n) and history Hist(n):

    c_n = max_{j in W(n)} s_nj
    y_n = (sum_{j in W(n)} g exp(s_nj - c_n) v_j + sum_{j in Hist(n)} (phi_q(q_n).phi_k(k_j)) v_j)
          / (sum_{j in W(n)} g exp(s_nj - c_n)    + sum_{j in Hist(n)}  phi_q(q_n).phi_k(k_j))

Positions count from each row's first real token (its position 0): the row is rolled so that
token sits at index 0, computed, and rolled back. Padded keys contribute nothing.
  * ``linear``:         W(n) empty;                     Hist(n) = {j <= n}
  * ``sliding_window``: W(n) = {n-w < j <= n};          Hist(n) = {j <= n-w}
  * ``terraced``:       tiles of w from position 0; W(n) = previous tile + current tile up to n;
                        Hist(n) = all tiles before the previous one.

Memory is O(L w) for the window part and O(L/C F d) for the linear part: no L x L tensor.
Half-precision inputs are computed in float32 and the result is cast back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F_

KINDS = ("linear", "sliding_window", "terraced")
LINEAR_CHUNK = 64  # chunk length of the causal linear part; any value gives the same result


def _leading_pad(mask: torch.Tensor) -> torch.Tensor:
    """[B, L] bool -> [B] number of padding tokens before the first real one."""
    return (mask.long().cumsum(-1) == 0).sum(-1)


def _roll_rows(x: torch.Tensor, shift: torch.Tensor, dim: int) -> torch.Tensor:
    """Per-row circular shift left by ``shift[b]`` along ``dim`` (batch is dim 0)."""
    L = x.shape[dim]
    idx = (torch.arange(L, device=x.device)[None, :] + shift[:, None]) % L  # [B, L]
    shape = [x.shape[0]] + [1] * (x.dim() - 1)
    shape[dim] = L
    idx = idx.view(shape).expand_as(x)
    return x.gather(dim, idx)


def left_align(q, k, v, q_feat, k_feat, attention_mask):
    """Roll each row so its first real token sits at index 0 (positions then equal indices).

    Returns ``((q, k, v, q_feat, k_feat), mask, shift)``: ``mask`` is the rolled [B, L] bool key
    mask (None without one), ``shift`` the per-row roll to undo with :func:`restore_rows`
    (None when no row needed one)."""
    tensors = (q, k, v, q_feat, k_feat)
    if attention_mask is None:
        return tensors, None, None
    L = q.shape[2]
    mask = attention_mask.to(device=q.device).bool()
    shift = _leading_pad(mask)
    if not bool((shift % L != 0).any()):
        return tensors, mask, None
    return tuple(_roll_rows(t, shift, 2) for t in tensors), _roll_rows(mask, shift, 1), shift


def restore_rows(y: torch.Tensor, shift: torch.Tensor | None) -> torch.Tensor:
    """Undo :func:`left_align` on an output [B, H, L, d]."""
    return y if shift is None else _roll_rows(y, (-shift) % y.shape[2], 2)


def _pad_len(x: torch.Tensor, dim: int, front: int, back: int) -> torch.Tensor:
    pad = [0, 0] * (x.dim() - 1 - dim) + [front, back]
    return F_.pad(x, pad)


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den with 0 where den == 0 (padded queries), without NaN gradients."""
    ok = den > 0
    return num / torch.where(ok, den, torch.ones_like(den)).unsqueeze(-1)


def window_terms(q, k, v, mask, mix, kind: str, w: int, scale: float):
    """Softmax window numerator U [B, H, L, d] and denominator D [B, H, L] (already times g).

    Queries are cut into blocks of w; block i sees key blocks i-1 and i, so scores are
    [B, Hkv, G, L/w, w, 2w] (banded, O(L w)).
    """
    B, H, L, d = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    Lp = -(-L // w) * w
    nb = Lp // w
    qb = _pad_len(q, 2, 0, Lp - L).view(B, Hkv, G, nb, w, d)
    kb = _pad_len(k, 2, w, Lp - L).view(B, Hkv, nb + 1, w, d)
    vb = _pad_len(v, 2, w, Lp - L).view(B, Hkv, nb + 1, w, d)
    mb = _pad_len(mask, 1, w, Lp - L).view(B, nb + 1, w)
    kb = torch.cat([kb[:, :, :-1], kb[:, :, 1:]], dim=3)  # [B, Hkv, nb, 2w, d]
    vb = torch.cat([vb[:, :, :-1], vb[:, :, 1:]], dim=3)
    mb = torch.cat([mb[:, :-1], mb[:, 1:]], dim=2)  # [B, nb, 2w]

    r = torch.arange(w, device=q.device)[:, None]  # query offset in its block
    c = torch.arange(2 * w, device=q.device)[None, :]  # key offset from the previous block's start
    band = c <= w + r  # causal
    if kind == "sliding_window":
        band = band & (c > r)  # the last w keys
    allowed = band[None, None, None, None] & mb[:, None, None, :, None, :]  # [B, 1, 1, nb, w, 2w]

    s = torch.einsum("bhgnqd,bhnkd->bhgnqk", qb, kb) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    cmax = s.amax(dim=-1, keepdim=True)
    cmax = torch.where(torch.isfinite(cmax), cmax, torch.zeros_like(cmax))
    p = torch.exp(s - cmax)  # masked entries are exp(-inf) = 0
    g = torch.sigmoid(mix.float()).view(1, Hkv, G, 1, 1, 1)
    p = p * g
    U = torch.einsum("bhgnqk,bhnkd->bhgnqd", p, vb)
    D = p.sum(-1)
    U = U.reshape(B, H, Lp, d)[:, :, :L]
    D = D.reshape(B, H, Lp)[:, :, :L]
    return U, D


def causal_linear_terms(qf, kf, v, chunk: int = LINEAR_CHUNK):
    """Inclusive causal linear attention: num_n = sum_{j<=n} (qf_n.kf_j) v_j, den_n = sum qf_n.kf_j.

    Chunked: exclusive prefix states per chunk plus a masked [C, C] intra-chunk product.
    qf, kf: [B, H, L, F]; v: [B, Hkv, L, d] (shared by the G query heads of each KV head).
    """
    B, H, L, Fd = qf.shape
    Hkv, d = v.shape[1], v.shape[-1]
    G = H // Hkv
    C = chunk
    Lp = -(-L // C) * C
    nc = Lp // C
    qc = _pad_len(qf, 2, 0, Lp - L).view(B, Hkv, G, nc, C, Fd)
    kc = _pad_len(kf, 2, 0, Lp - L).view(B, Hkv, G, nc, C, Fd)
    vc = _pad_len(v, 2, 0, Lp - L).view(B, Hkv, nc, C, d)

    chunk_kv = torch.einsum("bhgncf,bhncd->bhgnfd", kc, vc)  # [B, Hkv, G, nc, F, d]
    chunk_z = kc.sum(-2)  # [B, Hkv, G, nc, F]
    S = torch.cat([torch.zeros_like(chunk_kv[:, :, :, :1]), chunk_kv[:, :, :, :-1].cumsum(3)], dim=3)
    z = torch.cat([torch.zeros_like(chunk_z[:, :, :, :1]), chunk_z[:, :, :, :-1].cumsum(3)], dim=3)
    num = torch.einsum("bhgncf,bhgnfd->bhgncd", qc, S)
    den = torch.einsum("bhgncf,bhgnf->bhgnc", qc, z)
    A = torch.einsum("bhgncf,bhgnmf->bhgncm", qc, kc)
    A = A * torch.ones(C, C, device=qf.device, dtype=torch.bool).tril()
    num = num + torch.einsum("bhgncm,bhnmd->bhgncd", A, vc)
    den = den + A.sum(-1)
    return num.reshape(B, H, Lp, d)[:, :, :L], den.reshape(B, H, Lp)[:, :, :L]


def terraced_linear_terms(qf, kf, v, w: int):
    """History of the terraced window: for a query in tile i, all keys of tiles < i - 1."""
    B, H, L, Fd = qf.shape
    Hkv, d = v.shape[1], v.shape[-1]
    G = H // Hkv
    Lp = -(-L // w) * w
    nt = Lp // w
    qt = _pad_len(qf, 2, 0, Lp - L).view(B, Hkv, G, nt, w, Fd)
    kt = _pad_len(kf, 2, 0, Lp - L).view(B, Hkv, G, nt, w, Fd)
    vt = _pad_len(v, 2, 0, Lp - L).view(B, Hkv, nt, w, d)
    tile_kv = torch.einsum("bhgncf,bhncd->bhgnfd", kt, vt).cumsum(3)  # inclusive prefix over tiles
    tile_z = kt.sum(-2).cumsum(3)
    # tile i reads the prefix through tile i-2
    S = _pad_len(tile_kv, 3, 2, 0)[:, :, :, :nt]
    z = _pad_len(tile_z, 3, 2, 0)[:, :, :, :nt]
    num = torch.einsum("bhgncf,bhgnfd->bhgncd", qt, S)
    den = torch.einsum("bhgncf,bhgnf->bhgnc", qt, z)
    return num.reshape(B, H, Lp, d)[:, :, :L], den.reshape(B, H, Lp)[:, :, :L]


def hybrid_attention_torch(q, k, v, q_feat, k_feat, mix, kind, window_size=64, attention_mask=None, scale=None):
    """See the module docstring. Inputs are assumed validated (see ``core.attention``)."""
    out_dtype = q.dtype
    B, H, L, d = q.shape
    scale = d**-0.5 if scale is None else scale
    (q, k, v, qf, kf), mask, shift = left_align(*(t.float() for t in (q, k, v, q_feat, k_feat)), attention_mask)
    if mask is None:
        mask = torch.ones(B, L, dtype=torch.bool, device=q.device)
    kf = kf * mask[:, None, :, None]
    vm = v * mask[:, None, :, None]

    if kind == "linear":
        num, den = causal_linear_terms(qf, kf, vm)
        y = _safe_div(num, den)
    else:
        U, D = window_terms(q, k, v, mask, mix, kind, window_size, scale)
        if kind == "sliding_window":  # history = keys at least w behind: shift keys by w
            kf_s = _pad_len(kf, 2, window_size, 0)[:, :, :L]
            v_s = _pad_len(vm, 2, window_size, 0)[:, :, :L]
            num, den = causal_linear_terms(qf, kf_s, v_s)
        else:
            num, den = terraced_linear_terms(qf, kf, vm, window_size)
        y = _safe_div(U + num, D + den)
    return restore_rows(y, shift).to(out_dtype)
