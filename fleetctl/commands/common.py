"""Options shared by the commands, and the output helpers every command uses."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fleetctl.errors import InputError

if TYPE_CHECKING:  # rich is imported when a command first prints (issue 16.10)
    from fleetctl.safetext import SafeConsole

    out: SafeConsole
    err: SafeConsole

PlaybookArg = Annotated[Path, typer.Argument(help="Playbook YAML, or a directory holding playbook.yaml.",
                                             show_default=False)]
InventoryOpt = Annotated[
    Path | None,
    typer.Option("-i", "--inventory", help="Inventory YAML (required; no address is ever a default).",
                 show_default=False),
]
LimitOpt = Annotated[
    str | None,
    typer.Option("--limit", "-l", help="Hosts to act on: names, group names, globs, comma lists; '!x' excludes."),
]
ForksOpt = Annotated[int, typer.Option("-f", "--forks", min=1, max=1024, help="Hosts worked on at once.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else there.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks and remote stderr.")]
AcceptNewOpt = Annotated[
    bool,
    typer.Option("--accept-new-host-keys", help="Trust unknown host keys on first use and record them (a changed key is always refused)."),
]

DEFAULT_FORKS = 32

# stdout carries results (tables or the JSON document); stderr carries progress and errors.
# SafeConsole: strings are never parsed as markup or emoji codes and control characters are shown
# escaped (fleetctl/safetext.py); our own styling is passed as rich Text.
# A terminal (or COLUMNS set) gets tables fitted to its width and prose wrapped at spaces (issue 16.7).
def _console(stderr: bool) -> SafeConsole:
    from fleetctl.safetext import SafeConsole

    c = SafeConsole(stderr=stderr, highlight=False, soft_wrap=True)
    if not c.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        # pipes and CI logs: wide enough for the tables, lines never wrapped
        c = SafeConsole(stderr=stderr, highlight=False, soft_wrap=True, width=160)
        c.wrap_prose = False
    return c


def __getattr__(name: str) -> Any:
    """`out` and `err`, made on first use (one of each per process)."""
    if name in ("out", "err"):
        globals()[name] = c = _console(name == "err")
        return c
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def require_inventory(path: Path | None) -> Path:
    if path is None:
        raise InputError("no inventory given", hint="pass -i INVENTORY.yaml (e.g. the sandbox's DIR/inventory.yaml)")
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
    """Print the command's one JSON document: the envelope of fleetctl/jsonout.py (docs/json.md).
    Every value stays raw: json.dumps escapes control characters (and, with ensure_ascii, everything
    outside ASCII) itself, so nothing is interpreted by a terminal."""
    from fleetctl.jsonout import envelope

    run = JSON_RUN
    if run is not None:
        run.emitted = True
        if run.interrupt.is_set():  # Ctrl-C: the command exits 130, so the document is not ok
            ok = False
            extra["interrupted"] = True
            message = f"interrupted (Ctrl-C): {message}" if message and not message.startswith("interrupted") \
                else (message or "interrupted (Ctrl-C)")

    doc = envelope(command, ok=ok, hosts=hosts, op_id=op_id, message=message, summary=summary, **extra)
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()
