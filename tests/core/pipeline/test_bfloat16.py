"""A converted model run in bfloat16 (``load_converted(..., dtype=...)``, ``--dtype`` of chat and bench):
the same model as in float32 within bfloat16's precision, and its cached decoding equal to its
parallel forward at that precision."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from core.eval.metrics import teacher_context
from core.load import load_converted
from tests.core.attention.test_surgery import left_padded_batch, positions, rel_err

pytestmark = pytest.mark.slow  # conversions and exports cast to bfloat16

IDS, MASK = left_padded_batch([60, 41], 60, seed=3)


def _logits(model, ids=IDS, mask=MASK):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits.float()


def test_bfloat16_student_and_teacher_match_float32(finished_run, workspace):
    run = finished_run[0]
    full, _, _ = load_converted(run, device="cpu", workspace=workspace)
    half, _, _ = load_converted(run, device="cpu", workspace=workspace, dtype="bfloat16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in full.parameters()} == {torch.float32}
    real = MASK.bool()
    student_err = rel_err(_logits(half)[real], _logits(full)[real])
    assert 1e-6 < student_err < 3e-2  # bfloat16, not float32 in disguise, and close to it
    with teacher_context(full), teacher_context(half):
        assert rel_err(_logits(half)[real], _logits(full)[real]) < 3e-2


def test_bfloat16_decoding_equals_the_parallel_forward(finished_run, workspace):
    model, _, _ = load_converted(finished_run[0], device="cpu", workspace=workspace, dtype="bfloat16")
    full = _logits(model)
    prefix, cache, stepped = 20, DynamicCache(config=model.config), []
    pos = positions(MASK)
    with torch.no_grad():
        out = model(input_ids=IDS[:, :prefix], attention_mask=MASK[:, :prefix], position_ids=pos[:, :prefix],
                    past_key_values=cache, use_cache=True)
        stepped.append(out.logits.float())
        for t in range(prefix, IDS.shape[1]):
            out = model(input_ids=IDS[:, t : t + 1], attention_mask=MASK[:, : t + 1], position_ids=pos[:, t : t + 1],
                        past_key_values=cache, use_cache=True)
            stepped.append(out.logits.float())
    real = MASK.bool()
    assert rel_err(torch.cat(stepped, dim=1)[real], full[real]) < 2e-2


def test_an_exported_model_runs_in_bfloat16_with_its_teacher(exported, export_workspace):
    folder = exported[2]
    full, _, _ = load_converted(folder, device="cpu", workspace=export_workspace)
    half, _, _ = load_converted(folder, device="cpu", workspace=export_workspace, dtype="bfloat16")
    real = MASK.bool()
    assert rel_err(_logits(half)[real], _logits(full)[real]) < 3e-2
    with teacher_context(full), teacher_context(half):  # the base model's weights, swapped in as bfloat16
        teacher = _logits(half)
        assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
        assert rel_err(teacher[real], _logits(full)[real]) < 3e-2
