"""The Ray executor: each claimed job attempt runs as one Ray job (Ray Jobs API).

Contract:
  * :class:`RayExecutor` wraps ``ray.job_submission.JobSubmissionClient``: ``submit`` starts
    ``python -m jobs.runner <id> --workspace W`` as Ray job ``lolcats-<id>-<attempt>`` with
    ``LOLCATS_DB_URL`` / ``LOLCATS_WORKSPACE`` in its runtime environment, so the runner on the
    cluster writes its heartbeats, metrics, events and outcome into the job database itself.
    ``status`` / ``stop`` / ``logs`` are the Ray job's status, ``stop_job`` and logs.
  * Under the shared supervision loop (:class:`jobs.supervisor.Supervisor`; the two together are
    :class:`RayWorker`, ``lolcats worker --executor ray``), every ``poll_interval``:
      - a job the runner ended itself (succeeded / failed / cancelled in the database) is done:
        its Ray logs are appended to ``runs/<id>/runner.log``; a Ray job still running
        ``exit_grace`` seconds after its attempt ended in the database is stopped (the database wins);
      - a Ray job that ended while the database still says ``running`` (the runner died without
        recording) is judged with :func:`map_status`: ``SUCCEEDED``/``FAILED`` -> ``failed`` with Ray's
        message and the log tail, ``STOPPED`` -> ``cancelled`` after a cancel request, else
        ``interrupted`` (resumable); a Ray job Ray no longer knows -> ``interrupted``;
      - cancel: the runner stops cooperatively at its next step (checkpoint kept); if it is still
        running ``cancel_grace`` seconds after the request, the cancel is forwarded as
        ``stop_job`` (terminate and kill are both ``stop_job``, which sends SIGTERM, then SIGKILL,
        to the job's process group on its node);
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.workspace import ENV_VAR as WORKSPACE_ENV
from jobs import store
from jobs.db import DB_URL_ENV, Database
from jobs.errors import JobsError
from jobs.models import JobStatus, utcnow
from jobs.runner import SUPERVISOR_ENV
from jobs.supervisor import (ALIVE, PENDING, Attempt, Poll, Supervisor, SupervisorOptions, owner_gone,
                             parse_worker_id)
from jobs.worker import PROJECT_ROOT

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
    """Submit, watch, stop and read the logs of job runners on a Ray cluster; the handle of an
    attempt is its submission id."""

    id_prefix = WORKER_PREFIX
    owns_processes = False  # the jobs keep running on the cluster when the supervisor stops
    transient_errors: tuple[type[BaseException], ...] = (OSError,)  # requests' connection errors too

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


    # -- the supervision loop's executor interface (jobs.supervisor.Executor) ----------------------
    def describe(self) -> str:
        return f"Ray Jobs API {self.address}"

    def start(self, db: Database, claim: store.Claim, supervisor_id: str) -> str | None:
        sid = submission_id(claim.job_id, claim.attempt)
        try:
            self.submit(claim.job_id, claim.attempt)
        except Exception as exc:  # noqa: BLE001 - any submission failure ends this attempt with its reason
            store.mark_failed(db, claim.job_id, claim.attempt,
                              f"could not submit the job to Ray at {self.address}: {exc}; check that the "
                              "cluster is up (`ray status`) and --ray-address", source="worker")
            return None
        store.add_event(db, claim.job_id, f"submitted to Ray at {self.address} as {sid}", source="worker",
                        attempt=claim.attempt)
        log.info("job %s attempt %s: Ray job %s", claim.job_id, claim.attempt, sid)
        return sid

    def poll(self, sid: str) -> Poll:
        ray_status = self.status(sid)
        if ray_status == "PENDING":  # waiting for cluster resources
            return PENDING
        if ray_status in ACTIVE:
            return ALIVE
        return Poll(ended=True, exit=ray_status)

    def terminate(self, sid: str) -> str:
        self.stop(sid)
        return f"cancel forwarded to Ray (stop_job {sid})"

    def kill(self, sid: str) -> str:
        self.stop(sid)
        return f"Ray job {sid} stopped"

    def collect(self, attempt: Attempt) -> None:
        self.save_logs(attempt)

    def judge(self, db: Database, attempt: Attempt, ray_status: str | None, cancel_requested: bool) -> None:
        """The Ray job ended (or vanished) while the database still says running."""
        sid = attempt.handle
        outcome = JobStatus.INTERRUPTED if attempt.killed_because else map_status(ray_status, cancel_requested)
        logs = self.save_logs(attempt)
        tail = "\n".join(logs.splitlines()[-40:])
        if outcome == JobStatus.CANCELLED:
            store.mark_cancelled(db, attempt.job_id, attempt.attempt, f"Ray job {sid} stopped after the cancel request",
                                 source="worker")
        elif outcome == JobStatus.INTERRUPTED:
            if attempt.killed_because:
                reason = f"{attempt.killed_because}; Ray job {sid} stopped"
            elif ray_status is None:
                reason = f"Ray no longer knows job {sid} (the cluster restarted?)"
            else:
                reason = f"Ray job {sid} was stopped outside the workbench"
            store.mark_interrupted(db, attempt.job_id, attempt.attempt,
                                   reason + "; resume continues from the last checkpoint")
        else:
            message = self.message(sid) or f"Ray job {ray_status}"
            last = tail.splitlines()[-1] if tail else "(no output)"
            store.mark_failed(db, attempt.job_id, attempt.attempt,
                              f"the job process ended without recording a result (Ray: {message}): {last}", tail,
                              source="worker")
        log.info("job %s: Ray job %s %s -> %s", attempt.job_id, sid, ray_status, outcome.value)

    def save_logs(self, attempt: Attempt) -> str:
        """Append the Ray job's output to the run folder's runner.log."""
        sid = attempt.handle
        logs = self.logs(sid)
        if logs:
            try:
                attempt.run_dir.mkdir(parents=True, exist_ok=True)
                with open(attempt.run_dir / "runner.log", "a", encoding="utf-8") as f:
                    f.write(f"--- Ray job {sid} ---\n{logs}")
            except OSError as exc:
                log.warning("could not write %s: %s", attempt.run_dir / "runner.log", exc)
        return logs

    def reconcile(self, supervisor: Supervisor) -> list[int]:
        """Adopt running jobs of Ray supervisors that are gone (or whose heartbeat went stale)."""
        db = supervisor.db
        adopted = []
        now = utcnow()
        for job in store.running_jobs(db):
            wid = job.worker_id or ""
            if job.id in supervisor.tracked or wid == supervisor.id or not wid.startswith(WORKER_PREFIX):
                continue
            owner = parse_worker_id(wid[len(WORKER_PREFIX):])
            owner_dead = owner_gone(owner, supervisor.host)
            if not (owner_dead or job.silent_seconds(now) > supervisor.options.stale_after):
                continue
            sid = submission_id(job.id, job.attempt)
            supervisor.tracked[job.id] = Attempt(job.id, job.attempt, sid, db.workspace / f"runs/{job.id}")
            store.add_event(db, job.id, f"Ray job {sid} adopted by supervisor {supervisor.id} (previous supervisor "
                            f"{'gone' if owner_dead else 'silent'})", source="worker", attempt=job.attempt)
            adopted.append(job.id)
        if adopted:
            supervisor.watch()
        return adopted


@dataclass
class RayWorkerOptions(SupervisorOptions):
    address: str = DEFAULT_ADDRESS  # the head's dashboard (Jobs API) address
    kill_grace: float | None = None  # stop_job escalates from SIGTERM to SIGKILL by itself
    # a Ray job still running this long after its attempt ended in the database is stopped (the database wins)
    exit_grace: float | None = 30.0
    python: str = "python"  # the interpreter on the cluster nodes
    remote_workspace: str | None = None  # the workspace path on the nodes (default: the same as here)
    num_cpus: float | None = None  # Ray resources reserved for each job's entrypoint
    num_gpus: float | None = None


class RayWorker(Supervisor):
    """``lolcats worker --executor ray``: the supervision loop over a :class:`RayExecutor`
    (``concurrency``: jobs submitted at once; the cluster queues beyond its resources)."""

    def __init__(self, db: Database, options: RayWorkerOptions | None = None, executor: RayExecutor | None = None):
        options = options or RayWorkerOptions()
        if executor is None:
            executor = RayExecutor(
                options.address, db_url=db.url, workspace=options.remote_workspace or str(db.workspace),
                python=options.python, num_cpus=options.num_cpus, num_gpus=options.num_gpus)
        super().__init__(db, options, executor)
        if db.url.startswith("sqlite") and not any(h in options.address for h in ("127.0.0.1", "localhost")):
            log.warning("the job database is SQLite (%s): jobs on other nodes can only reach it through a shared "
                        "filesystem; use PostgreSQL (LOLCATS_DB_URL) for a real cluster", db.url)
