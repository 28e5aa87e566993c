"""Shared set-up for commands that act on hosts: inventory, --limit, the Fleet, progress."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl.commands import common
from fleetctl.commands.common import err, require_inventory
from fleetctl.errors import EXIT_INTERRUPTED, Interrupted
from fleetctl.ui.safetext import DETAIL_LIMIT, line, safe

if TYPE_CHECKING:  # imported when a command reaches its hosts (issue 16.10)
    from fleetctl.config.hosts import Inventory
    from fleetctl.config.playbook_model import Playbook
    from fleetctl.ops.runner import Fleet

__all__ = ["EXIT_INTERRUPTED", "Interrupted"]


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
                  accept_new_host_keys: bool = False, command: str = "fleetctl",
                  ahead: Callable[[Any], None] | None = None) -> Iterator[RunContext]:
    """The command's fleet. The hosts' connections start opening at once, in the background
    (Fleet.prefetch), while the command loads the rest of what it needs; not with
    --accept-new-host-keys, which records keys only once the command's input has been read.
    `ahead`: the first step's work that may start as soon as a host is connected (Fleet.prefetch).
    An inventory resolved before from the same inputs is taken as kept (config/inventory_cache.py),
    without parsing it again."""
    from fleetctl.config import inventory_cache

    started = time.monotonic()
    path = require_inventory(inventory)
    inv = inventory_cache.lookup(path)
    if inv is None:
        from fleetctl.config.inventory import load_inventory

        sha = inventory_cache.file_sha(path)
        inv = load_inventory(path)
        inventory_cache.save(inv, sha)
    hosts = inv.select(limit)
    from fleetctl.transport import become

    b = common.BECOME
    hosts = become.apply(hosts, become.Cli(bool(b.get("become")), b.get("become_user"), b.get("become_method"),
                                           bool(b.get("ask_become_pass"))))
    if common.LIST_HOSTS:
        list_hosts(command, hosts, json)
    if b.get("ask_become_pass") and any(h.becomes for h in hosts) and become.password() is None:
        become.ask_password()
    from fleetctl.ops import runlog

    runlog.begin(command, log_file=common.LOG_FILE, argv=common.ARGV, inventory=inv.path, hosts=hosts)
    from fleetctl.ops.runner import (  # the transport (paramiko, fabric): once the input is valid
        Fleet,
        raise_fd_limit,
    )

    note = raise_fd_limit(len(hosts))
    if note:
        sys.stderr.write(note + "\n")
    fleet = Fleet(inv, hosts, forks=forks, accept_new_host_keys=accept_new_host_keys, wait_lock=common.WAIT_LOCK)
    if not accept_new_host_keys:
        fleet.prefetch(ahead)
    handler = _CtrlC(fleet, inv.path)
    previous = handler.install()
    run = common.JsonRun(fleet.interrupt) if json else None
    common.JSON_RUN = run
    exit_code = 0
    try:
        yield RunContext(inv, fleet, started, json, debug)
    except BaseException as e:
        exit_code = _exit_code(e)
        raise
    finally:
        handler.uninstall(previous)
        common.JSON_RUN = None
        try:
            if fleet.interrupt.is_set():
                what = (f"interrupted: {len(fleet.not_started)} host(s) not started, {len(fleet.at_interrupt)} were "
                        f"in flight and finished or timed out")
                if run is not None and not run.emitted:  # --json: a script still gets its one document
                    common.emit_json(command, ok=False, hosts=interrupt_rows(fleet), message=what, interrupted=True)
                sys.stdout.flush()
                sys.stderr.write(interrupt_report(fleet))
                raise Interrupted(what, hint=f"'fleetctl status -i {inv.path}' shows each host's state")
        finally:
            _report_accepted_keys(fleet)
            fleet.close()
            failed = [n for n, o in fleet.last.items() if not o.ok] + sorted(fleet.not_started)
            say = runlog.end(130 if fleet.interrupt.is_set() else exit_code, fallback_failed=failed,
                             argv=common.ARGV)
            if say:
                sys.stdout.flush()
                sys.stderr.write(say + "\n")


def _exit_code(e: BaseException) -> int:
    """The exit status a command ends with when `e` leaves it (cli.main's mapping)."""
    from fleetctl.errors import FleetctlError

    code = getattr(e, "exit_code", None)  # typer.Exit, FleetctlError
    if isinstance(code, int):
        return code
    if isinstance(e, SystemExit):
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    if isinstance(e, KeyboardInterrupt):
        return 130
    return 2 if isinstance(e, FleetctlError) else 1


@contextmanager
def playbook_fleet(playbook: Path, inventory: Path | None, limit: str | None, forks: int, *, json: bool,
                   debug: bool, accept_new_host_keys: bool = False, command: str = "fleetctl",
                   ahead: Callable[[Any], None] | None = None) -> Iterator[tuple[Playbook, RunContext]]:
    """fleet_context, with the playbook loaded while the hosts' connections open (pydantic and the
    playbook's models are most of a command's start; a playbook loaded before from the same inputs
    is taken as kept: config/playbook_cache.py). A playbook file that is not there fails
    first, before any host is contacted; a malformed one fails the same way, once the inventory
    has been read."""
    if not (playbook / "playbook.yaml" if playbook.is_dir() else playbook).is_file():
        from fleetctl.config.playbook import load_playbook

        load_playbook(playbook)  # raises its one line
    from fleetctl.model import suggest

    suggest.playbook = str(playbook)
    with fleet_context(inventory, limit, forks, json=json, debug=debug, command=command,
                       accept_new_host_keys=accept_new_host_keys, ahead=ahead) as ctx:
        from fleetctl.config import playbook_cache

        yield playbook_cache.load(playbook), ctx


def list_hosts(command: str, hosts: list[Any], json: bool) -> None:
    """--list-hosts: the selection, as Ansible prints it (or one JSON document); no host is touched."""
    import typer

    if json:
        common.emit_json(command, ok=True, hosts=[{"host": h.name, "ok": True, "state": "selected", "message": "",
                                                   "address": h.address, "port": h.port, "user": h.user,
                                                   "groups": list(h.groups)} for h in hosts],
                         message=f"{len(hosts)} host(s) selected; none touched", list_hosts=True)
    else:
        sys.stdout.write(f"  hosts ({len(hosts)}):\n" + "".join(f"    {safe_name(h.name)}\n" for h in hosts))
        sys.stdout.flush()
    raise typer.Exit(0)


def safe_name(name: str) -> str:
    return name.encode("ascii", "backslashreplace").decode("ascii") if not name.isprintable() else name


def _report_accepted_keys(fleet: Fleet) -> None:
    """Keys trusted on first use are said on stderr, so the user can check them out of band."""
    for msg in fleet.accepted_keys():
        err.print(line(msg))


class _CtrlC:
    """SIGINT during a fleet command. First press: start no new host, let the hosts in flight finish
    or time out (their transactions end cleanly), then report per host and exit 130. Second press:
    exit at once, naming the hosts that may be left mid-transaction."""

    def __init__(self, fleet: Fleet, inventory: Path) -> None:
        self.fleet = fleet
        self.inventory = inventory

    def install(self) -> tuple[bool, object]:
        if threading.current_thread() is not threading.main_thread():
            return False, None
        return True, signal.signal(signal.SIGINT, self)

    def uninstall(self, previous: tuple[bool, object]) -> None:
        installed, handler = previous
        if installed:  # a handler not set from Python reads as None: restore the default then
            signal.signal(signal.SIGINT, handler if handler is not None else signal.default_int_handler)  # type: ignore[arg-type]

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        f = self.fleet
        flying = {name: (c.step or "between steps") for name, c in list(f.inflight.items())}
        where = ", ".join(f"{n} (at {s})" for n, s in flying.items())
        if not f.interrupt.is_set():
            f.at_interrupt.update(flying)
            f.interrupt.set()
            sys.stderr.write(f"\ninterrupt: starting no new host; waiting for {len(flying)} host(s) in flight to "
                             f"finish or time out{': ' + where if where else ''}. Press Ctrl-C again to exit at once.\n")
            sys.stderr.flush()
            from fleetctl.transport import events

            events.emit("interrupt")
            return
        sys.stderr.write(f"\ninterrupted again: exiting now; {len(flying)} host(s) left in flight"
                         f"{': ' + where if where else ''}. A host may be left mid-transaction: "
                         f"'fleetctl status -i {self.inventory}' shows it (the next deploy or rollback repairs "
                         f"an interrupted one).\n")
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(EXIT_INTERRUPTED)


def interrupt_rows(fleet: Fleet) -> list[dict[str, Any]]:
    """--json after a Ctrl-C that came before the command's own result: per host, what it did."""
    rows = []
    for h in fleet.hosts:
        last = fleet.last.get(h.name)
        conn = fleet._conns.get(h.name)
        done = list(dict.fromkeys(conn.done)) if conn is not None else []
        if h.name in fleet.at_interrupt:
            state = "in-flight"
        elif h.name in fleet.not_started or last is None:
            state = "not-started"
        else:
            state = "done" if last.ok else last.status
        msg = (f"in flight at {fleet.at_interrupt[h.name]} when interrupted" if state == "in-flight"
               else "" if last is None else "" if last.ok else last.message)
        rows.append({"host": h.name, "ok": False, "state": state, "message": msg, "done": done,
                     "last_step": None if last is None else ("done" if last.ok else last.status)})
    return rows


def interrupt_report(fleet: Fleet) -> str:
    """Per host, after a Ctrl-C: done, not started, or in flight at step X (and how that ended)."""
    lines = ["interrupted (Ctrl-C): per host:"]
    for h in fleet.hosts:
        last = fleet.last.get(h.name)
        conn = fleet._conns.get(h.name)
        did = f" (done: {', '.join(dict.fromkeys(conn.done))})" if conn is not None and conn.done else ""
        ended = ("" if last is None else
                 "done" if last.ok else f"{last.status}: {last.message}")
        if h.name in fleet.at_interrupt:
            lines.append(f"  {h.name}: in flight at {fleet.at_interrupt[h.name]} when interrupted; then {ended}")
        elif h.name in fleet.not_started:  # with steps done: only the next step did not start
            lines.append(f"  {h.name}: next step not started{did}" if did else f"  {h.name}: not started")
        elif last is not None:
            lines.append(f"  {h.name}: {ended}{did if last.ok else ''}")
        else:
            lines.append(f"  {h.name}: not started")
    return "\n".join(lines) + "\n"


def print_debug_details(ctx: RunContext, outcomes: list) -> None:
    if not ctx.debug:
        return
    for o in outcomes:
        if getattr(o, "debug", None):
            err.print(line(f"--- {o.host} detail ---"))
            err.print(safe(o.debug, multiline=True, limit=DETAIL_LIMIT))


T = TypeVar("T")


def run_with_progress(ctx: RunContext, what: str, fn: Callable[[], T]) -> T:
    """Run fn with a live 'hosts done / failed' bar on stderr (not with --json, not off a terminal)."""
    from fleetctl.ui.render import host_progress

    if ctx.fleet.interrupt.is_set():  # after a Ctrl-C no later step starts on any host: the report
        raise Interrupted(f"interrupted before {what}")  # (fleet_context) says what each host did
    with host_progress(err, len(ctx.fleet.hosts), what, enabled=not ctx.json) as tick:
        ctx.fleet.progress = tick
        ctx.fleet.step = what
        try:
            return fn()
        finally:
            ctx.fleet.progress = None
            ctx.fleet.step = "run"


def fmt_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""
