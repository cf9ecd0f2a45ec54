"""Chat page: one message, teacher and student answers side by side, truncation notice, and chat
(and heatmaps) while a conversion is running."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time

import pytest
import torch

from jobs import api
from tests.app.apptest import open_page, plotly_figures, texts, widget
from tests.app.seed import PROJECT_ROOT, tiny_convert_config

STATS = re.compile(r"(\d+) tokens in [\d.]+ s · [\d.]+ tok/s")


def _answers(at) -> list[str]:
    return [c.value for c in at.caption if STATS.search(c.value)]


def _send(at, message: str):
    at.chat_input(key="chat_input").set_value(message).run()
    assert not at.exception, [e.value for e in at.exception]


def test_both_models_answer_with_speed_and_memory(seeded_ws):
    at = open_page("views/chat.py")
    widget(at, "selectbox", "chat_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "number_input", "chat_max_new").set_value(12).run()
    _send(at, "What is two plus two?")
    answers = _answers(at)
    assert len(answers) == 2, texts(at)
    teacher, student = answers
    assert STATS.search(teacher).group(1) == "12" and "KV cache" in teacher
    assert STATS.search(student).group(1) == "12" and "state + window cache" in student
    body = texts(at)
    assert "Teacher · softmax attention" in body and "Student · LoLCATs attention" in body
    (exchange,) = at.session_state["chat_history"][str(seeded_ws.workspace / "runs" / str(seeded_ws.conversion))]
    cached = exchange["prompt_tokens"] + 12
    crossover = math.ceil(exchange["student"]["cache_bytes"] * cached / exchange["teacher"]["cache_bytes"])
    assert f"({cached} tokens here)" in body and f"passes the student's at about {crossover} tokens" in body
    assert "Each time is one run, not an average" in body
    at.run()  # the exchange stays on the page
    assert len(_answers(at)) == 2
    _send(at, "And three plus three?")
    assert len(_answers(at)) == 4


def test_both_models_warm_up_before_the_first_timed_answer(seeded_ws, monkeypatch):
    """The teacher answers first: untimed warm-up of both models keeps its first answer from paying
    the start-up costs alone, and the caption says what the times include."""
    from app import generation

    calls = []
    stream = generation.stream_answer

    def recording(loaded, prepared, *, teacher, settings, answer=None):
        calls.append(("teacher" if teacher else "student", settings.max_new_tokens))
        return stream(loaded, prepared, teacher=teacher, settings=settings, answer=answer)

    monkeypatch.setattr(generation, "stream_answer", recording)
    at = open_page("views/chat.py")
    widget(at, "selectbox", "chat_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "number_input", "chat_max_new").set_value(5).run()
    _send(at, "What is two plus two?")
    warm = generation.WARM_UP_TOKENS
    assert calls == [("teacher", warm), ("student", warm), ("teacher", 5), ("student", 5)]
    assert len(_answers(at)) == 2
    note = [c.value for c in at.caption if c.value.startswith("Times are wall-clock seconds")]
    assert len(note) == 1 and f"both models generated {warm} tokens untimed" in note[0]
    assert "\"First token\" includes reading the whole prompt" in note[0]
    _send(at, "And three plus three?")  # warmed once: the second message is timed straight away
    assert calls[4:] == [("teacher", 5), ("student", 5)]


@pytest.fixture
def generate_calls(monkeypatch):
    """Every ``generate`` call of the page: its sampling arguments and the tokens it returned."""
    from transformers.generation.utils import GenerationMixin

    calls = []
    real = GenerationMixin.generate

    def spy(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        settings = {k: kwargs.get(k) for k in ("do_sample", "temperature", "top_p")}
        calls.append((settings, out.sequences[0, kwargs["input_ids"].shape[1]:].tolist()))
        return out

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    return calls


def test_sampling_settings_are_used(seeded_ws, generate_calls):
    at = open_page("views/chat.py")
    widget(at, "selectbox", "chat_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "number_input", "chat_max_new").set_value(6).run()
    _send(at, "Say something.")  # greedy
    widget(at, "slider", "chat_temperature").set_value(1.0).run()
    widget(at, "slider", "chat_top_p").set_value(0.5).run()
    _send(at, "Say something.")
    _send(at, "Say something.")
    assert [STATS.search(a).group(1) for a in _answers(at)] == ["6"] * 6
    timed = generate_calls[2:]  # the first two calls are the untimed warm-up of teacher and student
    assert len(generate_calls) == 8
    settings = [c[0] for c in timed]
    assert settings == [{"do_sample": False, "temperature": None, "top_p": None}] * 2 + [
        {"do_sample": True, "temperature": 1.0, "top_p": 0.5}] * 4  # teacher and student per message
    tokens = [c[1] for c in timed]
    greedy, sampled, again = tokens[0:2], tokens[2:4], tokens[4:6]
    assert sampled == again  # the same seed: the same sample
    assert sampled[0] != greedy[0] and sampled[1] != greedy[1]  # sampling changed both answers


def test_long_prompt_is_truncated_with_a_visible_notice(seeded_ws):
    at = open_page("views/chat.py")
    widget(at, "number_input", "chat_context").set_value(128).run()
    widget(at, "number_input", "chat_max_new").set_value(8).run()
    _send(at, " ".join(f"w{i}" for i in range(300)))
    notices = [w.value for w in at.warning]
    assert any("context is 128 tokens" in n and "8 are kept for the answer" in n for n in notices), notices
    assert len(_answers(at)) == 2


def test_impossible_settings_say_what_to_change(seeded_ws):
    at = open_page("views/chat.py")
    widget(at, "number_input", "chat_context").set_value(64).run()
    widget(at, "number_input", "chat_max_new").set_value(64).run()
    _send(at, "Hello")
    assert any("lower max new tokens" in e.value for e in at.error)


@pytest.fixture
def running_conversion(seeded):
    """A real conversion running in a worker process on the seeded workspace; cancelled at the end."""
    ws = seeded.workspace
    config = tiny_convert_config(stage1={"steps": 100000, "eval_every": 1000})
    job = api.submit_job("convert", config, name="still-running", workspace=ws)
    cmd = [sys.executable, "-m", "jobs", "worker", "--workspace", str(ws), "--poll-interval", "0.2",
           "--cancel-grace", "2", "--kill-grace", "2"]
    log = open(ws.parent / "running-worker.log", "wb")
    worker = subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            info = api.get_job(job.id, workspace=ws)
            if info.status == "running" and info.progress_stage == "stage1":
                break
            assert not info.is_terminal, (info.status, info.error)
            assert time.monotonic() < deadline, "the conversion did not start training"
            time.sleep(0.5)
        yield info
    finally:
        api.cancel_job(job.id, workspace=ws)
        deadline = time.monotonic() + 60
        while not api.get_job(job.id, workspace=ws).is_terminal and time.monotonic() < deadline:
            time.sleep(0.3)
        worker.terminate()
        worker.wait(30)
        log.close()


def test_chat_and_heatmaps_work_while_a_conversion_runs(seeded_ws, running_conversion):
    at = open_page("views/chat.py")
    widget(at, "selectbox", "chat_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "number_input", "chat_max_new").set_value(8).run()
    _send(at, "Are you still there?")
    assert len(_answers(at)) == 2
    at = open_page("views/attention.py")
    widget(at, "selectbox", "attention_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "text_area", "attention_prompt").set_value("A different prompt while training runs").run()
    assert not at.exception and plotly_figures(at)
    info = api.get_job(running_conversion.id, workspace=seeded_ws.workspace)
    assert info.status == "running" and info.progress_step >= running_conversion.progress_step


def test_empty_state(fresh_ws):
    at = open_page("views/chat.py")
    assert "needs a finished conversion" in texts(at)
    assert not at.chat_input


def test_bfloat16_precision_answers_with_a_bfloat16_copy(seeded_ws, monkeypatch):
    """Precision bfloat16: both models answer from a bfloat16 copy of the conversion."""
    from app import common
    from core import load

    loads = []
    real = load.load_converted

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        loads.append((kwargs.get("dtype"), {p.dtype for p in out[0].parameters()}))
        return out

    monkeypatch.setattr(load, "load_converted", spy)
    common._load.clear()
    at = open_page("views/chat.py")
    widget(at, "selectbox", "chat_conversion").set_value(f"job:{seeded_ws.conversion}").run()
    widget(at, "number_input", "chat_max_new").set_value(6).run()
    widget(at, "radio", "chat_precision").set_value("bfloat16").run()
    _send(at, "What is two plus two?")
    assert len(_answers(at)) == 2, texts(at)
    assert loads[-1] == ("bfloat16", {torch.bfloat16})  # the answers came from the copy loaded last
    assert all(dtypes == {torch.float32} for dtype, dtypes in loads if dtype is None)
