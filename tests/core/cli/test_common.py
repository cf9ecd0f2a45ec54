"""The shared error handler and run-folder rule of every command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from core.cli.common import EXIT_STOPPED, EXIT_USER_ERROR, cli_errors, run_path
from core.config import ConfigError
from core.progress import StopRequested
from core.workspace import WorkspaceError

runner = CliRunner()


class ToolError(Exception):
    """A user error of some other layer, passed to the handler."""


def app_raising(exc: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @cli_errors(ToolError)
    def fail() -> None:
        raise exc

    return app


@pytest.mark.parametrize("exc, code, line", [
    (ConfigError("stage1.lr: must be > 0; lower it"), EXIT_USER_ERROR, "error: stage1.lr: must be > 0; lower it"),
    (ToolError("no job with id 9 [see `jobs list`]"), EXIT_USER_ERROR, "error: no job with id 9 [see `jobs list`]"),
    (StopRequested("stage1 stopped after step 3"), EXIT_STOPPED, "stopped: stage1 stopped after step 3"),
], ids=["core-user-error", "layer-user-error", "stopped"])
def test_user_errors_are_one_line_and_an_exit_status(exc, code, line):
    result = runner.invoke(app_raising(exc), [])
    assert result.exit_code == code
    assert result.output.strip() == line and "Traceback" not in result.output


def test_bugs_keep_their_traceback():
    result = runner.invoke(app_raising(KeyError("layer")), [])
    assert isinstance(result.exception, KeyError)  # not swallowed into a one-line "user error"
    assert "error:" not in result.output


def test_absolute_output_is_used_as_given_relative_output_stays_in_the_workspace(tmp_path):
    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere" / "run"
    assert run_path(str(elsewhere), ws, "run") == elsewhere.resolve()
    assert run_path("demo", ws, "run") == (ws / "runs" / "demo").resolve()
    assert run_path(None, ws, "cpu-demo").parent == (ws / "runs").resolve()
    with pytest.raises(WorkspaceError, match="escapes the workspace"):
        run_path("../../outside", ws, "run")


def test_importing_the_command_lines_loads_no_torch():
    code = "import sys, core.cli, jobs.cli; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
