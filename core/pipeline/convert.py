"""One conversion run end to end: load, measure the teacher, convert, stage 1, stage 2, evaluate.

Run folder layout (all under ``output``)::

    config.json       the resolved ConvertConfig (what --resume compares against)
    teacher.json      teacher perplexity, measured once before conversion
    stage1/{last,best}/, stage2/{last,best}/   checkpoints (safetensors + JSON)
    report.json       teacher_ppl, student_ppl, ppl_ratio, per_layer_mse, passkey, samples, timings

A killed or stopped run resumes with ``resume=True``: finished stages are loaded from their best
checkpoint, an unfinished one continues from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import torch
from torch import nn

from core.train.checkpoint import load_checkpoint
from core.config import ConfigError, ConvertConfig, config_diff
from core.data import load_blocks, load_rows, load_spec_data, read_options
from core.eval.metrics import passkey, per_layer_mse, perplexity, samples, teacher_context
from core.attention.surgery import linearize
from core.models import check_seq_len, load_model
from core.io import atomic_write_json
from core.progress import NullProgress, ProgressCallback
from core.train.distill_attention import train_stage1
from core.train.finetune_lora import train_stage2, wrap_for_stage2
from core.train.loop import load_best

CONFIG_FILE = "config.json"
REPORT_FILE = "report.json"


def prepare_run_dir(config: ConvertConfig, output: Path, resume: bool) -> None:
    """Create the run folder, or check that a resumed run keeps the same config."""
    stored = output / CONFIG_FILE
    if stored.exists():
        if not resume:
            raise ConfigError(f"{output} already holds a run; pass --resume to continue it or choose another --output")
        old = json.loads(stored.read_text())
        diff = config_diff(old, config.model_dump())
        if diff:
            raise ConfigError("cannot resume: the config changed what was trained:\n  " + "\n  ".join(map(str, diff)))
    else:
        output.mkdir(parents=True, exist_ok=True)
        atomic_write_json(stored, config.model_dump())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def eval_text_blocks(config: ConvertConfig, tokenizer) -> dict[str, torch.Tensor]:
    source = "kjv-sample" if config.data.eval_text == "bundled" else config.data.eval_text
    blocks = load_blocks(source, tokenizer, format="text", seq_len=config.data.seq_len)
    return {k: v[: config.eval.ppl_blocks] for k, v in blocks.as_dict().items()}


def build_student(config: ConvertConfig, workspace=None) -> tuple[nn.Module, object]:
    """Base model + conversion (untrained): the starting point of a run and of loading one."""
    m = config.model
    model, tokenizer = load_model(m.source, dtype=m.dtype, device=m.device, workspace=workspace,
                                  trust_remote_code=m.trust_remote_code)
    return model, tokenizer


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
    prepare_run_dir(config, output, resume)
    dumped = config.model_dump()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    seed_everything(config.seed)

    progress.on_log(f"loading model {config.model.source}")
    model, tokenizer = build_student(config, workspace)
    check_seq_len(model, config.data.seq_len)
    splits = load_spec_data(config.data, tokenizer, seed=config.seed)
    train, val = splits.train.as_dict(), splits.validation.as_dict()
    if len(splits.validation) == 0:
        val = {k: v[:1] for k, v in train.items()}
    eval_blocks = eval_text_blocks(config, tokenizer)
    progress.on_log(f"data: {json.dumps(splits.info)}")
    timings["load_s"] = time.perf_counter() - t0

    teacher_file = output / "teacher.json"
    if teacher_file.exists():
        teacher_ppl = json.loads(teacher_file.read_text())["teacher_ppl"]
    else:
        t = time.perf_counter()
        teacher_ppl = perplexity(model, eval_blocks, progress=progress, stage="teacher_eval")
        atomic_write_json(teacher_file, {"teacher_ppl": teacher_ppl})
        timings["teacher_eval_s"] = time.perf_counter() - t
    progress.on_log(f"teacher held-out perplexity {teacher_ppl:.3f}")

    linearize(model, config.attention)
    result: dict = {}
    if config.stage1.enabled:
        t = time.perf_counter()
        if _finished(output, "stage1", config.stage1.steps):
            load_best(model, output, "stage1")
        else:
            result["stage1"] = train_stage1(model, config.stage1, train, val, output, progress, config.seed, dumped)
        timings["stage1_s"] = time.perf_counter() - t
    if config.stage2.enabled:
        t = time.perf_counter()
        model = wrap_for_stage2(model, config.stage2)
        if _finished(output, "stage2", config.stage2.steps):
            load_best(model, output, "stage2")
        else:
            result["stage2"] = train_stage2(model, config.stage2, train, val, output, progress, config.seed, dumped)
        timings["stage2_s"] = time.perf_counter() - t

    t = time.perf_counter()
    report = evaluate_run(model, tokenizer, config, eval_blocks, val, teacher_ppl, progress)
    timings["eval_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    report.update({"timings": timings, "training": result, "data": splits.info, "config": dumped})
    atomic_write_json(output / REPORT_FILE, report)
    progress.on_log(f"student perplexity {report['student_ppl']:.3f} (teacher {teacher_ppl:.3f}); report in {output}")
    return report


def _finished(output: Path, stage: str, steps: int) -> bool:
    last = output / stage / "last"
    return last.exists() and load_checkpoint(last)[1]["step"] >= steps and (output / stage / "best").exists()


def evaluate_run(model, tokenizer, config: ConvertConfig, eval_blocks, val, teacher_ppl, progress) -> dict:
    e = config.eval
    student_ppl = perplexity(model, eval_blocks, progress=progress, stage="student_eval")
    val_ppl = perplexity(model, val, e.ppl_blocks, progress=progress, stage="student_val")
    mse = per_layer_mse(model, eval_blocks, e.mse_blocks)
    key_student = passkey(model, tokenizer, e, config.seed)
    with teacher_context(model):
        key_teacher = passkey(model, tokenizer, e, config.seed)
    prompts = _sample_prompts(config, e.samples)
    return {
        "teacher_ppl": teacher_ppl,
        "student_ppl": student_ppl,
        "ppl_ratio": student_ppl / teacher_ppl,
        "val_ppl": val_ppl,
        "per_layer_mse": mse,
        "passkey": {
            "student": [r.__dict__ for r in key_student],
            "teacher": [r.__dict__ for r in key_teacher],
            "student_accuracy": sum(r.accuracy for r in key_student) / max(len(key_student), 1),
            "teacher_accuracy": sum(r.accuracy for r in key_teacher) / max(len(key_teacher), 1),
        },
        "samples": samples(model, tokenizer, prompts, e.max_new_tokens),
    }


def _sample_prompts(config: ConvertConfig, n: int) -> list[str]:
    """The first validation rows' instructions (or the start of their text)."""
    if n == 0:
        return []
    rows = load_rows(config.data.source, **{**read_options(config.data), "max_examples": n})
    if rows.format == "instruction":
        return [(ins + ("\n\n" + inp if inp else "")).strip()[:1000]
                for ins, inp in zip(rows.columns["instruction"], rows.columns.get("input", [""] * len(rows)))]
    return [t[:300] for t in rows.columns["text"]]
