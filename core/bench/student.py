"""The student measured against a teacher: a converted copy of it, or a converted run's student.

Speed and memory do not depend on the trained values, so a fresh conversion with random feature
maps measures the same as a trained one with the same settings.
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

from core.attention.surgery import linearize
from core.bench.config import BenchConfig


def convert_teacher(teacher: nn.Module, config: BenchConfig) -> nn.Module:
    """The student of ``teacher``: ``config.student_checkpoint`` when set (see
    :func:`load_converted_student`), else a converted deep copy with feature maps initialised
    from ``config.seed``. The teacher itself is left unchanged."""
    if config.student_checkpoint:
        return load_converted_student(teacher, config.student_checkpoint, config)
    student = copy.deepcopy(teacher)
    torch.manual_seed(config.seed)  # the random feature-map init
    linearize(student, config.attention_spec())
    return student.eval()


def load_converted_student(teacher: nn.Module, checkpoint: str | os.PathLike, config: BenchConfig) -> nn.Module:
    """The student of a converted run folder or exported model (:func:`core.load.load_converted`),
    on the teacher's device. ``config.model`` should name the same base model as the run.

    This benchmarks a run's exact conversion (and its LoRA wrapping)."""
    from core.load import load_converted

    device = next(teacher.parameters()).device
    student, _, _ = load_converted(checkpoint, device=str(device), workspace=config.workspace, dtype=config.dtype)
    student.to(device)
    return student.eval()
