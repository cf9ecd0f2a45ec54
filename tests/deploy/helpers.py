"""Helpers of the deployment tests: waiting, free local ports, a throw-away Ray head."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil

from tests.jobs.jobs_testutil import wait_for  # noqa: F401  (re-exported for the deploy tests)

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class RayHead:
    """A one-node Ray cluster on 127.0.0.1 only, started for a test and stopped by process id.

    ``ray start --head --block`` keeps the launcher in the foreground; stopping terminates exactly
    the process tree it started (what ``ray stop`` would do, without touching any other Ray on the
    machine). ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes every Ray component bind to the
    loopback address instead of the machine's network address; usage statistics are off."""

    def __init__(self, num_cpus: int = 1):
        gcs, dashboard, client, agent_http, agent_grpc, runtime_env, metrics = free_ports(7)
        self.address = f"http://127.0.0.1:{dashboard}"
        self.temp_dir = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # short: Ray's socket paths have a length limit
        self.log = Path(self.temp_dir) / "head.log"
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                    "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)}
        ray = shutil.which("ray", path=self.env["PATH"]) or "ray"
        cmd = [ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
               "--port", str(gcs), "--dashboard-port", str(dashboard), "--ray-client-server-port", str(client),
               "--dashboard-agent-listen-port", str(agent_http), "--dashboard-agent-grpc-port", str(agent_grpc),
               "--runtime-env-agent-port", str(runtime_env), "--metrics-export-port", str(metrics),
               "--num-cpus", str(num_cpus), "--include-dashboard", "true", "--disable-usage-stats",
               "--temp-dir", self.temp_dir]
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.temp_dir, stdin=subprocess.DEVNULL, start_new_session=True)
        self.tree: dict[int, psutil.Process] = {}

    def wait_ready(self, timeout: float = 90.0) -> str:
        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"ray start exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.address + "/api/version", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(up, timeout, what="the Ray head's Jobs API", interval=0.5)
        return self.address

    def remember_processes(self) -> None:
        """Record the head's process tree (call while it runs: workers may sit in their own groups)."""
        try:
            for p in [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]:
                self.tree[p.pid] = p
        except psutil.NoSuchProcess:
            pass

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        self.remember_processes()
        procs = list(self.tree.values())
        for p in procs:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self._out.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
