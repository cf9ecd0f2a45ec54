"""The chunked (parallel) form of hybrid attention in PyTorch: banded window plus chunked linear part.

Inputs q ``[B, H, L, d]``, k and v ``[B, H_kv, L, d]`` (H = H_kv G), q_feat ``[B, H, L, F]``,
k_feat ``[B, H, L, F]`` or ``[B, H_kv, L, F]`` (``kernels.hybrid.heads``), mix ``[H]``, key mask ``[B, L]``. For query n with s_nj = q_n.k_j * scale,
g = sigmoid(mix), window W(n) and history Hist(n) (``kernels.hybrid.window``):

    c_n = max_{j in W(n)} s_nj
    y_n = (sum_{j in W(n)} g exp(s_nj - c_n) v_j + sum_{j in Hist(n)} (phi_q(q_n).phi_k(k_j)) v_j)
          / (sum_{j in W(n)} g exp(s_nj - c_n)    + sum_{j in Hist(n)}  phi_q(q_n).phi_k(k_j))

The window rule (kind, w and s sink tokens) is a :class:`kernels.hybrid.window.WindowRule`. With
s > 0 the keys at positions < s join W(n) for every query n at or after them and leave Hist(n)
(``kernels.hybrid.window``); c_n is then the max over the window and those keys.
With ``decay`` (log gamma_h <= 0 per head of k_feat) each history term is weighted by
gamma_h^(window_start(p_n) - 1 - p_j), its age counted from the window's edge (``kernels.hybrid.decay``).
Positions count from each row's first real token; padded keys contribute nothing. Memory is
O(L w) for the window part and O(L / C F d) for the linear part; half-precision inputs are
computed in float32 and the result cast back. How: docs/kernels.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F_

from kernels.hybrid.blocks import blocks, cpu_inference
from kernels.hybrid.decay import tile_ages
from kernels.hybrid.heads import query_heads
from kernels.hybrid.window import WindowRule, window_start

LINEAR_CHUNK = 64  # chunk length of the causal linear part; any value gives the same result
MIN_WINDOW_TILE = 32  # the shortest query block window_tile picks for a sliding window


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


# Window weights exp(s - c) are floored at exp(-40) ~ 4e-18: below float32 resolution next to the
# window's largest weight exp(0) = 1, while smaller weights (and their products with values) reach
# float32 denormals, on which CPU exp and matrix products run many times slower.
EXP_FLOOR = -40.0


def augment_values(v: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [..., d + 1] with a last column of ones: one product with the augmented values
    gives a numerator (first d columns) and its denominator (last column) together."""
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def _tiles(x: torch.Tensor, t: int) -> torch.Tensor:
    """[B, Hx, L, D] -> [B, Hx, L/t, t, D], zero-padded at the end to a multiple of t."""
    B, Hx, L, D = x.shape
    Lp = -(-L // t) * t
    return (x if Lp == L else _pad_len(x, 2, 0, Lp - L)).view(B, Hx, Lp // t, t, D)


def _grouped(x: torch.Tensor, Hkv: int) -> torch.Tensor:
    """Query-head tensor [B, H, ...] viewed as [B, Hkv, G, ...] (G query heads per KV head)."""
    return x.view(x.shape[0], Hkv, x.shape[1] // Hkv, *x.shape[2:])


def window_terms(q, k, va, mask, kind: str, w: int, scale: float, extra=None, tile: int | None = None) -> torch.Tensor:
    """Softmax window terms [B, H, L, d + 1]: sum_{j in W(n)} exp(s_nj - c_n) [v_j, 1] (not yet times g).

    Queries are cut into blocks of ``tile`` T (default w; for a sliding window any divisor of w,
    :func:`window_tile`); block i sees key blocks i - w/T to i, so scores are
    [B, Hkv, L/T, G T, w + T] (banded, O(L (w + T))); the G query heads of a KV head share one
    matrix product per block. Without autograd the score tensor is reused in place.
    ``extra``: None, or s further softmax keys every query may see, ``(keys [B, Hkv, s, d],
    augmented values [B, Hkv, s, d + 1], visible [B, L, s] bool)``, appended to every block's keys
    (the sink tokens; ``visible`` must exclude a key that the band already holds for that query).
    """
    B, H, L, d = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    T = tile or w
    m = w // T  # key blocks before the query's own
    qb = _grouped(_tiles(q * scale, T), Hkv).transpose(2, 3)  # [B, Hkv, nb, G, T, d]
    nb = qb.shape[2]
    kb = _pad_len(_tiles(k, T), 2, m, 0)  # m blocks of zeros in front: [B, Hkv, nb + m, T, d]
    vb = _pad_len(_tiles(va, T), 2, m, 0)
    mb = _pad_len(_tiles(mask[:, None, :, None], T), 2, m, 0)[:, 0, :, :, 0]  # [B, nb + m, T]
    kb = torch.cat([kb[:, :, j : j + nb] for j in range(m + 1)], dim=3)  # [B, Hkv, nb, w + T, d]
    vb = torch.cat([vb[:, :, j : j + nb] for j in range(m + 1)], dim=3)
    mb = torch.cat([mb[:, j : j + nb] for j in range(m + 1)], dim=2)  # [B, nb, w + T]

    r = torch.arange(T, device=q.device)[:, None]  # query offset in its block
    c = torch.arange(w + T, device=q.device)[None, :]  # key offset from the start of block i - m
    band = c <= w + r  # causal
    if kind == "sliding_window":
        band = band & (c > r)  # the last w keys
    allowed = band[None, None, None, None] & mb[:, None, :, None, None, :]  # [B, 1, nb, 1, T, w + T]
    if extra is not None:  # the extra keys after each block's band: [.., w + T + s]
        ek, ev, visible = extra
        kb = torch.cat([kb, ek[:, :, None].expand(-1, -1, nb, -1, -1).to(kb.dtype)], dim=3)
        vb = torch.cat([vb, ev[:, :, None].expand(-1, -1, nb, -1, -1).to(vb.dtype)], dim=3)
        seen = _tiles(visible[:, None], T)[:, 0].bool()  # [B, nb, T, s]
        allowed = torch.cat([allowed.expand(B, 1, nb, 1, T, w + T), seen[:, None, :, None]], dim=-1)
    nk = kb.shape[3]

    s = torch.matmul(qb.reshape(B, Hkv, nb, G * T, d), kb.transpose(-1, -2)).view(B, Hkv, nb, G, T, nk)
    inplace = not s.requires_grad  # inference: one score buffer, no temporaries of its size
    s = s.masked_fill_(~allowed, float("-inf")) if inplace else s.masked_fill(~allowed, float("-inf"))
    cmax = s.amax(dim=-1, keepdim=True)
    cmax = torch.where(torch.isfinite(cmax), cmax, torch.zeros_like(cmax))
    # masked entries (exp(-inf) = 0) are raised to the floor by the clamp and zeroed again by the mask
    if inplace:
        p = s.sub_(cmax).clamp_(min=EXP_FLOOR).exp_().mul_(allowed)
    else:
        p = torch.exp((s - cmax).clamp(min=EXP_FLOOR)) * allowed
    out = torch.matmul(p.view(B, Hkv, nb, G * T, nk), vb).view(B, Hkv, nb, G, T, d + 1)
    return out.transpose(2, 3).reshape(B, H, nb * T, d + 1)[:, :, :L]


def window_tile(kind: str, w: int) -> int:
    """The query block of :func:`window_terms` and tile of :func:`history_terms` for a window of w:
    w for the terraced window (its tiles are its rule); for a sliding window the largest divisor
    of w from 32 to w / 3 (each query then scores w + T keys instead of 2w and the history's
    partial tile is T long; smaller blocks lose more to their count than they save:
    benchmarks/window_tiles.py), else w."""
    if kind != "sliding_window":
        return w
    return next((t for t in range(w // 3, MIN_WINDOW_TILE - 1, -1) if w % t == 0), w)


def _shifted_bmm(a: torch.Tensor, b: torch.Tensor, shift: int, tiles: int) -> torch.Tensor:
    """out[i] = a[i] @ b[i - shift] over a flat batch of ``tiles`` consecutive tiles per head; the
    first ``shift`` tiles of every head get 0. Pairing contiguous slices of the flat batch keeps
    both operands copy-free (slicing the tile axis of a [B, Hkv, G, nt, ...] tensor would not)."""
    n = a.shape[0]
    if shift == 0:
        return torch.bmm(a, b)
    shift = min(shift, n)
    if a.requires_grad or b.requires_grad:
        out = torch.cat([a.new_zeros(shift, a.shape[1], b.shape[2]), torch.bmm(a[shift:], b[: n - shift])])
    else:
        out = a.new_empty(n, a.shape[1], b.shape[2])
        torch.bmm(a[shift:], b[: n - shift], out=out[shift:])
    out.view(-1, tiles, *out.shape[1:])[:, :shift] = 0  # also clears pairs across two heads
    return out


def history_terms(qf, kf, va, tile: int, lag: int, partial: bool, decay: torch.Tensor | None = None) -> torch.Tensor:
    """Linear-attention terms [B, H, L, d + 1]: sum_{j in Hist(n)} (qf_n . kf_j) [v_j, 1], by tiles of ``tile``.

    For a query at offset r of tile i, Hist(n) holds every key of tiles <= i - lag and, when
    ``partial``, the keys of tile i - lag + 1 at offsets <= r. So with tile = C: causal linear
    (lag 1, partial); with tile T dividing w: sliding-window history j <= n - w (lag w / T + 1,
    partial); with tile = w: the terraced history, all tiles before the previous one (lag 2). Prefix states per tile are
    [B, Hkv, G, L/tile, F, d + 1] (O(L / tile F d)); the partial tile is a masked [tile, tile] product.
    qf, kf: [B, H, L, F] (kf zero at padded keys); va: [B, Hkv, L, d + 1] (augmented values).

    ``decay`` ([H] log gamma, or None): the prefixes decay (``kernels.hybrid.decay``), a tile's
    prefix holding sum_{j <= its last key e} gamma^(e - j) kf_j [v_j, 1]^T; the query reading it
    scales it by gamma^(r + 1) when ``partial`` (1 otherwise: the terraced history ends at the
    prefix's last key), and the partial tile's pair (r, r') is weighted gamma^(r - r'). Together
    that is gamma^(window_start(n) - 1 - j) for every history key.
    """
    B, H, L, Fd = qf.shape
    Hkv, d1 = va.shape[1], va.shape[-1]
    G = H // Hkv
    qt, kt = _tiles(qf, tile), _tiles(kf, tile)  # [B, H, nt, T, F]
    nt = qt.shape[2]
    n = B * H * nt  # one flat batch of tiles, head by head
    qt, kt = qt.reshape(n, tile, Fd), kt.reshape(n, tile, Fd)
    vt = _tiles(va, tile)[:, :, None].expand(B, Hkv, G, nt, tile, d1).reshape(n, tile, d1)  # per query head
    if decay is None:
        prefix = torch.bmm(kt.transpose(1, 2), vt)  # each tile's sum_j kf_j [v_j, 1]^T: [n, F, d + 1]
        prefix = prefix.view(B * H, nt, Fd, d1)
        prefix = (prefix.cumsum(1) if prefix.requires_grad else prefix.cumsum_(1)).view(n, Fd, d1)
        qp = qt
    else:
        ages = tile_ages(decay, tile, nt, B)
        prefix = torch.bmm((kt * ages.key).transpose(1, 2), vt).view(B, H, nt, Fd * d1)
        prefix = torch.matmul(ages.carry, prefix).view(n, Fd, d1)  # decayed prefix sums over the tiles
        qp = qt * ages.query if partial else qt
    out = _shifted_bmm(qp, prefix, lag, nt)  # tile i reads the prefix through key tile i - lag
    if partial:  # query tile i against key tile i - lag + 1, keys at offsets <= the query's
        a = _shifted_bmm(qt, kt.transpose(1, 2), lag - 1, nt)
        a = a.tril_() if decay is None else a * ages.pair
        av = _shifted_bmm(a, vt, lag - 1, nt)
        out = out + av if out.requires_grad else out.add_(av)
    return out.view(B, H, nt * tile, d1)[:, :, :L]


def _sink_split(k, va, kf, mask, kind: str, w: int, sinks: int):
    """Sink tokens of left-aligned rows (index = position): the window's extra keys (see
    :func:`window_terms`) and the key features with the sinks left out of the history."""
    L = k.shape[2]
    s = min(sinks, L)
    idx = torch.arange(L, device=k.device)
    visible = mask[:, None, :s] & (idx[None, :s] < window_start(kind, w, idx)[:, None])[None]  # [B, L, s]
    return (k[:, :, :s], va[:, :, :s], visible), kf * (idx >= s)[None, None, :, None]


def _terms(q, k, v, q_feat, k_feat, mix, rule: WindowRule, attention_mask, scale, sink_keys, decay) -> torch.Tensor:
    """:func:`hybrid_terms_torch` over whole tensors."""
    B, H, L, d = q.shape
    scale = d**-0.5 if scale is None else scale
    kind, window_size, sinks = rule.kind, rule.window_size, rule.sinks
    (q, k, v, qf, kf), mask, shift = left_align(*(t.float() for t in (q, k, v, q_feat, k_feat)), attention_mask)
    if mask is None:
        mask = torch.ones(B, L, dtype=torch.bool, device=q.device)
    else:
        kf = kf * mask[:, None, :, None]  # padded keys leave the history (the window masks them itself)
    va = augment_values(v)
    extra = None
    if sink_keys is not None:
        sk, sv, visible = sink_keys
        extra = (sk.float(), augment_values(sv.float()), visible if shift is None else _roll_rows(visible, shift, 1))
    elif sinks:
        extra, kf = _sink_split(k, va, kf, mask, kind, window_size, sinks)

    if kind == "linear":
        t = history_terms(qf, kf, va, LINEAR_CHUNK, lag=1, partial=True, decay=decay)
    else:
        w = window_size
        g = torch.sigmoid(mix.float()).view(1, H, 1, 1)
        tile = window_tile(kind, w)  # the sliding window's history: every key up to n - w, m = w / tile tiles back
        window = window_terms(q, k, va, mask, kind, w, scale, extra, tile)
        history = history_terms(qf, kf, va, tile, lag=w // tile + 1, partial=kind == "sliding_window", decay=decay)
        t = window * g + history if window.requires_grad else window.mul_(g).add_(history)
    return restore_rows(t, shift)


def normalise(t: torch.Tensor) -> torch.Tensor:
    """[..., d + 1] numerator and denominator -> [..., d] outputs (0 where nothing is attended)."""
    num, den = t[..., :-1], t[..., -1]
    return num / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)


def _in_pieces(op, width: int, dtype, q, k, v, q_feat, k_feat, mix, rule: WindowRule, attention_mask, scale, sink_keys,
               decay) -> torch.Tensor:
    """``op`` (a function of :func:`_terms`'s arguments giving ``[B', H', L, width]``) over the
    whole tensors, or, for inference on CPU, over pieces of batch rows and key/value heads that
    each fit in cache (``kernels.hybrid.blocks``), written into one ``[B, H, L, width]`` output.
    Every row and every key/value head with its query heads is an independent problem."""
    k_feat, decay = query_heads(k_feat, q.shape[1]), query_heads(decay, q.shape[1], dim=0)
    args = (q, k, v, q_feat, k_feat, mix, rule, attention_mask, scale, sink_keys, decay)
    if not cpu_inference(q, k, v, q_feat, k_feat, mix):
        return op(*args)
    B, H, L, _ = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    extra = rule.sinks if sink_keys is None else sink_keys[0].shape[2]
    pieces = blocks(B, Hkv, 4 * G * L * (2 * rule.window_size + extra + q_feat.shape[-1]))  # scores + history per head
    if len(pieces) == 1:
        return op(*args)
    out = torch.empty(B, H, L, width, dtype=dtype, device=q.device)
    for rows, heads in pieces:
        hq = slice(heads.start * G, heads.stop * G)
        piece_sinks = None if sink_keys is None else (sink_keys[0][rows, heads], sink_keys[1][rows, heads], sink_keys[2][rows])
        out[rows, hq] = op(q[rows, hq], k[rows, heads], v[rows, heads], q_feat[rows, hq], k_feat[rows, hq], mix[hq], rule,
                           None if attention_mask is None else attention_mask[rows], scale, piece_sinks,
                           None if decay is None else decay[hq])
    return out


def hybrid_terms_torch(q, k, v, q_feat, k_feat, mix, rule: WindowRule, attention_mask=None, scale=None, *,
                       sink_keys=None, decay=None) -> torch.Tensor:
    """The op before its normalisation: [B, H, L, d + 1] float32, numerator (first d columns) and
    denominator (last column) of y_n, window terms times g plus history terms (:func:`normalise`
    divides). Inputs as :func:`hybrid_attention_torch`; ``sink_keys`` (in place of the sequence's
    first ``rule.sinks`` keys) gives the sink tokens explicitly, for a chunk whose own first keys
    are not the sequence's: ``(keys [B, Hkv, s, d], values [B, Hkv, s, d], visible [B, L, s]
    bool)`` (the caller leaves them out of ``k_feat``)."""
    return _in_pieces(_terms, q.shape[-1] + 1, torch.float32, q, k, v, q_feat, k_feat, mix, rule, attention_mask, scale,
                      sink_keys, decay)


def _attention(*args) -> torch.Tensor:
    return normalise(_terms(*args)).to(args[0].dtype)


def hybrid_attention_torch(q, k, v, q_feat, k_feat, mix, rule: WindowRule, attention_mask=None, scale=None, *,
                           decay=None):
    """See the module docstring. Inputs are assumed validated (the contract and its checks:
    :func:`kernels.dispatch.hybrid_attention`)."""
    return _in_pieces(_attention, q.shape[-1], q.dtype, q, k, v, q_feat, k_feat, mix, rule, attention_mask, scale, None,
                      decay)
