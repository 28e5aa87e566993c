"""What ops need from a host connection (`Transport`), the errors every transport raises, and the
step/deadline bookkeeping the runner's watchdog reads (`Steps`).

Ops (fleetctl/ops, facts.py) only call `agent()`, `open_tcp()` and read `host`; the runner
(runner.py) calls `connect()`, `begin_transaction()`, `overdue()`, `abort()`, `close()`. SSH
(ssh.py) is one implementation; local.py runs the same agent as a local subprocess (tests).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from fleetctl.config.hosts import Host
from fleetctl.errors import FleetctlError
from fleetctl.transport import events

ABORT_GRACE = 5.0  # seconds a step may overrun its own timeout before the watchdog cuts the connection


class Unreachable(FleetctlError):
    """The host could not be reached or authenticated."""

    reference = "host-unreachable"

    def __init__(self, message: str, *, hint: str | None = None, transient: bool = True) -> None:
        super().__init__(message, hint=hint)
        self.transient = transient


class RemoteError(FleetctlError):
    """A remote command or the agent failed on the host. Its reference follows the agent's kind."""

    def __init__(self, message: str, *, kind: str = "failed", hint: str | None = None,
                 detail: str | None = None) -> None:
        super().__init__(message, hint=hint, reference=KIND_REFERENCES.get(kind, "host-failed"))
        self.kind = kind
        self.detail = detail


# the agent's error kind (and the transport's "timeout") -> the error's reference (docs/errors.md)
KIND_REFERENCES = {
    "failed": "host-failed",
    "timeout": "host-timeout",
    "bad_input": "host-refused-input",
    "locked": "host-lock-held",
    "drifted": "host-files-drifted",
    "changed": "host-files-changed",
}


class Stream(Protocol):
    """A byte stream to a TCP port as seen from the host (socket-like)."""

    def settimeout(self, timeout: float | None) -> None: ...
    def sendall(self, data: bytes) -> None: ...
    def recv(self, n: int) -> bytes: ...
    def close(self) -> None: ...


class Transport(Protocol):
    """One host's connection for one command."""

    host: Host
    aborted: str | None  # why the watchdog cut this host off (its line)
    done: list[str]  # agent actions this host answered, in order
    accepted_keys: list[str]  # host keys recorded on first use during connect (reported to the user)

    def connect(self) -> None: ...
    def agent(self, action: str, request: Mapping[str, Any] | None = None, *,
              timeout: float | None = None) -> Any: ...
    def open_tcp(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> Stream: ...
    def run_command(self, argv: list[str], why: str, cap: int, timeout: float | None = None, *,
                    inside: bool = True, failed: list[tuple[int | None, bytes]] | None = None,
                    merge_stderr: bool = False) -> bytes | None: ...
    def begin_transaction(self) -> None: ...
    def overdue(self, now: float) -> str | None: ...
    def abort(self, why: str) -> None: ...
    def close(self) -> None: ...


class Steps:
    """What a host is doing now, for the watchdog (runner.py), reports and Ctrl-C: a step, the
    monotonic time it must end by, and the line that reports it stalled."""

    host: Host

    def __init__(self) -> None:
        self.step: str | None = None
        self.step_deadline: float | None = None
        self.step_stalled: str = ""
        self.txn_deadline: float | None = None  # the per-host deadline of the current host transaction
        self.aborted: str | None = None
        self.done: list[str] = []

    def _begin(self, step: str, limit: float, stalled: str | None = None,
               grace: float = ABORT_GRACE) -> float:
        """Start a step that must end within `limit` seconds (the watchdog cuts it `grace` seconds
        later); returns its deadline."""
        if self.aborted:
            raise RemoteError(self.aborted, kind="timeout")
        deadline = time.monotonic() + limit
        self.step, self.step_deadline = step, deadline + grace
        events.emit("step", self.host.name, step)
        self.step_stalled = stalled or f"{self.host.name}: no answer to {step} within {limit:g}s"
        return deadline

    def _end(self) -> None:
        self.step = self.step_deadline = None

    def begin_transaction(self) -> None:
        """A host transaction (one Fleet.run call on this host) starts: its per-host deadline."""
        self.txn_deadline = time.monotonic() + self.host.host_timeout
        self.aborted = None

    def overdue(self, now: float) -> str | None:
        """The line to report if this host is past its step's bound (plus a grace: each step enforces
        its own timeout first) or its per-host deadline; else None."""
        if self.step_deadline is not None and now > self.step_deadline:
            return self.step_stalled
        if self.txn_deadline is not None and now > self.txn_deadline and (
                self.step_deadline is None or now > self.step_deadline):
            at = f" (at {self.step})" if self.step else ""
            return f"{self.host.name}: past its per-host deadline of {self.host.host_timeout:g}s{at}"
        return None

    def abort(self, why: str) -> None:
        """Cut this host off (from another thread): every wait on it ends at once and the host is
        reported with `why`. The transport's _cut() must not block the caller."""
        if self.aborted:
            return
        self.aborted = why
        self._cut()

    def _cut(self) -> None:
        raise NotImplementedError
