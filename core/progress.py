"""Progress reporting from long-running core work (conversion stages, evaluation, benchmarks).

Core code never prints progress or writes to a database; it calls a :class:`ProgressCallback`.
The CLI renders the calls as progress bars, the job system records them as metric rows, and
tests collect them in a list.

Contract:
  * ``on_step(stage, step, total, metrics, layer_metrics)`` after every optimisation or
    evaluation step. ``stage`` is a short name (``"stage1"``, ``"stage2"``, ``"eval"``,
    ``"bench"``); ``step`` counts from 1; ``total`` is the planned number of steps or ``None``;
    ``metrics`` maps a name to a finite float; ``layer_metrics`` maps a layer index to its own
    metrics (per-layer attention MSE, for example) or is ``None``.
  * ``on_log(message)`` for a human-readable line (stage started, checkpoint written, ...).
  * ``should_stop()`` is polled between steps; when it returns True the running stage writes a
    checkpoint and raises :class:`StopRequested` (cooperative cancel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class StopRequested(Exception):
    """Raised by a stage after it checkpointed because ``should_stop()`` returned True."""


class ProgressCallback(Protocol):
    def on_step(
        self,
        stage: str,
        step: int,
        total: int | None,
        metrics: dict[str, float],
        layer_metrics: dict[int, dict[str, float]] | None = None,
    ) -> None: ...

    def on_log(self, message: str) -> None: ...

    def should_stop(self) -> bool: ...


class NullProgress:
    """A callback that ignores everything and never asks to stop."""

    def on_step(self, stage, step, total, metrics, layer_metrics=None) -> None:
        pass

    def on_log(self, message: str) -> None:
        pass

    def should_stop(self) -> bool:
        return False


@dataclass
class RecordingProgress:
    """Keeps every call in memory: handy in notebooks and tests."""

    steps: list[tuple[str, int, int | None, dict[str, float], dict[int, dict[str, float]] | None]] = field(
        default_factory=list
    )
    logs: list[str] = field(default_factory=list)
    stop_after: int | None = None  # ask to stop once this many steps were reported

    def on_step(self, stage, step, total, metrics, layer_metrics=None) -> None:
        self.steps.append((stage, step, total, dict(metrics), layer_metrics))

    def on_log(self, message: str) -> None:
        self.logs.append(message)

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.steps) >= self.stop_after
