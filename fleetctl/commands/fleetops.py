"""deploy, verify-logs, rollback, explain, launch, stop, status, history."""

from __future__ import annotations

import typer

from fleetctl.errors import FleetctlError


def _pending(name: str, issue: int) -> None:
    raise FleetctlError(f"'fleetctl {name}' is not built yet (tracked in issue {issue})")


def register(app: typer.Typer) -> None:
    @app.command("deploy", help="Patch every host to the playbook's intended files (plan, backup, atomic swap, verify).")
    def deploy() -> None:
        _pending("deploy", 3)

    @app.command("verify-logs", help="Prove from each server's current log, per host and rank, that the patched code runs.")
    def verify_logs() -> None:
        _pending("verify-logs", 5)

    @app.command("rollback", help="Restore each host's files to their bytes before its last (or a named) deploy.")
    def rollback() -> None:
        _pending("rollback", 3)

    @app.command("explain", help="Say per host which SGLang worker class and file will run, and whether the playbook patches it.")
    def explain() -> None:
        _pending("explain", 4)

    @app.command("launch", help="Start the SGLang servers of the playbook's launch profile and wait until ready.")
    def launch() -> None:
        _pending("launch", 5)

    @app.command("stop", help="Stop the servers fleetctl launched (SIGTERM, then SIGKILL after a timeout).")
    def stop() -> None:
        _pending("stop", 5)

    @app.command("status", help="Per host: deploy state of the files, servers running, restart needed.")
    def status() -> None:
        _pending("status", 3)

    @app.command("history", help="The local ledger of deploys and rollbacks.")
    def history() -> None:
        _pending("history", 3)
