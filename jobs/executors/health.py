"""Health check of a job worker: ``python -m jobs.executors.health [--workspace W] [--db-url URL]``.

Healthy (exit 0, one line on stdout) when all of these hold:
  * the job database answers (schema version read);
  * a worker process (``lolcats worker`` / ``python -m jobs worker``) for this workspace runs on
    this host (in a container: in this container);
  * every job a worker of this host is running has a heartbeat younger than ``--stale-after``
    seconds (the runner beats every 2 s; a silent job means a hung runner or a stuck worker).
Otherwise exit 1 with the reason. Used as the worker's Docker health check.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from pathlib import Path

import psutil

from core.workspace import ENV_VAR as WORKSPACE_ENV

from jobs import store
from jobs.db import DB_URL_ENV, open_db, schema_version
from jobs.executors.ray_jobs import WORKER_PREFIX
from jobs.models import utcnow
from jobs.supervisor import parse_worker_id


def _is_worker(cmdline: list[str]) -> bool:
    """``... lolcats worker ...``, ``python -m jobs worker ...`` (and the same with ``jobs.cli``)."""
    for i, arg in enumerate(cmdline[:-1]):
        if cmdline[i + 1] == "worker" and (os.path.basename(arg) == "lolcats" or arg in ("jobs", "jobs.cli")):
            return True
    return False


def _workspace_of(proc: psutil.Process, cmdline: list[str]) -> Path | None:
    """The workspace a worker process serves: ``--workspace``/``-w``, else its ``LOLCATS_WORKSPACE``,
    else ``./workspace`` of its working directory (as :func:`core.workspace.workspace_root` resolves it)."""
    for i, arg in enumerate(cmdline):
        if arg in ("--workspace", "-w") and i + 1 < len(cmdline):
            value = cmdline[i + 1]
            break
        if arg.startswith("--workspace="):
            value = arg.split("=", 1)[1]
            break
    else:
        try:
            value = proc.environ().get(WORKSPACE_ENV) or "workspace"
        except psutil.Error:
            return None
    try:
        return (Path(proc.cwd()) / Path(value).expanduser()).resolve()
    except psutil.Error:
        return None


def worker_pids(workspace: Path | None = None) -> list[int]:
    """Worker processes on this host (serving ``workspace``, when given)."""
    me = os.getpid()
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.info["pid"] == me or not _is_worker(cmdline):
                continue
            if workspace is None or _workspace_of(proc, cmdline) == workspace.resolve():
                pids.append(proc.info["pid"])
        except psutil.Error:
            continue
    return pids


def check(workspace: str | None = None, db_url: str | None = None, stale_after: float = 60.0) -> tuple[bool, str]:
    try:
        db = open_db(workspace, db_url)
        version = schema_version(db)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the database is the answer
        return False, f"job database unreachable: {exc}"
    pids = worker_pids(db.workspace)
    if not pids:
        return False, f"no worker process (lolcats worker) for the workspace {db.workspace} runs on this host"
    host = socket.gethostname()
    now = utcnow()
    ours = 0
    for job in store.running_jobs(db):
        owner = parse_worker_id((job.worker_id or "").removeprefix(WORKER_PREFIX))
        if owner is None or owner[0] != host:
            continue
        ours += 1
        silent = job.silent_seconds(now)
        if silent > stale_after:
            return False, f"job {job.id} has had no heartbeat for {silent:.0f} s (limit {stale_after:g} s)"
    return True, f"ok: worker pid {', '.join(map(str, pids))}; database schema v{version}; {ours} running job(s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.executors.health", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default=None)
    parser.add_argument("--db-url", default=os.environ.get(DB_URL_ENV))
    parser.add_argument("--stale-after", type=float, default=60.0)
    args = parser.parse_args(argv)
    ok, message = check(args.workspace, args.db_url, args.stale_after)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
