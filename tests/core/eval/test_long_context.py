"""Quality by context length: the sliding-window baseline against a float64 oracle, the figures
against sums written out here, and the report of a tiny conversion."""

import math
import re
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import core
from core.config import LongContextSpec
from core.eval.long_context import (FILLER, NOISE_BLOCK, QUESTION, auto_lengths, frontier, frontier_windows, judge,
                                    long_context_report, paired_margin, passkey_hit, passkey_item, passkey_prompt,
                                    resolve_lengths, summarise)
from core.eval.long_context_result import FRONTIER, LongContextResult, passkey_accuracy
from core.attention.layer import teacher_attention
from core.eval.metrics import teacher_context
from core.eval.window_baseline import WindowBaseline, baselines, state_bytes, window_softmax
from tests.core.attention.test_surgery import converted, left_padded_batch, positions, rel_err
from tests.tiny_models import byte_level_tokenizer
from tests.long_context_report import FORMER_PASSKEY, GRID_ACCURACY, long_context_section
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


@torch.no_grad()
def test_a_trained_window_keeps_the_students_lora(tiny_run, workspace):
    """``trained``: the window over the student's own weights, LoRA on; a window covering the input is
    then the model's full softmax with its adapters, not the teacher."""
    model = core.load_converted(tiny_run, device="cpu", workspace=workspace)[0]
    ids = torch.randint(5, 1000, (2, 40), generator=torch.Generator().manual_seed(2))
    covering = WindowBaseline("window", "sliding_window", 64, 0)
    with teacher_attention(core.lolcats_modules(model.get_base_model()).values()):
        softmax_with_lora = model(input_ids=ids, use_cache=False).logits
    with window_softmax(model, covering, trained=True):
        trained = model(input_ids=ids, use_cache=False).logits
    with window_softmax(model, covering):
        untrained = model(input_ids=ids, use_cache=False).logits
    assert rel_err(trained, softmax_with_lora) < 1e-5
    assert rel_err(trained, untrained) > 1e-4


@pytest.mark.parametrize("feature_positions", ["none", "rotary"])
@pytest.mark.parametrize("key_map_heads", ["query", "kv"])
def test_memory_matched_window_holds_the_students_state_bytes(feature_positions, key_map_heads):
    model = converted("llama", "terraced", window=16, sinks=3, feature_positions=feature_positions,
                      key_map_heads=key_map_heads)
    attn = core.lolcats_modules(model)[0]
    Hs, Hkv, d, F = attn.state_heads, attn.num_kv_heads, attn.head_dim, attn.feature_map_q.output_dim
    assert Hs == (Hkv if key_map_heads == "kv" else attn.num_heads)
    sizes = state_bytes(attn, 4)
    assert sizes["kv_bytes_per_token"] == 2 * Hkv * d * 4
    # S, z per state head; a ring of 2w keys (once, whatever the feature maps read) and values; sinks
    assert sizes["state_bytes"] == 4 * (Hs * F * d + Hs * F) + (2 * 16 + 3) * 2 * Hkv * d * 4
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
    (short_v, long_v) = judge(scores, [64, 300], ["window"])
    assert (short_v.outcome, long_v.outcome) == ("better", "worse")
    assert short_v.margin == pytest.approx(0.0)  # a constant difference has no noise
    assert long_v.log_diff == pytest.approx(0.2 * 199 / 299 - 0.05) and 0 < long_v.margin < long_v.log_diff


def test_a_difference_inside_the_paired_noise_is_level_and_one_beyond_it_is_not():
    g = torch.Generator().manual_seed(0)
    L = 8 * NOISE_BLOCK + 1
    teacher = torch.rand(2, L - 1, generator=g, dtype=torch.float64) * 4
    noise = torch.randn(2, L - 1, generator=g, dtype=torch.float64) * 0.5
    top = torch.zeros(2, L - 1, dtype=torch.long)
    blocks = (noise[:, : L - 1].reshape(-1, NOISE_BLOCK).mean(1))
    want = 2 * float(blocks.std() / math.sqrt(blocks.numel()))
    assert paired_margin(noise, L) == pytest.approx(want)
    assert paired_margin(noise[:1, :NOISE_BLOCK], NOISE_BLOCK + 1) == pytest.approx(
        2 * float(noise[0, :NOISE_BLOCK].std() / math.sqrt(NOISE_BLOCK)))  # one block: the tokens' own error
    centred = noise - noise.mean()
    for shift, outcome in ((0.0, "level"), (0.3 * want, "level"), (3 * want, "worse"), (-3 * want, "better")):
        scores = {"teacher": (teacher, top), "student": (teacher + centred + shift, top), "window": (teacher, top)}
        (v,) = judge(scores, [L], ["window"])
        assert v.outcome == outcome, (shift, v)
        assert v.log_diff == pytest.approx(shift, abs=1e-12) and v.margin == pytest.approx(paired_margin(centred, L))


def test_the_frontier_interpolates_in_log_bytes_between_the_two_nearest_windows():
    L, kv = 129, 10
    teacher = torch.zeros(1, L - 1, dtype=torch.float64)
    top = torch.zeros(1, L - 1, dtype=torch.long)
    w = {"window_12": 0.4, "memory_matched": 0.2, "window_92": 0.1}  # log ratios at 16, 40, 96 keys with 4 sinks
    chosen = [WindowBaseline("window", "terraced", 8, 4), WindowBaseline("memory_matched", "sliding_window", 36, 4)]
    windows = frontier_windows(chosen, [12, 36, 92, 200], L)
    assert [(b.name, b.window) for b in windows] == [("window_12", 12), ("memory_matched", 36), ("window_92", 92)]
    scores = {"teacher": (teacher, top), "student": (teacher + 0.15, top),
              **{name: (teacher + v, top) for name, v in w.items()}}
    student_bytes = 60 * kv  # between 40 and 96 keys' bytes
    section, (verdict,) = frontier(scores, [L], windows, kv, student_bytes)
    t = (math.log(600) - math.log(400)) / (math.log(960) - math.log(400))
    curve = math.exp((1 - t) * 0.2 + t * 0.1)
    assert [p["bytes_per_layer"] for p in section["points"]] == [160, 400, 960]
    assert section["at"][0]["curve_ratio"] == pytest.approx(curve)
    # the curve reaches the student's 0.15 halfway between 40 and 96 keys in log ratio: geometric mean of bytes
    assert section["at"][0]["equal_quality_bytes"] == pytest.approx(math.sqrt(400 * 960))
    # a window needs about 620 bytes for the student's quality, which holds 600: below the curve
    assert verdict.against == FRONTIER and verdict.outcome == "better" and verdict.margin == 0.0
    assert verdict.reference_ratio == pytest.approx(curve) and verdict.student_ratio == pytest.approx(math.exp(0.15))
    _, (beyond,) = frontier(scores, [L], windows, kv, 5000)  # past the largest window: its ratio
    assert beyond.reference_ratio == pytest.approx(math.exp(0.1))


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

    def forward(self, input_ids, use_cache=False, logits_to_keep=0):
        nxt = torch.roll(input_ids, -1, dims=1) + self.shift
        logits = torch.nn.functional.one_hot(nxt % 400, 400).float() * 10
        return SimpleNamespace(logits=logits[:, -logits_to_keep:])  # transformers' 0: every position


@pytest.mark.parametrize("length", [1000, 2000])
def test_passkey_prompt_length_and_needle_depth(length):
    tokenizer = byte_level_tokenizer()
    per_filler = len(tokenizer(FILLER, add_special_tokens=False)["input_ids"])
    where = []
    for depth in (0.0, 0.5, 1.0):
        prompt = passkey_prompt(tokenizer, length, depth, 54321)
        n_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert length - 2 * per_filler <= n_tokens <= length + 2
        assert prompt.endswith(QUESTION) and re.search(r"The pass key is (\d+)\.", prompt).group(1) == "54321"
        where.append(prompt.index("The pass key is 54321") / len(prompt))
    assert where[0] < 0.4 and where[2] > 0.6 and where[0] < where[1] < where[2]


def test_passkey_counts_a_hit_only_when_greedy_decoding_gives_every_key_token():
    tok = byte_level_tokenizer()
    ids, start = passkey_item(tok, 200, 0.5, 48213)
    assert tok.decode(ids[start:]).strip() == "48213"
    assert "48213" in tok.decode(ids[:start])  # the needle is in the prompt
    assert passkey_hit(NextTokenOracle(), ids, start)
    assert not passkey_hit(NextTokenOracle(shift=1), ids, start)


def test_passkey_accuracy_is_the_grids_mean_or_an_older_reports_own_section():
    section = long_context_section()
    assert passkey_accuracy({"long_context": section}) == pytest.approx(GRID_ACCURACY)
    assert passkey_accuracy({"long_context": section, "passkey": FORMER_PASSKEY}) == pytest.approx(GRID_ACCURACY)
    assert passkey_accuracy({"long_context": None, "passkey": FORMER_PASSKEY}) == {"teacher": 1.0, "student": 0.5}
    no_grid = {k: v for k, v in section.items() if k != "passkey"}
    assert passkey_accuracy({"long_context": no_grid, "passkey": FORMER_PASSKEY}) == {"teacher": 1.0, "student": 0.5}
    assert passkey_accuracy({"long_context": no_grid, "passkey": None}) is None  # measured with 0 trials
    assert passkey_accuracy({}) is None and passkey_accuracy(None) is None


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
    result = LongContextResult.model_validate(section)
    assert {(v.against, v.length) for v in result.verdicts} == {
        (name, n) for name in ("window", "memory_matched", FRONTIER) for n in (64, 256)}
    for v in result.verdicts:
        assert v.margin > 0 and v.outcome == ("level" if abs(v.log_diff) <= v.margin else
                                              "better" if v.log_diff < 0 else "worse")
    points = result.frontier.points
    assert [p.window for p in points] == sorted(p.window for p in points) and len(points) >= 2
    kv = section["kv_bytes_per_token"]
    assert all(p.bytes_per_layer == (p.window + 2) * kv and p.window + 2 < 256 for p in points)
    assert result.frontier.student_bytes == section["state_bytes_per_layer"]
    matched = section["baselines"]["memory_matched"]["window"]
    on_curve = next(p for p in points if p.window == matched)
    assert on_curve.ratios == [row["memory_matched"]["ratio"] for row in section["by_length"]]
    assert section["passkey"]["accuracy"].keys() == {"teacher", "student", "window", "memory_matched"}
    assert len(section["passkey"]["accuracy"]["student"]) == 1


@pytest.mark.slow
def test_the_time_budget_drops_the_longest_lengths(tmp_path):
    model, tokenizer, _ = core.load_converted(convert_tiny(tmp_path, eval={"long_context": {"enabled": False}})[0])
    spec = LongContextSpec(lengths=[64, 512], sequences=1, passkey_trials=0, time_budget_s=1e-6)
    section = long_context_report(model, tokenizer, spec, 64)
    assert section["lengths"] == [64] and section["dropped_lengths"] == [512]


def test_a_sliding_window_students_own_window_is_a_point_of_the_frontier():
    """The own-window baseline of a sliding-window student is measured anyway: it joins the curve
    under its name; a terraced student's own window is no sliding window and does not."""
    own = WindowBaseline("window", "sliding_window", 126, 4)
    matched = WindowBaseline("memory_matched", "sliding_window", 191, 4)
    windows = frontier_windows([own, matched], [32, 512], 4096)
    assert [(b.name, b.window) for b in windows] == [("window_32", 32), ("window", 126), ("memory_matched", 191),
                                                     ("window_512", 512)]
    terraced = WindowBaseline("window", "terraced", 64, 4)
    assert [b.name for b in frontier_windows([terraced, matched], [32], 4096)] == ["window_32", "memory_matched"]
