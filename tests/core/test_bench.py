"""The throughput / memory benchmark on tiny random models (numbers, OOM handling, figures)."""

import json
import math

import pytest
import torch

from core.bench import (
    BenchConfig,
    build_student,
    figures,
    is_oom,
    run_benchmark,
    write_result,
)
from core.progress import RecordingProgress, StopRequested
from tests.tiny_models import tiny_model

SMALL = {
    "batch_sizes": [1, 3],
    "prompt_lengths": [16, 40],
    "gen_lengths": [3],
    "linearize": {"window_size": 8},
    "warmup": False,
}


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


@pytest.fixture(scope="module")
def result():
    progress = RecordingProgress()
    config = BenchConfig(**SMALL, extra_points=[[2, 24, 4]], repeats=2)
    out = run_benchmark(config, progress, teacher=tiny_model("llama"))
    out["_progress"] = progress
    return out


def test_sweep_points_for_both_models(result):
    keys = {(p["model"], p["batch_size"], p["prompt_length"], p["gen_length"]) for p in result["points"]}
    expected = {(1, 16, 3), (3, 16, 3), (1, 40, 3), (2, 24, 4)}  # axes around (1, 16, 3) + the extra point
    assert keys == {(m, *pt) for m in ("teacher", "student") for pt in expected}
    assert all(p["status"] == "ok" for p in result["points"])


def test_every_reported_number_is_positive_and_finite(result):
    body = {k: result[k] for k in ("points", "comparisons")}
    values = list(numbers(body))
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
    student = [p for p in result["points"] if p["model"] == "student" and p["batch_size"] == 1]
    assert len({p["cache_bytes"] for p in student}) == 1  # fixed-size state: independent of the context
    for p in result["points"]:
        assert p["decode_peak_memory_bytes"] >= p["weight_bytes"] + min(p["prefill_cache_bytes"], p["cache_bytes"])


def test_progress_reports_every_measurement(result):
    progress = result["_progress"]
    steps = [s for s in progress.steps if s[0] == "bench"]
    assert len(steps) == 4 * 2 * 2  # points x models x repeats
    assert [s[1] for s in steps] == list(range(1, 17))
    assert all(math.isfinite(v) for s in steps for v in s[3].values())


def test_results_write_as_strict_json(result, tmp_path):
    body = {k: v for k, v in result.items() if not k.startswith("_")}
    path = write_result(body, tmp_path / "out" / "bench.json")
    assert json.loads(path.read_text())["points"] == body["points"]


def test_figures_build(result):
    figs = figures(result)
    assert set(figs) == {"throughput_vs_batch", "throughput_vs_context", "memory_vs_batch", "memory_vs_context"}
    for fig in figs.values():
        traces = [t for t in fig.data if len(t.x)]
        assert {t.name.split()[0] for t in traces} == {"teacher", "student"}
        assert all(y > 0 and math.isfinite(y) for t in traces for y in t.y)
        fig.to_json()
    batch_traces = figs["throughput_vs_batch"].data
    assert sorted(batch_traces[0].x) == [1, 3]


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes"),
        MemoryError(),
    ],
    ids=["torch-oom", "cpu-allocator", "memory-error"],
)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_out_of_memory_point_is_recorded_and_sweep_continues(monkeypatch, error, phase):
    teacher = tiny_model("llama")
    config = BenchConfig(**SMALL)
    student = build_student(teacher, config)
    real_forward = student.forward
    calls = []

    def forward(*args, **kwargs):
        ids = kwargs["input_ids"]
        calls.append(tuple(ids.shape))
        if ids.shape[0] == 3 and (ids.shape[1] > 1) == (phase == "prefill"):  # the batch-3 point fails
            raise error
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(student, "forward", forward)
    progress = RecordingProgress()
    out = run_benchmark(config, progress, teacher=teacher, student=student)
    status = {(p["model"], p["batch_size"], p["prompt_length"]): p["status"] for p in out["points"]}
    assert status == {
        ("teacher", 1, 16): "ok", ("student", 1, 16): "ok",
        ("teacher", 3, 16): "ok", ("student", 3, 16): "oom",
        ("teacher", 1, 40): "ok", ("student", 1, 40): "ok",
    }
    oom = next(p for p in out["points"] if p["status"] == "oom")
    assert type(error).__name__ in oom["error"]
    assert "prefill_tokens_per_second" not in oom
    assert (1, 40) in calls  # the point after the failing one still ran
    teacher_b3 = next(p for p in out["points"] if p["model"] == "teacher" and p["batch_size"] == 3)
    assert len(teacher_b3["decode_step_times_s"]) == 2  # the teacher finished the point alone
    assert len(out["comparisons"]) == 2  # only points where both models were measured
    assert any("out of memory" in line for line in progress.logs)
    assert sum(s[3] == {"oom": 1.0} for s in progress.steps) == 1
    figs = figures(out)  # figures still build with an OOM point
    assert "out of memory" in figs["throughput_vs_batch"].layout.title.text


def test_teacher_and_student_are_interleaved(monkeypatch):
    teacher = tiny_model("llama")
    config = BenchConfig(batch_sizes=[2], prompt_lengths=[12, 20], gen_lengths=[4], warmup=False, linearize={"window_size": 8})
    student = build_student(teacher, config)
    calls = []
    for name, model in (("teacher", teacher), ("student", student)):
        def forward(*args, _name=name, _real=model.forward, **kwargs):
            calls.append((_name, kwargs["input_ids"].shape[1]))
            return _real(*args, **kwargs)

        monkeypatch.setattr(model, "forward", forward)
    run_benchmark(config, teacher=teacher, student=student)
    first, second = calls[:8], calls[8:]
    # point 1: teacher then student prefill, then decode steps alternating (the order flips every step)
    assert first == [("teacher", 12), ("student", 12), ("student", 1), ("teacher", 1),
                     ("teacher", 1), ("student", 1), ("student", 1), ("teacher", 1)]
    # point 2 starts with the student
    assert second[:2] == [("student", 20), ("teacher", 20)]


def test_other_errors_are_not_swallowed(monkeypatch):
    teacher = tiny_model("llama")
    config = BenchConfig(**SMALL)

    def forward(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(teacher, "forward", forward)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_benchmark(config, teacher=teacher)


def test_is_oom():
    assert is_oom(torch.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("expected scalar type Float"))
    assert not is_oom(ValueError("out of memory"))


def test_stop_request_is_honoured():
    progress = RecordingProgress(stop_after=3)
    with pytest.raises(StopRequested):
        run_benchmark(BenchConfig(**SMALL), progress, teacher=tiny_model("llama"))
    assert len(progress.steps) == 4  # polled between points: the second point finished


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3"])
def test_other_architectures(arch):
    config = BenchConfig(batch_sizes=[2], prompt_lengths=[20], gen_lengths=[3], warmup=False, linearize={"window_size": 8})
    out = run_benchmark(config, teacher=tiny_model(arch))
    assert [p["status"] for p in out["points"]] == ["ok", "ok"]
    assert all(v > 0 and math.isfinite(v) for v in numbers(out["points"]))


def test_grid_and_axes_points():
    axes = BenchConfig(batch_sizes=[1, 2], prompt_lengths=[8, 16], gen_lengths=[2, 4], base_prompt_length=16)
    assert axes.points() == [(1, 16, 2), (2, 16, 2), (1, 8, 2), (1, 16, 4)]
    grid = BenchConfig(batch_sizes=[1, 2], prompt_lengths=[8, 16], gen_lengths=[2], sweep="grid")
    assert grid.points() == [(1, 8, 2), (1, 16, 2), (2, 8, 2), (2, 16, 2)]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"gen_lengths": [1]}, "gen_lengths"),
        ({"batch_sizes": [0]}, "batch_sizes"),
        ({"sweep": "diagonal"}, "sweep"),
        ({"models": ["oracle"]}, "models"),
        ({"linearize": {"kind": "quadratic"}}, "attention kind"),
        ({"repeats": 0}, "repeats"),
        ({"extra_points": [[1, 8]]}, "extra_points"),
    ],
)
def test_config_errors_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        BenchConfig(**fields)


def test_config_round_trip():
    config = BenchConfig(batch_sizes=[2], extra_points=[[8, 4096, 8]], linearize={"kind": "sliding_window"})
    assert BenchConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown BenchConfig fields"):
        BenchConfig.from_dict({"batch": 1})


def test_student_checkpoint_is_loaded_from_a_run(tmp_path):
    from core.train.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="does not exist"):
        build_student(tiny_model("llama"), BenchConfig(student_checkpoint=str(tmp_path / "no-such-run")))


def test_thread_setting_is_applied_and_restored():
    before = torch.get_num_threads()
    config = BenchConfig(batch_sizes=[1], prompt_lengths=[12], gen_lengths=[2], warmup=False, threads=1)
    out = run_benchmark(config, teacher=tiny_model("llama"))
    assert out["environment"]["torch_threads"] == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        BenchConfig(threads=0)
