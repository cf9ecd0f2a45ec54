"""Quality by context length: the sliding-window baseline against a float64 oracle, the figures
against sums written out here, and the report of a tiny conversion."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import core
from core.config import LongContextSpec
from core.eval.long_context import (auto_lengths, long_context_report, passkey_hit, passkey_item, resolve_lengths,
                                    summarise, verdict)
from core.eval.metrics import teacher_context
from core.eval.window_baseline import WindowBaseline, baselines, state_bytes, window_softmax
from tests.core.attention.test_surgery import converted, left_padded_batch, positions, rel_err
from tests.tiny_models import byte_level_tokenizer
from tests.tiny_runs import convert_tiny


def window_oracle(attn, hidden, position_embeddings, window, sinks):
    """o_proj(softmax over {n - w < j <= n} ∪ {j < s} of q.k * scale, times v), in float64."""
    q, k, v = (t.double() for t in attn.project(hidden, position_embeddings)[:3])
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    L = q.shape[2]
    n, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    allowed = (j <= n) & ((j > n - window) | (j < sinks))
    s = (q @ k.transpose(-1, -2) * attn.scaling).masked_fill(~allowed, float("-inf"))
    y = torch.softmax(s, -1) @ v
    B = q.shape[0]
    return y.transpose(1, 2).reshape(B, L, -1) @ attn.o_proj.weight.double().T


@pytest.mark.parametrize("window, sinks", [(8, 0), (8, 3), (1, 2)])
@torch.no_grad()
def test_window_baseline_layer_equals_the_banded_softmax_oracle(window, sinks):
    model = converted("llama", "terraced", window=16, sinks=4)
    layer = model.model.layers[1]
    captured = {}
    handle = layer.self_attn.register_forward_pre_hook(
        lambda m, a, kw: captured.update(h=kw["hidden_states"], pe=kw["position_embeddings"]), with_kwargs=True)
    ids = torch.randint(3, 101, (2, 60), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, use_cache=False)
    handle.remove()
    with window_softmax(model, WindowBaseline("window", "sliding_window", window, sinks)):
        out, _ = model.model.layers[1].self_attn(captured["h"], captured["pe"])
    want = window_oracle(core.lolcats_modules(model)[1], captured["h"], captured["pe"], window, sinks)
    assert rel_err(out, want) < 1e-6
    assert type(model.model.layers[1].self_attn).__name__ == "LolcatsAttention"  # restored after the block


@torch.no_grad()
def test_a_window_covering_the_input_is_the_teacher_and_padding_is_honoured():
    model = converted("llama", "terraced", window=16, sinks=2, softmax_layers=(1,))
    ids, mask = left_padded_batch([50, 31], 50)
    pos = positions(mask)
    with teacher_context(model):
        teacher = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    with window_softmax(model, WindowBaseline("window", "sliding_window", 64, 2)):
        covering = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        alone = model(input_ids=ids[1:, -31:], position_ids=pos[1:, -31:]).logits
    with window_softmax(model, WindowBaseline("window", "terraced", 4, 2)):
        short = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    real = mask.bool()
    assert rel_err(covering[real], teacher[real]) < 1e-5
    assert rel_err(covering[1, -31:], alone[0]) < 1e-5  # a padded row equals the row alone
    assert rel_err(short[real], teacher[real]) > 1e-3


@pytest.mark.parametrize("feature_positions", ["none", "rotary"])
def test_memory_matched_window_holds_the_students_state_bytes(feature_positions):
    model = converted("llama", "terraced", window=16, sinks=3, feature_positions=feature_positions)
    attn = core.lolcats_modules(model)[0]
    H, Hkv, d, F = attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.feature_map_q.output_dim
    sizes = state_bytes(attn, 4)
    assert sizes["kv_bytes_per_token"] == 2 * Hkv * d * 4
    unrotated = 2 * 16 * Hkv * d * 4 if feature_positions == "none" else 0  # the ring's keys before RoPE
    # S, z, ring of 2w keys and values, sinks
    assert sizes["state_bytes"] == 4 * (H * F * d + H * F) + (2 * 16 + 3) * 2 * Hkv * d * 4 + unrotated
    (own, matched), _ = baselines(model)
    assert (own.kind, own.window, own.sinks) == ("terraced", 16, 3) and matched.kind == "sliding_window"
    assert matched.window + matched.sinks == sizes["state_bytes"] // sizes["kv_bytes_per_token"]


def test_figures_by_length_and_position_are_the_ratios_of_perplexities():
    L = 300
    teacher = torch.full((2, L - 1), 1.0, dtype=torch.float64)
    student = teacher.clone()
    student[:, 100:] += 0.2  # worse from position 100 on
    window = teacher + 0.05
    top_t = torch.arange(L - 1).repeat(2, 1)
    top_s = top_t.clone()
    top_s[0, :50] = -1  # 50 of 2 x 299 predictions differ
    scores = {"teacher": (teacher, top_t), "student": (student, top_s), "window": (window, top_t)}
    summary = summarise(scores, [64, 300])
    short, long = summary["by_length"]
    assert short["student"]["ratio"] == pytest.approx(1.0) and short["teacher_ppl"] == pytest.approx(math.e)
    assert long["student"]["ratio"] == pytest.approx(math.exp(0.2 * 199 / 299))
    assert long["window"]["ratio"] == pytest.approx(math.exp(0.05))
    assert long["student"]["top1_agreement"] == pytest.approx(1 - 50 / 598)
    assert short["student"]["top1_agreement"] == pytest.approx(1 - 50 / 126)
    assert [(b["start"], b["end"]) for b in summary["by_position"]] == [(0, 64), (64, 256), (256, 299)]
    assert summary["by_position"][1]["student"] == pytest.approx(math.exp(0.2 * 156 / 192))
    assert summary["by_position"][2]["student"] == pytest.approx(math.exp(0.2))
    lines = verdict(summary, {"window": "sliding window 8 + 0 sinks"})
    assert lines == ["the student is WORSE than the untrained sliding window 8 + 0 sinks at 300 tokens"]


def test_auto_lengths_reach_eight_times_the_training_length_within_the_positions():
    assert auto_lengths(256, 8192) == [256, 512, 1024, 2048]
    assert auto_lengths(512, 8192) == [256, 512, 1024, 2048, 4096]
    assert auto_lengths(1024, 2048) == [256, 512, 1024, 2048]
    assert auto_lengths(64, None) == [64, 128, 256, 512]
    assert auto_lengths(300, 8192) == [256, 300, 512, 1024, 2048]
    lengths, keys = resolve_lengths(LongContextSpec(), 512, 2048)
    assert lengths == [256, 512, 1024, 2048] and keys == [512, 1024, 2048]
    lengths, keys = resolve_lengths(LongContextSpec(lengths=[4096, 128, 1024], passkey_lengths=[900]), 64, 2048)
    assert lengths == [128, 1024] and keys == [900]


class NextTokenOracle(nn.Module):
    """Logits that put all mass on ``answer`` (offset by ``shift``) after each position: a model
    that always knows the next token, or always misses it by ``shift``."""

    def __init__(self, shift=0):
        super().__init__()
        self.shift, self.p = shift, nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, use_cache=False):
        nxt = torch.roll(input_ids, -1, dims=1) + self.shift
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt % 400, 400).float() * 10)


def test_passkey_counts_a_hit_only_when_greedy_decoding_gives_every_key_token():
    tok = byte_level_tokenizer()
    ids, start = passkey_item(tok, 200, 0.5, 48213)
    assert tok.decode(ids[start:]).strip() == "48213"
    assert "48213" in tok.decode(ids[:start])  # the needle is in the prompt
    assert passkey_hit(NextTokenOracle(), ids, start)
    assert not passkey_hit(NextTokenOracle(shift=1), ids, start)


def test_a_tiny_conversion_reports_quality_by_length_against_both_baselines(tmp_path):
    run, report = convert_tiny(tmp_path, attention={"sink_tokens": 2, "history_norm": "power"},
                               eval={"long_context": {"lengths": [64, 256], "sequences": 2, "passkey_trials": 1,
                                                      "passkey_lengths": [128], "passkey_depths": [0.5]}})
    section = report["long_context"]
    assert section["lengths"] == [64, 256] and section["dropped_lengths"] == []  # as asked, not the preset's
    assert set(section["baselines"]) == {"window", "memory_matched"}
    assert section["baselines"]["window"] == {"kind": "terraced", "window": 16, "sinks": 2,
                                              "label": "terraced window 16 + 2 sinks"}
    for row in section["by_length"]:
        for name in ("student", "window", "memory_matched"):
            assert math.isfinite(row[name]["ratio"]) and 0 <= row[name]["top1_agreement"] <= 1
    assert [b["end"] for b in section["by_position"]] == [64, 255]
    assert len(section["verdict"]) == 2
    assert section["passkey"]["accuracy"].keys() == {"teacher", "student", "window"}
    assert len(section["passkey"]["accuracy"]["student"]) == 1


@pytest.mark.slow
def test_the_time_budget_drops_the_longest_lengths(tmp_path):
    model, tokenizer, _ = core.load_converted(convert_tiny(tmp_path, eval={"long_context": {"enabled": False}})[0])
    spec = LongContextSpec(lengths=[64, 512], sequences=1, passkey_trials=0, time_budget_s=1e-6)
    section = long_context_report(model, tokenizer, spec, 64)
    assert section["lengths"] == [64] and section["dropped_lengths"] == [512]
