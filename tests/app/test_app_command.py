"""``lolcats app``: worker + UI in their own process groups, bound to 127.0.0.1, stopped together."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request

import psutil
import pytest
from typer.testing import CliRunner

from app.cli import app as cli
from app.server import ui_command
from jobs import api
from tests.app.serving import AppProcess, free_port

pytestmark = pytest.mark.slow  # the app command with its worker and UI processes


def test_help_lists_the_options():
    result = CliRunner().invoke(cli, ["app", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--workspace", "--no-worker"):
        assert option in result.output


def test_ui_command_is_headless_and_private():
    cmd = ui_command("127.0.0.1", 8765)
    args = dict(zip(cmd, cmd[1:]))
    assert args["--server.address"] == "127.0.0.1" and args["--server.port"] == "8765"
    assert args["--server.headless"] == "true" and args["--browser.gatherUsageStats"] == "false"
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("app/streamlit_app.py")


def test_port_in_use_is_one_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(cli, ["app", "--port", str(port), "--workspace", str(tmp_path / "ws")])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output and "pass --port" in result.output


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_app_runs_worker_and_ui_and_stops_both(tmp_path):
    ws = tmp_path / "ws"
    app = AppProcess(ws, free_port())
    try:
        app.wait_ready()
        with urllib.request.urlopen(app.url, timeout=5) as r:
            assert r.status == 200
        kids = app.children()
        cmds = {" ".join(k.cmdline()): k for k in kids}
        worker = next(k for c, k in cmds.items() if "jobs worker" in c)
        ui = next(k for c, k in cmds.items() if "streamlit run" in c)
        for proc in (worker, ui):
            assert os.getpgid(proc.pid) == proc.pid  # its own process group
        assert f"--workspace {ws}" in " ".join(worker.cmdline())
        listening = [c.laddr for c in ui.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening)
        # the worker really runs jobs of this workspace
        job = api.submit_job("selftest", {"steps": 2}, workspace=ws)
        _wait(lambda: api.get_job(job.id, workspace=ws).status == "succeeded", 60, "the selftest job")
    finally:
        code = app.stop(signal.SIGTERM)
    assert code == 0, app.output()[-2000:]
    for proc in (worker, ui):
        _wait(lambda: not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, 30, f"process {proc.pid}")
    assert "stopping the UI and the worker" in app.output()


def test_killed_app_takes_its_children_along(tmp_path):
    app = AppProcess(tmp_path / "ws", free_port())
    try:
        app.wait_ready()
        kids = app.children()
        assert len(kids) == 2
    finally:
        app.stop(signal.SIGKILL)
    for proc in kids:
        _wait(lambda: not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, 30, f"process {proc.pid}")
