"""launch (--check shows its plan), stop, verify-logs, servers: their options and help, declared here and nothing else.

Light (issue 16.10) and thin (issue 12.5): each command hands its parsed options to `run(name, ...)`,
which imports servers_impl.py (the command table, commands/__init__.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fleetctl.commands import run
from fleetctl.commands.common import (
    PlaybookArg,
    fleet_options,
)


def register(app: typer.Typer) -> None:
    @app.command("launch", help="Start the SGLang servers of the playbook's launch profile and wait until ready.")
    @fleet_options
    def launch(
        playbook: PlaybookArg,
        replace: bool = typer.Option(False, "--replace", help="Stop a fleetctl server already running there first."),
        timeout: float | None = typer.Option(None, "--timeout", min=0.1,
                                             help="Seconds to wait per host for ready (default: launch.ready_timeout)."),
        drop_unknown_flags: bool = typer.Option(
            False, "--drop-unknown-flags",
            help="Leave out flags the installed SGLang does not register (e.g. the patch's own flag after a rollback)."),
        allow_uncovered: bool = typer.Option(
            False, "--allow-uncovered", help="Launch even where the worker that will run is not one the playbook patches."),
        check: bool = typer.Option(False, "--check", help="Show the launch plan (argv, env, GPUs, ports, what "
                                   "--replace stops) and start or stop nothing."),
        **shared: Any,
    ) -> None:
        run("launch", playbook=playbook, replace=replace, timeout=timeout,
            drop_unknown_flags=drop_unknown_flags, allow_uncovered=allow_uncovered, check=check, **shared)

    @app.command("verify-logs", help="Prove from each server's current log, per host and rank, that the patched code runs.")
    @fleet_options
    def verify_logs(
        playbook: PlaybookArg,
        **shared: Any,
    ) -> None:
        run("verify-logs", playbook=playbook, **shared)

    @app.command("stop", help="Stop the servers fleetctl launched (SIGTERM, then SIGKILL after a timeout).")
    @fleet_options
    def stop(
        playbook: Annotated[Path | None, typer.Argument(metavar="PLAYBOOK",
                                                        help="Optional playbook: its launch.stop_timeout.")] = None,
        instance: list[str] | None = typer.Option(None, "--instance", help="Only this instance (repeatable), e.g. port-30000."),
        timeout: float | None = typer.Option(None, "--timeout", min=0.1,
                                             help="Seconds between SIGTERM and SIGKILL (default: launch.stop_timeout, 30)."),
        **shared: Any,
    ) -> None:
        run("stop", playbook=playbook, instance=instance, timeout=timeout, **shared)

    @app.command("servers", help="List the servers fleetctl launched (--discover: every SGLang server process).")
    @fleet_options
    def servers(
        discover: bool = typer.Option(
            False, "--discover",
            help="Find every SGLang server process from /proc, whoever started it: argv, environment, log, "
                 "port, which worker it runs, and whether it runs code older than the files on disk."),
        **shared: Any,
    ) -> None:
        run("servers", discover=discover, **shared)
