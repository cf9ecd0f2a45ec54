"""The workbench serves an export through vLLM: the Jobs page's Serve starts the server in the
background, shows its address and curl line once it answers, the Chat page asks it beside the
teacher and the student (greedy, the served model's answer is the student's), and Stop ends it."""

from __future__ import annotations

import time
import urllib.error

import pytest

from jobs.db import close_all
from serving import servers
from tests.app.apptest import button, open_page, texts, widget
from tests.serving.conftest import ENGINE_TIMEOUT_S, tiny_export

pytestmark = pytest.mark.serving


def wait_ready(server: servers.Server, folder) -> None:
    deadline = time.monotonic() + ENGINE_TIMEOUT_S
    while not servers.ready(server):
        log = open(server.log).read()[-4000:]
        assert servers.find(folder, server.name), f"the server exited:\n{log}"
        assert time.monotonic() < deadline, f"the server was not ready after {ENGINE_TIMEOUT_S} s:\n{log}"
        time.sleep(2)


def test_the_jobs_page_serves_an_export_and_the_chat_page_asks_it(python, tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    folder = tiny_export(ws, "served")
    monkeypatch.setenv("LOLCATS_WORKSPACE", str(ws))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    try:
        jobs = open_page("views/jobs.py")
        widget(jobs, "selectbox", "jobs_folder").set_value("exports/served").run()
        button(jobs, "serve_exports-served").click().run()
        assert not jobs.exception, [e.value for e in jobs.exception]
        (server,) = servers.running(ws / "servers")
        assert (server.name, server.export, server.host) == ("served", str(folder.resolve()), "127.0.0.1")
        wait_ready(server, ws / "servers")
        jobs.run()
        assert f"Served at `{server.url}` as model `served`" in texts(jobs) and server.curl in texts(jobs)

        chat = open_page("views/chat.py")
        widget(chat, "selectbox", "chat_conversion").set_value("exports/served").run()
        widget(chat, "number_input", "chat_max_new").set_value(12).run()
        widget(chat, "selectbox", "chat_served").set_value("served").run()
        chat.chat_input(key="chat_input").set_value("Tell me about the sea.").run()
        assert not chat.exception, [e.value for e in chat.exception]
        (exchange,) = chat.session_state["chat_history"][str(folder)]
        answer, student = exchange["served"], exchange["student"]
        assert "error" not in answer, answer
        assert answer["model"] == "served" and answer["new_tokens"] == student["new_tokens"] > 0
        assert answer["text"].split() == student["text"].split()
        assert "Served · vLLM" in texts(chat)

        button(jobs, "serve_stop_exports-served").click().run()
        assert servers.running(ws / "servers") == []
        with pytest.raises(urllib.error.URLError):
            servers.request(f"{server.url}/models", timeout=5)
    finally:
        for left in servers.running(ws / "servers"):
            servers.stop(left, ws / "servers")
        close_all()
