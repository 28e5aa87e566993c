"""fleetctl patch apply|check|new: local tools for patch authors."""

from __future__ import annotations

import typer

patch_app = typer.Typer(help="Local tools for patch authors: apply, check, new.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(patch_app, name="patch")
