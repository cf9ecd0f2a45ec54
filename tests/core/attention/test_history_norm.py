"""The history normalisations of a converted layer: power, r_h(n) = N(n)^-sigmoid(a_h) on the history
term, against a closed form written here; power and decay in every form a converted layer runs
(prefill, row pieces, carried chunks, decode at 4096 tokens)."""

import pytest
import torch
from transformers import DynamicCache

import core
from core.attention.layer import LolcatsAttention
from core.config import AttentionSpec, stored_attention, stored_config
from core.load import load_converted
from kernels.hybrid.naive import naive_hybrid_attention
from kernels.hybrid.window import WindowRule
from tests.core.attention.test_surgery import converted, left_padded_batch, positions, rel_err
from tests.tiny_models import tiny_model
from tests.tiny_runs import convert_tiny

CASES = [("sliding_window", 0), ("sliding_window", 3), ("terraced", 0), ("terraced", 4)]


def history_scale(kind, w, sinks, pos, logits):
    """The closed form: N = max(first window position - sinks, 1), r = N ** -sigmoid(a) per head."""
    start = pos - w + 1 if kind == "sliding_window" else w * (torch.div(pos, w, rounding_mode="floor") - 1)
    n = (start - sinks).clamp(min=1).double()
    return n[:, None, :, None] ** -torch.sigmoid(logits.double())[None, :, None, None]


def layer_inputs(attn, B=3, L=70):
    """Random q [B, H, L, d], k, v [B, H_kv, L, d] for ``attn`` and a left-padded [B, L] bool mask."""
    g = torch.Generator().manual_seed(3)
    H, Hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q, k, v = torch.randn(B, H, L, d, generator=g), torch.randn(B, Hkv, L, d, generator=g), torch.randn(B, Hkv, L, d, generator=g)
    _, mask = left_padded_batch([70, 41, 9], L)
    return q, k, v, mask.bool()


@pytest.mark.parametrize("kind, sinks", CASES)
@torch.no_grad()
def test_layer_prefill_equals_the_float64_oracle_with_the_history_scale(kind, sinks):
    model = converted("llama", kind, window=8, sinks=sinks, history_norm="power")
    attn = core.lolcats_modules(model)[0]
    q, k, v, mask = layer_inputs(attn)
    L, H, Hkv = q.shape[2], attn.num_heads, attn.num_kv_heads
    y, _ = attn.prefill(q, k, v, mask, False, q, k)  # the feature maps read the rotated q, k (feature_positions rotary)
    pos = torch.arange(L)[None] - (~mask).long().sum(-1, keepdim=True)  # from each row's first real token
    qf = attn.feature_map_q(q).double() * history_scale(kind, 8, sinks, pos, attn.history_power)
    kf = attn.feature_map_k(k.repeat_interleave(H // Hkv, dim=1))
    want = naive_hybrid_attention(q, k, v, qf, kf, attn.mix, WindowRule(kind, 8, sinks), mask, attn.scaling)
    assert rel_err(y.double()[mask[:, None, :, None].expand_as(y)], want[mask[:, None, :, None].expand_as(want)]) < 1e-6
    plain = naive_hybrid_attention(q, k, v, attn.feature_map_q(q), kf, attn.mix, WindowRule(kind, 8, sinks), mask, attn.scaling)
    assert rel_err(plain, want) > 1e-2  # the scale changes the output


@pytest.mark.parametrize("norm", ["power", "decay"])
@pytest.mark.parametrize("kind, sinks", [("sliding_window", 4), ("terraced", 4)])
@torch.no_grad()
def test_decoding_4096_tokens_equals_the_parallel_forward(kind, sinks, norm):
    model = converted("llama", kind, window=16, sinks=sinks, history_norm=norm)
    ids, mask = left_padded_batch([4096, 4001], 4096)
    pos = positions(mask)
    full = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    cache = DynamicCache(config=model.config)
    prefix = 3500  # a prompt, then the last 596 tokens one at a time
    steps = [model(input_ids=ids[:, :prefix], attention_mask=mask[:, :prefix], position_ids=pos[:, :prefix],
                   past_key_values=cache, use_cache=True).logits]
    for t in range(prefix, ids.shape[1]):
        steps.append(model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=pos[:, t:t + 1],
                           past_key_values=cache, use_cache=True).logits)
    stepped = torch.cat(steps, dim=1)
    real = mask.bool()
    assert rel_err(stepped[real], full[real]) < 1e-4
    assert rel_err(stepped[:, -100:][real[:, -100:]], full[:, -100:][real[:, -100:]]) < 1e-4  # the far end alone


@pytest.mark.parametrize("norm", ["power", "decay"])
@pytest.mark.parametrize("kind, sinks", CASES)
@torch.no_grad()
def test_chunked_prefill_and_row_pieces_keep_the_norm(kind, sinks, norm, monkeypatch):
    model = converted("llama", kind, window=8, sinks=sinks, history_norm=norm)
    ids, mask = left_padded_batch([90, 61, 12], 90)
    pos = positions(mask)
    full = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    cache, logits = DynamicCache(config=model.config), []
    for a, b in ((0, 33), (33, 40), (40, 90)):
        logits.append(model(input_ids=ids[:, a:b], attention_mask=mask[:, :b], position_ids=pos[:, a:b],
                            past_key_values=cache, use_cache=True).logits)
    real = mask.bool()
    assert rel_err(torch.cat(logits, dim=1)[real], full[real]) < 1e-5
    monkeypatch.setattr(LolcatsAttention, "row_pieces", lambda self, q: [slice(i, i + 1) for i in range(q.shape[0])])
    pieces = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert rel_err(pieces[real], full[real]) < 1e-6


def test_history_norm_defaults_to_decay_and_power_needs_a_window():
    assert AttentionSpec().history_norm == "decay" and AttentionSpec().init_history_power == 0.9
    assert AttentionSpec(kind="linear", history_norm="power").history_norm == "none"  # it would cancel
    assert AttentionSpec(kind="linear").history_norm == "decay"
    with pytest.raises(ValueError, match="history_norm"):
        AttentionSpec(history_norm="mean")
    with pytest.raises(ValueError, match="init_history_power must be in"):
        AttentionSpec(init_history_power=1.0)


def test_runs_and_exports_stored_before_the_option_load_with_the_papers_history_term():
    old = {"kind": "terraced", "window_size": 64}  # an attention spec written before history_norm existed
    assert stored_attention(old).history_norm == "none"
    assert stored_config({"attention": old}).attention.history_norm == "none"
    assert stored_config({"attention": {**old, "history_norm": "power"}}).attention.history_norm == "power"
    assert stored_config({}).attention.history_norm == "none"


def test_the_exponents_start_at_init_history_power():
    model = core.linearize(tiny_model(), AttentionSpec(kind="sliding_window", window_size=8, history_norm="power",
                                                       init_history_power=0.8))
    for m in core.lolcats_modules(model).values():
        assert torch.allclose(torch.sigmoid(m.history_power), torch.full_like(m.history_power, 0.8))


def test_stage1_trains_the_exponents_and_runs_keep_them(tmp_path):
    run, _ = convert_tiny(tmp_path, attention={"history_norm": "power", "sink_tokens": 2})
    model, _, _ = load_converted(run)
    exponents = {n: p for n, p in model.named_parameters() if n.endswith(".history_power")}
    assert len(exponents) == len(core.lolcats_modules(model))
    assert all(p.abs().max() > 1e-4 for p in exponents.values())  # moved from their start at 0
    assert all(m.history_norm == "power" for m in core.lolcats_modules(model).values())
