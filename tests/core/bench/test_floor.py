"""The attention-free floor: zeros of the attention's shape, no attention call, no cache, the teacher untouched."""

import copy

import pytest
import torch
from transformers import AttentionInterface

from core.bench.floor import FLOOR_ATTENTION, AttentionFreeFloor, attention_free
from core.bench.memory import cache_bytes, weight_bytes
from tests.tiny_models import tiny_model


def test_attention_free_returns_zeros_of_the_interface_shape():
    q = torch.randn(2, 4, 5, 16)
    k, v = torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 8)
    out, weights = attention_free(None, q, k, v, None, scaling=0.25)
    assert out.shape == (2, 5, 4, 8) and out.dtype == q.dtype  # [B, L, H, d] like sdpa_attention_forward
    assert weights is None and not out.any()


@pytest.fixture
def counted(monkeypatch):
    """Calls of the floor's and of sdpa's attention functions, counted through the interface."""
    calls = {FLOOR_ATTENTION: 0, "sdpa": 0}
    for name in calls:
        real = AttentionInterface._global_mapping[name]

        def counting(*args, _name=name, _real=real, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setitem(AttentionInterface._global_mapping, name, counting)
    return calls


def test_floor_skips_attention_and_leaves_the_teacher_as_it_was(counted):
    teacher = tiny_model("llama")
    floor = AttentionFreeFloor(teacher)
    ids = torch.randint(3, 101, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = floor(input_ids=ids)
        assert counted == {FLOOR_ATTENTION: 3, "sdpa": 0}  # one call per layer, none to softmax attention
        reference = teacher(input_ids=ids)
    assert counted == {FLOOR_ATTENTION: 3, "sdpa": 3}
    assert teacher.config._attn_implementation == "sdpa"
    assert out.logits.shape == reference.logits.shape == (2, 9, 101)
    assert weight_bytes(floor) == weight_bytes(teacher)


def test_floor_equals_the_teacher_with_attention_outputs_zeroed():
    # zero attention -> o_proj(0) = 0 (no bias): the floor is the teacher whose o_proj weights are zero
    teacher = tiny_model("llama", seed=3)
    zeroed = copy.deepcopy(teacher)
    for layer in zeroed.model.layers:
        layer.self_attn.o_proj.weight.data.zero_()
    ids = torch.randint(3, 101, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected, got = zeroed(input_ids=ids).logits, AttentionFreeFloor(teacher)(input_ids=ids).logits
        teacher_logits = teacher(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (teacher_logits - got).abs().max() > 1e-2  # attention matters in the teacher


def test_floor_cache_counts_tokens_and_stores_nothing():
    floor = AttentionFreeFloor(tiny_model("llama"))
    cache = floor.new_cache()
    ids = torch.randint(3, 101, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        out = floor(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        step = floor(input_ids=out.logits[:, -1].argmax(-1, keepdim=True), past_key_values=cache, use_cache=True)
    assert out.logits.shape == (2, 1, 101) and step.logits.shape == (2, 1, 101)
    assert [layer.get_seq_length() for layer in cache.layers] == [8, 8, 8]
    assert cache.get_seq_length() == 8 and cache_bytes(cache) == 0
