"""``lolcats app``: the job worker and the Streamlit UI, started and stopped together.

* The worker is ``lolcats worker --workspace W`` (run as ``python -m jobs worker``, the same command
  without importing the conversion library into the supervisor) in a subprocess with its own process group; if it
  dies on its own it is restarted (a few times, then the app stops with a message).
* The UI is ``streamlit run app/streamlit_app.py`` bound to ``--host`` (127.0.0.1 by default, so
  it is not reachable from other machines) and ``--port``, headless, without usage statistics,
  in its own process group too.
* Both get ``LOLCATS_WORKSPACE`` = the workspace. On Linux both are also told to exit if this
  process dies (``PR_SET_PDEATHSIG``), so a killed app leaves nothing behind.
* SIGINT / SIGTERM, or the UI exiting, stops everything: the worker gets SIGTERM (it interrupts its
  running jobs, which stay resumable) and SIGKILL if it is still there after ``STOP_GRACE_S``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from core.workspace import ENV_VAR as WORKSPACE_ENV
from core.workspace import workspace_root

PROJECT_ROOT = Path(__file__).resolve().parent.parent
APP_SCRIPT = Path(__file__).resolve().parent / "streamlit_app.py"
STOP_GRACE_S = 20.0  # the worker's own shutdown: SIGTERM to its jobs, then SIGKILL after its kill_grace
MAX_WORKER_RESTARTS = 5


class AppError(Exception):
    """A problem starting the app (port taken, ...): the message names the cause and the fix."""


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGTERM when the parent dies (Linux only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise AppError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); another program uses the port: "
                           "pass --port with a free one") from None


def ui_command(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP_SCRIPT),
            "--server.address", host, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
            "--server.runOnSave", "false", "--global.developmentMode", "false",
            "--client.toolbarMode", "viewer"]


def worker_command(root: Path) -> list[str]:
    return [sys.executable, "-m", "jobs", "worker", "--workspace", str(root)]


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[WORKSPACE_ENV] = str(root)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    return env


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    return subprocess.Popen(cmd, env=env, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=preexec)


def _stop(proc: subprocess.Popen | None, grace: float) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL it after ``grace`` seconds, reap."""
    if proc is None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    try:  # leftovers of the group (the leader exited first)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def serve(host: str = "127.0.0.1", port: int = 8501, workspace: str | os.PathLike | None = None,
          worker: bool = True, say=print) -> int:
    """Run worker + UI until interrupted or the UI exits; returns the exit code."""
    root = workspace_root(workspace)
    check_port(host, port)
    env = _env(root)
    stop: list[str] = []

    def on_signal(signum, _frame):
        stop.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    worker_proc = ui_proc = None
    restarts: list[float] = []
    code = 0
    try:
        if worker:
            worker_proc = _start(worker_command(root), env)
        ui_proc = _start(ui_command(host, port), env)
        shown = "localhost" if host in ("127.0.0.1", "::1") else host
        say(f"LoLCATs Workbench on http://{shown}:{port} (workspace {root}); Ctrl-C stops the app and its worker.")
        while not stop:
            if ui_proc.poll() is not None:
                code = ui_proc.returncode
                say(f"the UI process exited with code {code}; stopping")
                break
            if worker_proc is not None and worker_proc.poll() is not None:
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < 300] + [now]
                if len(restarts) > MAX_WORKER_RESTARTS:
                    say(f"the worker exited {len(restarts)} times in 5 minutes (last code {worker_proc.returncode}); "
                        "stopping. Run `lolcats worker` by hand to see why.")
                    code = 1
                    break
                say(f"the worker exited with code {worker_proc.returncode}; restarting it")
                worker_proc = _start(worker_command(root), env)
            time.sleep(0.3)
        if stop:
            say(f"{stop[0]}: stopping the UI and the worker")
    finally:
        _stop(ui_proc, 10.0)
        _stop(worker_proc, STOP_GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code
