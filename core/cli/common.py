"""What every command line of the project shares: the error handler, the workspace option, run folders, progress.

Used by ``lolcats`` (:mod:`app.cli`), ``lolcats jobs`` (:mod:`jobs.cli`) and the distributed entry
point ``python -m core.cli.distributed``. Importing it loads neither torch nor transformers.

Exit status: 0 done, 1 a user error (one line naming the cause and the fix, on stderr), 3 stopped
on request (the checkpoint is kept). Any other exception is a bug and ends with its traceback.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable, Optional

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from core.config.presets import PRESET_DESCRIPTIONS
from core.progress import StopRequested
from core.workspace import WorkspaceError, runs_dir, safe_child, workspace_root

EXIT_USER_ERROR = 1
EXIT_STOPPED = 3

console = Console()
err_console = Console(stderr=True)

WORKSPACE_HELP = "Workspace folder (default: $LOLCATS_WORKSPACE or ./workspace)."
WorkspaceOpt = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP)
PRESET_HELP = "Base preset, the file's fields override it: " + "; ".join(
    f"{name} ({description})" for name, description in PRESET_DESCRIPTIONS.items())
SET_HELP = ("Override one config field: FIELD=VALUE, FIELD a dotted path such as attention.window_size, "
            "VALUE parsed as YAML; repeatable, applied in order.")

ErrorTypes = tuple[type[BaseException], ...]


def _core_user_errors() -> ErrorTypes:
    from core.errors import USER_ERRORS  # only once a command failed: core.errors loads torch

    return (WorkspaceError, *USER_ERRORS)


def exit_status(exc: BaseException, user_errors: ErrorTypes = ()) -> int | None:
    """Report ``exc`` and return the exit status; None when it is a bug (the caller re-raises it).

    User errors are ``user_errors`` and :data:`core.errors.USER_ERRORS`; each prints one line."""
    if isinstance(exc, StopRequested):
        err_console.print(f"stopped: {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_STOPPED
    if isinstance(exc, user_errors) or isinstance(exc, _core_user_errors()):
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_USER_ERROR
    return None


def cli_errors(*user_errors: type[BaseException]) -> Callable[[Callable], Callable]:
    """Decorator for a Typer command: user errors (``user_errors`` and core's) and stop requests
    become their line and exit status (:func:`exit_status`); bugs keep their traceback."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (click.exceptions.Exit, click.ClickException, click.Abort):
                raise  # the command line's own exits and usage errors
            except Exception as exc:
                code = exit_status(exc, user_errors)
                if code is None:
                    raise
                raise typer.Exit(code) from None

        return wrapper

    return decorate


def run_path(output: Optional[str], workspace: Optional[Path], default_name: str) -> Path:
    """The run folder a command line names: an absolute ``output`` as given, a relative one under
    ``<workspace>/runs`` (refused when it climbs out), none ``<default_name>-<date>-<time>`` there."""
    if output is not None and Path(output).expanduser().is_absolute():
        return Path(output).expanduser().resolve()
    target = output or f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return safe_child(runs_dir(workspace_root(workspace)), target)


class RichProgress:
    """Renders core progress callbacks as one progress bar per stage."""

    def __init__(self):
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[metrics]}"), TimeRemainingColumn(), console=console)
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        self.bars.__exit__(*exc)

    def on_step(self, stage, step, total, metrics, layer_metrics=None):
        if stage not in self.tasks:
            self.tasks[stage] = self.bars.add_task(stage, total=total, metrics="")
        shown = "  ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:3])
        self.bars.update(self.tasks[stage], completed=step, total=total, metrics=shown)

    def on_log(self, message):
        self.bars.console.log(message)

    def should_stop(self):
        return False


__all__ = ["cli_errors", "exit_status", "run_path", "RichProgress", "WorkspaceOpt", "WORKSPACE_HELP", "console", "err_console",
           "EXIT_USER_ERROR", "EXIT_STOPPED"]
