"""Chat generation for the workbench: one prompt, answered by the teacher and by the student.

Teacher and student are one model object (:func:`core.eval.metrics.teacher_context` switches it to the
original softmax attention with LoRA off, and an export to its base model's weights), so answers
are generated one after the other, each holding the model's lock; :func:`warm_up` runs both once,
untimed, so that the first timed answer does not pay the start-up costs alone. Tokens stream
through transformers' ``TextIteratorStreamer`` while
``generate`` runs in a helper thread.

A prompt that does not fit the context (``context_tokens - max_new_tokens``) is truncated, keeping
the end of the message, and :func:`prepare_prompt` returns a notice saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

STREAM_TIMEOUT_S = 600.0  # longest wait for the next token (another user may hold the model)
WARM_UP_TOKENS = 2  # tokens each model generates, untimed, before its first timed answer (prefill and decode run)


@dataclass
class Settings:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 0.9
    seed: int = 0


@dataclass
class Prepared:
    input_ids: Any  # [1, L] LongTensor
    prompt_tokens: int
    notice: str | None = None  # set when the message was truncated


@dataclass
class Answer:
    text: str = ""
    new_tokens: int = 0
    seconds: float = 0.0
    first_token_s: float | None = None
    cache_bytes: int | None = None  # KV cache (teacher) or recurrent state + window cache (student)
    peak_cuda_bytes: int | None = None
    error: str | None = None

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 and self.new_tokens else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def memory_crossover(teacher_cache_bytes: int, cached_tokens: int, student_cache_bytes: int) -> int | None:
    """The context length (tokens) at which the teacher's KV cache, which grows by the same number of
    bytes with every token, passes the student's recurrent state + window cache, which stays the same
    size once the window is full: ``student bytes / (teacher bytes / cached tokens)``, rounded up.
    None when either size is unknown or nothing was cached."""
    if not (teacher_cache_bytes and cached_tokens and student_cache_bytes):
        return None
    return math.ceil(student_cache_bytes * cached_tokens / teacher_cache_bytes)


def context_limit(model) -> int | None:
    """The model's maximum positions, if its config says."""
    config = getattr(model, "config", None)
    getter = getattr(config, "get_text_config", None)
    text_config = getter(decoder=True) if getter else config
    value = getattr(text_config, "max_position_embeddings", None)
    return int(value) if value else None


def prepare_prompt(tokenizer, message: str, context_tokens: int, max_new_tokens: int) -> Prepared:
    """Chat-template the message; if it does not fit ``context_tokens - max_new_tokens``, keep the
    end of the message (the question usually comes last) and say so."""
    import torch

    from core.eval.metrics import chat_prompt

    budget = context_tokens - max_new_tokens
    if budget < 8:
        raise ValueError(f"max new tokens ({max_new_tokens}) leaves no room for a prompt in a context of "
                         f"{context_tokens} tokens; lower max new tokens")
    text = chat_prompt(tokenizer, message)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= budget:
        return Prepared(torch.tensor([ids]), len(ids))
    message_ids = tokenizer(message, add_special_tokens=False)["input_ids"]
    overhead = len(ids) - len(message_ids)  # chat template around the message
    keep = budget - overhead - 4  # re-tokenising the cut can merge or split a few tokens
    if keep < 1:
        raise ValueError(f"the chat template alone takes {overhead} tokens, more than the {budget} the context "
                         "leaves for the prompt; lower max new tokens or raise the context")
    kept = tokenizer.decode(message_ids[-keep:], skip_special_tokens=True)
    ids = tokenizer(chat_prompt(tokenizer, kept), add_special_tokens=False)["input_ids"]
    if len(ids) > budget:  # never exceed the context, whatever the tokenizer did at the cut
        ids = ids[-budget:]
    notice = (f"Your message is {len(message_ids)} tokens, more than fits: the context is {context_tokens} tokens and "
              f"{max_new_tokens} are kept for the answer. Only the last {keep} tokens of the message were sent "
              f"({len(message_ids) - keep} dropped from the start).")
    return Prepared(torch.tensor([ids]), len(ids), notice)


def _cache_bytes(cache: Any) -> int | None:
    """Bytes the generation cache keeps alive (:func:`core.bench.cache_bytes`); None when it cannot
    be measured (an optional figure of the answer)."""
    from core.bench import cache_bytes

    try:
        return int(cache_bytes(cache))
    except Exception:  # noqa: BLE001 - optional figure
        return None


def stream_answer(loaded, prepared: Prepared, *, teacher: bool, settings: Settings,
                  answer: Answer | None = None) -> Iterator[str]:
    """Yield the answer text as it grows; ``answer`` (filled in place) holds the figures at the end.

    ``loaded`` has ``model``, ``tokenizer`` and ``lock`` (:class:`app.common.LoadedModel`).
    """
    import torch
    from transformers import TextIteratorStreamer

    from core.eval.metrics import teacher_context

    answer = answer if answer is not None else Answer()
    tok, model = loaded.tokenizer, loaded.model
    streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True, timeout=STREAM_TIMEOUT_S)
    state: dict[str, Any] = {}
    device = next(model.parameters()).device
    ids = prepared.input_ids.to(device)
    sample = settings.temperature > 0
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(settings.max_new_tokens),
                  do_sample=sample, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                  streamer=streamer, return_dict_in_generate=True)
    if sample:
        kwargs.update(temperature=float(settings.temperature), top_p=float(settings.top_p), top_k=None)

    def work() -> None:
        try:
            with loaded.lock:
                context = teacher_context(model) if teacher else contextlib.nullcontext()
                with context, torch.inference_mode():
                    torch.manual_seed(settings.seed)
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    state["t0"] = time.perf_counter()
                    out = model.generate(**kwargs)
                    state["seconds"] = time.perf_counter() - state["t0"]
                    state["new_tokens"] = int(out.sequences.shape[1] - ids.shape[1])
                    state["cache_bytes"] = _cache_bytes(getattr(out, "past_key_values", None))
                    if device.type == "cuda":
                        state["peak_cuda"] = int(torch.cuda.max_memory_allocated(device))
        except BaseException as exc:  # noqa: BLE001 - reported to the page, never lost in the thread
            state["error"] = f"{type(exc).__name__}: {exc}"
            streamer.end()

    thread = threading.Thread(target=work, name="chat-generate", daemon=True)
    thread.start()
    text = ""
    try:
        for chunk in streamer:
            if chunk and answer.first_token_s is None and "t0" in state:
                answer.first_token_s = time.perf_counter() - state["t0"]
            text += chunk
            answer.text = text
            yield text
    except Exception as exc:  # noqa: BLE001 - e.g. queue.Empty after STREAM_TIMEOUT_S
        state.setdefault("error", f"no token for {STREAM_TIMEOUT_S:.0f} s ({type(exc).__name__}); the model may be "
                                  "busy with another request")
    thread.join(timeout=5.0)
    answer.text = text
    answer.error = state.get("error")
    answer.new_tokens = state.get("new_tokens", 0)
    answer.seconds = state.get("seconds", 0.0)
    answer.cache_bytes = state.get("cache_bytes")
    answer.peak_cuda_bytes = state.get("peak_cuda")


def teacher_unavailable(loaded) -> str | None:
    """Why ``loaded`` has no true teacher to answer (an export whose base model cannot be loaded,
    :func:`core.export.teacher.teacher_problem`); None when it has one."""
    from core.export.teacher import teacher_problem

    with loaded.lock:
        return teacher_problem(loaded.model)


def generate_answer(loaded, prepared: Prepared, *, teacher: bool, settings: Settings) -> Answer:
    """The whole answer at once (scripts and tests)."""
    answer = Answer()
    for _ in stream_answer(loaded, prepared, teacher=teacher, settings=settings, answer=answer):
        pass
    return answer


def warm_up(loaded, prepared: Prepared, settings: Settings) -> None:
    """Generate :data:`WARM_UP_TOKENS` tokens of ``prepared`` as the teacher (when it is available) and as
    the student, untimed.

    One-time costs (kernel compilation and autotuning, allocator growth, lazy initialisation) then
    fall on neither timed answer, whichever goes first. A failure here is left to the timed answer
    to report.
    """
    short = dataclasses.replace(settings, max_new_tokens=WARM_UP_TOKENS)
    for teacher in ((True, False) if teacher_unavailable(loaded) is None else (False,)):
        generate_answer(loaded, prepared, teacher=teacher, settings=short)


__all__ = ["Settings", "Prepared", "Answer", "context_limit", "prepare_prompt", "stream_answer", "generate_answer",
           "teacher_unavailable", "warm_up"]
