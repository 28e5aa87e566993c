"""fleetctl sandbox up|down|status: a local fleet of real sshd hosts for trying fleetctl."""

from __future__ import annotations

import typer

sandbox_app = typer.Typer(help="A local fleet of real OpenSSH hosts on loopback: up, down, status.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
