"""Random attention inputs shared by the attention and kernel tests (never zeros)."""

import torch

from core.attention import build_feature_map


def make_inputs(B, H, Hkv, L, d, f, *, feature_map="hedgehog", pads=(), seed=42, dtype=torch.float32, feat_dtype=None, device="cpu"):
    """q [B, H, L, d], k and v [B, Hkv, L, d], learned-map features [B, H, L, F], mix [H], mask [B, L].

    ``pads[b]`` left-padding tokens in row b (a row may be all padding)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, d, generator=g)
    k = torch.randn(B, Hkv, L, d, generator=g)
    v = torch.randn(B, Hkv, L, d, generator=g)
    torch.manual_seed(seed)
    fq = build_feature_map(feature_map, H, d, f, init="random")
    fk = build_feature_map(feature_map, H, d, f, init="random")
    with torch.no_grad():
        qf, kf = fq(q), fk(k.repeat_interleave(H // Hkv, dim=1))
    mix = torch.randn(H, generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
    q, k, v = (t.to(dtype) for t in (q, k, v))
    qf, kf = (t.to(feat_dtype or dtype) for t in (qf, kf))
    return tuple(t.to(device) for t in (q, k, v, qf, kf, mix, mask))
