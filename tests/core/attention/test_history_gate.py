"""The history gate (``attention.history_gate: query``): query n's history term scaled by
g_h(q_n) = 2 sigmoid(u_h . q_n / sqrt(d) + b_h), against that closed form written here in float64;
decoding equal to the parallel forward (carried chunks, row pieces, every architecture, key maps
per key/value head; at 4096 tokens: test_key_map_heads.py); the start equal to the ungated layer; the setting,
runs written before it, and stage 1 training the gates."""

import pytest
import torch

import core
from core.attention.layer import LolcatsAttention
from core.config import AttentionSpec, stored_attention
from core.eval.window_baseline import state_bytes
from core.load import load_converted
from tests.core.attention.test_history_decay import layer_prefill, written_out
from tests.core.attention.test_key_map_heads import decode
from tests.core.attention.test_surgery import converted, left_padded_batch, positions, rel_err
from tests.tiny_models import tiny_model
from tests.tiny_runs import convert_tiny


def gate_written_out(q, u, b):
    """2 sigmoid(u_h . q_n / sqrt(d) + b_h), ``[B, H, L, 1]`` in float64."""
    logit = (q.double() * u.double()[None, :, None, :]).sum(-1) / q.shape[-1] ** 0.5
    return (2 * torch.sigmoid(logit + b.double()[None, :, None]))[..., None]


@pytest.mark.parametrize("kind, sinks", [("sliding_window", 0), ("sliding_window", 3), ("terraced", 4)])
@torch.no_grad()
def test_layer_prefill_equals_the_gated_weights_written_out(kind, sinks):
    attn, (q, k, v, mask), y, qf, kf = layer_prefill(converted("llama", kind, window=8, sinks=sinks, history_gate="query"))
    gate = gate_written_out(q, attn.history_gate.weight, attn.history_gate.bias)
    assert gate.std() > 0.2  # a gate that varies across queries
    qf, gamma = qf.double(), torch.sigmoid(attn.history_decay)
    want = written_out(q, k, v, qf * gate, kf, attn.mix, gamma, kind, 8, sinks, mask, attn.scaling)
    real = mask[:, None, :, None].expand_as(y)
    assert rel_err(y.double()[real], want[real]) < 1e-6
    ungated = written_out(q, k, v, qf, kf, attn.mix, gamma, kind, 8, sinks, mask, attn.scaling)
    assert rel_err(ungated[real], want[real]) > 1e-2  # the gate changes the output


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("kind, sinks, norm", [("sliding_window", 2, "power"), ("terraced", 4, "decay")])
@torch.no_grad()
def test_carried_chunks_decode_and_row_pieces_equal_the_full_forward(arch, kind, sinks, norm, monkeypatch):
    model = converted(arch, kind, window=8, sinks=sinks, history_norm=norm, key_map_heads="kv", history_gate="query",
                      softmax_layers=(1,))
    ids, mask = left_padded_batch([90, 61, 12], 90)
    full = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    stepped, _ = decode(model, ids, mask, prefix=33, chunks=(40, 70))
    real = mask.bool()
    assert rel_err(stepped[real], full[real]) < 1e-5
    monkeypatch.setattr(LolcatsAttention, "row_pieces", lambda self, q: [slice(i, i + 1) for i in range(q.shape[0])])
    pieces = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    assert rel_err(pieces[real], full[real]) < 1e-6


@torch.no_grad()
def test_a_new_gate_starts_as_the_ungated_layer_and_holds_no_state():
    gated, plain = (core.linearize(tiny_model("llama", seed=0),
                                   AttentionSpec(kind="sliding_window", window_size=8, feature_dim=8, history_gate=g))
                    for g in ("query", "none"))
    plain.load_state_dict({n: t for n, t in gated.state_dict().items() if ".history_gate." not in n})  # same maps
    ids, mask = left_padded_batch([40, 25], 40)
    a = gated(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    b = plain(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    assert torch.equal(a, b)
    g, p = core.lolcats_modules(gated)[0], core.lolcats_modules(plain)[0]
    assert state_bytes(g, 4) == state_bytes(p, 4)  # parameters only: the decode state is the ungated one's
    assert len(g.trained_parameters()) == len(p.trained_parameters()) + 2
    assert "history_gate=query" in repr(g) and "history_gate" not in repr(p)


def test_the_setting():
    assert AttentionSpec().history_gate == "none"
    with pytest.raises(ValueError, match="history_gate"):
        AttentionSpec(history_gate="window")
    assert stored_attention({"kind": "terraced"}).history_gate == "none"  # runs written before the field
    assert AttentionSpec(kind="linear", history_gate="query").history_gate == "none"  # it would cancel


def test_stage1_trains_the_gates_and_runs_keep_them(tmp_path):
    run, _ = convert_tiny(tmp_path, attention={"history_gate": "query", "sink_tokens": 2})
    model, _, _ = load_converted(run)
    gates = {n: p for n, p in model.named_parameters() if ".history_gate." in n}
    assert len(gates) == 2 * len(core.lolcats_modules(model))
    assert all(p.abs().max() > 1e-5 for p in gates.values())  # moved from their start at 0
