"""Decoding runs shared by the recurrent tests: a prompt prefilled into the state, then one token
per step, and the naive reference's outputs at the decoded positions.

Rows: one without padding, one left-padded, one that gets its first real token only during
decoding; one row skips a token now and then (valid = False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.attention import HedgehogFeatureMap
from kernels.hybrid.naive import naive_hybrid_attention, positions
from kernels.hybrid.recurrent_torch import HybridState, decode_step_torch, prefill_state
from kernels.hybrid.recurrent_triton import decode_step_triton
from kernels.hybrid.window import WindowRule
from tests.kernels.conftest import DEVICE
from tests.kernels.utils import assert_close


@dataclass
class DecodeCase:
    kind: str
    w: int
    k: torch.Tensor  # prompt keys [B, H_kv, P, d]
    v: torch.Tensor
    mask: torch.Tensor  # prompt mask [B, P] bool
    steps: list[tuple[torch.Tensor, ...]]  # per step (q, k, v, q_feat, valid)
    mix: torch.Tensor
    key_features: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (keys, positions) -> phi_k
    scale: float
    sinks: int = 0
    decay: torch.Tensor | None = None  # log gamma [H_s]

    @property
    def rule(self) -> WindowRule:
        return WindowRule(self.kind, self.w, self.sinks)

    def step_args(self, t: int) -> tuple:
        """The arguments of the decode step for step ``t`` (those after the state)."""
        q, k, v, qf, valid = self.steps[t]
        return (self.rule, q, k, v, qf, self.mix, valid, self.key_features, self.scale, self.decay)

    def prefill(self) -> HybridState:
        """The state after the prompt."""
        return prefill_state(self.rule, self.k, self.v, self.key_features(self.k, positions(self.mask)), self.mask,
                             self.decay)


def feature_keys(k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """What phi_k reads when it reads other keys than the softmax: a mix of the key's coordinates
    that depends on its position ``pos`` ``[B, K]`` (k ``[B, H_kv, K, d]``), standing for the key
    before RoPE, which the layer recovers from the cached key and its position."""
    turn = torch.cos(0.3 * pos.to(k.dtype))[:, None, :, None]
    return 0.8 * k.flip(-1) * turn + 0.3 * k


def sample_decay(H: int) -> torch.Tensor:
    """log gamma [H] for the decay tests: rates from fast (0.6) to none (1.0)."""
    return torch.linspace(0.6, 1.0, H).log().to(DEVICE)


def decode_case(kind, w, *, dtype=torch.float32, B=3, H=4, Hkv=2, d=16, f=8, P=9, T=13, sinks=0, decay=False,
                own_keys=False, kv_maps=False, padded=True) -> DecodeCase:
    """``own_keys``: phi_k reads :func:`feature_keys` of the keys and their positions, not the keys;
    ``kv_maps``: the key feature map (and so the state and the decay rates) per key/value head,
    else per query head; ``padded``: the rows of the module docstring, else every token of every
    row real (the rows in step)."""
    Hs = Hkv if kv_maps else H  # the state's heads
    g = torch.Generator().manual_seed(42)
    torch.manual_seed(42)
    fq = HedgehogFeatureMap(H, d, f, init="random").to(DEVICE)
    fk = HedgehogFeatureMap(Hs, d, f, init="random").to(DEVICE)
    read = feature_keys if own_keys else (lambda keys, pos: keys)

    def key_features(keys, pos):
        return fk(read(keys, pos).repeat_interleave(Hs // Hkv, dim=1))

    rand = lambda *shape: torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype)  # noqa: E731
    mix = torch.randn(H, generator=g).to(DEVICE)
    k, v = rand(B, Hkv, P, d), rand(B, Hkv, P, d)
    mask = torch.ones(B, P, dtype=torch.bool, device=DEVICE)
    if padded:
        mask[1, :3] = False
        mask[2:, :] = False
    steps = []
    with torch.no_grad():
        for t in range(T):
            q_t, k_t, v_t = rand(B, H, 1, d), rand(B, Hkv, 1, d), rand(B, Hkv, 1, d)
            valid = torch.ones(B, dtype=torch.bool, device=DEVICE)
            if padded:
                valid[2:] = t >= 2
                valid[1] = t % 5 != 3
            steps.append((q_t, k_t, v_t, fq(q_t), valid))
    return DecodeCase(kind, w, k, v, mask, steps, mix, key_features, d**-0.5, sinks, sample_decay(Hs) if decay else None)


def whole_sequence(case: DecodeCase) -> tuple[torch.Tensor, ...]:
    """(k, v, mask) of prompt and steps together: [B, H_kv, P + T, d] twice and [B, P + T]."""
    k = torch.cat([case.k] + [s[1] for s in case.steps], dim=2)
    v = torch.cat([case.v] + [s[2] for s in case.steps], dim=2)
    mask = torch.cat([case.mask] + [s[4][:, None] for s in case.steps], dim=1)
    return k, v, mask


@torch.no_grad()
def assert_matches_naive(case: DecodeCase, ys: list[torch.Tensor], ratio: float) -> None:
    """The decoded outputs ``ys`` (one [B, H, 1, d] per step) against the naive reference over the
    whole sequence, at the real tokens (prompt queries do not enter: they are set to zero)."""
    k, v, mask = whole_sequence(case)
    B, H, _, d = case.steps[0][0].shape
    P = case.k.shape[2]
    F = case.steps[0][3].shape[-1]
    q = torch.cat([case.steps[0][0].new_zeros(B, H, P, d)] + [s[0] for s in case.steps], dim=2)
    qf = torch.cat([case.steps[0][3].new_zeros(B, H, P, F)] + [s[3] for s in case.steps], dim=2)
    kf = case.key_features(k, positions(mask))
    decay = case.decay
    if kf.shape[1] != H:  # a state per key/value head: the oracle reads each query head's group, explicitly
        G = H // kf.shape[1]
        kf, decay = kf.repeat_interleave(G, dim=1), None if decay is None else decay.repeat_interleave(G)
    ref = naive_hybrid_attention(q, k, v, qf, kf, case.mix, case.rule, mask, case.scale, decay=decay)[:, :, P:]
    real = mask[:, None, P:, None]
    y = torch.cat(ys, dim=2).double()
    assert_close("y vs naive", torch.where(real, ref, 0.0), torch.where(real, y, 0.0), ratio)


def check_decode_triton(kind, w, *, dtype=torch.float32, inplace=False, B=3, H=4, Hkv=2, d=16, f=8, P=9, T=13, ratio=1e-5,
                        sinks=0, decay=False, own_keys=False, kv_maps=False):
    """Prefill a :func:`decode_case`, then decode ``T`` tokens with the Triton and the PyTorch step side
    by side: outputs, linear state and window cache equal step by step, outputs equal to the naive reference."""
    case = decode_case(kind, w, dtype=dtype, B=B, H=H, Hkv=Hkv, d=d, f=f, P=P, T=T, sinks=sinks, decay=decay,
                       own_keys=own_keys, kv_maps=kv_maps)
    ys = []
    with torch.no_grad():
        # two states: each step writes its window cache in place
        state_ref, state_tri = case.prefill(), case.prefill()
        for t in range(T):
            args = case.step_args(t)
            y_ref, state_ref = decode_step_torch(state_ref, *args)
            y_tri, state_tri = decode_step_triton(state_tri, *args, inplace=inplace)
            assert y_tri.shape == y_ref.shape and y_tri.dtype == y_ref.dtype
            assert_close(f"y step {t}", y_ref, y_tri, ratio)
            assert_close(f"S step {t}", state_ref.S, state_tri.S, ratio)
            assert_close(f"z step {t}", state_ref.z, state_tri.z, ratio)
            for name in ("win_k", "win_v", "win_pos", "win_valid", "first", "sink_k", "sink_v", "sink_valid"):
                held = sinks or "sink" not in name
                assert torch.equal(getattr(state_ref, name), getattr(state_tri, name)) if held \
                    else getattr(state_ref, name) is getattr(state_tri, name) is None, f"{name} step {t}"
            assert state_ref.seen == state_tri.seen
            ys.append(y_tri)
    assert_matches_naive(case, ys, ratio)
