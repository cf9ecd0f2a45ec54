"""``lolcats ablate``: the paper's Table 2 protocol (swap / transfer / LoRA / both at equal steps), or
with ``--budgets`` the quality / cost trade-off of keeping K layers softmax (the ``budgets`` job kind,
the Budgets page; ``--softmax-budgets`` is its older spelling)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from core.cli.common import PRESET_HELP, SET_HELP, RichProgress, WorkspaceOpt, cli_errors, console, run_path
from core.lists import comma_ints, comma_names
from core.pipeline.budget_spec import BudgetSweepConfig


@cli_errors()
def ablate(
    preset: str = typer.Option("cpu-demo", "--preset", "-p", help=PRESET_HELP),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML overriding the preset."),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
    steps: Optional[int] = typer.Option(None, help="Total training steps per variant (default: stage1 + stage2 steps)."),
    kinds: str = typer.Option("linear,terraced", help="Comma-separated attention kinds."),
    output: Optional[str] = typer.Option(None, "--output", "-o",
                                         help="Folder: an absolute path, or a name under <workspace>/runs."),
    budgets: Optional[str] = typer.Option(
        None, "--budgets", "--softmax-budgets", help="Comma-separated K values, e.g. 0,1,2,4,8: the same recipe "
        "with the K worst-to-linearize layers kept softmax (one attention transfer for all), quality against "
        "decode cost."),
    context: int = typer.Option(BudgetSweepConfig.model_fields["context"].default, help="With --budgets: context length the decode cost is measured at."),
    resume: bool = typer.Option(False, "--resume"),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Table 2 protocol: swap / transfer only / LoRA only / both, at equal total steps; or, with
    --budgets, perplexity and decode cost for each number of softmax layers."""
    from core.config import load_config
    from core.pipeline.ablation import markdown_table, run_ablation

    cfg = load_config(config, preset, overrides=sets)
    if budgets is not None:
        _budget_sweep(cfg, budgets, context, output, resume, workspace)
        return
    out = run_path(output, workspace, "ablation")
    with RichProgress() as progress:
        result = run_ablation(cfg, out, kinds=comma_names(kinds), total_steps=steps,
                              progress=progress, resume=resume, workspace=workspace)
    console.print(markdown_table(result["rows"]))
    console.print(f"written: {out / 'ablation.md'}, {out / 'ablation.json'}")


def _budget_sweep(cfg, budgets: str, context: int, output: Optional[str], resume: bool, workspace) -> None:
    from core.config import ConfigError
    from core.config.schema import build_spec
    from core.pipeline.budget_table import markdown_table
    from core.pipeline.budgets import run_budget_sweep

    try:
        values = comma_ints(budgets, "--budgets", "0,1,2,4,8")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    sweep = build_spec(BudgetSweepConfig, {"base": cfg.model_dump(), "budgets": values, "context": context})
    out = run_path(output, workspace, "budgets")
    with RichProgress() as progress:
        result = run_budget_sweep(sweep, out, progress=progress, resume=resume, workspace=workspace)
    console.print(markdown_table(result))
    console.print(f"written: {out / 'budgets.md'}, {out / 'budgets.json'}, {out / 'budgets.html'}")
