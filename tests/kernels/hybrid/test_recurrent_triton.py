"""Triton decode step against the PyTorch one (outputs and state, step by step from a prefill) and
against the naive reference. Window 4 so that several tiles / windows fold (rows: see decoding.py).
"""

import pytest
import torch

from kernels.hybrid.recurrent_torch import decode_step_torch, prefill_state
from kernels.hybrid.recurrent_triton import decode_step_triton
from kernels.hybrid.window import KINDS
from tests.kernels.hybrid.decoding import assert_matches_naive, decode_case
from tests.kernels.utils import assert_close


def run_both(kind, w, *, dtype=torch.float32, inplace=False, B=3, H=4, Hkv=2, d=16, f=8, P=9, T=13, ratio=1e-5):
    case = decode_case(kind, w, dtype=dtype, B=B, H=H, Hkv=Hkv, d=d, f=f, P=P, T=T)
    ys = []
    with torch.no_grad():
        # two states: each step writes its window cache in place
        state_ref, state_tri = (prefill_state(kind, w, case.k, case.v, case.key_features(case.k), case.mask) for _ in range(2))
        for t in range(T):
            args = case.step_args(t)
            y_ref, state_ref = decode_step_torch(state_ref, *args)
            y_tri, state_tri = decode_step_triton(state_tri, *args, inplace=inplace)
            assert y_tri.shape == y_ref.shape and y_tri.dtype == y_ref.dtype
            assert_close(f"y step {t}", y_ref, y_tri, ratio)
            assert_close(f"S step {t}", state_ref.S, state_tri.S, ratio)
            assert_close(f"z step {t}", state_ref.z, state_tri.z, ratio)
            for name in ("win_k", "win_v", "win_pos", "win_valid", "first"):
                assert torch.equal(getattr(state_ref, name), getattr(state_tri, name)), f"{name} step {t}"
            assert state_ref.seen == state_tri.seen
            ys.append(y_tri)
    assert_matches_naive(case, ys, ratio)


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
