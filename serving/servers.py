"""Servers the workbench keeps running: one vLLM OpenAI-compatible server per export, started in
the background, found again by any later page run, and stopped on request.

A server is a process group started by :func:`serving.launch.start_server` whose record,
``<folder>/<export name>.json`` (:class:`Server`), names its process id, address and log
(``<folder>/<export name>.log``). A record whose process has exited is dropped when read, so a
crashed server or a restarted machine leaves nothing stale behind. Standard library only (the
HTTP calls too: two small JSON requests do not justify a client library in both environments).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from serving.launch import curl_line, start_server

SERVER_MODULE = b"vllm.entrypoints.openai.api_server"  # in a live server's command line


@dataclass(frozen=True)
class Server:
    """One running server: ``export`` served at ``http://host:port/v1`` as model ``name``."""

    name: str
    export: str
    host: str
    port: int
    pid: int
    log: str
    started: float  # time.time() at start

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def curl(self) -> str:
        return curl_line(self.host, self.port, self.name)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def request(url: str, body: dict | None = None, timeout: float = 600) -> dict:
    """GET ``url`` (POST ``body`` as JSON when given) and read the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return json.loads(response.read())


def _record(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}.json"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is a live server (not exited, not a zombie, not a reused id)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0]:  # a child of this process that exited: reaped now
            return False
    except ChildProcessError:  # started by another process (an earlier page run, the command line)
        pass
    proc = Path(f"/proc/{pid}")
    if Path("/proc").is_dir():  # Linux: not a zombie, and not a reused id running something else
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, IndexError):
            return False
        return state != "Z" and (not cmdline or SERVER_MODULE in cmdline)  # empty: still starting
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def find(folder: str | os.PathLike, name: str) -> Server | None:
    """The running server of the export named ``name``; None (its stale record removed) otherwise."""
    path = _record(Path(folder), name)
    try:
        server = Server(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if _alive(server.pid):
        return server
    path.unlink(missing_ok=True)
    return None


def running(folder: str | os.PathLike) -> list[Server]:
    """Every running server with a record in ``folder``, by export name."""
    folder = Path(folder)
    found = (find(folder, path.stem) for path in sorted(folder.glob("*.json"))) if folder.is_dir() else ()
    return [server for server in found if server is not None]


def start(export_dir: str | os.PathLike, folder: str | os.PathLike, host: str = "127.0.0.1",
          port: int | None = None, **options) -> Server:
    """Start serving ``export_dir`` in the background (``options``: :func:`serving.launch.server_command`'s)
    and record it in ``folder``; ``port`` None picks a free one. A second start of the same export
    while its server runs: ``RuntimeError``. The server answers once :func:`ready`."""
    export_dir, folder = Path(export_dir).resolve(), Path(folder)
    name = export_dir.name
    if (server := find(folder, name)) is not None:
        raise RuntimeError(f"{name} is already served at {server.url} (process {server.pid})")
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    log = folder / f"{name}.log"
    with log.open("w") as out:
        process = start_server(export_dir, host, port, stdout=out, **options)
    server = Server(name=name, export=str(export_dir), host=host, port=port, pid=process.pid, log=str(log),
                    started=time.time())
    _record(folder, name).write_text(json.dumps(asdict(server), indent=2))
    return server


def ready(server: Server) -> bool:
    """Whether the server answers (its model list) now."""
    try:
        request(f"{server.url}/models", timeout=2)
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return False
    return True


def stop(server: Server, folder: str | os.PathLike, timeout: float = 30) -> None:
    """Stop the server and its engine processes (SIGTERM to its process group, SIGKILL after
    ``timeout`` seconds) and remove its record."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _record(Path(folder), server.name).unlink(missing_ok=True)


def complete(server: Server, prompt: list[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0) -> dict:
    """The server's completion of the token ids ``prompt``: ``text``, ``new_tokens``, ``seconds``
    (the request's wall time: prompt and answer together)."""
    started = time.perf_counter()
    answer = request(f"{server.url}/completions", {
        "model": server.name, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
        "top_p": top_p, "seed": seed})
    return {"text": answer["choices"][0]["text"], "new_tokens": answer["usage"]["completion_tokens"],
            "seconds": time.perf_counter() - started}


__all__ = ["Server", "complete", "find", "free_port", "ready", "request", "running", "start", "stop"]
