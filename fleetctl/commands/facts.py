"""fleetctl facts: what each host is."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("facts", help="Per host: reachable, OS, python, SGLang version and dir, torch, file hashes, GPUs.")
    def facts() -> None:
        raise NotImplementedError
