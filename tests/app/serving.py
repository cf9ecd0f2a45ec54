"""Start ``lolcats app`` as a real process on a free port and wait until the UI answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppProcess:
    """``python -m app.cli app --port P --workspace W``; output in ``log``."""

    def __init__(self, ws: Path, port: int | None = None, *args: str):
        self.ws, self.port = ws, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = ws.parent / f"app-{self.port}.log"
        self._out = open(self.log, "wb")
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        env.pop("LOLCATS_WORKSPACE", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "app", "--port", str(self.port), "--workspace", str(ws), *args],
            cwd=PROJECT_ROOT, stdout=self._out, stderr=subprocess.STDOUT, env=env)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"lolcats app exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the UI did not answer on {self.url} within {timeout} s:\n{self.output()[-3000:]}")

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=False)
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        return self.proc.returncode
