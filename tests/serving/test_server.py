"""``lolcats serve EXPORT --port P``: vLLM's OpenAI-compatible endpoint answers a completion with the
workbench model's greedy tokens and log-probabilities; stopping the command stops the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error

import pytest

from serving.servers import free_port, request
from tests.serving.conftest import ENGINE_TIMEOUT_S, tiny_export, token_prompts
from tests.serving.reference import reference_logprobs

pytestmark = pytest.mark.serving


def wait_ready(url: str, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + ENGINE_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"lolcats serve exited ({process.returncode}):\n{log.read_text()[-4000:]}"
        try:
            request(f"{url}/v1/models")
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(2)
    pytest.fail(f"the server was not ready after {ENGINE_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def test_lolcats_serve_answers_an_openai_completion(python, serving_workspace, tmp_path):
    folder = tiny_export(serving_workspace, "served")
    port, log = free_port(), tmp_path / "server.log"
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", str(folder), "--port", str(port),
                                    "--max-model-len", "512", "--dtype", "float32"],
                                   stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log)
        prompt = token_prompts([40], seed=1)[0]
        answer = request(f"{url}/v1/completions", {"model": folder.name, "prompt": prompt, "max_tokens": 8,
                                                   "temperature": 0, "logprobs": 0, "return_tokens_as_token_ids": True})
        choice = answer["choices"][0]
        tokens = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
        greedy, logprobs, _ = reference_logprobs(folder)(prompt, tokens)
        assert tokens == greedy and answer["usage"]["completion_tokens"] == 8
        assert max(abs(a - b) for a, b in zip(logprobs, choice["logprobs"]["token_logprobs"])) < 1e-4
        assert "serving" in log.read_text() and "curl http://127.0.0.1" in log.read_text()
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(60)
    with pytest.raises(urllib.error.URLError):  # the server went with the command
        request(f"{url}/v1/models")
