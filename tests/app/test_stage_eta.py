"""The running stage's ETA: from this attempt's pace, and right on the first step after a resume
(whose step number counts the steps of the earlier attempt, not this one's)."""

from datetime import timedelta

import pytest

from app.common import stage_eta, utcnow
from jobs.records import JobInfo, MetricPoint


def job(attempt: int, step: int, total: int, started_s_ago: float) -> JobInfo:
    now = utcnow()
    return JobInfo(id=1, kind="convert", name=None, status="running", priority=0, config={}, created_at=now,
                   started_at=now - timedelta(seconds=started_s_ago), finished_at=None, attempt=attempt,
                   worker_id="w", pid=1, pgid=1, heartbeat_at=now, cancel_requested=False, status_reason=None,
                   error=None, log_tail=None, run_dir=None, progress_stage="stage1", progress_step=step,
                   progress_total=total, result=None)


def point(attempt: int, step: int, s_ago: float) -> MetricPoint:
    return MetricPoint(id=step, attempt=attempt, stage="stage1", step=step, layer=None, name="loss", value=1.0,
                       time=utcnow() - timedelta(seconds=s_ago))


def test_pace_of_this_attempt():
    # steps 1..10 one every 6 s, the last just now: 90 steps left at 6 s
    points = [point(1, s, 6 * (10 - s)) for s in range(1, 11)]
    assert stage_eta(job(1, 10, 100, 65), points) == pytest.approx(540, abs=2)


def test_first_step_of_a_first_attempt_uses_the_time_since_it_started():
    assert stage_eta(job(1, 1, 100, 6), [point(1, 1, 0)]) == pytest.approx(594, abs=2)


def test_first_step_after_a_resume_uses_the_earlier_pace_not_the_step_number():
    # attempt 1 ran steps 1..55 at 60 s a step; attempt 2 resumed and has just logged step 56,
    # 70 s after it started (loading included): 944 steps left at about 60 s, not 70 / 56 s
    earlier = [point(1, s, 10_000 - 60 * s) for s in range(1, 56)]
    eta = stage_eta(job(2, 56, 1000, 70), earlier + [point(2, 56, 0)])
    assert eta == pytest.approx(944 * 60, rel=0.01)
    two_steps = earlier + [point(2, 56, 50), point(2, 57, 0)]  # then this attempt's own pace
    assert stage_eta(job(2, 57, 1000, 120), two_steps) == pytest.approx(943 * 50, rel=0.01)
