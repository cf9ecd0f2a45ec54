"""Chat: the same message answered by the teacher (original softmax attention) and the student
(LoLCATs attention) of a finished conversion, side by side, with speed and memory per answer; and,
when an export is served through vLLM (the Jobs page's Serve), the served model's answer beside them.

Works while a conversion runs: it reads the finished run folder and never touches the worker.
"""

from __future__ import annotations

import os

import streamlit as st

from app import common, generation, served

WHO = {"teacher": "Teacher · softmax attention", "student": "Student · LoLCATs attention", "served": "Served · vLLM"}
AVATAR = {"teacher": ":material/school:", "student": ":material/bolt:", "served": ":material/dns:"}
MEMORY_LABEL = {"teacher": "KV cache", "student": "state + window cache"}
PRECISIONS = {"as trained": None, "bfloat16": "bfloat16"}  # label -> dtype given to load_converted
TIMING_NOTE = (
    "Times are wall-clock seconds of each model's own generation, one model after the other on this machine. "
    f"Before the first timed answer both models generated {generation.WARM_UP_TOKENS} tokens untimed, so neither "
    "time includes start-up costs (kernel compilation, memory allocation). \"First token\" includes reading the "
    "whole prompt; tok/s counts every new token over the whole answer. Each time is one run, not an average: on a "
    "busy machine the same answer can take several times longer a moment later (the Benchmark page repeats its "
    "measurements and reports their spread)."
)


def _memory_note(ex: dict) -> None:
    """The two memory figures in context: the teacher's KV cache grows with the context, the
    student's state stays the same size, and where the two meet (:func:`app.generation.memory_crossover`)."""
    teacher, student = ex.get("teacher") or {}, ex.get("student") or {}
    cached = ex.get("prompt_tokens", 0) + teacher.get("new_tokens", 0)
    crossover = generation.memory_crossover(teacher.get("cache_bytes"), cached, student.get("cache_bytes"))
    if crossover is None:
        return
    per_token = common.fmt_bytes(teacher["cache_bytes"] / cached)
    where = ("so for this short exchange the teacher's is still the smaller" if cached < crossover
             else "so here the student's is already the smaller")
    st.caption(f"Memory: the teacher's KV cache grows by {per_token} with every token ({cached} tokens here); the "
            f"student's recurrent state + window cache stays the same size however long the context. The teacher's "
            f"passes the student's at about {crossover} tokens, {where}.")


def _busy_warning() -> None:
    """A warning when the machine's load exceeds its cores: the times then measure the crowd."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:
        st.warning(f"This machine is busy (load {load:.1f} on {cores} cores): these times are noisy, and one "
                   "answer can take several times longer than the same answer later.", icon=":material/speed:")


def _stats(who: str, a: dict) -> str:
    if a.get("error"):
        return ""
    parts = [f"{a['new_tokens']} tokens in {a['seconds']:.2f} s"]
    if a["new_tokens"] and a["seconds"] > 0:
        parts.append(f"{a['new_tokens'] / a['seconds']:.1f} tok/s")
    if a.get("first_token_s") is not None:
        parts.append(f"first token after {a['first_token_s']:.2f} s")
    if a.get("cache_bytes") is not None:
        parts.append(f"{MEMORY_LABEL[who]} {common.fmt_bytes(a['cache_bytes'])}")
    if a.get("peak_cuda_bytes") is not None:
        parts.append(f"peak GPU memory {common.fmt_bytes(a['peak_cuda_bytes'])}")
    return " · ".join(parts)


def _show_answer(who: str, a: dict) -> None:
    with st.chat_message("assistant", avatar=AVATAR[who]):
        st.markdown(f"**{WHO[who]}**" + (f" `{a['model']}`" if a.get("model") else ""))
        if a.get("unavailable"):
            st.warning(f"Teacher unavailable: {a['unavailable']}", icon=":material/school:")
        elif a.get("error"):
            st.error(f"Generation failed: {a['error']}")
        else:
            st.markdown(a["text"].strip() or "_(empty answer: only whitespace or special tokens)_")
            st.caption(_stats(who, a))


def _show_exchange(ex: dict) -> None:
    with st.chat_message("user"):
        st.markdown(ex["message"])
    if ex.get("notice"):
        st.warning(ex["notice"], icon=":material/content_cut:")
    who_answered = [who for who in WHO if who in ex]
    for col, who in zip(st.columns(len(who_answered)), who_answered):
        with col:
            _show_answer(who, ex[who])
    _memory_note(ex)


def _settings(limit: int | None) -> tuple[generation.Settings, int]:
    with st.expander("Generation settings", expanded=False):
        c1, c2, c3, c4 = st.columns(4)
        max_new = c1.number_input("Max new tokens", min_value=1, max_value=2048, value=64, step=16, key="chat_max_new")
        temperature = c2.slider("Temperature", 0.0, 2.0, 0.0, 0.05, key="chat_temperature",
                                help="0 = greedy (the same answer every time)")
        top_p = c3.slider("Top-p", 0.05, 1.0, 0.9, 0.05, key="chat_top_p", help="used when temperature > 0")
        top = limit or 4096
        context = c4.number_input("Context (tokens)", min_value=16, max_value=top, value=top, step=256,
                                  key="chat_context", help="the model's maximum positions; longer prompts are "
                                                           "truncated with a notice")
        st.caption("Both answers use the same settings and seed. Each message is answered on its own (no "
                   "conversation memory), so both models see exactly the same prompt. They are generated one after "
                   "the other on the same weights: the teacher is the converted model with its original attention "
                   "and LoRA off.")
    return generation.Settings(int(max_new), float(temperature), float(top_p)), int(context)


def _answer_live(lm, prepared, who: str, settings) -> dict:
    answer = generation.Answer()
    with st.chat_message("assistant", avatar=AVATAR[who]):
        st.markdown(f"**{WHO[who]}**")
        slot = st.empty()
        slot.markdown("_waiting for the model..._")
        for text in generation.stream_answer(lm, prepared, teacher=who == "teacher", settings=settings, answer=answer):
            slot.markdown(text + " ▌")
        a = answer.to_dict()
        if a.get("error"):
            slot.error(f"Generation failed: {a['error']}")
        else:
            slot.markdown(a["text"].strip() or "_(empty answer: only whitespace or special tokens)_")
            st.caption(_stats(who, a))
    return a


def _served_choice() -> served.servers.Server | None:
    """A model served through vLLM (started on the Jobs page) to ask as well, if the user picks one."""
    live = {server.name: server for server in served.running()}
    if not live:
        return None
    pick = st.selectbox("Also ask a served model", ["none", *live], key="chat_served",
                        help="An export served through vLLM (the Jobs page's Serve): it answers the same prompt "
                             "tokens with the same settings. Served from the same export as this student, greedy, "
                             "its answer is the student's.")
    return live.get(pick)


def _answer_served(server, prepared, settings) -> dict:
    with st.chat_message("assistant", avatar=AVATAR["served"]):
        st.markdown(f"**{WHO['served']}** `{server.name}`")
        with st.spinner(f"Asking {server.url}..."):
            a = served.answer(server, prepared.input_ids[0].tolist(), settings.max_new_tokens, settings.temperature,
                              settings.top_p)
        if a.get("error"):
            st.error(f"The served model failed: {a['error']}")
        else:
            st.markdown(a["text"].strip() or "_(empty answer: only whitespace or special tokens)_")
            st.caption(_stats("served", a) + " (over HTTP, prompt included)")
    return {**a, "model": server.name}


def _warm_up_once(lm, prepared, settings) -> None:
    """:func:`app.generation.warm_up` before this session's first timed answer from ``lm``."""
    warm = st.session_state.setdefault("chat_warm_models", set())
    if id(lm) in warm:
        return
    with st.spinner("Warming up both models (untimed), so that neither answer pays the start-up costs..."):
        generation.warm_up(lm, prepared, settings)
    warm.add(id(lm))


def main() -> None:
    st.title("Chat")
    st.caption("One message, two answers: the original model (teacher) and its linearized version (student).")
    jobs = common.conversions()
    if not jobs:
        common.no_conversion_notice("Chat", "chat_demo")
        return
    job = common.conversion_picker(jobs, "chat_conversion")
    precision = st.radio("Precision", list(PRECISIONS), horizontal=True, key="chat_precision",
                         help="bfloat16 holds the weights in half the memory, at bfloat16's precision (its speed "
                              "depends on the CPU's bfloat16 support); both models use the same")
    try:
        lm = common.loaded_model(job, PRECISIONS[precision])
    except Exception as exc:  # noqa: BLE001 - a run folder that cannot be loaded: say why
        st.error(f"Could not load {job.title} from {job.run_dir}: {exc}")
        return
    settings, context = _settings(generation.context_limit(lm.model))
    server = _served_choice()
    history = st.session_state.setdefault("chat_history", {}).setdefault(str(job.run_dir), [])
    if history and st.button("Clear the conversation", key="chat_clear", icon=":material/delete:"):
        history.clear()
    for ex in history:
        _show_exchange(ex)
    message = st.chat_input("Message both models", key="chat_input")
    if not message:
        if history:
            st.caption(TIMING_NOTE)
        else:
            st.info("Type a message below: the teacher answers first, then the student, token by token.")
        return
    with st.chat_message("user"):
        st.markdown(message)
    try:
        prepared = generation.prepare_prompt(lm.tokenizer, message, context, settings.max_new_tokens)
    except ValueError as exc:
        st.error(str(exc))
        return
    if prepared.notice:
        st.warning(prepared.notice, icon=":material/content_cut:")
    exchange = {"message": message, "notice": prepared.notice, "prompt_tokens": prepared.prompt_tokens}
    _warm_up_once(lm, prepared, settings)
    cols = st.columns(3 if server else 2)
    unavailable = generation.teacher_unavailable(lm)
    for col, who in zip(cols, ("teacher", "student")):
        with col:
            if who == "teacher" and unavailable:
                exchange[who] = {"unavailable": unavailable}
                _show_answer(who, exchange[who])
            else:
                exchange[who] = _answer_live(lm, prepared, who, settings)
    if server:
        with cols[2]:
            exchange["served"] = _answer_served(server, prepared, settings)
    history.append(exchange)
    _memory_note(exchange)
    _busy_warning()
    st.caption(TIMING_NOTE)


main()
