"""gpu-check: its options and help, declared here and nothing else (light: issue 16.10). The work is
in gpucheck_impl.py and fleetctl/ops/gpu_check.py."""

from __future__ import annotations

from typing import Any

import typer

from fleetctl.commands import run
from fleetctl.commands.common import PlaybookArg, fleet_options

HELP = ("On each host's own GPU and SGLang install: a tiny model fleetctl makes there, throwaway servers "
        "(speculation on, off, the patch's dynamic mode): marker, greedy outputs, tokens/s; then removes it all.")


def register(app: typer.Typer) -> None:
    @app.command("gpu-check", help=HELP)
    @fleet_options
    def gpu_check(
        playbook: PlaybookArg,
        timeout: float | None = typer.Option(None, "--timeout", min=1.0,
                                             help="Seconds to wait for each throwaway server to be ready "
                                                  "(default: launch.ready_timeout)."),
        check: bool = typer.Option(False, "--check", help="Show each host's plan (GPU, torch, the three servers' "
                                   "argv and env, the concurrencies) and make or start nothing."),
        **shared: Any,
    ) -> None:
        run("gpu-check", playbook=playbook, timeout=timeout, check=check, **shared)
