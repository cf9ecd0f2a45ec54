"""The ``lolcats`` command line: one Typer app composed of the commands of each layer."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from app.server import AppError
from core.cli import register as register_core
from core.cli.common import WorkspaceOpt, cli_errors
from jobs.cli import register as register_jobs
from serving.launch import ServingEnvError
from serving.spec import ExportError

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


@app.command("serve")
@cli_errors(ServingEnvError, ExportError)
def serve_export(
    export: Path = typer.Argument(..., help="Exported folder (`lolcats export RUN OUT`)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port of the OpenAI-compatible endpoint."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (127.0.0.1: this machine only)."),
    dtype: str = typer.Option("auto", "--dtype", help="Weights' dtype in vLLM: auto (the export's), float32, bfloat16."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1,
                                                help="Longest prompt plus completion (default: the model's positions)."),
) -> None:
    """Serve an export through vLLM: an OpenAI-compatible endpoint (needs `bash scripts/setup-serving.sh` once)."""
    from serving.launch import serve

    raise typer.Exit(serve(export, host, port, say=lambda m: typer.echo(m, err=True), dtype=dtype,
                           max_model_len=max_model_len))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
