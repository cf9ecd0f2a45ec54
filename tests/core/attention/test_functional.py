"""core.attention.hybrid_attention: argument validation, and the dispatched result against the naive reference."""

import pytest
import torch

from core.attention import hybrid_attention
from kernels.hybrid.naive import naive_hybrid_attention
from kernels.hybrid.window import KINDS, WindowRule
from tests.attention_inputs import make_inputs


@pytest.mark.parametrize("kind", KINDS)
def test_matches_naive_reference(kind):
    q, k, v, qf, kf, mix, mask = make_inputs(2, 4, 2, 70, 16, 8, pads=(0, 9))
    y = hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, window_size=16), attention_mask=mask)
    ref = naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, 16), mask)
    m = mask.bool()[:, None, :, None]
    assert ((torch.where(m, y.double() - ref, 0.0)).norm() / torch.where(m, ref, 0.0).norm()).item() <= 1e-5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="softmax"), "unknown attention kind 'softmax'"),
        (dict(kind="linear", window_size=0), "window_size must be >= 1, got 0"),
    ],
)
def test_bad_arguments(kwargs, message):
    q, k, v, qf, kf, mix, _ = make_inputs(1, 2, 1, 8, 4, 4)
    with pytest.raises(ValueError, match=message):
        hybrid_attention(q, k, v, qf, kf, mix, WindowRule(**kwargs))


def test_shape_errors_name_the_shapes():
    q, k, v, qf, kf, mix, _ = make_inputs(1, 4, 2, 8, 4, 4)
    with pytest.raises(ValueError, match=r"multiple of key/value heads"):
        hybrid_attention(q[:, :3], k, v, qf[:, :3], kf[:, :3], mix[:3], WindowRule("linear"))
    with pytest.raises(ValueError, match=r"mix must have shape \[H\] = \[4\]"):
        hybrid_attention(q, k, v, qf, kf, mix[:2], WindowRule("linear"))
