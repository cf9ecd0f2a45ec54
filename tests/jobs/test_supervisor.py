"""The supervision loop (jobs.supervisor) over a stand-in executor whose attempts never run: the
test sets what ``poll`` answers and backdates heartbeats; the job database is a real one.
The local executor's tests (test_jobs_lifecycle, real processes and signals) run the same loop."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from jobs import api, store
from jobs.db import open_db
from jobs.models import Job, utcnow
from jobs.supervisor import ALIVE, PENDING, Attempt, Poll, Supervisor, SupervisorOptions


class FakeExecutor:
    """Records every call; ``state[handle]`` is what ``poll`` answers (ALIVE until a test changes it)."""

    id_prefix = "fake:"
    owns_processes = True
    transient_errors = ()

    def __init__(self):
        self.state: dict[str, Poll] = {}
        self.calls: list[tuple[str, str]] = []
        self.judged: list[tuple[int, object, bool, str | None]] = []

    def describe(self):
        return "a stand-in"

    def start(self, db, claim, supervisor_id):
        handle = f"h{claim.job_id}"
        self.state[handle] = ALIVE
        return handle

    def poll(self, handle):
        return self.state[handle]

    def terminate(self, handle):
        self.calls.append(("terminate", handle))
        return f"terminated {handle}"

    def kill(self, handle):
        self.calls.append(("kill", handle))
        self.state[handle] = Poll(ended=True, exit="killed")
        return f"killed {handle}"

    def judge(self, db, attempt: Attempt, exit, cancel_requested):
        self.judged.append((attempt.job_id, exit, cancel_requested, attempt.killed_because))
        store.mark_interrupted(db, attempt.job_id, attempt.attempt, attempt.killed_because or "judged")

    def collect(self, attempt):
        self.calls.append(("collect", attempt.handle))

    def reconcile(self, supervisor):
        return []


def _supervisor(ws, **options) -> tuple[Supervisor, FakeExecutor, list[int]]:
    ids = [api.submit_job("selftest", {"steps": 3}, workspace=ws).id for _ in range(2)]
    executor = FakeExecutor()
    sup = Supervisor(open_db(ws), SupervisorOptions(concurrency=2, **options), executor)
    assert sup.claim_and_submit() and sup.claim_and_submit() and not sup.claim_and_submit()
    return sup, executor, ids


def _backdate_heartbeat(sup, job_id, seconds):
    sup.db.write(lambda s: s.execute(update(Job).where(Job.id == job_id)
                                     .values(heartbeat_at=utcnow() - timedelta(seconds=seconds))))


def test_a_stale_heartbeat_kills_the_attempt_and_it_is_judged_interrupted(tmp_path):
    sup, executor, (hung, fine) = _supervisor(tmp_path / "ws", stale_after=30)
    assert sup.id.startswith("fake:") and set(sup.tracked) == {hung, fine}
    _backdate_heartbeat(sup, hung, 100)
    sup.watch()  # hung: killed
    assert executor.calls == [("kill", f"h{hung}")]
    assert "no heartbeat for 100 s (limit 30 s)" in sup.tracked[hung].killed_because
    sup.watch()  # the kill ended it while the job still reads running: the executor judges
    assert [j[:3] for j in executor.judged] == [(hung, "killed", False)]
    assert "the job process hung" in executor.judged[0][3]
    info = api.get_job(hung, workspace=tmp_path / "ws")
    assert info.status == "interrupted" and "no heartbeat for" in info.status_reason
    assert set(sup.tracked) == {fine} and api.get_job(fine, workspace=tmp_path / "ws").status == "running"


def test_cancel_terminates_after_the_grace_then_kills_after_the_kill_grace(tmp_path):
    sup, executor, (cancelled, other) = _supervisor(tmp_path / "ws", cancel_grace=0.0, kill_grace=0.0)
    api.cancel_job(cancelled, workspace=tmp_path / "ws")
    sup.watch()  # notes the request: the runner gets its chance to stop cooperatively
    assert executor.calls == []
    sup.watch()  # grace 0 is over: terminate
    assert executor.calls == [("terminate", f"h{cancelled}")]
    sup.watch()  # still alive after the kill grace: kill
    assert executor.calls == [("terminate", f"h{cancelled}"), ("kill", f"h{cancelled}")]
    sup.watch()  # ended, job still running in the database, cancel requested: judged
    assert executor.judged == [(cancelled, "killed", True, None)]
    events = " | ".join(e.message for e in api.job_events(cancelled, workspace=tmp_path / "ws"))
    assert f"no cooperative stop within 0 s: terminated h{cancelled}" in events and f"killed h{cancelled}" in events
    assert set(sup.tracked) == {other}


def test_no_kill_step_without_a_kill_grace_and_none_within_the_cancel_grace(tmp_path):
    sup, executor, (first, second) = _supervisor(tmp_path / "ws", cancel_grace=0.0, kill_grace=None)
    api.cancel_job(first, workspace=tmp_path / "ws")
    for _ in range(4):
        sup.watch()
    assert executor.calls == [("terminate", f"h{first}")]  # terminate escalates on its own (Ray's stop_job)

    sup.options.cancel_grace = 3600.0
    api.cancel_job(second, workspace=tmp_path / "ws")
    for _ in range(3):
        sup.watch()
    assert executor.calls == [("terminate", f"h{first}")]  # still within the grace


def test_pending_attempts_get_their_heartbeat_and_a_cancel_stops_them_at_once(tmp_path):
    sup, executor, (waiting, _) = _supervisor(tmp_path / "ws", stale_after=30, cancel_grace=3600.0)
    executor.state[f"h{waiting}"] = PENDING
    _backdate_heartbeat(sup, waiting, 100)
    sup.watch()
    assert executor.calls == []  # not taken for hung: the supervisor beats for it
    assert (utcnow() - api.get_job(waiting, workspace=tmp_path / "ws").heartbeat_at).total_seconds() < 30
    api.cancel_job(waiting, workspace=tmp_path / "ws")
    sup.watch()
    assert executor.calls == [("terminate", f"h{waiting}")]


def test_an_attempt_that_recorded_its_outcome_is_collected_not_judged(tmp_path):
    sup, executor, (done, _) = _supervisor(tmp_path / "ws")
    attempt = sup.tracked[done].attempt
    store.mark_succeeded(sup.db, done, attempt, {"ok": True})
    executor.state[f"h{done}"] = Poll(ended=True, exit=0)
    sup.watch()
    assert executor.calls == [("collect", f"h{done}")] and executor.judged == []
    assert api.get_job(done, workspace=tmp_path / "ws").status == "succeeded"


def test_shutdown_terminates_then_kills_what_the_executor_owns(tmp_path):
    sup, executor, ids = _supervisor(tmp_path / "ws", kill_grace=0.0, poll_interval=0.01)
    sup.stop("worker shut down by SIGTERM")
    assert sup.run() == 0
    assert [c for c, _ in executor.calls] == ["terminate", "terminate", "kill", "kill"]
    assert sorted(j[0] for j in executor.judged) == ids
    assert all(j[3] == "worker shut down by SIGTERM" for j in executor.judged)
    assert not sup.tracked
