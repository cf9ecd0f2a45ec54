"""The Chat page's teacher: for an export, its base model answers (not the merged weights with
softmax attention); an export whose base model cannot be loaded has no teacher to answer."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from app import generation
from core.export.teacher import TEACHER_ATTRIBUTE, ExportTeacher
from core.models import load_model
from core.export.folder import export
from core.load import load_converted
from core.run_folder import EXPORT_CONFIG
from tests.tiny_runs import convert_tiny, merged_weights_with_softmax

pytestmark = pytest.mark.slow  # a tiny conversion and its export


def test_teacher_unavailable_names_the_reason():
    model = nn.Linear(2, 2)
    loaded = SimpleNamespace(model=model, tokenizer=None, lock=threading.Lock())
    assert generation.teacher_unavailable(loaded) is None  # a run folder's model: its teacher is itself
    setattr(model, TEACHER_ATTRIBUTE, ExportTeacher(None))
    assert "does not name its base model" in generation.teacher_unavailable(loaded)
    setattr(model, TEACHER_ATTRIBUTE, ExportTeacher({"source": "/nowhere/base-model", "dtype": "float32"}))
    reason = generation.teacher_unavailable(loaded)
    assert "could not be loaded" in reason and "/nowhere/base-model" in reason


@pytest.fixture(scope="module")
def exported(workspace):
    run, _ = convert_tiny(workspace)
    return export(run, workspace / "export", workspace=workspace)


def test_the_teacher_of_an_export_is_its_base_model(exported, workspace):
    model, tokenizer, _ = load_converted(exported, device="cpu", workspace=workspace)
    loaded = SimpleNamespace(model=model, tokenizer=tokenizer, lock=threading.Lock())
    assert generation.teacher_unavailable(loaded) is None
    prepared = generation.prepare_prompt(tokenizer, "What is two plus two?", 128, 2)
    prefill: list[torch.Tensor] = []  # next-token logits of each forward pass of generate
    model.register_forward_hook(lambda module, args, output: prefill.append(output.logits[0, -1].clone()))
    first = {}
    for teacher in (True, False):
        prefill.clear()
        answer = generation.generate_answer(loaded, prepared, teacher=teacher,
                                            settings=generation.Settings(max_new_tokens=2))
        assert answer.error is None and answer.new_tokens == 2
        first[teacher] = prefill[0]

    base = json.loads((exported / EXPORT_CONFIG).read_text())["base_model"]
    base_model, _ = load_model(base["source"], dtype=base["dtype"], device="cpu", workspace=workspace)
    with torch.no_grad():
        expected = base_model(input_ids=prepared.input_ids).logits[0, -1]
        student = model(input_ids=prepared.input_ids).logits[0, -1]
        wrong = merged_weights_with_softmax(model, lambda m: m(input_ids=prepared.input_ids).logits[0, -1])
    torch.testing.assert_close(first[True], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first[False], student, rtol=1e-5, atol=1e-5)
    assert (wrong - expected).abs().max() > 1e-3  # the wrong teacher would show
