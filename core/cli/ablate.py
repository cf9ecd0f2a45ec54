"""``lolcats ablate``: the paper's Table 2 protocol (swap / transfer / LoRA / both at equal steps)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from core.cli.common import PRESET_HELP, SET_HELP, RichProgress, WorkspaceOpt, cli_errors, console, run_path


@cli_errors()
def ablate(
    preset: str = typer.Option("cpu-demo", "--preset", "-p", help=PRESET_HELP),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML overriding the preset."),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
    steps: Optional[int] = typer.Option(None, help="Total training steps per variant (default: stage1 + stage2 steps)."),
    kinds: str = typer.Option("linear,terraced", help="Comma-separated attention kinds."),
    output: Optional[str] = typer.Option(None, "--output", "-o",
                                         help="Folder: an absolute path, or a name under <workspace>/runs."),
    resume: bool = typer.Option(False, "--resume"),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Table 2 protocol: swap / transfer only / LoRA only / both, at equal total steps."""
    from core.config import load_config
    from core.pipeline.ablation import markdown_table, run_ablation

    cfg = load_config(config, preset, overrides=sets)
    out = run_path(output, workspace, "ablation")
    with RichProgress() as progress:
        result = run_ablation(cfg, out, kinds=[k.strip() for k in kinds.split(",")], total_steps=steps,
                              progress=progress, resume=resume, workspace=workspace)
    console.print(markdown_table(result["rows"]))
    console.print(f"written: {out / 'ablation.md'}, {out / 'ablation.json'}")
