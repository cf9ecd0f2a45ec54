"""``lolcats export``: a standalone model folder (LoRA merged) from a run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from core.cli.common import WorkspaceOpt, cli_errors, console


@cli_errors()
def export(
    run: Path = typer.Argument(..., help="Run folder."),
    out: Path = typer.Argument(..., help="Folder for the standalone model (LoRA merged)."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Export a standalone folder with LoRA merged; `lolcats chat/eval` and core.load_converted read it."""
    from core.pipeline.runs import export as export_run

    console.print(f"exported to {export_run(run, out, workspace=workspace)}")
