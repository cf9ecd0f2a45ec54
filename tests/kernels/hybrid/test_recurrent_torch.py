"""The PyTorch recurrent form: prefill, then token-by-token decoding, against the naive reference,
and the state it reaches against a prefill of the whole sequence (rows: see decoding.py)."""

import pytest
import torch

import kernels.hybrid.recurrent_torch as recurrent_torch
from kernels.hybrid.naive import positions
from kernels.hybrid.recurrent_torch import decode_step_torch, fold_keys, prefill_state
from kernels.hybrid.window import KINDS, WindowRule, window_capacity
from tests.kernels.hybrid.decoding import assert_matches_naive, decode_case, whole_sequence
from tests.kernels.utils import assert_close


@pytest.mark.parametrize("kind, sinks, decay, own_keys, kv_maps", [(kind, 0, False, False, False) for kind in KINDS]
                         + [("sliding_window", 3, False, False, False), ("terraced", 3, False, False, False)]
                         + [(kind, 3 * (kind != "linear"), True, False, False) for kind in KINDS]
                         + [(kind, 3 * (kind != "linear"), True, True, False) for kind in KINDS]
                         + [(kind, 3 * (kind != "linear"), True, True, True) for kind in KINDS]
                         + [("terraced", 0, False, False, True)])
@pytest.mark.parametrize("w, P, T", [(4, 9, 13), (40, 70, 14)], ids=["w4", "w40"])
@torch.no_grad()
def test_decode_matches_naive_and_a_whole_prefill(kind, sinks, decay, own_keys, kv_maps, w, P, T):
    """``own_keys``: phi_k reads other keys than the softmax (keys before RoPE), computed from each
    cached key and its position; ``kv_maps``: the key feature map, the state and the decay rates per
    key/value head."""
    case = decode_case(kind, w, P=P, T=T, sinks=sinks, decay=decay, own_keys=own_keys, kv_maps=kv_maps)
    state = case.prefill()
    ys = []
    for t in range(T):
        y, state = decode_step_torch(state, *case.step_args(t))
        ys.append(y)
    assert_matches_naive(case, ys, 1e-5)

    k, v, mask = whole_sequence(case)
    whole = prefill_state(WindowRule(kind, w, sinks), k, v, case.key_features(k, positions(mask)), mask, case.decay)
    assert whole.seen == state.seen == P + T and whole.win_k.shape[2] == window_capacity(kind, w)
    assert state.S.shape[1] == state.z.shape[1] == (2 if kv_maps else 4)  # the state's heads
    assert_close("S", whole.S, state.S, 1e-5)
    assert_close("z", whole.z, state.z, 1e-5)
    assert torch.equal(whole.first, state.first) and torch.equal(whole.win_valid, state.win_valid)
    cached = whole.win_valid[:, None, :, None]
    assert torch.equal(whole.win_pos[whole.win_valid], state.win_pos[state.win_valid])
    for name in ("win_k", "win_v"):
        assert torch.equal(torch.where(cached, getattr(whole, name), 0), torch.where(cached, getattr(state, name), 0)), name
    assert_same_sinks(whole, state, sinks)


@pytest.mark.parametrize("sinks, decay, own_keys, kv_maps", [(0, False, False, False), (3, False, False, False),
                                                           (3, True, True, False), (3, True, True, True),
                                                           (0, True, False, True)])
@torch.no_grad()
def test_rows_in_step_take_the_aligned_step_with_the_general_steps_result(sinks, decay, own_keys, kv_maps, monkeypatch):
    """Sliding window, no padding: once the window is full and every sink below it, each step takes
    :func:`decode_step_aligned`, whose outputs and state equal the general step's (run beside it on
    a second state) and the naive reference's. The prompt (5 tokens, w = 4) leaves the first
    aligned step for the decode, and the key leaving at the first one or two is a sink key."""
    w, P, T = 4, 5, 12
    case = decode_case("sliding_window", w, P=P, T=T, sinks=sinks, decay=decay, own_keys=own_keys, kv_maps=kv_maps,
                       padded=False)
    taken = []
    aligned = recurrent_torch.decode_step_aligned
    monkeypatch.setattr(recurrent_torch, "decode_step_aligned", lambda state, *a: taken.append(state.seen) or aligned(state, *a))
    general = recurrent_torch.aligned_step
    state, ref = case.prefill(), case.prefill()
    ys = []
    for t in range(T):
        y, state = decode_step_torch(state, *case.step_args(t))
        monkeypatch.setattr(recurrent_torch, "aligned_step", lambda *a: False)
        y_ref, ref = decode_step_torch(ref, *case.step_args(t))
        monkeypatch.setattr(recurrent_torch, "aligned_step", general)
        assert_close(f"y step {t}", y_ref, y, 1e-6)
        assert_close(f"S step {t}", ref.S, state.S, 1e-6)
        assert_close(f"z step {t}", ref.z, state.z, 1e-6)
        for name in ("win_k", "win_v", "win_pos", "win_valid", "first", "sink_k", "sink_v", "sink_valid"):
            assert (getattr(ref, name) is getattr(state, name) is None) if name.startswith("sink") and not sinks \
                else torch.equal(getattr(ref, name), getattr(state, name)), f"{name} step {t}"
        assert ref.seen == state.seen
        ys.append(y)
    assert taken == list(range(max(P, w + sinks - 1), P + T))
    assert_matches_naive(case, ys, 1e-5)


def assert_same_sinks(whole, state, sinks: int) -> None:
    """Both states hold the same sink cache (None without sinks)."""
    assert whole.sinks == state.sinks == sinks
    if sinks:
        assert torch.equal(whole.sink_valid, state.sink_valid)
        held = whole.sink_valid[:, None, :, None]
        for name in ("sink_k", "sink_v"):
            assert torch.equal(torch.where(held, getattr(whole, name), 0), torch.where(held, getattr(state, name), 0)), name


@pytest.mark.parametrize("H, per_head", [(4, False), (4, True), (2, True)], ids=["G2", "G2-decay", "G1-decay"])
def test_folding_one_key_equals_folding_it_beside_a_key_of_weight_zero(H, per_head):
    """One leaving key (a sliding window's decode step) is folded by broadcasting, several by
    matmul: the two agree."""
    g = torch.Generator().manual_seed(0)
    B, Hkv, F, d = 3, 2, 6, 5
    S, z = torch.randn(B, H, F, d, generator=g), torch.rand(B, H, F, generator=g)
    kf, v = torch.rand(B, H, 2, F, generator=g), torch.randn(B, Hkv, 2, d, generator=g)
    weight = torch.rand(B, H, 2, generator=g) if per_head else torch.tensor([[True, False], [True, True], [False, True]])
    one = fold_keys(S, z, kf[:, :, :1], v[:, :, :1], weight[..., :1])
    off = weight.clone()
    off[..., 1] = 0
    two = fold_keys(S, z, kf, v, off)
    assert_close("S", two[0], one[0], 1e-6)
    assert_close("z", two[1], one[1], 1e-6)
    assert not torch.allclose(one[0], S)  # the key was folded
