"""Cache blocking: inference on CPU in pieces gives the whole-tensor results (attention, carried
chunks, feature maps, a model's prefill and its state)."""

import pytest
import torch
from transformers import DynamicCache

import kernels.hybrid.blocks as blocking
from core.attention import build_feature_map
from kernels.hybrid.blocks import blocks
from kernels.hybrid.carry import prefill_chunk
from kernels.hybrid.chunk_torch import hybrid_attention_torch, hybrid_terms_torch
from kernels.hybrid.naive import naive_hybrid_attention
from kernels.hybrid.recurrent_torch import HybridState, prefill_state
from kernels.hybrid.window import KINDS, WindowRule
from tests.attention_inputs import make_inputs
from tests.core.attention.test_surgery import converted, left_padded_batch, positions

WHOLE = 1 << 40  # a budget no test input reaches: one piece
BUDGETS = [1, 60_000]  # one (row, head) per piece; several rows or heads per piece


def rel_err(a, b, mask=None):
    a, b = a.double(), b.double()
    if mask is not None:
        m = mask.bool()[:, None, :, None]
        a, b = torch.where(m, a, 0.0), torch.where(m, b, 0.0)
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("outer, inner, unit, budget", [(5, 3, 10, 65), (5, 3, 10, 25), (2, 7, 10, 30), (3, 4, 100, 1)])
def test_pieces_cover_every_unit_once_within_the_budget(outer, inner, unit, budget):
    pieces = blocks(outer, inner, unit, budget)
    seen = torch.zeros(outer, inner, dtype=torch.long)
    for rows, cols in pieces:
        seen[rows, cols] += 1
        n = (rows.stop - rows.start) * (cols.stop - cols.start)
        assert n * unit <= budget or n == 1
    assert (seen == 1).all()
    assert len(pieces) > 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", BUDGETS)
def test_attention_in_pieces_equals_whole_and_oracle(monkeypatch, kind, budget):
    sinks = 0 if kind == "linear" else 3
    q, k, v, qf, kf, mix, mask = make_inputs(4, 6, 3, 150, 16, 8, pads=(0, 7, 70, 149), seed=3)
    mask[0, 40:45] = 0  # padding in the middle of a row too
    with torch.no_grad():
        monkeypatch.setattr(blocking, "BLOCK_BYTES", WHOLE)
        whole = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule(kind, 16, sinks), mask)
        whole_terms = hybrid_terms_torch(q, k, v, qf, kf, mix, WindowRule(kind, 16, sinks), mask)
        monkeypatch.setattr(blocking, "BLOCK_BYTES", budget)
        assert len(blocks(4, 3, 4 * 2 * 150 * (32 + sinks + qf.shape[-1]))) > 1
        pieces = hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule(kind, 16, sinks), mask)
        terms = hybrid_terms_torch(q, k, v, qf, kf, mix, WindowRule(kind, 16, sinks), mask)
    ref = naive_hybrid_attention(q, k, v, qf, kf, mix, WindowRule(kind, 16, sinks), mask)
    assert rel_err(pieces, whole, mask) <= 1e-6
    assert rel_err(terms, whole_terms, mask) <= 1e-6
    assert rel_err(pieces, ref, mask) <= 1e-5


@pytest.mark.parametrize("kind, sinks", [("sliding_window", 2), ("terraced", 4), ("terraced", 0)])
def test_carried_chunk_in_pieces_equals_whole(monkeypatch, kind, sinks):
    q, k, v, qf, _, mix, mask = make_inputs(3, 6, 3, 100, 16, 8, pads=(0, 9, 30), seed=5)
    torch.manual_seed(5)
    fmap = build_feature_map("hedgehog", 6, 16, 8, init="random")
    fk = lambda keys, positions=None: fmap(keys.repeat_interleave(2, dim=1))  # noqa: E731 (positions: unused)
    with torch.no_grad():
        kf = fk(k)
    m = mask.bool()
    results = []
    for budget in (WHOLE, 1):
        monkeypatch.setattr(blocking, "BLOCK_BYTES", budget)
        with torch.no_grad():
            state = prefill_state(WindowRule(kind, 16, sinks), k[:, :, :60], v[:, :, :60], kf[:, :, :60], m[:, :60])
            y, after = prefill_chunk(state, WindowRule(kind, 16, sinks), q[:, :, 60:], k[:, :, 60:], v[:, :, 60:], qf[:, :, 60:],
                                     kf[:, :, 60:], mix, m[:, 60:], fk, 16**-0.5)
        results.append((y, after))
    (y0, s0), (y1, s1) = results
    assert rel_err(y1, y0, mask[:, 60:]) <= 1e-6
    assert torch.allclose(s1.S, s0.S, rtol=1e-6, atol=1e-6) and torch.equal(s1.win_k, s0.win_k)


@pytest.mark.parametrize("feature_map", ["hedgehog", "t2r"])
@pytest.mark.parametrize("shape", [(3, 4, 70, 16), (5, 4, 1, 16)], ids=["prompt", "decode"])
def test_feature_maps_in_pieces_equal_the_autograd_form(monkeypatch, feature_map, shape):
    torch.manual_seed(0)
    fmap = build_feature_map(feature_map, 4, 16, 8, init="random")
    with torch.no_grad():
        fmap.weight.add_(torch.randn_like(fmap.weight))
    x = torch.randn(*shape)
    graph = fmap(x)  # weights need grad: the whole-tensor broadcast product
    assert graph.requires_grad
    for budget in (1, 3000, WHOLE):
        monkeypatch.setattr(blocking, "BLOCK_BYTES", budget)
        with torch.no_grad():
            out = fmap(x)
        assert out.shape == graph.shape
        assert rel_err(out, graph.detach()) <= 1e-6


def test_state_concat_inverts_row_selection():
    _, k, v, _, kf, _, mask = make_inputs(5, 4, 2, 40, 8, 4, pads=(0, 3, 39, 10, 0), seed=7)
    state = prefill_state(WindowRule("terraced", 8, sinks=2), k, v, kf, mask.bool())
    parts = [state.select(torch.arange(a, b)) for a, b in ((0, 2), (2, 3), (3, 5))]
    joined = HybridState.concat(parts)
    for name in ("S", "z", "win_k", "win_v", "win_pos", "win_valid", "first", "sink_k", "sink_v", "sink_valid"):
        assert torch.equal(getattr(joined, name), getattr(state, name)), name
    assert joined.seen == state.seen


@pytest.mark.parametrize("kind, sinks", [("terraced", 4), ("sliding_window", 0), ("linear", 0)])
def test_model_prefill_in_row_pieces_equals_one_piece(monkeypatch, kind, sinks):
    """A converted model's prompt run row by row (and head by head) gives the same logits, the same
    state, and the same decoded continuation."""
    model = converted("llama", kind, window=8, sinks=sinks)
    ids, mask = left_padded_batch([50, 37, 12, 50], 50)
    runs = []
    for budget in (WHOLE, 1):
        monkeypatch.setattr(blocking, "BLOCK_BYTES", budget)
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), past_key_values=cache,
                        use_cache=True)
            step_mask = torch.cat([mask, mask.new_ones(4, 1)], 1)
            nxt = model(input_ids=out.logits[:, -1:].argmax(-1), attention_mask=step_mask,
                        position_ids=positions(step_mask)[:, -1:], past_key_values=cache, use_cache=True)
        runs.append((out.logits, nxt.logits, cache.layers[0].state))
    (l0, n0, s0), (l1, n1, s1) = runs
    real = mask.bool()
    assert rel_err(l1[real], l0[real]) <= 1e-5
    assert rel_err(n1, n0) <= 1e-5
    assert torch.allclose(s1.S, s0.S, rtol=1e-5, atol=1e-6) and torch.equal(s1.first, s0.first)
