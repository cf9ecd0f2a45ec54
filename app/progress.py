"""How far along a job is: the pace of a stage, the time left in it, and a conversion's overall
progress and time left across its phases (no Streamlit: the pages draw what this computes).

Overall progress weighs each phase of :func:`core.pipeline.phases.conversion_phases` by its
seconds: measured (its own seconds per step, this attempt's when it has two steps, else an
earlier attempt's) or, before it runs, its steps x cost x the seconds per cost unit of the latest
phase measured. Until a phase is measured the weights are the costs alone and no time is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from core.pipeline.phases import Phase, conversion_phases, unlisted_phases
from core.run_folder import STAGE1, STAGE2, TEACHER_EVAL
from jobs.kinds import CONVERT
from jobs.records import JobInfo, MetricPoint

PACE_METRICS = ("loss", "nll")  # one row per step of a training or an evaluation stage


def pace(points: list[MetricPoint]) -> tuple[float | None, int, datetime]:
    """(seconds per step between the first and the last step of ``points``, or None with one step
    only; the last step; its time)."""
    steps: dict[int, datetime] = {}
    for p in points:
        steps.setdefault(p.step, p.time)
    ordered = sorted(steps.items())
    (s0, t0), (s1, t1) = ordered[0], ordered[-1]
    return ((t1 - t0).total_seconds() / (s1 - s0) if s1 > s0 else None), s1, t1


def stage_pace(points: list[MetricPoint], stage: str, attempt: int) -> float | None:
    """Seconds per step of ``stage``: this ``attempt``'s pace, else the latest earlier attempt's."""
    rows = [p for p in points if p.stage == stage]
    for a in sorted({p.attempt for p in rows if p.attempt <= attempt}, reverse=True):
        measured = pace([p for p in rows if p.attempt == a])[0]
        if measured is not None:
            return measured
    return None


@dataclass(frozen=True)
class Overall:
    fraction: float  # of the listed phases' work done
    eta_s: float | None  # seconds left in them (None until a phase's pace is measured)
    after: str  # what runs after them, unlisted (long context, tasks), or ""


def _done(phases: list[Phase], job: JobInfo) -> list[float]:
    """Fraction done of each phase: those before the running stage 1, the running one by its step."""
    stages = [p.stage for p in phases]
    if job.progress_stage not in stages:  # before the first step, or past the listed phases
        return [float(job.progress_stage is not None)] * len(phases)
    current = stages.index(job.progress_stage)
    step = (job.progress_step or 0) / job.progress_total if job.progress_total else 0.0
    return [1.0 if i < current else min(step, 1.0) if i == current else 0.0 for i in range(len(phases))]


def overall_progress(job: JobInfo, points: list[MetricPoint], now: datetime) -> Overall | None:
    """Overall progress of a running conversion (``points``: its metric rows of
    :data:`PACE_METRICS`; ``now``: naive UTC); None for another job or state."""
    if job.kind != CONVERT or job.status != "running":
        return None
    phases = conversion_phases(job.config)
    done = _done(phases, job)
    paces = [stage_pace(points, p.stage, job.attempt) for p in phases]
    measured = [(s / p.cost) for s, p in zip(paces, phases) if s is not None]
    per_unit = measured[-1] if measured else None
    if per_unit is None:
        units = [p.steps * p.cost for p in phases]
        return Overall(sum(d * u for d, u in zip(done, units)) / sum(units), None, unlisted_phases(job.config))
    seconds = [(s if s is not None else p.cost * per_unit) * p.steps for s, p in zip(paces, phases)]
    left = sum((1 - d) * s for d, s in zip(done, seconds))
    last = max((p.time for p in points if p.attempt == job.attempt), default=None)
    if last is not None and left > 0:
        left = max(left - (now - last).total_seconds(), 0.0)
    return Overall(sum(d * s for d, s in zip(done, seconds)) / sum(seconds), left, unlisted_phases(job.config))


def seconds_per_unit(config: dict, points: list[MetricPoint]) -> float | None:
    """Seconds per cost unit of a finished conversion with ``config`` (its last attempt's measured
    phases, the median over them), or None when none was measured."""
    attempt = max((p.attempt for p in points), default=0)
    rates = sorted(s / p.cost for p in conversion_phases(config)
                   if (s := stage_pace(points, p.stage, attempt)) is not None)
    return rates[len(rates) // 2] if rates else None


# the report.json ``timings`` of the phases timed on their own (the student's evaluation shares its
# time with the long-context one)
TIMED_PHASES = {TEACHER_EVAL: "teacher_eval_s", STAGE1: "stage1_s", STAGE2: "stage2_s"}


def seconds_per_unit_from_timings(config: dict, timings: dict) -> float | None:
    """Seconds per cost unit of a finished conversion from its report's ``timings``: a run made
    outside the job system, whose steps are not in the database. The median over the phases timed
    on their own (:data:`TIMED_PHASES`), or None when none was."""
    rates = sorted(timings[key] / (p.steps * p.cost) for p in conversion_phases(config)
                   if (key := TIMED_PHASES.get(p.stage)) and isinstance(timings.get(key), (int, float))
                   and p.steps * p.cost > 0)
    return rates[len(rates) // 2] if rates else None


def estimate_seconds(config: dict, per_unit: float) -> float:
    """Seconds the listed phases of a conversion with ``config`` take at ``per_unit`` seconds per cost unit."""
    return sum(p.steps * p.cost for p in conversion_phases(config)) * per_unit


__all__ = ["PACE_METRICS", "Overall", "estimate_seconds", "overall_progress", "pace", "seconds_per_unit",
           "seconds_per_unit_from_timings", "stage_pace"]
