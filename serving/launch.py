"""Starting vLLM's OpenAI-compatible server on an export, from the project's own environment.

vLLM runs in its own environment, ``.venv-serving`` (``scripts/setup-serving.sh``): the CPU build
of vLLM pins an older transformers than the project. This module imports neither; it checks the
export folder (:mod:`serving.spec`), finds the serving interpreter and starts
``python -m vllm.entrypoints.openai.api_server`` there (the ``vllm`` command of the CPU build
looks for a distribution named ``vllm`` and fails).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from serving.spec import read_export_config

ROOT = Path(__file__).resolve().parents[1]
SERVING_PYTHON_ENV = "LOLCATS_SERVING_PYTHON"  # another serving interpreter than ROOT/.venv-serving
SETUP_HINT = "bash scripts/setup-serving.sh"


class ServingEnvError(RuntimeError):
    """The serving environment is missing or broken; the message names the fix."""


def serving_python() -> Path:
    """The serving environment's interpreter: ``$LOLCATS_SERVING_PYTHON``, else ``.venv-serving``
    of the project; :class:`ServingEnvError` when it is not there."""
    python = Path(os.environ.get(SERVING_PYTHON_ENV) or ROOT / ".venv-serving" / "bin" / "python")
    if not python.exists():
        raise ServingEnvError(f"the serving environment is missing ({python} not found): run `{SETUP_HINT}` "
                              "in the project folder (a few minutes, about 3.5 GB)")
    return python


def server_command(export_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 8000,
                   dtype: str = "auto", max_model_len: int | None = None) -> list[str]:
    """The command line that serves ``export_dir`` (checked first: :func:`serving.spec.read_export_config`)
    at ``http://host:port/v1``, the model named by its folder's name. ``max_model_len``: the longest
    prompt plus completion, at most the model's positions (``max_position_embeddings``, the default)."""
    config = read_export_config(export_dir)
    length = min(filter(None, (max_model_len, config.get("max_position_embeddings"))), default=None)
    command = [str(serving_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(export_dir),
               "--served-model-name", Path(export_dir).resolve().name, "--host", host, "--port", str(port),
               "--dtype", dtype]
    return command + (["--max-model-len", str(length)] if length else [])


def server_env() -> dict[str, str]:
    """The environment of the server process: this one, with vLLM's CPU cache size (GiB) set to 1
    unless given (``VLLM_CPU_KVCACHE_SPACE``; vLLM's default, 4, is more than a small model needs)."""
    return {"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ}


def start_server(export_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 8000, *,
                 stdout=None, **options) -> subprocess.Popen:
    """Start the server (:func:`server_command`) in its own process group; stop it with
    :func:`stop_server`."""
    return subprocess.Popen(server_command(export_dir, host, port, **options), env=server_env(), stdout=stdout,
                            stderr=subprocess.STDOUT if stdout is not None else None, start_new_session=True)


def stop_server(process: subprocess.Popen, timeout: float = 30) -> None:
    """Stop a server :func:`start_server` started, with its engine processes (its process group)."""
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def curl_line(host: str, port: int, name: str) -> str:
    """A shell command that asks the server at ``host:port`` serving model ``name`` for a completion."""
    return (f"curl http://{host}:{port}/v1/completions -H 'Content-Type: application/json' "
            f"-d '{{\"model\": \"{name}\", \"prompt\": \"Hello\", \"max_tokens\": 16}}'")


def serve(export_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 8000, say=print, **options) -> int:
    """Serve ``export_dir`` until interrupted (Ctrl-C or SIGTERM, which stop the server too); the
    server's exit status."""
    import signal

    process = start_server(export_dir, host, port, **options)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that the server is stopped below
    say(f"serving {export_dir} at http://{host}:{port}/v1 (OpenAI-compatible; Ctrl-C stops it); try\n"
        f"  {curl_line(host, port, Path(export_dir).resolve().name)}")
    try:
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_server(process)
