"""Shared set-up for commands that act on hosts: inventory, --limit, the Fleet, progress."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from fleetctl.commands.common import err, require_inventory
from fleetctl.safetext import DETAIL_LIMIT, line, safe

if TYPE_CHECKING:  # imported when a command reaches its hosts (issue 16.10)
    from fleetctl.config.inventory import Inventory
    from fleetctl.fleet import Fleet


@dataclass
class RunContext:
    inventory: Inventory
    fleet: Fleet
    started: float
    json: bool
    debug: bool

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@contextmanager
def fleet_context(inventory: Path | None, limit: str | None, forks: int, *, json: bool, debug: bool,
                  accept_new_host_keys: bool = False) -> Iterator[RunContext]:
    from fleetctl.config.inventory import load_inventory

    started = time.monotonic()
    inv = load_inventory(require_inventory(inventory))
    hosts = inv.select(limit)
    from fleetctl.fleet import Fleet  # the transport (paramiko, fabric): only once the input is valid
    fleet = Fleet(inv, hosts, forks=forks, accept_new_host_keys=accept_new_host_keys)
    try:
        yield RunContext(inv, fleet, started, json, debug)
    finally:
        fleet.close()


def print_debug_details(ctx: RunContext, outcomes: list) -> None:
    if not ctx.debug:
        return
    for o in outcomes:
        if getattr(o, "detail", None):
            err.print(line(f"--- {o.host} detail ---"))
            err.print(safe(o.detail, multiline=True, limit=DETAIL_LIMIT))


T = TypeVar("T")


def run_with_progress(ctx: RunContext, what: str, fn: Callable[[], T]) -> T:
    """Run fn with a live 'hosts done / failed' bar on stderr (not with --json, not off a terminal)."""
    from fleetctl.render import host_progress

    with host_progress(err, len(ctx.fleet.hosts), what, enabled=not ctx.json) as tick:
        ctx.fleet.progress = tick
        try:
            return fn()
        finally:
            ctx.fleet.progress = None


def fmt_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""
