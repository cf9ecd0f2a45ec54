"""Core commands of the ``lolcats`` CLI, one module per command, plus what every command line shares.

    lolcats convert [CONFIG.yaml] [--preset NAME] [--output DIR] [--resume]
    lolcats eval RUN_OR_EXPORT [--ppl-blocks N] [--seq-len L] [--passkey-trials T] [-o FILE]
    lolcats export RUN OUT
    lolcats chat RUN_OR_EXPORT [--max-new-tokens N]
    lolcats ablate [--preset NAME] [--steps N] [--kinds linear,terraced]
    lolcats bench [--model M] [--batch-sizes 1,8] [--prompt-lengths 1024,4096] [-o FILE]

An absolute ``--output`` is used as given; a relative one lives under ``<workspace>/runs`` and is
refused when it climbs out. Errors and exit status: :mod:`core.cli.common`.
"""

from __future__ import annotations

from typing import Callable

import typer

from core.cli.ablate import ablate
from core.cli.bench import bench
from core.cli.chat import chat
from core.cli.common import RichProgress, WorkspaceOpt, cli_errors, exit_status, run_path
from core.cli.convert import convert
from core.cli.evaluate import evaluate
from core.cli.export import export

COMMANDS: dict[str, Callable] = {"convert": convert, "eval": evaluate, "export": export, "chat": chat,
                                 "bench": bench, "ablate": ablate}


def register(app: typer.Typer) -> None:
    """Add the core commands to the top-level app."""
    for name, command in COMMANDS.items():
        app.command(name)(command)


__all__ = ["COMMANDS", "register", "cli_errors", "exit_status", "run_path", "RichProgress", "WorkspaceOpt"]
