"""fleetctl facts: its options and help (light: issue 16.10); facts_impl.py runs it."""

from __future__ import annotations

import typer

from fleetctl.commands.common import (
    DEFAULT_FORKS,
    AcceptNewOpt,
    DebugOpt,
    ForksOpt,
    InventoryOpt,
    JsonOpt,
    LimitOpt,
)


def register(app: typer.Typer) -> None:
    @app.command("facts", help="Per host: reachable, OS, python, SGLang version and dir, torch, file hashes, GPUs.")
    def facts(
        inventory: InventoryOpt = None,
        limit: LimitOpt = None,
        forks: ForksOpt = DEFAULT_FORKS,
        files: bool = typer.Option(False, "--files", help="List the sha256 of every hashed file."),
        json_out: JsonOpt = False,
        debug: DebugOpt = False,
        accept_new_host_keys: AcceptNewOpt = False,
    ) -> None:
        from fleetctl.commands import facts_impl

        facts_impl.facts(inventory=inventory, limit=limit, forks=forks, files=files, json_out=json_out, debug=debug,
            accept_new_host_keys=accept_new_host_keys)
