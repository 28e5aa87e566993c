"""Options shared by the commands, and the output helpers every command uses."""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fleetctl.errors import InputError

if TYPE_CHECKING:  # rich is imported when a command first prints (issue 16.10)
    from fleetctl.ui.safeconsole import SafeConsole

    out: SafeConsole
    err: SafeConsole

PlaybookArg = Annotated[Path, typer.Argument(metavar="PLAYBOOK", help="Playbook YAML, or a directory holding "
                                             "playbook.yaml.", show_default=False)]
InventoryOpt = Annotated[
    Path | None,
    typer.Option("-i", "--inventory", help="Inventory: fleetctl's YAML, or Ansible's (INI, YAML, "
                 "'ansible-inventory --list' JSON, a script) (required; no address is ever a default).",
                 show_default=False),
]
LimitOpt = Annotated[
    str | None,
    typer.Option("--limit", "-l", help="Hosts to act on, Ansible's patterns: names, groups, globs, '~regex', "
                 "'a:b' or 'a,b', '&x' also in x, '!x' not in x, 'web[0:3]', '@FILE' (a retry file)."),
]
ListHostsOpt = Annotated[
    bool, typer.Option("--list-hosts", help="Print the hosts -i and --limit select, and touch no host.")]
ForksOpt = Annotated[int, typer.Option("-f", "--forks", min=1, max=1024, help="Hosts worked on at once.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else there.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks and remote stderr.")]
AcceptNewOpt = Annotated[
    bool,
    typer.Option("--accept-new-host-keys", help="Trust unknown host keys on first use and record them (a changed key is always refused)."),
]

BecomeOpt = Annotated[bool, typer.Option("-b", "--become", help="Run the agent on each host as another user "
                                         "through sudo (Ansible's become; a host's become settings in the "
                                         "inventory take precedence).")]
BecomeUserOpt = Annotated[str | None, typer.Option("--become-user", help="The user to become (default root).",
                                                   show_default=False)]
BecomeMethodOpt = Annotated[str | None, typer.Option("--become-method", help="How to become: sudo (the only "
                                                     "one fleetctl runs).", show_default=False)]
AskBecomePassOpt = Annotated[bool, typer.Option("-K", "--ask-become-pass", help="Ask once for the sudo password "
                                                "(never echoed or logged; sent only to sudo's stdin).")]

LogFileOpt = Annotated[str | None, typer.Option("--log-file", help="Append this run's JSON-lines events (plan, "
                                              "per-host start/end, result, timings) to this file instead of the "
                                              "controller's run log.", show_default=False)]

WaitLockOpt = Annotated[float, typer.Option(
    "--wait-lock", min=0, max=86400, metavar="SECONDS",
    help="When another controller holds a host's lock (deploy, rollback, launch), wait up to this long "
         "for it to be released instead of failing that host at once (default 0).")]

DEFAULT_FORKS = 32

# The option block every command that acts on hosts takes, defined once: -i, --limit, -f after the
# command's own arguments (and --list-hosts, which the command's own code never sees: fleet_context
# reads it), --json, --debug, --accept-new-host-keys after its own options.
HEAD = (("inventory", InventoryOpt, None), ("limit", LimitOpt, None), ("forks", ForksOpt, DEFAULT_FORKS),
        ("list_hosts", ListHostsOpt, False))
TAIL = (("json_out", JsonOpt, False), ("debug", DebugOpt, False), ("accept_new_host_keys", AcceptNewOpt, False),
        ("become", BecomeOpt, False), ("become_user", BecomeUserOpt, None), ("become_method", BecomeMethodOpt, None),
        ("ask_become_pass", AskBecomePassOpt, False), ("log_file", LogFileOpt, None),
        ("wait_lock", WaitLockOpt, 0.0))
BECOME_KEYS = ("become", "become_user", "become_method", "ask_become_pass")
# options every fleet command takes that its own code never reads: fleet_context does (set per command)
LIST_HOSTS = False
BECOME: dict[str, Any] = {}  # -b/--become, --become-user, --become-method, -K (transport/become.py Cli)
LOG_FILE: str | None = None  # --log-file (fleetctl/ops/runlog.py)
WAIT_LOCK = 0.0  # --wait-lock: seconds a host's agent waits for a lock another controller holds
ARGV: list[str] = []  # the command line as given (cli.main): what a retry hint repeats


def fleet_options(fn: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared option block: `def stop(playbook: ..., timeout: ..., **shared)` is
    declared (and shown in --help) as taking -i/--inventory, --limit, -f, --json, --debug and
    --accept-new-host-keys too; they reach it in `shared` under the names of HEAD and TAIL (but
    --list-hosts, the become options and --log-file, which fleet_context reads)."""
    sig = inspect.signature(fn, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]

    def is_argument(p: inspect.Parameter) -> bool:
        return isinstance(p.default, typer.models.ArgumentInfo) or any(
            isinstance(m, typer.models.ArgumentInfo) for m in getattr(p.annotation, "__metadata__", ()))

    def made(block: tuple[tuple[str, Any, Any], ...]) -> list[inspect.Parameter]:
        return [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a, default=d) for n, a, d in block]

    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]  # typer passes every value by name
    args = [p for p in own if is_argument(p)]
    rest = [p for p in own if not is_argument(p)]

    @functools.wraps(fn)
    def command(**kwargs: Any) -> None:
        global LIST_HOSTS, BECOME, LOG_FILE, WAIT_LOCK
        LIST_HOSTS = bool(kwargs.pop("list_hosts", False))
        WAIT_LOCK = float(kwargs.pop("wait_lock", 0.0) or 0.0)
        BECOME = {k: kwargs.pop(k, None) for k in BECOME_KEYS}
        LOG_FILE = kwargs.pop("log_file", None)
        fn(**kwargs)

    command.__signature__ = sig.replace(parameters=[*args, *made(HEAD), *rest, *made(TAIL)])  # type: ignore[attr-defined]
    return command

# stdout carries results (tables or the JSON document); stderr carries progress and errors.
# SafeConsole: strings are never parsed as markup or emoji codes and control characters are shown
# escaped (fleetctl/ui/safetext.py); our own styling is passed as rich Text.
# A terminal (or COLUMNS set) gets tables fitted to its width and prose wrapped at spaces (issue 16.7).
def _console(stderr: bool) -> SafeConsole:
    from fleetctl.ui.safeconsole import SafeConsole

    c = SafeConsole(stderr=stderr, highlight=False, soft_wrap=True)
    if not c.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        # pipes and CI logs: tables fitted to 80 columns (cells fold: nothing is cut; --json has every
        # field whole), prose lines never wrapped (a line stays greppable)
        c = SafeConsole(stderr=stderr, highlight=False, soft_wrap=True, width=80)
        c.wrap_prose = False
    return c


class LazyConsole:
    """`out` / `err`: the SafeConsole, made (and rich imported) on first use, so a command that
    never prints for a person (--json) never imports rich (issue 17). Everything is forwarded."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: SafeConsole | None = None

    def resolved(self) -> SafeConsole:
        if self._console is None:
            self._console = _console(self._stderr)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resolved(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.resolved(), name, value)


out = LazyConsole(stderr=False)  # type: ignore[assignment]  # a SafeConsole in every use
err = LazyConsole(stderr=True)  # type: ignore[assignment]


def require_inventory(path: Path | None) -> Path:
    if path is None:
        raise InputError("no inventory given", hint="pass -i INVENTORY.yaml (e.g. the sandbox's DIR/inventory.yaml)",
                         reference="inventory-missing")
    return path


class JsonRun:
    """A --json fleet command in progress (set by fleet_context): after a Ctrl-C its document says
    ok=false and interrupted=true (exit 130), and one is printed even when the command had none yet."""

    def __init__(self, interrupt: Any) -> None:
        self.interrupt = interrupt  # the fleet's threading.Event
        self.emitted = False


JSON_RUN: JsonRun | None = None


def emit_json(command: str, *, ok: bool, hosts: list[dict[str, Any]] | None = None, op_id: str | None = None,
              message: str | None = None, summary: dict[str, int] | None = None, **extra: Any) -> None:
    """Print the command's one JSON document: the envelope of fleetctl/ui/jsonout.py (docs/json.md).
    Every value stays raw: json.dumps escapes control characters (and, with ensure_ascii, everything
    outside ASCII) itself, so nothing is interpreted by a terminal."""
    import fleetctl.ui.jsonout
    from fleetctl.ui.jsonout import envelope

    fleetctl.ui.jsonout.emitted = True
    run = JSON_RUN
    if run is not None:
        run.emitted = True
        if run.interrupt.is_set():  # Ctrl-C: the command exits 130, so the document is not ok
            ok = False
            extra["interrupted"] = True
            message = f"interrupted (Ctrl-C): {message}" if message and not message.startswith("interrupted") \
                else (message or "interrupted (Ctrl-C)")

    from fleetctl.model.suggest import complete_doc

    doc = complete_doc(envelope(command, ok=ok, hosts=hosts, op_id=op_id, message=message, summary=summary, **extra))
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()
