"""Fixtures of the library tests."""

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
