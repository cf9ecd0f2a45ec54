"""Commands of the ``core`` layer for the ``lolcats`` CLI."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this layer's commands to the top-level app."""
