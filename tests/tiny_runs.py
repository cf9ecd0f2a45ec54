"""Tiny-test conversions for the tests that read a finished run (seconds each, on CPU), and what the
tests of an export's teacher measure."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

import torch

from core.config import preset
from core.eval.metrics import teacher_context
from core.export.teacher import TEACHER_ATTRIBUTE
from core.pipeline.convert import run_convert
from core.progress import ProgressCallback

T = TypeVar("T")


def convert_tiny(workspace: Path, name: str = "tiny", progress: ProgressCallback | None = None,
                 **overrides) -> tuple[Path, dict]:
    """Convert the tiny-test preset, its sections updated by ``overrides`` as in
    :func:`core.config.preset`, into ``workspace/runs/<name>``; returns the run folder and its report."""
    out = workspace / "runs" / name
    return out, run_convert(preset("tiny-test", **overrides), out, progress, workspace=workspace)


def merged_weights_with_softmax(model: torch.nn.Module, measure: Callable[[torch.nn.Module], T]) -> T:
    """``measure(model)`` for the wrong teacher of an export: its merged weights with softmax
    attention instead of its base model."""
    teacher = getattr(model, TEACHER_ATTRIBUTE)
    delattr(model, TEACHER_ATTRIBUTE)
    try:
        with teacher_context(model):
            return measure(model)
    finally:
        setattr(model, TEACHER_ATTRIBUTE, teacher)


def last_logits(model: torch.nn.Module, tokenizer, prompt: str) -> torch.Tensor:
    """The next-token logits after ``prompt`` (on CPU)."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(next(model.parameters()).device)
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].cpu()
