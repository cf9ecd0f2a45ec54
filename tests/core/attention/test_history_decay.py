"""The decaying history (``history_norm: decay``): history key j of query n weighted by
gamma_h^(window_start(p_n) - 1 - p_j), against attention weights written out here in float64;
the configuration, and stage 1 training the rates. Decode and chunked forms: test_history_norm.py
(layer) and tests/kernels/hybrid (op)."""

import pytest
import torch

import core
from core.config import AttentionSpec
from core.load import load_converted
from kernels.hybrid.naive import window_masks
from tests.core.attention.test_history_norm import layer_inputs
from tests.core.attention.test_surgery import converted, rel_err
from tests.tiny_models import tiny_model
from tests.tiny_runs import convert_tiny


def written_out(q, k, v, qf, kf, mix, gamma, kind, w, sinks, mask, scale):
    """Hybrid attention with a decaying history, weight by weight: window keys g exp(s - c), history
    keys (qf . kf) gamma^age with age = (first window position of the query) - 1 - (key position)."""
    B, H, L, _ = q.shape
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, 1).double(), v.repeat_interleave(G, 1).double()
    win, hist = window_masks(kind, w, mask, sinks)  # the window rule itself is tested on its own
    pos = torch.arange(L)[None] - (~mask).long().sum(-1, keepdim=True)
    start = pos - w + 1 if kind == "sliding_window" else w * (torch.div(pos, w, rounding_mode="floor") - 1)
    age = (start[:, :, None] - 1 - pos[:, None, :]).double()  # [B, n, j]
    s = (q.double() @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~win, float("-inf"))
    c = s.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
    soft = torch.sigmoid(mix.double())[None, :, None, None] * torch.exp(s - c)
    lin = (qf.double() @ kf.double().transpose(-1, -2)) * gamma.double()[None, :, None, None] ** age[:, None]
    a = soft + torch.where(hist, lin, torch.zeros_like(lin))
    return (a / a.sum(-1, keepdim=True).clamp(min=1e-300)) @ v


def layer_prefill(model):
    """The first converted layer of ``model``, random inputs q, k, v and mask, its prefill output y,
    and the features phi_q(q), phi_k(k) (per query head) the oracle reads: the maps read q, k as
    given, as with feature_positions rotary."""
    attn = core.lolcats_modules(model)[0]
    q, k, v, mask = layer_inputs(attn)
    y, _ = attn.prefill(q, k, v, mask, False, q, k)
    kf = attn.feature_map_k(k.repeat_interleave(attn.num_heads // attn.num_kv_heads, dim=1))
    return attn, (q, k, v, mask), y, attn.feature_map_q(q), kf


@pytest.mark.parametrize("kind, sinks", [("sliding_window", 0), ("sliding_window", 3), ("terraced", 0), ("terraced", 4)])
@torch.no_grad()
def test_layer_prefill_equals_the_weights_written_out(kind, sinks):
    attn, (q, k, v, mask), y, qf, kf = layer_prefill(converted("llama", kind, window=8, sinks=sinks, history_norm="decay"))
    gamma = torch.sigmoid(attn.history_decay)
    want = written_out(q, k, v, qf, kf, attn.mix, gamma, kind, 8, sinks, mask, attn.scaling)
    real = mask[:, None, :, None].expand_as(y)
    assert rel_err(y.double()[real], want[real]) < 1e-6
    undecayed = written_out(q, k, v, qf, kf, attn.mix, torch.ones_like(gamma), kind, 8, sinks, mask, attn.scaling)
    assert rel_err(undecayed[real], want[real]) > 1e-2  # the decay changes the output


def test_decay_config():
    spec = AttentionSpec(history_norm="decay")
    assert spec.init_history_decay == 0.995
    assert AttentionSpec(kind="linear", history_norm="decay").history_norm == "decay"  # a decay does not cancel
    with pytest.raises(ValueError, match="init_history_decay must be in"):
        AttentionSpec(history_norm="decay", init_history_decay=1.0)
    model = core.linearize(tiny_model(), AttentionSpec(kind="terraced", window_size=8, history_norm="decay",
                                                       init_history_decay=0.95))
    for m in core.lolcats_modules(model).values():
        assert torch.allclose(torch.sigmoid(m.history_decay), torch.full_like(m.history_decay, 0.95))
        assert any(p is m.history_decay for p in m.trained_parameters())
        assert not hasattr(m, "history_power") and "history_norm=decay" in repr(m)


def test_stage1_trains_the_rates_and_runs_keep_them(tmp_path):
    run, _ = convert_tiny(tmp_path, attention={"history_norm": "decay", "sink_tokens": 2, "init_history_decay": 0.9})
    model, _, _ = load_converted(run)
    rates = {n: p for n, p in model.named_parameters() if n.endswith(".history_decay")}
    assert len(rates) == len(core.lolcats_modules(model))
    start = torch.logit(torch.tensor(0.9))
    assert all((p - start).abs().max() > 1e-4 for p in rates.values())  # moved from their start
    assert all(m.history_norm == "decay" for m in core.lolcats_modules(model).values())
