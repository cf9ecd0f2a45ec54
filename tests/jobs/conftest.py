"""Fixtures for the job system tests: a fresh workspace per test, real worker processes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest

from jobs.db import close_all
from jobs_testutil import WorkerProc


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch):
    for var in ("LOLCATS_WORKSPACE", "LOLCATS_DB_URL", "LOLCATS_DB_BUSY_TIMEOUT", "LOLCATS_DB_RETRY_TIMEOUT",
                "LOLCATS_SUPERVISOR_PID", "LOLCATS_HEARTBEAT_INTERVAL"):
        monkeypatch.delenv(var, raising=False)
    yield
    close_all()


@pytest.fixture
def ws(tmp_path) -> Path:
    """A fresh workspace; at teardown, any process still running for it (worker, runner, helper
    started by a job: all carry the path in their command line) is killed, even after a failure."""
    path = tmp_path / "ws"
    path.mkdir()
    yield path
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.info["pid"] != os.getpid() and any(str(path) in arg for arg in proc.info["cmdline"] or []):
            try:
                proc.kill()
            except psutil.Error:
                pass


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A workspace holding a tiny-test run (runs/tiny) and the models it needs, built once per module."""
    from tests.tiny_runs import convert_tiny  # torch loads here, only for the modules that use it

    root = tmp_path_factory.mktemp("template")
    convert_tiny(root)
    return root


@pytest.fixture
def tiny_ws(ws, template):
    """A fresh workspace with a copy of the template's tiny-test run and models."""
    for part in ("models", "runs"):
        shutil.copytree(template / part, ws / part)
    return ws


@pytest.fixture
def start_worker(ws):
    """Start worker processes for ``ws``; any still alive at the end are stopped."""
    workers: list[WorkerProc] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProc:
        w = WorkerProc(ws, *args, env=env, name=f"worker{len(workers)}")
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.stop()
