"""One conversion run end to end: load, measure the teacher, convert, stage 1, stage 2, evaluate.

Run folder layout (all under ``output``)::

    config.json       the resolved ConvertConfig (what --resume compares against)
    teacher.json      teacher perplexity, measured once before conversion
    stage1/{last,best}/, stage2/{last,best}/   checkpoints (safetensors + JSON)
    stage1/summary.json, stage2/summary.json   a finished stage's training summary
    softmax_choice.json  with ``attention.softmax_layers: auto``: the layers chosen after stage 1
                      and every layer's score (core.pipeline.softmax_choice)
    report.json       teacher_ppl, student_ppl, ppl_ratio, per_layer_mse, samples, timings,
                      softmax_layers (every layer left softmax), ``long_context`` (quality by context
                      length against the sliding-window baselines and the frontier, and the passkey
                      grid, core.eval.long_context_result),
                      ``softmax_score`` (``layer_score`` before it was named as the config
                      names it) and ``layer_scores``
                      with ``softmax_layers: auto``, and ``tasks`` (the task-accuracy result of
                      core.eval.harness) when ``eval.tasks`` is set
    tasks/<task>.json  a finished task's teacher/student entries (a resumed run skips it)

A killed or stopped run resumes with ``resume=True``: finished stages are loaded from their best
checkpoint, an unfinished one continues from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from core.attention.surgery import linearize, softmax_layer_indices
from core.config import ConvertConfig, apply_overrides, build_config
from core.data import held_out_source, load_blocks, load_rows, read_options
from core.eval.harness import check_known, evaluate_model, resolve_tasks, task_manager
from core.eval.long_context import long_context_report
from core.eval.metrics import per_layer_mse, perplexity, samples, teacher_context
from core.io import atomic_write_json
from core.pipeline.prelude import save_stage_summary, stage_finished, stage_summary, start_run
from core.pipeline.softmax_choice import check_budget, choose_softmax_layers
from core.progress import NullProgress, ProgressCallback
from core.run_folder import (REPORT_FILE, STAGE1, STAGE2, STUDENT_EVAL, STUDENT_VAL, TASK_CACHE_DIR, TEACHER_EVAL,
                             TEACHER_FILE, check_intact)
from core.train.distill_attention import train_stage1
from core.train.finetune_lora import train_stage2, wrap_for_stage2
from core.train.lora import base_model
from core.train.loop import load_best


def eval_text_blocks(config: ConvertConfig, tokenizer) -> dict[str, torch.Tensor]:
    blocks = load_blocks(held_out_source(config.data.eval_text), tokenizer, format="text", seq_len=config.data.seq_len)
    return {k: v[: config.eval.ppl_blocks] for k, v in blocks.as_dict().items()}


def run_convert(
    config: ConvertConfig,
    output: str | os.PathLike,
    progress: ProgressCallback | None = None,
    resume: bool = False,
    workspace: str | os.PathLike | None = None,
) -> dict:
    """Run (or resume) a conversion; writes and returns ``report.json``."""
    progress = progress or NullProgress()
    output = Path(output)
    if config.eval.tasks:  # refuse unknown task names before training, not after
        check_known(list(resolve_tasks(config.eval.tasks)), task_manager())
    dumped = config.model_dump()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    run = start_run(config, output, resume=resume, workspace=workspace, progress=progress)
    model, tokenizer, train, val = run.model, run.tokenizer, run.train, run.val
    eval_blocks = eval_text_blocks(config, tokenizer)
    timings["load_s"] = time.perf_counter() - t0

    teacher_file = output / TEACHER_FILE
    if teacher_file.exists():
        teacher_ppl = json.loads(teacher_file.read_text())["teacher_ppl"]
    else:
        t = time.perf_counter()
        teacher_ppl = perplexity(model, eval_blocks, progress=progress, stage=TEACHER_EVAL)
        atomic_write_json(teacher_file, {"teacher_ppl": teacher_ppl})
        timings["teacher_eval_s"] = time.perf_counter() - t
    progress.on_log(f"teacher held-out perplexity {teacher_ppl:.3f}")

    linearize(model, config.attention)
    check_budget(model, config.attention)
    result: dict = {}
    if config.stage1.enabled:
        t = time.perf_counter()
        result["stage1"] = _train_or_load(model, output, STAGE1, config.stage1.steps, lambda: train_stage1(
            model, config.stage1, train, val, output, progress, config.seed, dumped))
        timings["stage1_s"] = time.perf_counter() - t
    t = time.perf_counter()
    choice = choose_softmax_layers(model, config, val, output, progress)
    if choice is not None:
        timings["softmax_choice_s"] = time.perf_counter() - t
    if config.stage2.enabled:
        t = time.perf_counter()
        model = wrap_for_stage2(model, config.stage2)
        result["stage2"] = _train_or_load(model, output, STAGE2, config.stage2.steps, lambda: train_stage2(
            model, config.stage2, train, val, output, progress, config.seed, dumped))
        timings["stage2_s"] = time.perf_counter() - t

    t = time.perf_counter()
    report = evaluate_run(model, tokenizer, config, eval_blocks, val, teacher_ppl, progress)
    timings["eval_s"] = time.perf_counter() - t
    if config.eval.tasks:
        t = time.perf_counter()
        report["tasks"] = evaluate_model(model, tokenizer, config.eval.tasks, limit=config.eval.tasks_limit,
                                         progress=progress, cache_dir=output / TASK_CACHE_DIR)
        timings["tasks_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    report.update({"softmax_layers": softmax_layer_indices(base_model(model)), "timings": timings, "training": result,
                   "data": run.data_info, "config": dumped})
    if choice is not None:
        report.update({"softmax_score": choice["softmax_score"], "layer_scores": choice["layer_scores"]})
    check_intact(output)  # a run folder deleted meanwhile is not recreated holding only the report
    atomic_write_json(output / REPORT_FILE, report)
    progress.on_log(f"student perplexity {report['student_ppl']:.3f} (teacher {teacher_ppl:.3f}); report in {output}")
    return report


def _train_or_load(model: nn.Module, output: Path, stage: str, steps: int, train: Callable[[], dict]) -> dict:
    """Train ``stage`` (``train()``, which leaves its best weights loaded) and keep its summary, or,
    when it finished before, load its best weights; returns the stage's training summary."""
    if stage_finished(output, stage, steps):
        load_best(model, output, stage)
        return stage_summary(output, stage)
    summary = train()
    check_intact(output)
    save_stage_summary(output, stage, summary)
    return summary


def evaluate_run(model, tokenizer, config: ConvertConfig, eval_blocks, val, teacher_ppl: float | None, progress, *,
                 train_seq_len: int | None = None, with_long_context: bool = True, with_samples: bool = True) -> dict:
    """The evaluation step of a run: the figures of ``report.json``, and what ``lolcats eval``
    measures again on a run folder or an export.

    Student perplexity on ``eval_blocks`` and its ratio to ``teacher_ppl`` (measured by the caller;
    None: no teacher, no ratio), ``val_ppl`` on the validation blocks ``val`` (None: not measured),
    per-layer attention MSE on the first ``eval.mse_blocks`` blocks, answers to ``eval.samples``
    prompts of ``data`` (``with_samples=False``: no ``samples`` entry) and, when ``eval.long_context``
    is enabled and ``with_long_context`` is True, the ``long_context`` section, passkey grid
    included; ``train_seq_len`` (default ``data.seq_len``) is the training block length its
    ``auto`` lengths are relative to."""
    e = config.eval
    student_ppl = perplexity(model, eval_blocks, progress=progress, stage=STUDENT_EVAL)
    report = {"teacher_ppl": teacher_ppl, "student_ppl": student_ppl,
              "ppl_ratio": None if teacher_ppl is None else student_ppl / teacher_ppl}
    if val is not None:
        report["val_ppl"] = perplexity(model, val, e.ppl_blocks, progress=progress, stage=STUDENT_VAL)
    report["per_layer_mse"] = per_layer_mse(model, eval_blocks, e.mse_blocks)
    if with_samples:
        report["samples"] = samples(model, tokenizer, _sample_prompts(config, e.samples), e.max_new_tokens)
    if e.long_context.enabled and with_long_context:
        report["long_context"] = long_context_report(model, tokenizer, e.long_context,
                                                     train_seq_len or config.data.seq_len, config.data.eval_text,
                                                     config.seed, progress)
    return report


def evaluate_again(model: nn.Module, tokenizer, run_config: dict, overrides: list[str], progress: ProgressCallback,
                   teacher_unavailable: str | None = None) -> dict:
    """The run's evaluation step once more, on its model loaded back from a run folder or an export
    (``lolcats eval`` and the ``eval`` job): the run's own config (``run_config``, the dumped
    :class:`ConvertConfig`, which an export keeps) with ``dotted.path=VALUE`` ``overrides`` applied,
    so the same held-out text (``data.eval_text``), blocks and rules as the conversion's report,
    less what needs the run's training data (validation perplexity, sample answers).

    The teacher's perplexity is measured on the same blocks; with ``teacher_unavailable`` (an
    export whose base model cannot be loaded: why) there is no teacher, so no ratio and no
    long-context section (nor its passkey grid). ``auto`` long-context lengths stay relative to
    the run's training length, whatever ``data.seq_len`` the overrides set. The report adds
    ``teacher_unavailable``, the ``eval`` settings used and ``seq_len``."""
    trained = build_config(run_config)
    config = build_config(apply_overrides(trained.model_dump(), overrides))
    eval_blocks = eval_text_blocks(config, tokenizer)
    teacher = None
    if teacher_unavailable is None:
        with teacher_context(model):
            teacher = perplexity(model, eval_blocks, progress=progress, stage=TEACHER_EVAL)
    report = evaluate_run(model, tokenizer, config, eval_blocks, None, teacher, progress,
                          train_seq_len=trained.data.seq_len, with_long_context=teacher_unavailable is None,
                          with_samples=False)
    report.setdefault("long_context", None)
    return {**report, "teacher_unavailable": teacher_unavailable,
            "eval": config.eval.model_dump(exclude={"samples", "max_new_tokens"}), "seq_len": config.data.seq_len}


def _sample_prompts(config: ConvertConfig, n: int) -> list[str]:
    """The first validation rows' instructions (or the start of their text)."""
    if n == 0:
        return []
    rows = load_rows(config.data.source, **{**read_options(config.data), "max_examples": n})
    if rows.format == "instruction":
        return [(ins + ("\n\n" + inp if inp else "")).strip()[:1000]
                for ins, inp in zip(rows.columns["instruction"], rows.columns.get("input", [""] * len(rows)))]
    return [t[:300] for t in rows.columns["text"]]
