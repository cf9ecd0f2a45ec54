""":class:`core.progress.ProgressCallback` backed by the job database.

Contract (one instance per runner process and attempt):
  * ``on_step`` inserts one metric row per metric (and per layer metric), refreshes the job's
    heartbeat and progress columns, all in one transaction.
  * ``on_log`` inserts a job event row.
  * ``should_stop`` is True once a cancel was requested for the job, or once this attempt no
    longer owns the job (another process declared it interrupted); the answer comes from the
    last heartbeat, refreshed if older than ``poll_s``.
  * ``beat`` refreshes the heartbeat alone (called by the runner's background thread, so a long
    step or a model download does not look like a dead job).
Every write is lock-retried (:mod:`jobs.db`); none is ever lost silently.
"""

from __future__ import annotations

import threading
import time

from jobs import store
from jobs.db import Database


class DbProgress:
    def __init__(self, db: Database, job_id: int, attempt: int, *, poll_s: float = 0.5):
        self.db, self.job_id, self.attempt, self.poll_s = db, job_id, attempt, poll_s
        self._cancel = threading.Event()
        self._lost = threading.Event()
        self._last_beat = 0.0

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def _note(self, beat: store.Beat) -> None:
        self._last_beat = time.monotonic()
        if beat.cancel_requested:
            self._cancel.set()
        if not beat.owned:
            self._lost.set()

    def beat(self) -> None:
        self._note(store.heartbeat(self.db, self.job_id, self.attempt))

    def seconds_since_beat(self) -> float:
        return time.monotonic() - self._last_beat

    def on_step(self, stage, step, total, metrics, layer_metrics=None) -> None:
        self._note(store.heartbeat(self.db, self.job_id, self.attempt, stage=stage, step=step, total=total,
                                   metrics=metrics, layer_metrics=layer_metrics))

    def on_log(self, message: str) -> None:
        store.add_event(self.db, self.job_id, message, source="job", attempt=self.attempt)

    def should_stop(self) -> bool:
        if not (self._cancel.is_set() or self._lost.is_set()) and self.seconds_since_beat() > self.poll_s:
            self.beat()
        return self._cancel.is_set() or self._lost.is_set()
