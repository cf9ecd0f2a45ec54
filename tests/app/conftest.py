"""Fixtures of the workbench tests: a workspace seeded once per session with real jobs, fresh
workspaces for tests that change state, and AppTest instances bound to a workspace."""

from __future__ import annotations

import os

import pytest

from app import bench_results
from jobs.db import close_all
from tests.app.seed import Seeded, seed

ENV_VARS = ("LOLCATS_WORKSPACE", "LOLCATS_DB_URL", "LOLCATS_DB_BUSY_TIMEOUT", "LOLCATS_DB_RETRY_TIMEOUT",
            "LOLCATS_SUPERVISOR_PID", "LOLCATS_HEARTBEAT_INTERVAL")


@pytest.fixture(scope="session")
def seeded(tmp_path_factory) -> Seeded:
    saved = {v: os.environ.pop(v) for v in ENV_VARS if v in os.environ}
    try:
        return seed(tmp_path_factory.mktemp("seeded") / "ws")
    finally:
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    # pages read no measurement committed to the project unless a test provides one
    monkeypatch.setattr(bench_results, "SERVED_RESULT", tmp_path / "no-served-result.json")
    yield
    close_all()  # pooled connections of this test's workspaces (engines reconnect when used again)


@pytest.fixture
def fresh_ws(tmp_path, monkeypatch):
    """An empty workspace that the app under test uses."""
    path = tmp_path / "ws"
    path.mkdir()
    monkeypatch.setenv("LOLCATS_WORKSPACE", str(path))
    return path


@pytest.fixture
def seeded_ws(seeded, monkeypatch):
    """The seeded workspace, used by the app under test (tests must not change its jobs)."""
    monkeypatch.setenv("LOLCATS_WORKSPACE", str(seeded.workspace))
    return seeded
