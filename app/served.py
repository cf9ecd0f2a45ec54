"""Exports served through vLLM from the workbench: the Serve panel of an export on the Jobs page
(start, stop, the endpoint's address, a curl line, the server's log) and the servers the Chat page
can ask. The servers outlive page runs and browser sessions: :mod:`serving.servers` keeps their
records in the workspace's ``servers/`` folder."""

from __future__ import annotations

import time
import urllib.error
from pathlib import Path

import streamlit as st

from app import common
from core.workspace import SERVERS_DIR
from serving import servers
from serving.launch import ServingEnvError, serving_python

MAX_MODEL_LEN = 4096  # the longest prompt plus answer a workbench-started server takes (the state does not grow)


def folder() -> Path:
    """Where the workspace's server records and logs live."""
    return common.workspace() / SERVERS_DIR


def running() -> list[servers.Server]:
    return servers.running(folder())


def stop_if_served(export_dir: Path) -> None:
    """Stop the server of ``export_dir`` if one runs (before its folder is deleted)."""
    if (server := servers.find(folder(), export_dir.resolve().name)) is not None:
        servers.stop(server, folder())


def answer(server: servers.Server, prompt: list[int], max_new_tokens: int, temperature: float, top_p: float) -> dict:
    """The server's answer to the token ids ``prompt`` as the Chat page shows answers (``text``,
    ``new_tokens``, ``seconds``), or ``error``: the server's own message where it gave one."""
    try:
        return servers.complete(server, prompt, max_new_tokens, temperature, top_p)
    except urllib.error.HTTPError as exc:
        return {"error": f"{server.url} answered {exc.code}: {exc.read().decode('utf-8', 'replace')[:500]}"}
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        return {"error": f"{server.url}: {exc}"}


def _tail(path: str, size: int = 6000) -> str:
    try:
        return Path(path).read_bytes()[-size:].decode("utf-8", "replace")
    except OSError:
        return ""


def _start(export_dir: Path) -> None:
    """The Serve button's callback: start the server, or leave the reason for the panel."""
    try:
        servers.start(export_dir, folder(), max_model_len=MAX_MODEL_LEN)
    except (RuntimeError, ValueError, OSError) as exc:
        st.session_state["serve_error"] = f"Could not serve {export_dir.name}: {exc}"


def _stop(server: servers.Server) -> None:
    servers.stop(server, folder())
    st.session_state["flash"] = f"Stopped serving {server.name}."


def panel(export_dir: Path, key: str) -> None:
    """Serve ``export_dir``: a Serve button, or the running server's state, address, curl line, log and
    a Stop button."""
    server = servers.find(folder(), export_dir.resolve().name)
    if server is None:
        try:
            serving_python()
        except ServingEnvError as exc:
            st.caption(f"Serving through vLLM needs its own environment: {exc}.")
            return
        st.button("Serve", key=f"serve_{key}", icon=":material/dns:", on_click=_start, args=(export_dir,),
                  help="Start vLLM's OpenAI-compatible server on this export (127.0.0.1, a free port), in the "
                       "background: it keeps running until stopped here.")
        if error := st.session_state.pop("serve_error", None):
            st.error(error, icon=":material/error:")
        return
    if servers.ready(server):
        st.success(f"Served at `{server.url}` as model `{server.name}`; the Chat page can ask it.", icon=":material/dns:")
        st.code(server.curl, language="bash")
    else:
        waited = common.fmt_duration(time.time() - server.started)
        st.info(f"Starting vLLM on `{server.url}` ({waited} so far; a minute or more on a CPU)...",
                icon=":material/hourglass_top:")
    st.button("Stop serving", key=f"serve_stop_{key}", icon=":material/stop_circle:", on_click=_stop, args=(server,))
    with st.expander("Server log (last lines)"):
        st.code(_tail(server.log) or "(nothing yet)", language=None)


@st.fragment(run_every=common.REFRESH_S)
def live_panel(export_dir: Path, key: str) -> None:
    """:func:`panel`, redrawn while the page is open (a server starting turns ready by itself)."""
    panel(export_dir, key)
