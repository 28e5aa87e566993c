"""launch, stop, verify-logs: the servers and the proof from their logs (issue 5)."""

from __future__ import annotations

import typer

from fleetctl.errors import FleetctlError


def _pending(name: str) -> None:
    raise FleetctlError(f"'fleetctl {name}' is not built yet (tracked in issue 5)")


def register(app: typer.Typer) -> None:
    @app.command("verify-logs", help="Prove from each server's current log, per host and rank, that the patched code runs.")
    def verify_logs() -> None:
        _pending("verify-logs")

    @app.command("launch", help="Start the SGLang servers of the playbook's launch profile and wait until ready.")
    def launch() -> None:
        _pending("launch")

    @app.command("stop", help="Stop the servers fleetctl launched (SIGTERM, then SIGKILL after a timeout).")
    def stop() -> None:
        _pending("stop")
