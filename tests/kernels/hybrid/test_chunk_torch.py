"""The PyTorch chunked form against the naive quadratic reference, on random inputs with left padding."""

import pytest
import torch

from kernels.dispatch import hybrid_attention
from kernels.hybrid.chunk_torch import hybrid_attention_torch
from kernels.hybrid.naive import naive_hybrid_attention, naive_softmax_attention
from kernels.hybrid.window import KINDS, WindowRule
from tests.attention_inputs import make_inputs


def rel_err(a, b, mask=None):
    a, b = a.double(), b.double()
    if mask is not None:  # compare real query positions only
        m = mask.bool()[:, None, :, None]
        a, b = torch.where(m, a, 0.0), torch.where(m, b, 0.0)
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("L", [1, 63, 64, 65, 127, 128, 300])
def test_matches_oracle_with_left_padding(kind, L):
    q, k, v, qf, kf, mix, mask = make_inputs(3, 4, 2, L, 16, 8, pads=[min(p, L - 1) for p in (0, 5, 70)])
    y = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule(kind, 64), attention_mask=mask)
    ref = naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, 64), mask)
    assert torch.isfinite(y).all()
    assert rel_err(y, ref, mask) <= 1e-5


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("window", [1, 5, 16])
def test_other_windows_t2r_and_no_mask(kind, window):
    q, k, v, qf, kf, mix, _ = make_inputs(2, 6, 3, 50, 8, 12, feature_map="t2r", seed=1)
    y = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule(kind, window))
    ref = naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, window))
    assert rel_err(y, ref) <= 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_padding_in_the_middle_and_right(kind):
    q, k, v, qf, kf, mix, _ = make_inputs(2, 2, 1, 90, 8, 8, seed=3)
    mask = torch.ones(2, 90, dtype=torch.long)
    mask[0, 30:34] = 0
    mask[1, 70:] = 0
    y = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule(kind, 16), attention_mask=mask)
    ref = naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, 16), mask)
    assert rel_err(y, ref, mask) <= 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_causal(kind):
    """Changing tokens after position n leaves outputs up to n unchanged."""
    q, k, v, qf, kf, mix, mask = make_inputs(2, 4, 2, 150, 16, 8, pads=[0, 9])
    y = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule(kind, 32), mask)
    n = 77
    q2, k2, v2, qf2, kf2 = (t.clone() for t in (q, k, v, qf, kf))
    for t in (q2, k2, v2, qf2, kf2):
        t[:, :, n + 1 :] = torch.rand_like(t[:, :, n + 1 :]) * 3
    y2 = hybrid_attention_torch(q2, k2, v2, qf2, kf2, mix, WindowRule(kind, 32), mask)
    assert rel_err(y2[:, :, : n + 1], y[:, :, : n + 1], mask[:, : n + 1]) <= 1e-6
    assert not torch.allclose(y[:, :, n + 1 :], y2[:, :, n + 1 :])


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_padded_row_equals_row_alone(kind):
    q, k, v, qf, kf, mix, _ = make_inputs(1, 4, 2, 100, 16, 8, seed=7)
    pad = 37
    padded = [torch.cat([torch.randn(1, t.shape[1], pad, t.shape[3]).abs(), t], dim=2) for t in (q, k, v, qf, kf)]
    mask = torch.cat([torch.zeros(1, pad), torch.ones(1, 100)], dim=1).long()
    alone = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule(kind, 32))
    y = hybrid_attention_torch(*padded, mix, WindowRule(kind, 32), mask)
    assert rel_err(y[:, :, pad:], alone) <= 1e-6


def test_window_covering_sequence_is_softmax():
    """With history empty (sliding window longer than the input) the hybrid is softmax attention."""
    q, k, v, qf, kf, mix, mask = make_inputs(2, 4, 2, 40, 16, 8, pads=[0, 11])
    y = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule("sliding_window", 64), mask)
    ref = naive_softmax_attention(q, k, v, mask)
    assert rel_err(y, ref, mask) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_accumulates_in_float32(dtype):
    """Against the float64 oracle on the same half inputs the only large error is the one rounding
    of the output, so the bound is the dtype's unit roundoff (eps / 2: 3.9e-3 bf16, 4.9e-4 fp16).
    The Triton kernel's half tests allow more (2e-2, 2e-3) since it also rounds P to the input
    dtype for the tensor-core products."""
    q, k, v, qf, kf, mix, mask = make_inputs(1, 2, 1, 200, 16, 8, pads=[3])
    y = hybrid_attention_torch(q.to(dtype), k.to(dtype), v.to(dtype), qf.to(dtype), kf.to(dtype), mix, WindowRule("terraced", 64), mask)
    assert y.dtype == dtype
    ref = naive_hybrid_attention(q.to(dtype), k.to(dtype), v.to(dtype), qf.to(dtype), kf.to(dtype), mix, WindowRule("terraced", 64), mask)
    assert rel_err(y, ref, mask) <= torch.finfo(dtype).eps / 2


@pytest.mark.parametrize("kind", KINDS)
def test_wide_score_range_matches_oracle(kind):
    """Scores spread over hundreds of units: the window weights far below the row maximum
    (floored for speed on CPUs) still give the oracle's outputs."""
    q, k, v, qf, kf, mix, mask = make_inputs(2, 4, 2, 150, 16, 8, pads=[0, 9], seed=5)
    y = hybrid_attention_torch(q * 12, k * 12, v, qf, kf, mix, WindowRule(kind, 32), attention_mask=mask)
    ref = naive_hybrid_attention(q * 12, k * 12, v, qf, kf, mix, WindowRule(kind, 32), mask)
    assert rel_err(y, ref, mask) <= 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_oracle(kind):
    q, k, v, qf, kf, mix, mask = make_inputs(2, 4, 2, 70, 8, 8, pads=[0, 4])
    leaves = [t.clone().requires_grad_() for t in (q, k, v, qf, kf, mix)]
    y = hybrid_attention_torch(*leaves[:5], leaves[5], WindowRule(kind, 16), mask)
    w = torch.randn_like(y) * mask[:, None, :, None]
    (y * w).sum().backward()
    grads = [t.grad for t in leaves]
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v, qf, kf, mix)]
    ref = naive_hybrid_attention(*leaves64[:5], leaves64[5], WindowRule(kind, 16), mask)
    (ref * w.double()).sum().backward()
    for name, g1, t in zip("q k v q_feat k_feat mix".split(), grads, leaves64):
        if t.grad is None or g1 is None:  # linear attention has no window: q, k and mix do not enter
            assert kind == "linear" and name in ("q", "k", "mix"), name
            assert all(g is None or not g.any() for g in (g1, t.grad)), name
        else:
            assert rel_err(g1, t.grad) <= 1e-5, name


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
@pytest.mark.parametrize("sinks", [1, 4, 20])
def test_sink_tokens_match_the_oracle_with_gradients(kind, sinks):
    """The first ``sinks`` keys stay softmax for every later query (and leave the history): outputs
    and gradients of every input against the float64 oracle, with left padding."""
    q, k, v, qf, kf, mix, mask = make_inputs(3, 4, 2, 100, 16, 8, pads=[0, 5, 37])
    leaves = [t.clone().requires_grad_() for t in (q, k, v, qf, kf, mix)]
    y = hybrid_attention_torch(*leaves, WindowRule(kind, 16, sinks), mask)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, qf, kf, mix)]
    ref = naive_hybrid_attention(*ref_leaves, WindowRule(kind, 16, sinks), mask)
    assert rel_err(y, ref, mask) <= 1e-5
    assert rel_err(y, naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, 16), mask), mask) > 1e-2  # the sinks matter
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)) * mask[:, None, :, None]
    (y * dy).sum().backward()
    (ref * dy.double()).sum().backward()
    for name, got, want in zip("q k v qf kf mix".split(), leaves, ref_leaves):
        assert rel_err(got.grad, want.grad) <= 1e-4, name


def test_sink_tokens_need_a_window():
    q, k, v, qf, kf, mix, _ = make_inputs(1, 2, 1, 20, 8, 4)
    with pytest.raises(ValueError, match="sink tokens need a softmax part"):
        hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule("linear", 8, 2))


def assert_gradients_match(kind, y, ref, mask, leaves, ref_leaves):
    """Every input's gradient (q k v qf kf mix decay) of one random cotangent, through ``y`` and the
    float64 oracle ``ref``, within 1e-4."""
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)) * mask[:, None, :, None]
    (y * dy).sum().backward()
    (ref * dy.double()).sum().backward()
    for name, got, want in zip("q k v qf kf mix decay".split(), leaves, ref_leaves):
        if want.grad is None or not want.grad.any():  # linear attention: q, k and mix do not enter
            assert kind == "linear" and name in ("q", "k", "mix"), name
            continue
        assert got.grad.shape == want.grad.shape and rel_err(got.grad, want.grad) <= 1e-4, name


@pytest.mark.parametrize("kind, sinks", [("linear", 0), ("sliding_window", 0), ("sliding_window", 3), ("terraced", 0),
                                         ("terraced", 3)])
def test_decay_matches_the_oracle_with_gradients(kind, sinks):
    """A decaying history (gamma_h from 0.6 to 1 across heads): outputs and gradients of every input,
    log gamma included, against the float64 oracle over several tiles, with left padding."""
    q, k, v, qf, kf, mix, mask = make_inputs(3, 4, 2, 100, 16, 8, pads=[0, 5, 37])
    decay = torch.tensor([0.6, 0.9, 0.97, 1.0]).log()
    leaves = [t.clone().requires_grad_() for t in (q, k, v, qf, kf, mix, decay)]
    y = hybrid_attention_torch(*leaves[:6], WindowRule(kind, 16, sinks), mask, decay=leaves[6])
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, qf, kf, mix, decay)]
    ref = naive_hybrid_attention(*ref_leaves[:6], WindowRule(kind, 16, sinks), mask, decay=ref_leaves[6])
    assert rel_err(y, ref, mask) <= 1e-5
    assert rel_err(y, naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, 16, sinks), mask), mask) > 1e-2
    assert_gradients_match(kind, y, ref, mask, leaves, ref_leaves)
    assert decay.shape == (4,) and ref_leaves[6].grad[-1] != 0  # gamma = 1 still has a gradient (it may shrink)


def test_decay_of_one_is_the_paper_form():
    q, k, v, qf, kf, mix, mask = make_inputs(2, 4, 2, 90, 16, 8, pads=[0, 7])
    y = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule("terraced", 16, 2), mask, decay=torch.zeros(4))
    assert rel_err(y, hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule("terraced", 16, 2), mask), mask) <= 1e-6


@pytest.mark.parametrize("kind, sinks", [("linear", 0), ("sliding_window", 3), ("terraced", 3)])
def test_key_features_per_key_value_head_match_the_oracle_with_gradients(kind, sinks):
    """k_feat and the decay rates per key/value head ([B, H_kv, L, F], [H_kv]): equal, with every
    gradient, to the oracle given each query head its group's features and rate explicitly
    (query head h reads key/value head h // G), with left padding."""
    q, k, v, qf, kf, mix, mask = make_inputs(3, 6, 2, 100, 16, 8, pads=[0, 5, 37])
    kf = kf[:, ::3].contiguous()  # one map per key/value head: [B, 2, L, F]
    decay = torch.tensor([0.8, 0.97]).log()
    leaves = [t.clone().requires_grad_() for t in (q, k, v, qf, kf, mix, decay)]
    y = hybrid_attention(*leaves[:6], WindowRule(kind, 16, sinks), mask, decay=leaves[6], backend="torch")
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, qf, kf, mix, decay)]
    per_query = [ref_leaves[4].repeat_interleave(3, dim=1), ref_leaves[6].repeat_interleave(3)]
    ref = naive_hybrid_attention(*ref_leaves[:4], per_query[0], ref_leaves[5], WindowRule(kind, 16, sinks), mask,
                                 decay=per_query[1])
    assert rel_err(y, ref, mask) <= 1e-5
    assert_gradients_match(kind, y, ref, mask, leaves, ref_leaves)


@pytest.mark.parametrize("w, tile", [(64, 64), (96, 32), (126, 42)])
def test_a_sliding_window_in_several_tiles_matches_the_oracle_with_gradients(w, tile):
    """A sliding window cut into query blocks of a divisor of w (each block scoring w + T keys, the
    history's partial tile T long): outputs and every gradient against the float64 oracle, with
    sinks, a decaying history, key features per key/value head and left padding, over many tiles."""
    from kernels.hybrid.chunk_torch import window_tile

    assert window_tile("sliding_window", w) == tile and window_tile("terraced", w) == w
    q, k, v, qf, kf, mix, mask = make_inputs(2, 6, 2, 3 * w + 7, 16, 8, pads=[0, w // 2 + 3])
    kf = kf[:, ::3].contiguous()
    decay = torch.tensor([0.9, 0.99]).log()
    rule = WindowRule("sliding_window", w, 4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, qf, kf, mix, decay)]
    y = hybrid_attention(*leaves[:6], rule, mask, decay=leaves[6], backend="torch")
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, qf, kf, mix, decay)]
    ref = naive_hybrid_attention(*ref_leaves[:4], ref_leaves[4].repeat_interleave(3, dim=1), ref_leaves[5], rule, mask,
                                 decay=ref_leaves[6].repeat_interleave(3))
    assert rel_err(y, ref, mask) <= 1e-5
    with torch.no_grad():  # inference: the in-place path
        assert rel_err(hybrid_attention(q, k, v, qf, kf, mix, rule, mask, decay=decay, backend="torch"), ref, mask) <= 1e-5
    assert_gradients_match("sliding_window", y, ref, mask, leaves, ref_leaves)
