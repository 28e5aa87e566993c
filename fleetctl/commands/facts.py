"""fleetctl facts: its options and help (light: issue 16.10); facts_impl.py runs it."""

from __future__ import annotations

from typing import Any

import typer

from fleetctl.commands import run
from fleetctl.commands.common import (
    fleet_options,
)


def register(app: typer.Typer) -> None:
    @app.command("facts", help="Per host: reachable, OS, python, SGLang version and dir, torch, file hashes, GPUs.")
    @fleet_options
    def facts(
        files: bool = typer.Option(False, "--files", help="List the sha256 of every hashed file."),
        **shared: Any,
    ) -> None:
        run("facts", files=files, **shared)
