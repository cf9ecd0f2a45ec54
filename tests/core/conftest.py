"""Fixtures of the library tests: the core commands, and a tiny-test run with its export."""

from __future__ import annotations

import pytest
import typer

from core.cli import register


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    """The core commands (convert, eval, export, chat, ablate, bench) on an app of their own."""
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture(scope="session")
def export_workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("export-ws")


@pytest.fixture(scope="session")
def exported(export_workspace):
    """``(run folder, its report, its export folder)`` of a tiny-test conversion."""
    from core.export.folder import export  # torch loads for the tests that use it only
    from tests.tiny_runs import convert_tiny

    run, report = convert_tiny(export_workspace)
    return run, report, export(run, export_workspace / "export", workspace=export_workspace)
