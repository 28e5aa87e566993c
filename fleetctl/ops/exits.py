"""How a server ended, in one line: its exit status (from the host's supervisor), whether it had
become ready, and the exception its log ends with. Pure functions over what the agent sent."""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from typing import Any

# a log line's prefix as servers print them ("[2026-01-01 10:00:00 TP0] "), before the text
_PREFIX = re.compile(r"^\[[^\]]{0,80}\]\s*")
# the last line of a Python traceback: "pkg.mod.SomeError: message" or a bare "SomeError"
_EXC = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)\b(?::.*)?$")
MAX_LINE = 300


def status_text(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"status {returncode}"


def last_exception(tail: Sequence[str]) -> str | None:
    """The exception line that ends the last traceback in `tail` (None if there is none)."""
    lines = [_PREFIX.sub("", ln).rstrip() for ln in tail]
    start = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")),
                default=None)
    scan = lines[start + 1:] if start is not None else lines
    found = None
    for ln in scan:
        if ln and not ln[0].isspace() and _EXC.match(ln):
            found = ln
    if found is None and start is not None:  # the traceback's last unindented line
        found = next((ln for ln in reversed(scan) if ln and not ln[0].isspace()), None)
    if found is None:
        return None
    return found if len(found) <= MAX_LINE else found[:MAX_LINE] + "..."


def exited_line(exit_info: dict[str, Any] | None, *, ready: bool, tail: Sequence[str]) -> str:
    """'the server exited (status 1) before ready: RuntimeError: ...'."""
    how = "exited"
    if exit_info is not None and isinstance(exit_info.get("returncode"), int):
        how = f"exited ({status_text(exit_info['returncode'])})"
    line = f"the server {how} {'after' if ready else 'before'} ready"
    exc = last_exception(tail)
    return f"{line}: {exc}" if exc else line
