"""Fixtures of the deployment tests: a clean job environment for every test."""

from __future__ import annotations

import pytest

from jobs.db import close_all


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch):
    for var in ("LOLCATS_WORKSPACE", "LOLCATS_DB_URL", "LOLCATS_SUPERVISOR_PID", "LOLCATS_HEARTBEAT_INTERVAL",
                "LOLCATS_RAY_ADDRESS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    yield
    close_all()
