"""``lolcats convert``: one conversion run (attention transfer, LoRA, evaluation) into a run folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from core.cli.common import PRESET_HELP, SET_HELP, RichProgress, WorkspaceOpt, cli_errors, console, run_path


@cli_errors()
def convert(
    config: Optional[Path] = typer.Argument(None, help="YAML config (sections: model, data, attention, stage1, stage2, eval)."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help=PRESET_HELP),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
    output: Optional[str] = typer.Option(None, "--output", "-o",
                                         help="Run folder: an absolute path, or a name under <workspace>/runs."),
    resume: bool = typer.Option(False, "--resume", help="Continue a stopped or crashed run in --output."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Convert a model: attention transfer, then LoRA, then evaluation (writes report.json)."""
    from core.config import load_config
    from core.pipeline.convert import run_convert
    from core.run_folder import REPORT_FILE

    cfg = load_config(config, preset, overrides=sets)
    out = run_path(output, workspace, preset or "run")
    with RichProgress() as progress:
        report = run_convert(cfg, out, progress, resume=resume, workspace=workspace)
    console.print_json(json.dumps({k: report[k] for k in ("teacher_ppl", "student_ppl", "ppl_ratio", "val_ppl")}))
    console.print(f"report: {out / REPORT_FILE}")
