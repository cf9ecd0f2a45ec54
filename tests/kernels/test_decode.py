"""Triton decode step against ``core.attention.recurrent.decode_step``, step by step from a prefill.

Rows: one without padding, one left-padded, one that gets its first real token only during decoding;
one row skips a token now and then (valid = False). Window 4 so that several tiles / windows fold.
"""

import pytest
import torch

from core.attention import HedgehogFeatureMap
from core.attention.recurrent import decode_step, prefill_state
from kernels.hybrid.triton_decode import hybrid_decode_step_triton
from tests.kernels.conftest import DEVICE
from tests.kernels.utils import assert_close

KINDS = ["linear", "sliding_window", "terraced"]


def run_both(kind, w, *, dtype=torch.float32, inplace=False, B=3, H=4, Hkv=2, d=16, f=8, P=9, T=13, ratio=1e-5):
    G = H // Hkv
    g = torch.Generator().manual_seed(42)
    torch.manual_seed(42)
    fq = HedgehogFeatureMap(H, d, f, init="random").to(DEVICE)
    fk = HedgehogFeatureMap(H, d, f, init="random").to(DEVICE)
    key_features = lambda keys: fk(keys.repeat_interleave(G, dim=1))  # noqa: E731
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype)  # noqa: E731
    mix = torch.randn(H, generator=g).to(DEVICE)
    scale = d**-0.5

    k, v = rand(B, Hkv, P, d), rand(B, Hkv, P, d)
    mask = torch.ones(B, P, dtype=torch.bool, device=DEVICE)
    mask[1, :3] = False
    mask[2:, :] = False
    with torch.no_grad():
        # two states: each step writes its window cache in place
        state_ref, state_tri = (prefill_state(kind, w, k, v, key_features(k), mask) for _ in range(2))
        for t in range(T):
            q_t, k_t, v_t = rand(B, H, 1, d), rand(B, Hkv, 1, d), rand(B, Hkv, 1, d)
            qf_t = fq(q_t)
            valid = torch.ones(B, dtype=torch.bool, device=DEVICE)
            valid[2:] = t >= 2
            valid[1] = t % 5 != 3
            args = (kind, w, q_t, k_t, v_t, qf_t, mix, valid, key_features, scale)
            y_ref, state_ref = decode_step(state_ref, *args)
            y_tri, state_tri = hybrid_decode_step_triton(state_tri, *args, inplace=inplace)
            assert y_tri.shape == y_ref.shape and y_tri.dtype == y_ref.dtype
            assert_close(f"y step {t}", y_ref, y_tri, ratio)
            assert_close(f"S step {t}", state_ref.S, state_tri.S, ratio)
            assert_close(f"z step {t}", state_ref.z, state_tri.z, ratio)
            for name in ("win_k", "win_v", "win_pos", "win_valid", "first"):
                assert torch.equal(getattr(state_ref, name), getattr(state_tri, name)), f"{name} step {t}"
            assert state_ref.seen == state_tri.seen


@pytest.mark.parametrize("kind", KINDS)
def test_decode_step_matches_reference(kind):
    run_both(kind, 4)


def test_decode_step_in_place_state():
    run_both("terraced", 4, inplace=True, T=9)


def test_decode_step_bf16_gqa_head_dim_64():
    run_both("sliding_window", 4, dtype=torch.bfloat16, H=6, Hkv=2, d=64, f=32, T=6, ratio=2e-2)


def test_decode_window_longer_than_a_block():
    """Window cache of 2 w = 80 columns: the online max runs over two column blocks."""
    run_both("terraced", 40, B=2, H=2, Hkv=1, P=70, T=14)
