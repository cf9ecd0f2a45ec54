"""The Ray executor: each claimed job attempt runs as one Ray job (Ray Jobs API).

Contract:
  * :class:`RayExecutor` wraps ``ray.job_submission.JobSubmissionClient``: ``submit`` starts
    ``python -m jobs.runner <id> --workspace W`` as Ray job ``lolcats-<id>-<attempt>`` with
    ``LOLCATS_DB_URL`` / ``LOLCATS_WORKSPACE`` in its runtime environment, so the runner on the
    cluster writes its heartbeats, metrics, events and outcome into the job database itself.
    ``status`` / ``stop`` / ``logs`` are the Ray job's status, ``stop_job`` and logs.
  * :class:`RayWorker` is the supervisor loop (``lolcats worker --executor ray``). It claims
    queued jobs (at most ``concurrency`` submitted at once) and, every ``poll_interval``:
      - a job the runner ended itself (succeeded / failed / cancelled in the database) is done:
        its Ray logs are appended to ``runs/<id>/runner.log``; a Ray job still running
        ``exit_grace`` seconds after its attempt ended in the database is stopped (the database wins);
      - a Ray job that ended while the database still says ``running`` (the runner died without
        recording) is judged with :func:`map_status`: ``SUCCEEDED``/``FAILED`` -> ``failed`` with Ray's
        message and the log tail, ``STOPPED`` -> ``cancelled`` after a cancel request, else
        ``interrupted`` (resumable); a Ray job Ray no longer knows -> ``interrupted``;
      - cancel: the runner stops cooperatively at its next step (checkpoint kept); if it is still
        running ``cancel_grace`` seconds after the request, the cancel is forwarded as
        ``stop_job`` (SIGTERM, then SIGKILL, to the job's process group on its node);
      - a running job whose heartbeat is older than ``stale_after`` seconds is hung: stopped and
        marked ``interrupted``; a job Ray keeps ``PENDING`` (waiting for cluster resources) gets
        its heartbeat refreshed by the supervisor, so no worker takes it for dead.
  * Reconcile (at start and every ``reconcile_every`` s): a ``running`` job submitted by a Ray
    supervisor that is gone (same host, process dead) or whose heartbeat went stale is adopted:
    supervised from here on, or judged at once if its Ray job ended.
  * SIGTERM / SIGINT stop the supervisor only: its jobs keep running on the cluster and keep
    recording their own progress; a restarted supervisor adopts them.
"""

from __future__ import annotations

import logging
import shlex
import signal
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from core.workspace import ENV_VAR as WORKSPACE_ENV
from jobs import store
from jobs.db import DB_URL_ENV, Database
from jobs.errors import JobsError
from jobs.models import JobStatus, utcnow
from jobs.runner import SUPERVISOR_ENV
from jobs.worker import PROJECT_ROOT, make_worker_id, parse_worker_id, process_alive

log = logging.getLogger("jobs.executors.ray")

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
WORKER_PREFIX = "ray:"  # worker ids of Ray supervisors: "ray:<host>:<pid>:<start time>"
RAY_MISSING = ("the Ray executor needs the optional dependency ray: pip install -r requirements-ray.txt "
               "(or pip install 'lolcats-workbench[ray]')")
ACTIVE, ENDED = frozenset({"PENDING", "RUNNING"}), frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


def submission_id(job_id: int, attempt: int) -> str:
    """The Ray submission id of one attempt of a job (deterministic, so a supervisor can re-attach)."""
    return f"lolcats-{job_id}-{attempt}"


def map_status(ray_status: str | None, cancel_requested: bool = False) -> JobStatus:
    """Our state for a Ray job status (``None``: Ray does not know the job)."""
    if ray_status in ACTIVE:
        return JobStatus.RUNNING
    if ray_status == "SUCCEEDED":
        return JobStatus.SUCCEEDED
    if ray_status == "FAILED":
        return JobStatus.FAILED
    if ray_status == "STOPPED":
        return JobStatus.CANCELLED if cancel_requested else JobStatus.INTERRUPTED
    return JobStatus.INTERRUPTED


class RayExecutor:
    """Submit, watch, stop and read the logs of job runners on a Ray cluster."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, db_url: str, workspace: str | Path, python: str = "python",
                 num_cpus: float | None = None, num_gpus: float | None = None, env: dict[str, str] | None = None,
                 client: Any = None):
        self.address, self.db_url, self.workspace, self.python = address, db_url, str(workspace), python
        self.num_cpus, self.num_gpus, self.env = num_cpus, num_gpus, dict(env or {})
        if client is None:
            try:
                from ray.job_submission import JobSubmissionClient
            except ImportError:
                raise JobsError(RAY_MISSING) from None
            try:
                client = JobSubmissionClient(address)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise JobsError(f"cannot reach the Ray Jobs API at {address} ({exc}); start the cluster (`ray start "
                                "--head`) or pass the dashboard address with --ray-address") from None
        self.client = client

    def entrypoint(self, job_id: int) -> str:
        return shlex.join([self.python, "-m", "jobs.runner", str(job_id), "--workspace", self.workspace])

    def runtime_env(self) -> dict[str, Any]:
        env = {
            DB_URL_ENV: self.db_url,
            WORKSPACE_ENV: self.workspace,
            SUPERVISOR_ENV: "",  # no local supervisor process to watch: the Ray supervisor loop judges
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(PROJECT_ROOT),  # the project's own copy on a node built from the same image
            **self.env,
        }
        return {"env_vars": env}

    def submit(self, job_id: int, attempt: int) -> str:
        kwargs: dict[str, Any] = {}
        if self.num_cpus is not None:
            kwargs["entrypoint_num_cpus"] = self.num_cpus
        if self.num_gpus:
            kwargs["entrypoint_num_gpus"] = self.num_gpus
        return self.client.submit_job(
            entrypoint=self.entrypoint(job_id), submission_id=submission_id(job_id, attempt),
            runtime_env=self.runtime_env(), metadata={"lolcats_job": str(job_id), "attempt": str(attempt)}, **kwargs)

    def status(self, sid: str) -> str | None:
        """``PENDING`` | ``RUNNING`` | ``STOPPED`` | ``SUCCEEDED`` | ``FAILED``, or None if Ray does not know it."""
        try:
            return self.client.get_job_status(sid).value
        except RuntimeError as exc:  # the SDK raises RuntimeError for HTTP errors, 404 included
            if "404" in str(exc) or "does not exist" in str(exc):
                return None
            raise

    def message(self, sid: str) -> str:
        try:
            return self.client.get_job_info(sid).message or ""
        except RuntimeError:
            return ""

    def stop(self, sid: str) -> bool:
        try:
            return bool(self.client.stop_job(sid))
        except RuntimeError:
            return False

    def logs(self, sid: str) -> str:
        try:
            return self.client.get_job_logs(sid)
        except RuntimeError:
            return ""


@dataclass
class RayWorkerOptions:
    address: str = DEFAULT_ADDRESS  # the head's dashboard (Jobs API) address
    concurrency: int = 1  # jobs submitted to the cluster at the same time (the cluster queues beyond its resources)
    poll_interval: float = 1.0
    cancel_grace: float = 10.0  # wait this long for a cooperative stop before stop_job
    stale_after: float = 60.0  # a heartbeat older than this marks a running job hung
    exit_grace: float = 30.0  # a Ray job still running this long after its attempt ended in the database is stopped
    reconcile_every: float = 10.0
    once: bool = False  # claim at most `concurrency` jobs, supervise them to the end, exit
    exit_when_idle: bool = False
    python: str = "python"  # the interpreter on the cluster nodes
    remote_workspace: str | None = None  # the workspace path on the nodes (default: the same as here)
    num_cpus: float | None = None  # Ray resources reserved for each job's entrypoint
    num_gpus: float | None = None


@dataclass
class _Tracked:
    job_id: int
    attempt: int
    sid: str
    run_dir: Path
    cancel_seen: float | None = None
    ended_seen: float | None = None  # when the database first said this attempt ended
    stop_sent: float | None = None
    killed_because: str | None = None  # set when the supervisor stops the job itself (hung)


@dataclass
class RayWorker:
    db: Database
    options: RayWorkerOptions = field(default_factory=RayWorkerOptions)
    executor: RayExecutor | None = None

    def __post_init__(self) -> None:
        self.id = WORKER_PREFIX + make_worker_id()
        self.host = socket.gethostname()
        if self.executor is None:
            self.executor = RayExecutor(
                self.options.address, db_url=self.db.url,
                workspace=self.options.remote_workspace or str(self.db.workspace), python=self.options.python,
                num_cpus=self.options.num_cpus, num_gpus=self.options.num_gpus)
        if self.db.url.startswith("sqlite") and not any(h in self.options.address for h in ("127.0.0.1", "localhost")):
            log.warning("the job database is SQLite (%s): jobs on other nodes can only reach it through a shared "
                        "filesystem; use PostgreSQL (LOLCATS_DB_URL) for a real cluster", self.db.url)
        self.tracked: dict[int, _Tracked] = {}
        self._stop_reason: str | None = None

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        previous = {}

        def handler(signum, _frame):
            self._stop_reason = f"stopped by {signal.Signals(signum).name}"

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass
        try:
            log.info("ray supervisor %s started (Jobs API %s, concurrency %d, workspace %s)", self.id,
                     self.options.address, self.options.concurrency, self.db.workspace)
            self.reconcile()
            last_reconcile, claimed = time.monotonic(), 0
            while True:
                try:
                    self.watch()
                    if self._stop_reason:
                        break
                    if time.monotonic() - last_reconcile >= self.options.reconcile_every:
                        self.reconcile()
                        last_reconcile = time.monotonic()
                    idle = False
                    while len(self.tracked) < self.options.concurrency and not self._stop_reason:
                        if self.options.once and claimed >= self.options.concurrency:
                            break
                        if not self.claim_and_submit():
                            idle = True
                            break
                        claimed += 1
                    if not self.tracked and (
                            (self.options.once and (claimed >= self.options.concurrency or idle))
                            or (self.options.exit_when_idle and idle)):
                        break
                except (JobsError, SQLAlchemyError, OSError) as exc:  # OSError: requests' connection errors too
                    log.error("ray supervisor loop: %s; retrying", exc)
                time.sleep(self.options.poll_interval)
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        if self.tracked:
            log.info("%s: %d job(s) keep running on the Ray cluster (%s); a restarted supervisor adopts them",
                     self._stop_reason or "exiting", len(self.tracked), ", ".join(t.sid for t in self.tracked.values()))
        return 0

    def stop(self, reason: str = "stopped") -> None:
        self._stop_reason = reason

    # -- submitting ---------------------------------------------------------------------------
    def claim_and_submit(self) -> bool:
        """Claim the next queued job and submit it to Ray; False when nothing is queued."""
        claim = store.claim_next_job(self.db, self.id)
        if claim is None:
            return False
        sid = submission_id(claim.job_id, claim.attempt)
        try:
            self.executor.submit(claim.job_id, claim.attempt)
        except Exception as exc:  # noqa: BLE001 - any submission failure ends this attempt with its reason
            store.mark_failed(self.db, claim.job_id, claim.attempt,
                              f"could not submit the job to Ray at {self.options.address}: {exc}; check that the "
                              "cluster is up (`ray status`) and --ray-address", source="worker")
            return True
        store.add_event(self.db, claim.job_id, f"submitted to Ray at {self.options.address} as {sid}",
                        source="worker", attempt=claim.attempt)
        self.tracked[claim.job_id] = _Tracked(claim.job_id, claim.attempt, sid, self.db.workspace / claim.run_dir)
        log.info("job %s attempt %s: Ray job %s", claim.job_id, claim.attempt, sid)
        return True

    # -- supervising -------------------------------------------------------------------------
    def watch(self) -> None:
        """One pass over the supervised jobs (see the module contract)."""
        if not self.tracked:
            return
        # Ray first, then the database: a runner records its outcome before it exits, so an ended Ray
        # job whose attempt still reads `running` afterwards really died without recording.
        statuses = {t.job_id: self.executor.status(t.sid) for t in self.tracked.values()}
        running = {j.id: j for j in store.running_jobs(self.db) if j.id in self.tracked}
        now = time.monotonic()
        for t in list(self.tracked.values()):
            ray_status = statuses[t.job_id]
            job = running.get(t.job_id)
            if job is not None and job.attempt != t.attempt:
                job = None
            if job is None:  # the attempt ended in the database (recorded by the runner or judged elsewhere)
                if ray_status in ACTIVE:  # a runner exits just after recording; one that stays is stopped
                    t.ended_seen = t.ended_seen or now
                    if t.stop_sent is None and now - t.ended_seen >= self.options.exit_grace:
                        t.stop_sent = now
                        self.executor.stop(t.sid)
                    continue
                self._done(t)
                continue
            if ray_status not in ACTIVE:
                self._judge(t, ray_status, job.cancel_requested_at is not None)
                continue
            if ray_status == "PENDING":  # waiting for cluster resources: no runner yet to beat or to stop itself
                store.heartbeat(self.db, t.job_id, t.attempt)
                if job.cancel_requested_at is not None and t.stop_sent is None:
                    t.stop_sent = now
                    self.executor.stop(t.sid)
                continue
            silent = (utcnow() - job.heartbeat_at).total_seconds() if job.heartbeat_at else 0.0
            if silent > self.options.stale_after and t.killed_because is None:
                t.killed_because = (f"no heartbeat for {silent:.0f} s (limit {self.options.stale_after:g} s): the job "
                                    f"process hung; Ray job {t.sid} stopped")
                t.stop_sent = now
                self.executor.stop(t.sid)
                continue
            if job.cancel_requested_at is None:
                continue
            if t.cancel_seen is None:
                t.cancel_seen = now
            elif t.stop_sent is None and now - t.cancel_seen >= self.options.cancel_grace:
                t.stop_sent = now
                self.executor.stop(t.sid)
                store.add_event(self.db, t.job_id, f"no cooperative stop within {self.options.cancel_grace:g} s: "
                                f"cancel forwarded to Ray (stop_job {t.sid})", source="worker", level="warning",
                                attempt=t.attempt)

    def _judge(self, t: _Tracked, ray_status: str | None, cancel_requested: bool) -> None:
        """The Ray job ended (or vanished) while the database still says running."""
        outcome = JobStatus.INTERRUPTED if t.killed_because else map_status(ray_status, cancel_requested)
        logs = self._save_logs(t)
        tail = "\n".join(logs.splitlines()[-40:])
        if outcome == JobStatus.CANCELLED:
            store.mark_cancelled(self.db, t.job_id, t.attempt, f"Ray job {t.sid} stopped after the cancel request",
                                 source="worker")
        elif outcome == JobStatus.INTERRUPTED:
            if t.killed_because:
                reason = t.killed_because
            elif ray_status is None:
                reason = f"Ray no longer knows job {t.sid} (the cluster restarted?)"
            else:
                reason = f"Ray job {t.sid} was stopped outside the workbench"
            store.mark_interrupted(self.db, t.job_id, t.attempt, reason + "; resume continues from the last checkpoint")
        else:
            message = self.executor.message(t.sid) or f"Ray job {ray_status}"
            last = tail.splitlines()[-1] if tail else "(no output)"
            store.mark_failed(self.db, t.job_id, t.attempt,
                              f"the job process ended without recording a result (Ray: {message}): {last}", tail,
                              source="worker")
        log.info("job %s: Ray job %s %s -> %s", t.job_id, t.sid, ray_status, outcome.value)
        del self.tracked[t.job_id]

    def _done(self, t: _Tracked) -> None:
        self._save_logs(t)
        log.info("job %s: Ray job %s finished", t.job_id, t.sid)
        del self.tracked[t.job_id]

    def _save_logs(self, t: _Tracked) -> str:
        """Append the Ray job's output to the run folder's runner.log."""
        logs = self.executor.logs(t.sid)
        if logs:
            try:
                t.run_dir.mkdir(parents=True, exist_ok=True)
                with open(t.run_dir / "runner.log", "a", encoding="utf-8") as f:
                    f.write(f"--- Ray job {t.sid} ---\n{logs}")
            except OSError as exc:
                log.warning("could not write %s: %s", t.run_dir / "runner.log", exc)
        return logs

    # -- reconcile ----------------------------------------------------------------------------
    def reconcile(self) -> list[int]:
        """Adopt running jobs of Ray supervisors that are gone (or whose heartbeat went stale)."""
        adopted = []
        now = utcnow()
        for job in store.running_jobs(self.db):
            wid = job.worker_id or ""
            if job.id in self.tracked or wid == self.id or not wid.startswith(WORKER_PREFIX):
                continue
            owner = parse_worker_id(wid[len(WORKER_PREFIX):])
            owner_dead = owner is not None and owner[0] == self.host and not process_alive(owner[1], owner[2])
            beat = job.heartbeat_at or job.started_at
            stale = beat is None or now - beat > timedelta(seconds=self.options.stale_after)
            if not (owner_dead or stale):
                continue
            sid = submission_id(job.id, job.attempt)
            run_dir = self.db.workspace / f"runs/{job.id}"
            self.tracked[job.id] = _Tracked(job.id, job.attempt, sid, run_dir)
            store.add_event(self.db, job.id, f"Ray job {sid} adopted by supervisor {self.id} (previous supervisor "
                            f"{'gone' if owner_dead else 'silent'})", source="worker", attempt=job.attempt)
            adopted.append(job.id)
        if adopted:
            self.watch()
        return adopted
