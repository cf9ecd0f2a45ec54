"""The naive reference against formulas written out term by term: the hybrid equation per query
with the window of each kind spelled out, and softmax attention when the window spans the input."""

import pytest
import torch

from kernels.hybrid.naive import (
    hybrid_attention_matrix,
    naive_hybrid_attention,
    naive_softmax_attention,
    window_masks,
)
from kernels.hybrid.window import KINDS, WindowRule
from tests.attention_inputs import make_inputs
from tests.kernels.utils import assert_close


def in_window(kind: str, w: int, n: int, j: int) -> bool:
    """Key position j is in the softmax window of query position n (0 <= j <= n)."""
    if kind == "linear":
        return False
    if kind == "sliding_window":
        return n - j < w  # the last w keys
    return j // w >= n // w - 1  # the current and the previous tile


def brute_force(q, k, v, qf, kf, mix, kind, w, mask):
    """y_n = (sum_W g exp(s - c) v + sum_Hist phi_q.phi_k v) / (sum_W g exp(s - c) + sum_Hist phi_q.phi_k)."""
    B, H, L, d = q.shape
    G = H // k.shape[1]
    q, k, v, qf, kf = (t.double() for t in (q, k, v, qf, kf))
    y = torch.zeros(B, H, L, d, dtype=torch.float64)
    for b in range(B):
        real = [j for j in range(L) if mask[b, j]]
        pos = {j: j - real[0] for j in real} if real else {}
        for h in range(H):
            g, hk = torch.sigmoid(mix[h].double()), h // G
            for n in real:
                keys = [j for j in real if j <= n]
                win = [j for j in keys if in_window(kind, w, pos[n], pos[j])]
                hist = [j for j in keys if j not in win]
                s = {j: (q[b, h, n] @ k[b, hk, j]).item() * d**-0.5 for j in win}
                c = max(s.values(), default=0.0)
                weights = [(j, g * torch.exp(torch.tensor(s[j] - c, dtype=torch.float64))) for j in win]
                weights += [(j, qf[b, h, n] @ kf[b, h, j]) for j in hist]
                den = sum(a for _, a in weights)
                y[b, h, n] = sum(a * v[b, hk, j] for j, a in weights) / den
    return y


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("w", [1, 3, 8])
def test_matches_the_equation_term_by_term(kind, w):
    q, k, v, qf, kf, mix, mask = make_inputs(2, 4, 2, 19, 8, 4, pads=(0, 5), seed=11)
    mask[0, 9:11] = 0  # padding in the middle too
    y = naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, w), mask)
    m = mask.bool()[:, None, :, None]
    assert_close("y", brute_force(q, k, v, qf, kf, mix, kind, w, mask), torch.where(m, y, 0.0), 1e-12)


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_window_spanning_the_input_is_softmax(kind):
    q, k, v, qf, kf, mix, mask = make_inputs(2, 4, 2, 30, 16, 8, pads=(0, 7))
    y = naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, 30), mask)
    ref = naive_softmax_attention(q, k, v, mask)
    m = mask.bool()[:, None, :, None]
    assert_close("y", torch.where(m, ref, 0.0), torch.where(m, y, 0.0), 1e-12)


def test_softmax_matches_causal_sdpa():
    q, k, v, *_ = make_inputs(2, 4, 2, 30, 16, 8)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
    assert_close("y", ref, naive_softmax_attention(q, k, v), 1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_masks_split_the_causal_real_keys_and_rows_sum_to_one(kind):
    q, k, v, qf, kf, mix, mask = make_inputs(2, 2, 1, 25, 8, 4, pads=(0, 6))
    win, hist = window_masks(kind, 4, mask)
    causal_real = torch.ones(25, 25, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]
    assert not (win & hist).any() and torch.equal(win | hist, causal_real)
    a = hybrid_attention_matrix(q, k, qf, kf, mix, kind, 4, 8**-0.5, mask)
    real = mask.bool()[:, None, :]
    assert torch.allclose(a.sum(-1)[real.expand(-1, 2, -1)], torch.ones(()), atol=1e-6)
    assert not a.masked_select(~causal_real).any()
