"""The bundled SmolLM2-135M-Instruct converted end to end through ``core.run_convert``: the real
weights dequantised from the bundled GGUF, two steps of each stage at a short sequence length, the
report's numbers, and every decoder layer linearized when the run is loaded back. (The cpu-demo
preset's own wall time is measured by benchmarks/cpu_demo.py, not here.)"""

from __future__ import annotations

import json
import math

import pytest

import core
from core.attention.surgery import is_linearized, lolcats_modules
from core.config import BUNDLED_MODEL, preset
from core.eval.long_context_result import LongContextResult

STEPS = 2
SEQ_LEN = 256  # longer than the preset's sliding window: the linear history holds the older tokens
LAYERS = 30  # SmolLM2-135M's decoder layers, all converted (the preset keeps none as softmax)
CONFIG = preset(
    "cpu-demo",
    data={"seq_len": SEQ_LEN, "val_examples": 4, "max_examples": 48},
    stage1={"steps": STEPS, "grad_accum": 1, "eval_every": STEPS, "eval_blocks": 1},
    stage2={"steps": STEPS, "grad_accum": 1, "eval_every": STEPS, "eval_blocks": 1},
    eval={"ppl_blocks": 2, "mse_blocks": 1, "samples": 1, "max_new_tokens": 4,
          "long_context": {"lengths": [256, 512], "sequences": 1, "passkey_trials": 0}},
)


@pytest.fixture(scope="module")
def bundled_run(workspace):
    out = workspace / "runs" / "bundled"
    return out, core.run_convert(CONFIG, out, workspace=workspace)


@pytest.mark.slow
def test_the_bundled_model_converts_with_a_consistent_report(bundled_run):
    out, report = bundled_run
    assert CONFIG.model.source == BUNDLED_MODEL
    assert json.loads((out / "report.json").read_text()) == report
    teacher, student = report["teacher_ppl"], report["student_ppl"]
    assert math.isfinite(teacher) and math.isfinite(student)
    assert 1.0 < teacher < 50.0  # the pretrained weights (a random model of this vocabulary: ~49k)
    assert report["ppl_ratio"] == pytest.approx(student / teacher, rel=1e-12)
    mse = report["per_layer_mse"]
    assert len(mse) == LAYERS and all(math.isfinite(m) for m in mse)
    assert min(mse) > 1e-10  # every layer's output differs from softmax attention's (equal ones: ~1e-15)
    for stage in ("stage1", "stage2"):
        assert report["training"][stage]["steps"] == STEPS, report["training"][stage]
    assert report["data"]["seq_len"] == SEQ_LEN
    section = LongContextResult.model_validate(report["long_context"])
    matched = section.baselines["memory_matched"]
    # the preset's frontier windows below the longest length (512 + 4 sinks covers it), the student's own
    # sliding window and the memory-matched one
    own = section.baselines["window"]
    assert (own.kind, own.window) == ("sliding_window", CONFIG.attention.window_size) and own.window < SEQ_LEN
    assert [p.window for p in section.frontier.points] == sorted([32, own.window, matched.window])
    assert section.frontier.student_bytes == section.state_bytes_per_layer
    assert {v.against for v in section.verdicts} == {"window", "memory_matched", "frontier"}


@pytest.mark.slow
def test_the_bundled_run_loads_back_with_every_layer_linearized(bundled_run, workspace):
    out, _ = bundled_run
    model, tokenizer, info = core.load_converted(out, device="cpu", workspace=workspace)
    assert info["kind"] == "run" and info["config"]["model"]["source"] == BUNDLED_MODEL
    assert is_linearized(model)
    modules = lolcats_modules(model)
    assert sorted(modules) == list(range(LAYERS))
    assert {m.kind for m in modules.values()} == {"sliding_window"}
