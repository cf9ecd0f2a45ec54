"""A conversion's overall progress: phases weighed by their cost until measured, then by their
measured seconds; time left across every phase; a resumed attempt measured by its own steps."""

import dataclasses
from datetime import timedelta

import pytest

from app.common import utcnow
from app.progress import overall_progress
from core.config import preset
from core.pipeline.phases import conversion_phases
from jobs.records import JobInfo, MetricPoint

NOW = utcnow()
# teacher_eval 4 blocks, stage 1 20 steps x 2 micro-batches, stage 2 10 steps x 1 (kl), 4 + 4 eval blocks
CONFIG = preset("tiny-test", eval={"ppl_blocks": 4, "long_context": {"enabled": False}},
                stage1={"steps": 20, "grad_accum": 2}, stage2={"steps": 10, "grad_accum": 1, "loss": "kl"}).model_dump()


def job(stage: str | None, step: int | None, total: int | None, attempt: int = 1, config=CONFIG) -> JobInfo:
    return JobInfo(id=1, kind="convert", name=None, status="running", priority=0, config=config, created_at=NOW,
                   started_at=NOW - timedelta(hours=1), finished_at=None, attempt=attempt, worker_id="w", pid=1,
                   pgid=1, heartbeat_at=NOW, cancel_requested=False, status_reason=None, error=None, log_tail=None,
                   run_dir=None, progress_stage=stage, progress_step=step, progress_total=total, result=None)


def steps(stage: str, first: int, last: int, seconds: float, end_s_ago: float, attempt: int = 1) -> list[MetricPoint]:
    """Steps first..last of ``stage``, ``seconds`` apart, the last ``end_s_ago`` before NOW."""
    return [MetricPoint(id=i, attempt=attempt, stage=stage, step=s, layer=None, name="loss", value=1.0,
                        time=NOW - timedelta(seconds=end_s_ago + seconds * (last - s)))
            for i, s in enumerate(range(first, last + 1))]


def test_the_phases_and_their_costs_follow_the_config():
    phases = [(p.stage, p.steps, p.cost) for p in conversion_phases(CONFIG)]
    assert phases == [("teacher_eval", 4, 1.0), ("stage1", 20, 6.0), ("stage2", 10, 4.0),
                      ("student_eval", 4, 1.0), ("student_val", 4, 1.0)]
    off = preset("tiny-test", stage2={"enabled": False}).model_dump()
    assert "stage2" not in [p.stage for p in conversion_phases(off)]


def test_before_any_pace_the_costs_weigh_the_phases_and_no_time_is_given():
    whole = overall_progress(job("teacher_eval", 2, 4), steps("teacher_eval", 2, 2, 1.0, 0.0), NOW)
    assert whole.eta_s is None
    assert whole.fraction == pytest.approx(2 / (4 + 120 + 40 + 4 + 4))
    assert whole.after == ""


def test_measured_phases_and_the_time_left_across_all_of_them():
    # teacher eval 4 blocks at 0.5 s (0.5 s per cost unit), stage 1 at 3 s a step, step 10 of 20 just now:
    # left: 10 stage-1 steps (30 s), stage 2 at 4 x 0.5 = 2 s a step from the latest measured unit (3 / 6),
    # i.e. 20 s, then 8 eval blocks at 0.5 s
    points = steps("teacher_eval", 1, 4, 0.5, 40.0) + steps("stage1", 1, 10, 3.0, 0.0)
    whole = overall_progress(job("stage1", 10, 20), points, NOW)
    assert whole.eta_s == pytest.approx(30 + 20 + 4, abs=0.1)
    done, total = 2 + 30, 2 + 60 + 20 + 4
    assert whole.fraction == pytest.approx(done / total)


def test_a_resumed_attempt_is_timed_by_its_own_steps():
    earlier = steps("stage1", 1, 12, 9.0, 3600.0)  # a slower machine before the resume
    now = steps("stage1", 13, 15, 3.0, 0.0, attempt=2)
    whole = overall_progress(job("stage1", 15, 20, attempt=2), earlier + now, NOW)
    assert whole.eta_s == pytest.approx(5 * 3 + 10 * 2 + 8 * 0.5, abs=0.1)
    first = overall_progress(job("stage1", 13, 20, attempt=2), earlier + now[:1], NOW)
    # the earlier pace until this attempt has two steps, less the 6 s since its one step
    assert first.eta_s == pytest.approx(7 * 9 + 10 * 6 + 8 * 1.5 - 6, abs=0.1)


def test_past_the_listed_phases_they_are_done_and_what_follows_is_named():
    config = preset("tiny-test", eval={"tasks": "offline"}).model_dump()
    whole = overall_progress(job("long_context", 1, 3, config=config), [], NOW)
    assert whole.fraction == 1.0 and whole.after == "long-context evaluation and task accuracy"
    assert overall_progress(dataclasses.replace(job("stage1", 1, 4), kind="bench"), [], NOW) is None
