"""The benchmark sweep on tiny random models: the points, the numbers, progress, stopping, JSON."""

import json
import math

import pytest
import torch

from core.bench import BenchConfig, find_point, run_benchmark, write_result
from core.progress import RecordingProgress, StopRequested
from tests.core.bench.runs import SMALL, small_result
from tests.tiny_models import tiny_model


def numbers(obj):
    """Every int / float inside a JSON-like object (bools excluded)."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from numbers(v)


def without_floor_cache(points):
    """The points without the floor's cache sizes, which are 0: its cache stores nothing (tested below)."""
    cacheless = ("prefill_cache_bytes", "cache_bytes")
    return [{k: v for k, v in p.items() if not (p["model"] == "floor" and k in cacheless)} for p in points]


@pytest.fixture(scope="module")
def result():
    return small_result()


def test_sweep_points_for_every_model(result):
    keys = {(p["model"], p["batch_size"], p["prompt_length"], p["gen_length"]) for p in result["points"]}
    expected = {(1, 16, 3), (3, 16, 3), (1, 40, 3), (2, 24, 4)}  # axes around (1, 16, 3) + the extra point
    assert keys == {(m, *pt) for m in ("teacher", "student", "floor") for pt in expected}
    assert all(p["status"] == "ok" for p in result["points"])


def test_comparisons_give_student_over_teacher_and_over_the_floor(result):
    assert len(result["comparisons"]) == 4
    for c in result["comparisons"]:
        point = (c["batch_size"], c["prompt_length"], c["gen_length"])
        t, s, f = (find_point(result, m, *point) for m in ("teacher", "student", "floor"))
        assert c["prefill_speedup"] == pytest.approx(s["prefill_tokens_per_second"] / t["prefill_tokens_per_second"])
        assert c["decode_speedup"] == pytest.approx(s["decode_tokens_per_second"] / t["decode_tokens_per_second"])
        assert c["prefill_vs_floor"] == pytest.approx(s["prefill_tokens_per_second"] / f["prefill_tokens_per_second"])
        assert c["decode_vs_floor"] == pytest.approx(s["decode_tokens_per_second"] / f["decode_tokens_per_second"])
        assert c["decode_step_over_floor"] == pytest.approx(s["time_per_output_token_s"] / f["time_per_output_token_s"])
        assert c["decode_bytes_over_floor"] == pytest.approx((s["weight_bytes"] + s["cache_bytes"]) / f["weight_bytes"])
        assert c["decode_bytes_over_floor"] > 1
        assert c["floor_prefill_speedup"] == pytest.approx(f["prefill_tokens_per_second"] / t["prefill_tokens_per_second"])
        assert c["floor_decode_speedup"] == pytest.approx(f["decode_tokens_per_second"] / t["decode_tokens_per_second"])
        assert f["weight_bytes"] == t["weight_bytes"] and f["cache_bytes"] == 0


def test_every_reported_number_is_positive_and_finite(result):
    values = list(numbers({"points": without_floor_cache(result["points"]), "comparisons": result["comparisons"]}))
    assert len(values) > 100
    bad = [v for v in values if not (math.isfinite(v) and v > 0)]
    assert not bad
    for p in result["points"]:
        assert len(p["prefill_times_s"]) == 2  # two repeats
        assert len(p["decode_step_times_s"]) == 2 * (p["gen_length"] - 1)
        assert p["peak_memory_bytes"] >= p["weight_bytes"]
        assert p["peak_memory_bytes"] == max(p["prefill_peak_memory_bytes"], p["decode_peak_memory_bytes"])
        assert p["decode_tokens_per_second"] == pytest.approx(p["batch_size"] / p["time_per_output_token_s"])
        assert p["prefill_tokens_per_second"] == pytest.approx(
            p["batch_size"] * p["prompt_length"] / p["time_to_first_token_s"]
        )
        assert p["tokens_per_second"] == pytest.approx(
            p["batch_size"] * (p["prompt_length"] + p["gen_length"]) / p["elapsed_time"]
        )
        assert p["requests_per_second"] == pytest.approx(p["batch_size"] / p["elapsed_time"])
    json.dumps(result["points"], allow_nan=False)


def test_cache_sizes_match_the_models(result):
    # tiny llama: 3 layers, 2 KV heads of dim 16, float32 -> teacher K+V = 3 * 2 * B * 2 * T * 16 * 4 bytes
    for p in result["points"]:
        if p["model"] == "teacher":
            tokens = p["prompt_length"] + p["gen_length"] - 1  # the last generated token is never fed back
            assert p["cache_bytes"] == 3 * 2 * p["batch_size"] * 2 * tokens * 16 * 4
        if p["model"] == "floor":
            assert p["cache_bytes"] == 0  # the floor's cache counts tokens and stores nothing
    student = [p for p in result["points"] if p["model"] == "student" and p["batch_size"] == 1]
    assert len({p["cache_bytes"] for p in student}) == 1  # fixed-size state: independent of the context
    for p in result["points"]:
        assert p["decode_peak_memory_bytes"] >= p["weight_bytes"] + min(p["prefill_cache_bytes"], p["cache_bytes"])


def test_progress_reports_every_measurement(result):
    progress = result["_progress"]
    steps = [s for s in progress.steps if s[0] == "bench"]
    assert len(steps) == 4 * 3 * 2  # points x models x repeats
    assert [s[1] for s in steps] == list(range(1, 25))
    assert all(math.isfinite(v) for s in steps for v in s[3].values())


def test_results_write_as_strict_json(result, tmp_path):
    body = {k: v for k, v in result.items() if not k.startswith("_")}
    path = write_result(body, tmp_path / "out" / "bench.json")
    assert json.loads(path.read_text())["points"] == body["points"]


def test_stop_request_is_honoured():
    progress = RecordingProgress(stop_after=4)
    with pytest.raises(StopRequested):
        run_benchmark(BenchConfig(**SMALL), progress, teacher=tiny_model("llama"))
    assert len(progress.steps) == 6  # polled between points: the second point finished


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3", "gemma3"])
def test_other_architectures(arch):
    config = BenchConfig(batch_sizes=[2], prompt_lengths=[20], gen_lengths=[3], warmup=False, attention={"window_size": 8})
    out = run_benchmark(config, teacher=tiny_model(arch))
    assert [p["status"] for p in out["points"]] == ["ok", "ok", "ok"]
    assert all(v > 0 and math.isfinite(v) for v in numbers(without_floor_cache(out["points"])))


def test_thread_setting_is_applied_and_restored():
    before = torch.get_num_threads()
    config = BenchConfig(batch_sizes=[1], prompt_lengths=[12], gen_lengths=[2], warmup=False, threads=1)
    out = run_benchmark(config, teacher=tiny_model("llama"))
    assert out["environment"]["torch_threads"] == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        BenchConfig(threads=0)
