"""The workbench's server records (``serving.servers``) without an engine: a record whose process
exited is dropped when read, a second start of a served export is refused, stop ends the process
group and removes the record. The engine itself: tests/serving/test_workbench_serve.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from serving import servers


def started(process: subprocess.Popen) -> subprocess.Popen:
    """``process`` once its command line is readable (empty for an instant after the start)."""
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    deadline = time.monotonic() + 10
    while not cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    return process


def stand_in() -> subprocess.Popen:
    """A process whose command line names the server module, as a live server's does."""
    return started(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-m",
                                     servers.SERVER_MODULE.decode()], start_new_session=True))


def record(folder: Path, name: str, pid: int) -> servers.Server:
    server = servers.Server(name=name, export=f"/exports/{name}", host="127.0.0.1", port=1, pid=pid,
                            log=str(folder / f"{name}.log"), started=0.0)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(asdict(server)))
    return server


def test_a_record_whose_process_exited_is_dropped(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record(tmp_path, "gone", int(done.stdout))
    process = stand_in()
    try:
        live = record(tmp_path, "live", process.pid)
        assert servers.running(tmp_path) == [live]
        assert not (tmp_path / "gone.json").exists()
    finally:
        process.kill()
        process.wait()
    assert servers.find(tmp_path, "live") is None and not (tmp_path / "live.json").exists()


def test_a_served_export_is_not_started_twice_and_stop_ends_it(tmp_path):
    process = stand_in()
    server = record(tmp_path / "servers", "demo", process.pid)
    with pytest.raises(RuntimeError, match=f"demo is already served at http://127.0.0.1:1/v1 \\(process {process.pid}\\)"):
        servers.start(tmp_path / "exports" / "demo", tmp_path / "servers")
    servers.stop(server, tmp_path / "servers", timeout=10)
    assert process.wait(10) is not None
    assert servers.running(tmp_path / "servers") == []


def test_a_process_that_is_no_server_is_not_taken_for_one(tmp_path):
    other = started(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
    try:
        record(tmp_path, "reused", other.pid)  # a process id the system gave to something else
        assert servers.running(tmp_path) == []
    finally:
        other.kill()
        other.wait()
