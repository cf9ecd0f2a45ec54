"""The ``lolcats`` command line: one Typer app composed of the commands of each layer."""

from __future__ import annotations

import typer

from core.cli import register as register_core
from jobs.cli import register as register_jobs

app = typer.Typer(
    name="lolcats",
    help="LoLCATs Workbench: linearize a pretrained LLM's attention, then inspect and chat with it.",
    no_args_is_help=True,
    add_completion=False,
)
register_core(app)
register_jobs(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
