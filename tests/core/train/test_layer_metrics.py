"""Per-layer training metrics: stage 1 reports each layer's attention MSE from its first step,
every few steps, through the progress callback, beside the run-level training metrics."""

import pytest
import torch

from core.progress import RecordingProgress
from core.train import loop
from core.train.parallel import ONE_PROCESS
from tests.tiny_runs import convert_tiny


def _training_steps(progress: RecordingProgress, stage: str) -> list[tuple[int, dict, dict | None]]:
    """(step, metrics, layer metrics) of the training reports (not the validations) of ``stage``."""
    return [(step, metrics, layers) for s, step, _, metrics, layers in progress.steps
            if s == stage and "loss" in metrics]


def test_stage1_reports_every_layers_training_mse_from_step_1(tmp_path):
    progress = RecordingProgress()
    _, report = convert_tiny(tmp_path, progress=progress, stage2={"enabled": False})
    converted = {i for i, v in enumerate(report["per_layer_mse"]) if v is not None}
    reports = _training_steps(progress, "stage1")
    assert [step for step, _, _ in reports] == [1, 2, 3, 4]  # 4 steps: every one reported
    for step, metrics, layers in reports:
        assert set(layers) == converted and all(set(v) == {"train_mse"} for v in layers.values()), step
        mean = sum(v["train_mse"] for v in layers.values()) / len(layers)
        assert metrics["mse"] == pytest.approx(mean)  # the run-level training MSE is their mean


def test_layer_reports_come_every_few_steps_and_stay_few():
    for steps in (1, 4, loop.LAYER_REPORTS, 240, 2000, 10_007):
        due = [s for s in range(1, steps + 1) if loop.layer_report_due(s, steps)]
        assert due[0] == 1 and due[-1] == steps
        assert len(due) <= loop.LAYER_REPORTS + 2
        assert max((b - a for a, b in zip(due, due[1:])), default=1) <= max(1, -(-steps // loop.LAYER_REPORTS))


def test_a_layer_report_is_the_mean_over_the_steps_since_the_last_one(tmp_path):
    weight = torch.nn.Parameter(torch.zeros(1))
    model = torch.nn.Module()
    model.weight = weight
    calls = []

    def loss_fn(batch):
        calls.append(len(calls) + 1)  # one micro-batch a step: the step number
        return (weight - 1).pow(2).sum(), {}, {0: {"m": float(calls[-1])}, 3: {"m": -float(calls[-1])}}

    steps = 3 * loop.LAYER_REPORTS
    spec = loop.LoopSpec(stage="s", steps=steps, lr=1e-3, weight_decay=0.0, batch_size=1, grad_accum=1,
                    eval_every=steps, seed=0)
    progress = RecordingProgress()
    loop.run_loop(spec, model, {"x": torch.zeros(4, 1)}, loss_fn, lambda: (0.0, {}, None), tmp_path, progress, {},
             ONE_PROCESS)
    reported = {step: layers for step, _, layers in _training_steps(progress, "s") if layers}
    due = [s for s in range(1, steps + 1) if loop.layer_report_due(s, steps)]
    assert list(reported) == due
    for previous, step in zip([0] + due, due):
        mean = sum(range(previous + 1, step + 1)) / (step - previous)
        assert reported[step] == {0: {"m": pytest.approx(mean)}, 3: {"m": pytest.approx(-mean)}}
