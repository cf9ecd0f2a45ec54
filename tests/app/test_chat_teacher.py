"""The Chat page's teacher check: an export whose base model cannot be loaded has no teacher to answer."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from torch import nn

from app import generation
from core.export.teacher import TEACHER_ATTRIBUTE, ExportTeacher


def test_teacher_unavailable_names_the_reason():
    model = nn.Linear(2, 2)
    loaded = SimpleNamespace(model=model, tokenizer=None, lock=threading.Lock())
    assert generation.teacher_unavailable(loaded) is None  # a run folder's model: its teacher is itself
    setattr(model, TEACHER_ATTRIBUTE, ExportTeacher(None))
    assert "does not name its base model" in generation.teacher_unavailable(loaded)
    setattr(model, TEACHER_ATTRIBUTE, ExportTeacher({"source": "/nowhere/base-model", "dtype": "float32"}))
    reason = generation.teacher_unavailable(loaded)
    assert "could not be loaded" in reason and "/nowhere/base-model" in reason
