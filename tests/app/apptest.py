"""Helpers to drive the workbench with Streamlit's AppTest (in process, no browser)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py"
TIMEOUT = 120  # seconds per script run: a first run loads a model


def open_page(page: str | None = None) -> AppTest:
    """The app, run once, then switched to ``page`` (``"views/jobs.py"``) and run again."""
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if page is not None:
        at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """Every piece of text on the page (markdown, captions, alerts, code, titles, metrics), joined."""
    parts = []
    for kind in ("title", "header", "subheader", "markdown", "caption", "info", "warning", "error", "success",
                 "code", "text", "json", "toast"):
        for el in at.get(kind):
            parts.append(str(getattr(el, "value", "") or getattr(el, "body", "")))
    for m in at.get("metric"):
        parts.append(f"{m.label}: {m.value}")
    return "\n".join(parts)


def _decode(obj):
    """Plotly JSON with typed arrays (``{"dtype", "bdata", "shape"}``) turned into plain lists."""
    if isinstance(obj, dict):
        if "bdata" in obj and "dtype" in obj:
            arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=np.dtype(obj["dtype"]))
            if obj.get("shape"):
                arr = arr.reshape([int(n) for n in str(obj["shape"]).split(",")])
            return arr.tolist()
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def plotly_figures(at: AppTest) -> list[dict]:
    """The figures of every ``st.plotly_chart`` on the page, as plotly JSON dicts."""
    out = []
    for el in at.get("plotly_chart"):
        proto = el.proto
        spec = proto.spec if getattr(proto, "spec", None) else proto.figure.spec
        out.append(_decode(json.loads(spec)))
    return out


def widget(at: AppTest, kind: str, key: str):
    """The ``kind`` widget keyed ``key``, or ``key~<n>`` (the Launch form keys a field's widget by
    the field and the form's filling)."""
    for w in getattr(at, kind):
        if w.key == key or (w.key or "").startswith(key + "~"):
            return w
    raise AssertionError(f"no {kind} with key {key!r}; keys: {[w.key for w in getattr(at, kind)]}")


def button(at: AppTest, label_or_key: str):
    for b in at.button:
        if b.key == label_or_key or b.label == label_or_key:
            return b
    raise AssertionError(f"no button {label_or_key!r}; buttons: {[(b.key, b.label) for b in at.button]}")


def column_format(table, column: str) -> str | None:
    """The printf-style format an ``st.dataframe`` element gives ``column`` (None: Streamlit's default)."""
    config = json.loads(table.proto.columns or "{}").get(column, {})
    return config.get("type_config", {}).get("format")
