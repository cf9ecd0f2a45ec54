"""The compiled decode readout: the same outputs as the eager one, and a clean fallback when compiling fails."""

import logging

import pytest
import torch

from kernels.hybrid import compiled, recurrent_torch
from kernels.hybrid.naive import positions
from kernels.hybrid.recurrent_torch import decode_step_torch, prefill_state, readout
from tests.kernels.hybrid.decoding import assert_matches_naive, decode_case


@pytest.fixture
def fresh(monkeypatch):
    """A process state where nothing was compiled or given up yet, compilation requested; returns
    the functions ``torch.compile`` is asked to compile from then on."""
    monkeypatch.setattr(recurrent_torch, "compiled_readout", compiled.maybe_compile(readout))
    monkeypatch.setattr(compiled, "_failure", None)
    monkeypatch.setenv(compiled.ENV_VAR, "1")
    asked, compile_ = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: asked.append(fn) or compile_(fn, **kwargs))
    return asked


def readout_args(B=2, H=4, Hkv=2, d=16, F=8, K=8):
    g = torch.Generator().manual_seed(3)
    valid = torch.rand(B, K, generator=g) > 0.3
    return (torch.rand(B, H, 1, F, generator=g), torch.randn(B, H, 1, d, generator=g), torch.randn(B, H, F, d, generator=g),
            torch.rand(B, H, F, generator=g) + 0.5, torch.randn(B, Hkv, K, d, generator=g),
            torch.randn(B, Hkv, K, d, generator=g), valid, torch.randn(H, generator=g), d**-0.5)


@torch.no_grad()
def test_compiled_readout_equals_the_eager_one_across_steps(fresh):
    # one tiny graph (about 10 s of compilation), reused: decoding calls it at every step
    case = decode_case("terraced", 4, P=9, T=6)
    state = prefill_state(case.rule, case.k, case.v, case.key_features(case.k, positions(case.mask)), case.mask)
    ys = []
    for t in range(6):
        y, state = decode_step_torch(state, *case.step_args(t))
        ys.append(y)
    assert compiled.failure() is None and fresh == [readout]  # compiled once, reused by every step
    assert_matches_naive(case, ys, 1e-5)
    args = readout_args()
    torch.testing.assert_close(recurrent_torch.compiled_readout(*args), readout(*args), rtol=1e-6, atol=1e-6)


def test_sinks_read_beside_the_ring_equal_one_joined_cache():
    # the decode step reads the sink cache where it lies; a kernel taking one key tensor gets both joined
    g = torch.Generator().manual_seed(5)
    q_feat, q, S, z, win_k, win_v, win_valid, mix, scale = readout_args()
    B, Hkv, _, d = win_k.shape
    sinks = (torch.randn(B, Hkv, 3, d, generator=g) * 3, torch.randn(B, Hkv, 3, d, generator=g),
             torch.tensor([[True, False, True], [False, False, False]]))
    beside = readout(q_feat, q, S, z, win_k, win_v, win_valid, mix, scale, *sinks)
    one = readout(q_feat, q, S, z, *recurrent_torch.joined((win_k, win_v, win_valid), sinks), mix, scale)
    torch.testing.assert_close(beside, one, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(beside, readout(q_feat, q, S, z, win_k, win_v, win_valid, mix, scale))


def test_a_failing_compiler_falls_back_once_with_equal_outputs(fresh, monkeypatch, caplog):
    def broken(fn, **kwargs):
        raise RuntimeError("InductorError: no working C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken)
    args = readout_args()
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        first, second = recurrent_torch.compiled_readout(*args), recurrent_torch.compiled_readout(*args)
    assert compiled.failure() == "RuntimeError: InductorError: no working C++ compiler found"
    assert not compiled.enabled()
    assert len([r for r in caplog.records if "torch.compile" in r.getMessage()]) == 1  # logged once
    torch.testing.assert_close(first, readout(*args), rtol=0, atol=0)
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_compilation_is_off_by_default(monkeypatch):
    monkeypatch.delenv(compiled.ENV_VAR, raising=False)
    monkeypatch.setattr(compiled, "_failure", None)
    assert not compiled.enabled()
