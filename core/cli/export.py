"""``lolcats export``: a standalone model folder (LoRA merged) from a run folder, optionally pushed to the Hub."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from core.cli.common import WorkspaceOpt, cli_errors, console


@cli_errors()
def export(
    run: Path = typer.Argument(..., help="Run folder."),
    out: Path = typer.Argument(..., help="Folder for the standalone model (LoRA merged)."),
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", metavar="REPO",
                                              help="Also upload the folder to this Hugging Face Hub repository "
                                                   "(org/name; needs `huggingface-cli login` or HF_TOKEN)."),
    private: bool = typer.Option(False, help="Create the Hub repository as private (with --push-to-hub)."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Export a standalone folder with LoRA merged: plain transformers loads it with trust_remote_code=True, and
    `lolcats chat/eval` and core.load_converted read it."""
    from core.export.folder import export as export_run
    from core.export.folder import push_to_hub as push

    folder = export_run(run, out, workspace=workspace)
    console.print(f"exported to {folder}")
    if push_to_hub:
        console.print(f"pushed to https://huggingface.co/{push_to_hub}: {push(folder, push_to_hub, private=private)}")
