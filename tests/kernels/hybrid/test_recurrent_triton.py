"""Triton decode step against the PyTorch one (outputs and state, step by step from a prefill) and
against the naive reference. Window 4 so that several tiles / windows fold (rows: see decoding.py).
"""

import pytest
import torch

from kernels.hybrid.window import KINDS
from tests.kernels.hybrid.decoding import check_decode_triton


@pytest.mark.parametrize("kind", KINDS)
def test_decode_step_matches_reference(kind):
    check_decode_triton(kind, 4)


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_decode_step_with_sink_tokens(kind):
    """Sink tokens: stored while they pass, never folded, read beside the ring once they leave it."""
    check_decode_triton(kind, 4, sinks=3, T=16)


@pytest.mark.parametrize("kind", KINDS)
def test_decode_step_with_a_decaying_history(kind):
    """A decay: the state carried by the window's advance and the leaving keys weighted by their age
    (in PyTorch around the kernel), in place or not, with sink tokens where there is a window."""
    check_decode_triton(kind, 4, sinks=3 * (kind != "linear"), T=16, decay=True, inplace=kind == "terraced")


@pytest.mark.parametrize("kind", KINDS)
def test_decode_step_with_keys_of_its_own_for_the_feature_map(kind):
    """phi_k reads other keys than the softmax (the keys before RoPE): the ring keeps them and the
    keys it folds are read from there."""
    check_decode_triton(kind, 4, sinks=3 * (kind != "linear"), T=16, decay=True, own_keys=True)


@pytest.mark.parametrize("kind", KINDS)
def test_decode_step_with_a_state_per_key_value_head(kind):
    """The key feature map, the state and the decay rates per key/value head: the G programs of a
    group fold into one state head (never in place, though asked), each reads it."""
    check_decode_triton(kind, 4, sinks=3 * (kind != "linear"), T=16, decay=True, own_keys=True, kv_maps=True,
                        inplace=True)


def test_decode_step_in_place_state():
    check_decode_triton("terraced", 4, inplace=True, T=9)


def test_decode_step_bf16_gqa_head_dim_64():
    check_decode_triton("sliding_window", 4, dtype=torch.bfloat16, H=6, Hkv=2, d=64, f=32, T=6, ratio=2e-2)


def test_decode_window_longer_than_a_block():
    """Window cache of 2 w = 80 columns: the online max runs over two column blocks."""
    check_decode_triton("terraced", 40, B=2, H=2, Hkv=1, P=70, T=14)
