"""benchmarks/history_worth.py's scaled history: s = 1 is the student, s = 0.5 halves each converted
layer's query features (so its history term), and the layers come back as they were."""

import torch

import core
from benchmarks.history_worth import scaled_history
from tests.core.attention.test_surgery import converted, left_padded_batch, positions


@torch.no_grad()
def test_a_scaled_history_is_the_layer_with_its_query_features_times_s():
    model = converted("llama", "sliding_window", window=8, sinks=2)
    attn = core.lolcats_modules(model)[0]
    ids, mask = left_padded_batch([40, 25], 40)
    student = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    q = torch.randn(2, attn.num_heads, 5, attn.head_dim)
    with scaled_history(model, 0.5):
        scaled = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
        assert torch.allclose(attn.query_features(q), attn.feature_map_q(q) * 0.5, rtol=1e-6, atol=0)
    with scaled_history(model, 1.0):
        whole = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    assert all(m.history_gate is None for m in core.lolcats_modules(model).values())
    assert torch.equal(whole, student)
    real = mask.bool()
    assert (scaled[real] - student[real]).abs().max() > 1e-3
    assert torch.equal(model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits, student)
