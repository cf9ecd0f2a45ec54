"""The ``lolcats`` command line: one Typer app composed of the commands of each layer."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from app.server import AppError
from core.cli import register as register_core
from core.cli.common import WorkspaceOpt, cli_errors
from jobs.cli import register as register_jobs

app = typer.Typer(
    name="lolcats",
    help="LoLCATs Workbench: linearize a pretrained LLM's attention, then inspect and chat with it.",
    no_args_is_help=True,
    add_completion=False,
)
register_core(app)
register_jobs(app)


@app.command("app")
@cli_errors(AppError)
def serve_app(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (127.0.0.1: this machine only)."),
    port: int = typer.Option(8501, "--port", min=1, max=65535, help="Port of the web UI."),
    workspace: Optional[Path] = WorkspaceOpt,
    worker: bool = typer.Option(True, "--worker/--no-worker", help="Also start a job worker (default: yes)."),
) -> None:
    """Start the workbench: the web UI and a job worker, stopped together (Ctrl-C)."""
    from app.server import serve

    raise typer.Exit(serve(host, port, workspace, worker=worker, say=lambda m: typer.echo(m, err=True)))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
