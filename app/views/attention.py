"""Attention: teacher vs student attention weights of one layer and head for a short prompt.

Rows are queries, columns keys; the causal upper triangle is blank; teacher, student and
|difference| share one colour scale (log scale: attention sinks on the first token no longer
wash out the rest). Computed in this process on the finished conversion (loaded once).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from app import common
from app.charts import attention as charts
from core.io import read_json_object
from core.run_folder import REPORT_FILE

MAX_TOKENS = 256  # heatmaps are L x L per head: keep prompts short in the UI process
# Longer than two windows of the recipe (64): inside the window the student computes exact softmax,
# so teacher and student can only differ on keys older than the window.
DEFAULT_PROMPT = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk. He carried a small brass lamp, a "
    "notebook, and a flask of tea that his daughter had made for him. At the top he wiped the great lens, checked "
    "the oil, and wrote the weather in his notebook: wind from the west, a light rain, three fishing boats "
    "returning to the harbour. Then he lit the lamp and watched the beam sweep across the dark water. Years "
    "later, when the light was automated and the keeper had moved to a cottage in the village, his daughter "
    "found the notebooks in a wooden chest. Page after page recorded the wind, the rain and the boats, and on "
    "the last page of the last notebook he had written a single line: the sea was calm tonight, and every boat "
    "came home. She read it aloud to her own children, who asked what the keeper had seen from the top of the "
    "tower, and she told them"
)


@st.cache_data(show_spinner=False, max_entries=32)
def _maps(run_dir: str, stamp: float, prompt: str, layer: int) -> dict:
    """Attention maps of ``layer`` for ``prompt`` (cached per conversion, prompt and layer)."""
    import torch

    from core.attention.inspection import attention_maps
    from core.models.token_text import token_texts

    job_model = common._load(run_dir, stamp, str(common.workspace()))
    tok = job_model.tokenizer
    ids = tok(prompt, return_tensors="pt")["input_ids"][0]
    truncated = max(int(ids.shape[0]) - MAX_TOKENS, 0)
    ids = ids[:MAX_TOKENS]
    with job_model.lock, torch.no_grad():
        maps = attention_maps(job_model.model, ids, layer)
    return {"teacher": maps.teacher.float().numpy(), "student": maps.student.float().numpy(),
            "converted": maps.converted, "tokens": token_texts(tok, ids.tolist()), "truncated": truncated}


def _layers_info(job) -> tuple[int, list[int]]:
    lm = common.loaded_model(job)
    from core.attention.surgery import decoder_layers
    from core.train.lora import base_model

    n = len(decoder_layers(base_model(lm.model)))
    kept = common.softmax_layers(job)
    return n, kept


def _worst_layer(job, kept: list[int]) -> int | None:
    """The converted layer with the highest final attention MSE in the conversion's report (where
    the student departs most from the teacher), None without one."""
    result = job.result or read_json_object(job.run_dir / REPORT_FILE)
    mse = (result or {}).get("per_layer_mse")
    scored = [(v, i) for i, v in enumerate(mse if isinstance(mse, list) else [])
              if i not in kept and isinstance(v, (int, float))]
    return max(scored)[1] if scored else None


def _window_note(job, n_tokens: int, converted: bool) -> None:
    """Where teacher and student can differ: only on keys older than the softmax window."""
    attn = job.config.get("attention", {})
    kind, w = attn.get("kind"), attn.get("window_size")
    if not converted or kind not in ("sliding_window", "terraced") or not w:
        return
    first = w if kind == "sliding_window" else 2 * w
    how = (f"the last {w} keys" if kind == "sliding_window"
           else f"the keys of the current and the previous tile of {w} tokens")
    text = (f"The student gives exact softmax weights to {how}; older keys go through the linear (feature map) "
            f"part, so teacher and student can differ only from query {first} on.")
    if n_tokens <= first:
        st.info(text + f" This prompt has {n_tokens} tokens, all inside the window: use a longer prompt (more than "
                f"{first} tokens) to see the difference.")
    else:
        st.caption(text)


def main() -> None:
    st.title("Attention")
    st.caption("Teacher (softmax) vs student (LoLCATs) attention weights for a short prompt: rows are queries, "
               "columns are keys; future keys are masked.")
    jobs = common.conversions()
    if not jobs:
        common.no_conversion_notice("The Attention view", "attention_demo")
        return
    job = common.conversion_picker(jobs, "attention_conversion")
    try:
        n_layers, kept = _layers_info(job)
    except Exception as exc:  # noqa: BLE001 - a run folder that cannot be loaded: say why
        st.error(f"Could not load {job.title} from {job.run_dir}: {exc}")
        return
    prompt = st.text_area("Prompt", value=DEFAULT_PROMPT, key="attention_prompt", height=110,
                          help=f"Short prompts only: the first {MAX_TOKENS} tokens are shown.")
    c1, c2, c3 = st.columns([2, 2, 2])
    worst = _worst_layer(job, kept)
    layer = c1.selectbox("Layer", list(range(n_layers)), key=f"attention_layer~{job.tag}", index=worst or 0,
                         format_func=lambda i: f"layer {i}" + (" (kept as softmax)" if i in kept else "")
                         + (" (highest final MSE)" if i == worst else ""),
                         help="Opens on the converted layer with the highest final attention MSE: where the "
                              "student departs most from the teacher.")
    scale = c3.radio("Colour scale", ["linear", "log"], horizontal=True, key="attention_scale",
                     help="log: attention sinks (the first token) no longer dominate the colours")
    if not prompt.strip():
        st.info("Type a prompt to see its attention maps.")
        return
    report_file = job.run_dir / "report.json"
    stamp = report_file.stat().st_mtime if report_file.exists() else 0.0
    with st.spinner("Computing attention maps..."):
        try:
            maps = _maps(str(job.run_dir), stamp, prompt, int(layer))
        except ValueError as exc:
            st.error(str(exc))
            return
    heads = maps["teacher"].shape[0]
    head = c2.selectbox("Head", list(range(heads)), key="attention_head", format_func=lambda h: f"head {h}")
    if maps["truncated"]:
        st.warning(f"The prompt is {maps['truncated']} tokens longer than the {MAX_TOKENS} tokens this view "
                   f"shows; only its first {MAX_TOKENS} tokens are used.")
    if not maps["converted"]:
        st.info(f"Layer {layer} was kept as softmax attention: teacher and student are identical there.")
    _window_note(job, len(maps["tokens"]), maps["converted"])
    teacher, student = maps["teacher"][head], maps["student"][head]
    diff = np.abs(student - teacher)
    m1, m2, m3 = st.columns(3)
    m1.metric("Mean |difference| (causal part)", f"{diff[np.tril_indices(diff.shape[0])].mean():.2e}")
    m2.metric("Max |difference|", f"{diff.max():.3g}")
    m3.metric("Tokens", len(maps["tokens"]))
    fig = charts.attention_heatmaps(teacher, student, maps["tokens"], log=scale == "log",
                                    title=f"Layer {layer}, head {head}")
    st.plotly_chart(fig, key="attention_heatmaps")
    with st.expander("All heads of this layer (|student − teacher|)"):
        all_diff = np.abs(maps["student"] - maps["teacher"])
        st.plotly_chart(charts.head_grid(all_diff, log=scale == "log", title=f"Layer {layer}: |difference| per head"),
                        key="attention_heads")


main()
