"""One point: teacher and student interleaved, out-of-memory points recorded, other errors raised."""

import pytest
import torch

from core.bench import BenchConfig, convert_teacher, measure_point, run_benchmark
from core.io import is_oom
from tests.core.bench.runs import OOM_ERRORS, OOM_PHASES, SMALL, result_with_oom
from tests.tiny_models import tiny_model


@OOM_ERRORS
@OOM_PHASES
def test_out_of_memory_point_is_recorded_and_sweep_continues(monkeypatch, error, phase):
    out, progress, calls = result_with_oom(monkeypatch, error, phase)
    status = {(p["model"], p["batch_size"], p["prompt_length"]): p["status"] for p in out["points"]}
    assert status == {
        ("teacher", 1, 16): "ok", ("student", 1, 16): "ok", ("floor", 1, 16): "ok",
        ("teacher", 3, 16): "ok", ("student", 3, 16): "oom", ("floor", 3, 16): "ok",
        ("teacher", 1, 40): "ok", ("student", 1, 40): "ok", ("floor", 1, 40): "ok",
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


def record_forward_calls(monkeypatch, teacher, student) -> list[tuple[str, int]]:
    """``(model name, new tokens)`` of every forward call of ``teacher`` and ``student``, in order."""
    calls = []
    for name, model in (("teacher", teacher), ("student", student)):
        def forward(*args, _name=name, _real=model.forward, **kwargs):
            calls.append((_name, kwargs["input_ids"].shape[1]))
            return _real(*args, **kwargs)

        monkeypatch.setattr(model, "forward", forward)
    return calls


def test_teacher_and_student_are_interleaved(monkeypatch):
    teacher = tiny_model("llama")
    config = BenchConfig(batch_sizes=[2], prompt_lengths=[12, 20], gen_lengths=[4], warmup=False,
                         attention={"window_size": 8}, models=["teacher", "student"])
    student = convert_teacher(teacher, config)
    calls = record_forward_calls(monkeypatch, teacher, student)
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


def test_the_student_prefills_in_chunks_and_the_teacher_at_once(monkeypatch):
    teacher = tiny_model("llama")
    config = BenchConfig(batch_sizes=[2], prompt_lengths=[20], gen_lengths=[2], warmup=False,
                         attention={"window_size": 8}, models=["teacher", "student"], prefill_chunk=8)
    student = convert_teacher(teacher, config)
    calls = record_forward_calls(monkeypatch, teacher, student)
    out = run_benchmark(config, teacher=teacher, student=student)
    assert calls[:4] == [("teacher", 20), ("student", 8), ("student", 8), ("student", 4)]
    assert [p["status"] for p in out["points"]] == ["ok", "ok"]
    assert out["config"]["prefill_chunk"] == 8


def record_points(monkeypatch) -> list[tuple]:
    """``(input shape, generation length, order)`` of every :func:`measure_point` call of the sweep."""
    from core.bench import sweep

    calls = []

    def measure(models, input_ids, gen_length, tracker, order, chunks=None):
        calls.append((tuple(input_ids.shape), gen_length, list(order)))
        return measure_point(models, input_ids, gen_length, tracker, order, chunks)

    monkeypatch.setattr(sweep, "measure_point", measure)
    return calls


def test_every_point_is_timed_after_an_untimed_run_at_its_own_shape(monkeypatch):
    config = BenchConfig(batch_sizes=[2], prompt_lengths=[80, 96], gen_lengths=[4], repeats=2, warmup=True,
                         attention={"window_size": 8}, models=["teacher", "student"])
    calls = record_points(monkeypatch)
    out = run_benchmark(config, teacher=tiny_model("llama"))
    both, flipped, warm = ["teacher", "student"], ["student", "teacher"], calls[0][1]
    assert calls == [((2, 80), warm, both), ((2, 80), 4, both), ((2, 96), warm, flipped), ((2, 96), 4, flipped),
                     ((2, 80), 4, flipped), ((2, 96), 4, both)]  # the second repeat is not warmed up again
    assert warm < 4  # the untimed run is shorter: its prefill and a decode step
    assert all(len(p["prefill_times_s"]) == 2 and len(p["decode_step_times_s"]) == 2 * 3 for p in out["points"])
    assert out["timing"] == {"warmup_runs": 1, "warmup_decode_steps": 1, "repeats": 2}


def test_a_model_out_of_memory_in_the_untimed_run_is_not_timed(monkeypatch):
    teacher = tiny_model("llama")
    config = BenchConfig(**{**SMALL, "warmup": True})
    student = convert_teacher(teacher, config)
    real_forward = student.forward
    failed = []

    def forward(*args, **kwargs):
        if kwargs["input_ids"].shape[0] == 3:  # the batch-3 point
            failed.append(kwargs["input_ids"].shape[1])
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(student, "forward", forward)
    out = run_benchmark(config, teacher=teacher, student=student)
    status = {(p["model"], p["batch_size"]): p["status"] for p in out["points"] if p["prompt_length"] == 16}
    assert status == {("teacher", 1): "ok", ("student", 1): "ok", ("floor", 1): "ok",
                      ("teacher", 3): "ok", ("student", 3): "oom", ("floor", 3): "ok"}
    assert failed == [16]  # the untimed prefill failed; the student was not timed there
