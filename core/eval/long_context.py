"""Quality by context length: teacher, student and two training-free baselines on long held-out text.

A linear state is worth having only if it holds beyond the training length, and only if it beats
what needs no training at all: the teacher's own softmax over a short window plus sink tokens
(:mod:`core.eval.window_baseline`). For ``n`` contiguous held-out sequences of the longest length
L_max (the bundled KJV sample unless ``data.eval_text`` names a file; the conversion trains on
other data), one forward pass per model and sequence gives every token's next-token NLL and
greedy prediction. The figures at a shorter length L read the first L tokens of the same
sequences, which a causal model scores exactly as a sequence of length L:

    ratio(L)         = exp(mean_{t < L} nll_student - mean_{t < L} nll_teacher)   (= ppl_student / ppl_teacher)
    ratio[a, b)      = the same over the predicted positions a <= t < b (a position bucket)
    top1_agreement(L) = mean_{t < L} [argmax student_t == argmax teacher_t]

for the student and for each baseline. The frontier adds sliding windows of ``frontier_windows``
keys (plus the sinks) to the memory-matched one, each at its key/value bytes per layer, one forward
pass each per sequence (a window that covers the longest sequence is the teacher and is left out).

Verdicts (:class:`core.eval.long_context_result.Verdict`) compare the student with each baseline,
and with the frontier read at the student's own state bytes, at every length, with a margin from
the measurement's own noise (:func:`paired_margin`). A passkey grid (lengths x depths, ``trials``
keys per cell) scores teacher, student and both baselines the same way, by one forward pass each:
a cell's trial counts when greedy decoding would produce the key, i.e. every answer token is the
argmax of the logits before it.
"""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from core.attention.surgery import lolcats_modules
from core.config import LongContextSpec
from core.data import held_out_source, load_blocks
from core.eval.long_context_result import (FRONTIER, MEMORY_MATCHED, STUDENT, WINDOW, FrontierAt, LongContextResult,
                                           Verdict, curve_weights, equal_quality_bytes)
from core.eval.metrics import teacher_context
from core.eval.window_baseline import WindowBaseline, baselines, window_softmax
from core.progress import NullProgress, ProgressCallback
from core.run_folder import LONG_CONTEXT, LONG_CONTEXT_PASSKEY
from core.train.lora import base_model

BUCKET_EDGES = (0, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
NOISE_BLOCK = 64  # predicted positions per block of the paired noise estimate (paired_margin)
MIN_AUTO_LENGTH = 256
PASSKEY_MIN_LENGTH = 512


def auto_lengths(seq_len: int, limit: int | None) -> list[int]:
    """Powers of two from min(256, seq_len) to 8 x seq_len (and seq_len itself), at most ``limit``."""
    top = 8 * seq_len if limit is None else min(8 * seq_len, limit)
    lengths = {seq_len, *_doublings(min(MIN_AUTO_LENGTH, seq_len), top)}
    return sorted(n for n in lengths if n <= top) or [top]


def resolve_lengths(spec: LongContextSpec, seq_len: int, limit: int | None) -> tuple[list[int], list[int]]:
    """The evaluation lengths and passkey lengths the spec asks for, none above the model's positions."""
    lengths = auto_lengths(seq_len, limit) if spec.lengths == "auto" else list(spec.lengths)
    if limit is not None:
        lengths = [n for n in lengths if n <= limit]
    if not lengths:
        raise ValueError(f"no evaluation length fits the model's {limit} positions: {spec.lengths}")
    if spec.passkey_lengths == "auto":
        keys = _doublings(PASSKEY_MIN_LENGTH, lengths[-1]) or [lengths[-1]]
    else:
        keys = [n for n in spec.passkey_lengths if limit is None or n <= limit]
    return lengths, keys


def model_positions(model: nn.Module) -> int | None:
    return getattr(base_model(model).config.get_text_config(decoder=True), "max_position_embeddings", None)


@torch.no_grad()
def next_token_logits(model: nn.Module, ids: torch.Tensor, last: int = 0) -> torch.Tensor:
    """Logits that predict the last ``last`` tokens of one sequence ``ids`` [L] (0: every token
    after the first), ``[last or L - 1, V]``: one forward pass without a cache, whose LM head runs
    on those positions only (over every position, a vocabulary of tens of thousands makes the head
    a large part of a long pass)."""
    device = next(model.parameters()).device
    keep = last + 1 if last else 0  # transformers' logits_to_keep: 0 keeps every position
    return model(input_ids=ids[None].to(device), use_cache=False, logits_to_keep=keep).logits[0, :-1]


@torch.no_grad()
def token_scores(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token NLL and greedy prediction at every position of one sequence ``ids`` [L]:
    two [L - 1] tensors (float64, long), one forward pass without a cache."""
    logits = next_token_logits(model, ids).float()
    nll = F.cross_entropy(logits, ids[1:].to(logits.device), reduction="none").double().cpu()
    return nll, logits.argmax(-1).cpu()


def held_out_sequences(tokenizer, length: int, count: int, eval_text: str = "bundled") -> torch.Tensor:
    """``count`` contiguous sequences [count, length] of the held-out text (the bundled KJV sample,
    or ``eval_text``), consecutive and non-overlapping; refused when the text is too short."""
    source = held_out_source(eval_text)
    blocks = load_blocks(source, tokenizer, format="text", seq_len=length)
    have = blocks.as_dict()["input_ids"]
    if have.shape[0] < count:
        raise ValueError(f"the held-out text {source!r} has {have.shape[0]} sequence(s) of {length} tokens, "
                         f"{count} asked: lower eval.long_context.sequences or the longest length")
    return have[:count]


def _ratio(nll: torch.Tensor, ref: torch.Tensor) -> float:
    return math.exp(float(nll.mean() - ref.mean()))


def summarise(scores: dict[str, tuple[torch.Tensor, torch.Tensor]], lengths: list[int]) -> dict:
    """Per-length and per-bucket figures from every model's ``(nll, top1)`` [n, L_max - 1]; the
    key ``teacher`` is the reference, every other key a model compared with it."""
    t_nll, t_top = scores["teacher"]
    others = [name for name in scores if name != "teacher"]
    by_length = []
    for L in lengths:
        row = {"length": L, "teacher_ppl": math.exp(float(t_nll[:, : L - 1].mean()))}
        for name in others:
            nll, top = scores[name]
            row[name] = {"ppl": math.exp(float(nll[:, : L - 1].mean())), "ratio": _ratio(nll[:, : L - 1], t_nll[:, : L - 1]),
                         "top1_agreement": float((top[:, : L - 1] == t_top[:, : L - 1]).double().mean())}
        by_length.append(row)
    by_position = []
    longest = lengths[-1] - 1  # predicted positions 0 .. L_max - 2 (position t predicts token t + 1)
    for a, b in zip(BUCKET_EDGES, BUCKET_EDGES[1:]):
        if a >= longest:
            break
        b = min(b, longest)
        row = {"start": a, "end": b, "teacher_ppl": math.exp(float(t_nll[:, a:b].mean()))}
        for name in others:
            row[name] = _ratio(scores[name][0][:, a:b], t_nll[:, a:b])
        by_position.append(row)
    return {"by_length": by_length, "by_position": by_position}


def paired_margin(diff: torch.Tensor, length: int) -> float:
    """Twice the standard error of ``mean(diff[:, :length - 1])``, the paired per-token NLL
    difference [n, L_max - 1] of two models on the same tokens (nats): the sequences' first
    ``length - 1`` predicted positions are cut into blocks of :data:`NOISE_BLOCK` (a shorter last
    block is dropped), and the standard error is the block means' standard deviation over the
    square root of their count (blocks, not tokens, since neighbouring tokens' differences are
    correlated); with fewer than two whole blocks, the tokens' own standard error."""
    d = diff[:, : length - 1]
    whole = d.shape[1] // NOISE_BLOCK
    values = d[:, : whole * NOISE_BLOCK].reshape(-1, NOISE_BLOCK).mean(1) if d.shape[0] * whole >= 2 else d.reshape(-1)
    if values.numel() < 2:
        return 0.0
    return 2.0 * float(values.std() / math.sqrt(values.numel()))


def judge(scores: dict[str, tuple[torch.Tensor, torch.Tensor]], lengths: list[int], names: list[str]) -> list[Verdict]:
    """The student against each model of ``names`` at every length, with :func:`paired_margin`."""
    t_nll, s_nll = scores["teacher"][0], scores[STUDENT][0]
    return [Verdict.judge(name, L, _ratio(s_nll[:, : L - 1], t_nll[:, : L - 1]),
                          _ratio(scores[name][0][:, : L - 1], t_nll[:, : L - 1]),
                          paired_margin(s_nll - scores[name][0], L))
            for name in names for L in lengths]


def frontier(scores: dict[str, tuple[torch.Tensor, torch.Tensor]], lengths: list[int],
             windows: list[WindowBaseline], kv_bytes_per_token: int, student_bytes: int) -> tuple[dict, list[Verdict]]:
    """The frontier section (:class:`core.eval.long_context_result.Frontier`) of the sliding
    ``windows`` whose scores are in ``scores`` under their names, and the student's verdicts against
    the curve at ``student_bytes``: the curve's log ratio there is a weighted sum of two windows'
    log ratios, so the student is compared token by token with the same weighted sum of their NLLs."""
    windows = sorted(windows, key=lambda b: b.window)
    point_bytes = [(b.window + b.sinks) * kv_bytes_per_token for b in windows]
    t_nll, s_nll = scores["teacher"][0], scores[STUDENT][0]
    points = [{"window": b.window, "sinks": b.sinks, "bytes_per_layer": n,
               "ratios": [_ratio(scores[b.name][0][:, : L - 1], t_nll[:, : L - 1]) for L in lengths]}
              for b, n in zip(windows, point_bytes)]
    mixed = sum(w * scores[windows[i].name][0] for i, w in curve_weights(point_bytes, student_bytes))
    at, verdicts = [], []
    for j, L in enumerate(lengths):
        curve = _ratio(mixed[:, : L - 1], t_nll[:, : L - 1])
        student = _ratio(s_nll[:, : L - 1], t_nll[:, : L - 1])
        at.append(FrontierAt(length=L, curve_ratio=curve, equal_quality_bytes=equal_quality_bytes(
            point_bytes, [p["ratios"][j] for p in points], student)).model_dump())
        verdicts.append(Verdict.judge(FRONTIER, L, student, curve, paired_margin(s_nll - mixed, L)))
    return {"points": points, "student_bytes": student_bytes, "at": at}, verdicts


FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the pass key? The pass key is"


def passkey_prompt(tokenizer, length: int, depth: float, key: int) -> str:
    """About ``length`` tokens of filler with the needle at fraction ``depth`` (appendix protocol)."""
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    header = "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it. "
    per_filler = max(len(tokenizer(FILLER, add_special_tokens=False)["input_ids"]), 1)
    budget = length - len(tokenizer(header + needle + QUESTION, add_special_tokens=False)["input_ids"])
    n_fill = max(budget // per_filler, 0)
    before = int(round(n_fill * depth))
    return header + FILLER * before + needle + FILLER * (n_fill - before) + QUESTION


def passkey_item(tokenizer, length: int, depth: float, key: int) -> tuple[torch.Tensor, int]:
    """``(ids, answer_start)``: the passkey prompt with the key's tokens appended."""
    prompt = tokenizer(passkey_prompt(tokenizer, length, depth, key), return_tensors="pt")["input_ids"][0]
    answer = tokenizer(f" {key}", add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    return torch.cat([prompt, answer]), prompt.shape[0]


def passkey_hit(model: nn.Module, ids: torch.Tensor, answer_start: int) -> bool:
    """Whether greedy decoding after ``ids[:answer_start]`` produces ``ids[answer_start:]`` (the LM
    head on the answer's positions only, :func:`next_token_logits`)."""
    logits = next_token_logits(model, ids, ids.shape[0] - answer_start)
    return bool((logits.argmax(-1).cpu() == ids[answer_start:]).all())


def passkey_grid(model: nn.Module, tokenizer, spec: LongContextSpec, lengths: list[int], contexts: dict,
                 seed: int, progress: ProgressCallback) -> dict:
    """Accuracy [len(lengths)][len(depths)] per model of ``contexts`` (name -> context manager factory)."""
    rng = random.Random(seed)
    items = [[[passkey_item(tokenizer, n, depth, rng.randint(10000, 99999)) for _ in range(spec.passkey_trials)]
              for depth in spec.passkey_depths] for n in lengths]
    total = len(contexts) * len(lengths) * len(spec.passkey_depths) * spec.passkey_trials
    done, grid = 0, {}
    for name, context in contexts.items():
        with context():
            rows = []
            for cells in items:
                row = []
                for trials in cells:
                    hits = 0
                    for ids, start in trials:
                        hits += passkey_hit(model, ids, start)
                        done += 1
                        progress.on_step(LONG_CONTEXT_PASSKEY, done, total, {})
                    row.append(hits / max(len(trials), 1))
                rows.append(row)
            grid[name] = rows
    return {"lengths": lengths, "depths": list(spec.passkey_depths), "trials": spec.passkey_trials, "accuracy": grid}


def long_context_report(model: nn.Module, tokenizer, spec: LongContextSpec, seq_len: int, eval_text: str = "bundled",
                        seed: int = 0, progress: ProgressCallback | None = None) -> dict | None:
    """The ``long_context`` section of a report (see the module docstring), as
    :class:`core.eval.long_context_result.LongContextResult` dumps it; ``seq_len`` is the
    training block length, which ``"auto"`` lengths are relative to. None for a model with no
    converted layer (nothing differs from the teacher)."""
    if not lolcats_modules(base_model(model)):
        return None
    progress = progress or NullProgress()
    t0 = time.perf_counter()
    lengths, key_lengths = resolve_lengths(spec, seq_len, model_positions(model))
    lengths, dropped = _fit_budget(model, tokenizer, spec, lengths, key_lengths, eval_text)
    key_lengths = [n for n in key_lengths if n <= lengths[-1]]
    seqs = held_out_sequences(tokenizer, lengths[-1], spec.sequences, eval_text)
    chosen, sizes = baselines(model)
    curve = frontier_windows(chosen, spec.frontier_windows, lengths[-1])
    windows = {b.name: b for b in [*chosen, *curve]}
    contexts = {"teacher": lambda: teacher_context(model), STUDENT: nullcontext,
                **{name: (lambda b=b: window_softmax(model, b)) for name, b in windows.items()}}
    scores, done = {}, 0
    for name, context in contexts.items():
        with context():
            per_seq = []
            for ids in seqs:
                per_seq.append(token_scores(model, ids))
                done += 1
                progress.on_step(LONG_CONTEXT, done, len(contexts) * len(seqs), {})
        scores[name] = (torch.stack([s[0] for s in per_seq]), torch.stack([s[1] for s in per_seq]))
    summary = summarise({k: scores[k] for k in ("teacher", STUDENT, *(b.name for b in chosen))}, lengths)
    on_curve, frontier_verdicts = frontier(scores, lengths, [windows[b.name] for b in curve],
                                           sizes["kv_bytes_per_token"], sizes["state_bytes"])
    report = {
        "text": held_out_source(eval_text),
        "sequences": spec.sequences,
        "lengths": lengths,
        "dropped_lengths": dropped,
        "train_seq_len": seq_len,
        "baselines": {b.name: {"kind": b.kind, "window": b.window, "sinks": b.sinks, "label": b.label} for b in chosen},
        "state_bytes_per_layer": sizes["state_bytes"],
        "kv_bytes_per_token": sizes["kv_bytes_per_token"],
        **summary,
        "verdicts": [v.model_dump() for v in [*judge(scores, lengths, [b.name for b in chosen]), *frontier_verdicts]],
        "frontier": on_curve,
    }
    if spec.passkey_trials and key_lengths:
        report["passkey"] = passkey_grid(model, tokenizer, spec, key_lengths,
                                         {k: contexts[k] for k in ("teacher", STUDENT, WINDOW, MEMORY_MATCHED)},
                                         seed, progress)
    report["seconds"] = time.perf_counter() - t0
    return LongContextResult.model_validate(report).model_dump(mode="json")


def frontier_windows(chosen: list[WindowBaseline], sizes: list[int], longest: int) -> list[WindowBaseline]:
    """The frontier's sliding windows: the memory-matched baseline, the student's own window when
    it is a sliding window with those sinks (measured anyway), and one of each size in ``sizes``
    with the same sinks, named ``window_<w>``; a size equal to a baseline's window keeps that
    baseline's name, and windows whose keys plus sinks cover the ``longest`` sequence (the teacher
    itself) are left out."""
    matched = next(b for b in chosen if b.name == MEMORY_MATCHED)
    points = {b.window: b for b in chosen if b.kind == "sliding_window" and b.sinks == matched.sinks}
    points[matched.window] = matched
    for w in sizes:
        points.setdefault(w, WindowBaseline(f"window_{w}", "sliding_window", w, matched.sinks))
    return [b for w, b in sorted(points.items()) if b is matched or w + b.sinks < longest]


def _fit_budget(model: nn.Module, tokenizer, spec: LongContextSpec, lengths: list[int], key_lengths: list[int],
                eval_text: str) -> tuple[list[int], list[int]]:
    """``lengths`` without the longest ones whose estimated cost exceeds ``spec.time_budget_s``,
    and those dropped. The estimate times one student forward pass of the shortest length and
    scales it linearly in tokens by the forward passes the report makes up to a length n: teacher,
    student, the two baselines and each frontier window x ``sequences`` of n tokens, plus 4 models
    x the passkey prompts of at most n tokens.
    The shortest length is always kept."""
    probe = held_out_sequences(tokenizer, lengths[0], 1, eval_text)[0]
    t = time.perf_counter()
    token_scores(model, probe)
    per_token = (time.perf_counter() - t) / lengths[0]
    kept = [lengths[0]]
    for n in lengths[1:]:
        keys = spec.passkey_trials * len(spec.passkey_depths) * sum(k for k in key_lengths if k <= n)
        models = 4 + len(spec.frontier_windows)
        if per_token * (models * spec.sequences * n + 4 * keys) > spec.time_budget_s:
            break
        kept.append(n)
    return kept, [n for n in lengths if n not in kept]


def _doublings(start: int, top: int) -> list[int]:
    """start, 2 start, 4 start, ... up to ``top``."""
    out, n = [], start
    while n <= top:
        out.append(n)
        n *= 2
    return out


__all__ = ["BUCKET_EDGES", "NOISE_BLOCK", "auto_lengths", "frontier", "frontier_windows", "held_out_sequences", "judge",
           "long_context_report", "next_token_logits", "paired_margin", "passkey_grid", "passkey_prompt", "summarise",
           "token_scores"]
