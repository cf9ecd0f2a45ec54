"""The softmax-budget trade-off: the same recipe with K = 0, 1, 2, ... layers kept softmax, quality against cost.

One attention transfer serves every budget. The first budget's run (``budget-<K0>/``) trains stage 1
with every layer converted and scores the layers (``softmax_layers: auto``,
:mod:`core.pipeline.softmax_choice`); every other budget's run folder starts with a copy of its
``stage1/`` checkpoints and ``teacher.json`` and a ``softmax_choice.json`` holding the same scores
with its own K worst layers, so it only runs stage 2 and the evaluation. Each row then has:

* quality: held-out perplexity, its ratio to the teacher's, and the validation perplexity
  (and the report's task accuracy when ``eval.tasks`` is set);
* cost: the decode step time (median of ``decode_steps``, batch 1) and the bytes of the cache or
  state after ``context`` tokens, measured on the base model converted with the same layers kept
  softmax (speed does not depend on the trained values), from a synthetic cache of that length
  (:func:`core.bench.capacity.measure_batch`); the teacher is measured the same way for reference.

Writes ``budgets.json`` (the result), ``budgets.md`` (the table) and ``budgets.html`` (the plot) in
the output folder; a stopped sweep resumes run by run, and a budget whose run finished is read
back from its ``report.json``.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
from torch import nn

from core.attention.surgery import linearize
from core.bench.capacity import measure_batch
from core.bench.memory import peak_tracker, weight_bytes
from core.config import ConvertConfig
from core.eval.layer_scores import worst_layers
from core.io import atomic_write_json
from core.load import load_teacher, saved_choice
from core.pipeline.convert import run_convert
from core.pipeline.budget_spec import BudgetSweepConfig, budget_config
from core.pipeline.budget_table import markdown_table, tradeoff_figure
from core.pipeline.prelude import prepare_run_dir
from core.progress import NullProgress, ProgressCallback
from core.run_folder import CHOICE_FILE, CONFIG_FILE, REPORT_FILE, STAGE1, TEACHER_FILE

RESULT_FILE = "budgets.json"


def _seed_from(first: Path, run: Path, budget: int) -> None:
    """Start ``run`` from ``first``'s stage 1, teacher perplexity and layer scores."""
    if (run / CHOICE_FILE).is_file():
        return
    run.mkdir(parents=True, exist_ok=True)
    if (first / STAGE1).is_dir() and not (run / STAGE1).exists():
        shutil.copytree(first / STAGE1, run / STAGE1, ignore=shutil.ignore_patterns("cache"))
    shutil.copy2(first / TEACHER_FILE, run / TEACHER_FILE)
    choice = saved_choice(first)
    scores = {i: s for i, s in enumerate(choice["layer_scores"]) if s is not None}
    atomic_write_json(run / CHOICE_FILE, {**choice, "budget": budget, "softmax_layers": worst_layers(scores, budget)})


@torch.no_grad()
def decode_cost(teacher: nn.Module, base: ConvertConfig, softmax_layers: list[int] | None, context: int,
                steps: int) -> dict:
    """Decode step time and cache bytes at ``context`` tokens, batch 1: ``teacher`` itself when
    ``softmax_layers`` is None, else a copy converted as ``base.attention`` with those layers kept softmax."""
    model = teacher
    if softmax_layers is not None:
        model = copy.deepcopy(teacher)
        spec = base.attention.model_copy(update={"softmax_layers": softmax_layers, "softmax_budget": None})
        linearize(model, spec)
    device = next(model.parameters()).device
    tracker = peak_tracker(device)
    try:
        trial = measure_batch(model.eval(), 1, context, steps, tracker, weight_bytes(model), seed=0)
    finally:
        tracker.close()
    if trial["status"] != "ok":
        return {"decode_ms_per_step": None, "cache_bytes": None, "error": trial.get("error")}
    return {"decode_ms_per_step": 1000 * trial["time_per_output_token_s"], "cache_bytes": trial["cache_bytes"]}


def run_budget_sweep(config: BudgetSweepConfig, output: str | Path, progress: ProgressCallback | None = None,
                     resume: bool = False, workspace=None) -> dict:
    """Run every budget (see the module docstring); returns and writes the result."""
    progress = progress or NullProgress()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    first = output / f"budget-{config.budgets[0]}"
    reports = {}
    for k in config.budgets:
        run = output / f"budget-{k}"
        progress.on_log(f"softmax budget {k}: {run}")
        if k != config.budgets[0]:
            _seed_from(first, run, k)
        finished = run / REPORT_FILE
        if resume and finished.is_file() and (run / CONFIG_FILE).is_file():  # a finished budget is not re-evaluated
            prepare_run_dir(budget_config(config.base, k), run, resume=True)  # refuses a changed config
            reports[k] = json.loads(finished.read_text())
            continue
        reports[k] = run_convert(budget_config(config.base, k), run, progress, resume=resume, workspace=workspace)
    progress.on_log(f"decode cost at {config.context} tokens of context, batch 1")
    teacher, _ = load_teacher(config.base, workspace)
    reference = decode_cost(teacher, config.base, None, config.context, config.decode_steps)
    rows = []
    for k, report in reports.items():
        rows.append({"budget": k, "softmax_layers": report["softmax_layers"], "student_ppl": report["student_ppl"],
                     "ppl_ratio": report["ppl_ratio"], "val_ppl": report["val_ppl"],
                     **({"tasks": report["tasks"]} if "tasks" in report else {}),
                     **decode_cost(teacher, config.base, report["softmax_layers"], config.context,
                                   config.decode_steps),
                     "run": f"budget-{k}"})
    choice = saved_choice(first)
    result = {"softmax_score": choice["softmax_score"], "layer_scores": choice["layer_scores"],
              "context": config.context, "teacher_ppl": reports[config.budgets[0]]["teacher_ppl"],
              "teacher": reference, "rows": rows,
              "config": config.model_dump()}
    atomic_write_json(output / RESULT_FILE, result)
    (output / "budgets.md").write_text(markdown_table(result))
    tradeoff_figure(result).write_html(output / "budgets.html", include_plotlyjs=True)
    return result


def read_result(output: str | Path) -> dict | None:
    path = Path(output) / RESULT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


__all__ = ["run_budget_sweep", "decode_cost", "read_result", "RESULT_FILE"]
