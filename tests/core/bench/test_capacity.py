"""Capacity under a memory budget: size parsing, the synthetic cache, the doubling-then-bisecting search."""

import pytest
import torch

from core.bench import BenchConfig, convert_teacher
from core.bench import capacity as cap
from core.bench.capacity import find_capacity, synthetic_cache
from core.bench.config import parse_size
from core.bench.measure import new_cache
from core.bench.memory import peak_tracker, weight_bytes
from tests.tiny_models import tiny_model


@pytest.mark.parametrize("text, size", [("12GiB", 12 * 2**30), ("500MiB", 500 * 2**20), ("1.5 gib", 3 * 2**29),
                                        ("2GB", 2 * 10**9), ("1024", 1024), (4096, 4096), ("64 KiB", 65536)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "12 GiBs", "twelve", "-3MiB", "0", "1e9"])
def test_bad_sizes_are_config_errors(text):
    with pytest.raises(ValueError, match="memory budget"):
        parse_size(text)
    with pytest.raises(ValueError, match="memory budget"):
        BenchConfig(memory_budget=text)


def test_a_capacity_config_has_no_sweep_points():
    assert BenchConfig(memory_budget="12GiB", prompt_lengths=[8192]).points() == []


def test_synthetic_teacher_cache_has_the_shape_of_a_prefilled_one():
    teacher = tiny_model("llama")
    cache = synthetic_cache(teacher, 3, 21)
    assert cache.get_seq_length() == 21 and len(cache.layers) == 3
    for layer in cache.layers:
        assert layer.keys.shape == layer.values.shape == (3, 2, 21, 16) and layer.keys.std() > 0.5


@pytest.mark.parametrize("kind, sinks", [("terraced", 0), ("sliding_window", 0), ("linear", 0), ("terraced", 3)])
def test_synthetic_student_state_has_the_shape_and_positions_of_a_prefilled_one(kind, sinks):
    teacher = tiny_model("llama")
    student = convert_teacher(teacher, BenchConfig(attention={"kind": kind, "window_size": 8, "softmax_layers": [1],
                                                              "sink_tokens": sinks}))
    ids = torch.randint(3, 101, (2, 21), generator=torch.Generator().manual_seed(0))
    real = new_cache(student)
    with torch.inference_mode():
        student(input_ids=ids, past_key_values=real, use_cache=True)
    synthetic = synthetic_cache(student, 2, 21)
    for i, (a, b) in enumerate(zip(real.layers, synthetic.layers)):
        assert type(a) is type(b)
        if i == 1:  # the softmax layer keeps keys and values
            assert a.keys.shape == b.keys.shape
            continue
        for name in ("S", "z", "win_k", "win_v"):
            assert getattr(a.state, name).shape == getattr(b.state, name).shape
            assert getattr(a.state, name).dtype == getattr(b.state, name).dtype
        for name in ("win_pos", "win_valid", "first"):
            assert torch.equal(getattr(a.state, name), getattr(b.state, name)), name
        assert a.state.sinks == b.state.sinks == sinks
        if sinks:
            assert a.state.sink_k.shape == b.state.sink_k.shape and torch.equal(a.state.sink_valid, b.state.sink_valid)
        assert a.state.seen == b.state.seen == 21
    with torch.inference_mode():  # and decoding continues from it
        out = student(input_ids=ids[:, :1], past_key_values=synthetic, use_cache=True)
    assert out.logits.shape == (2, 1, 101) and torch.isfinite(out.logits).all()
    assert synthetic.get_seq_length() == 22


def _fake_model(monkeypatch, oom_from: int | None):
    """Trials of a model whose decode peak is 100 + 10 bytes per row (out of memory from ``oom_from``)."""
    calls = []

    def measure(model, batch, length, steps, tracker, weights, seed):
        calls.append(batch)
        if oom_from is not None and batch >= oom_from:
            return {"batch_size": batch, "status": "oom", "error": "MemoryError: "}
        return {"batch_size": batch, "status": "ok", "peak_memory_bytes": 100 + 10 * batch,
                "decode_tokens_per_second": 2.0 * batch, "time_per_output_token_s": 0.5}

    monkeypatch.setattr(cap, "measure_batch", measure)
    monkeypatch.setattr(cap, "_available_bytes", lambda: None)
    return calls


def _search(budget: int) -> dict:
    return find_capacity(None, 16, budget, steps=1, tracker=None, weights=100, seed=0, max_batch=1 << 20, log=lambda m: None)


def test_search_doubles_then_bisects_to_the_exact_largest_batch(monkeypatch):
    calls = _fake_model(monkeypatch, oom_from=None)
    found = _search(1000)  # fits up to batch 90
    assert found["largest_batch"] == 90 and found["decode_tokens_per_second"] == 180.0
    assert found["peak_memory_bytes"] == 1000
    status = {t["batch_size"]: t["status"] for t in found["trials"]}
    # 128 and 96 are predicted over the budget (1380, 1060 > 1000 x 1.05) and never allocated
    assert status[128] == status[96] == "over_budget_predicted" and status[92] == "over_budget"
    assert calls == [1, 2, 4, 8, 16, 32, 64, 80, 88, 92, 90]


def test_out_of_memory_trials_are_recorded_and_the_search_goes_on(monkeypatch):
    calls = _fake_model(monkeypatch, oom_from=40)
    found = _search(1000)
    assert found["largest_batch"] == 39
    assert calls == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 39]
    assert [t["batch_size"] for t in found["trials"] if t["status"] == "oom"] == [64, 48, 40]


def test_a_real_trial_out_of_memory_is_recorded(monkeypatch):
    student = convert_teacher(tiny_model("llama"), BenchConfig(attention={"window_size": 8}))
    real = cap.synthetic_cache

    def synthetic(model, batch, length, seed=0):
        if batch >= 4:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99 bytes")
        return real(model, batch, length, seed)

    monkeypatch.setattr(cap, "synthetic_cache", synthetic)
    tracker = peak_tracker(torch.device("cpu"))
    found = find_capacity(student, 24, 2**40, steps=2, tracker=tracker, weights=weight_bytes(student), seed=0,
                          max_batch=64, log=lambda m: None)
    assert found["largest_batch"] == 3
    assert [(t["batch_size"], t["status"]) for t in found["trials"]] == [(1, "ok"), (2, "ok"), (4, "oom"), (3, "ok")]
    ok = [t for t in found["trials"] if t["status"] == "ok"]
    assert all(len(t["decode_step_times_s"]) == 2 and t["peak_memory_bytes"] > t["cache_bytes"] > 0 for t in ok)
