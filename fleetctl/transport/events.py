"""Points a command reaches, signalled to a program that drives fleetctl and must act at an exact
point of it (the test suite, a wrapper script) instead of guessing with a sleep.

With `FLEETCTL_EVENT_FD=N` in the environment (N: a file descriptor the caller passed open, e.g. the
write end of a pipe), fleetctl writes one line per event to N as it happens: words separated by
single spaces, the event's name first. Unset (the normal case): nothing is written, nothing is
opened. Events (docs/reliability.md lists them):

    host-start HOST        a host begins its part of a step (it is "in flight" from now on)
    host-end HOST STATUS   ... and ends it (ok, failed, unreachable, skipped)
    step HOST WHAT         a bounded step on the host begins (spaces in WHAT written as _)
    interrupt              the first Ctrl-C was taken: no host starts anything new
    launch-waiting HOST    launch started the host's servers and waits for them to be ready
"""

from __future__ import annotations

import os

ENV = "FLEETCTL_EVENT_FD"
_fd: int | None = None
_read = False


def _target() -> int | None:
    global _fd, _read
    if not _read:
        _read = True
        raw = os.environ.get(ENV, "")
        _fd = int(raw) if raw.isdigit() else None
    return _fd


def emit(name: str, *words: str) -> None:
    """Write one event line; never raises (a reader that went away stops nothing)."""
    fd = _target()
    if fd is None:
        return
    text = " ".join([name, *(w.replace(" ", "_").replace("\n", "_") for w in words)]) + "\n"
    try:
        os.write(fd, text.encode("utf-8", "backslashreplace"))
    except OSError:
        pass
