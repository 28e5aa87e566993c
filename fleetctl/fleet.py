"""Run a function on many hosts at once: bounded parallelism, one connection per host, and
every outcome returned as data (a failing host never stops the others)."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetctl.config.inventory import Host, Inventory
from fleetctl.errors import FleetctlError
from fleetctl.transport.hostkeys import HostKeyError
from fleetctl.transport.ssh import HostConnection, RemoteError, Unreachable

Status = Literal["ok", "failed", "unreachable", "skipped"]


@dataclass
class HostOutcome:
    host: str
    status: Status
    message: str = ""
    data: Any = None
    elapsed: float = 0.0
    detail: str | None = None  # traceback or remote stderr, shown with --debug

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "message": self.message,
                "elapsed": round(self.elapsed, 3)}


ProgressFn = Callable[[HostOutcome], None]


@dataclass
class Fleet:
    inventory: Inventory
    hosts: list[Host]
    forks: int = 32
    accept_new_host_keys: bool = False
    progress: ProgressFn | None = None
    _conns: dict[str, HostConnection] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def connection(self, host: Host) -> HostConnection:
        with self._lock:
            c = self._conns.get(host.name)
            if c is None:
                c = HostConnection(host, self.inventory, accept_new_host_keys=self.accept_new_host_keys)
                self._conns[host.name] = c
            return c

    def run(self, fn: Callable[[HostConnection], Any], hosts: Iterable[Host] | None = None) -> list[HostOutcome]:
        """Call fn(conn) for each host (connecting first); outcomes in inventory order."""
        targets = list(self.hosts if hosts is None else hosts)

        def one(host: Host) -> HostOutcome:
            t0 = time.monotonic()
            conn = self.connection(host)
            try:
                conn.connect()
                data = fn(conn)
                out = HostOutcome(host.name, "ok", data=data)
            except (Unreachable, HostKeyError) as e:
                out = HostOutcome(host.name, "unreachable", e.line())
            except RemoteError as e:
                out = HostOutcome(host.name, "unreachable" if e.kind == "timeout" else "failed", e.line(),
                                  detail=e.detail)
            except FleetctlError as e:
                out = HostOutcome(host.name, "failed", e.line())
            except Exception as e:  # a bug: report it on this host, keep going with the others
                out = HostOutcome(host.name, "failed", f"internal error: {e.__class__.__name__}: {e}",
                                  detail=traceback.format_exc())
            out.elapsed = time.monotonic() - t0
            if self.progress:
                self.progress(out)
            return out

        if not targets:
            return []
        workers = max(1, min(self.forks, len(targets)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetctl-host") as pool:
            return list(pool.map(one, targets))

    def close(self) -> None:
        conns = list(self._conns.values())
        self._conns.clear()
        for c in conns:
            c.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
