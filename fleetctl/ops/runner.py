"""Run a function on many hosts at once: bounded parallelism, one connection per host, and
every outcome returned as data (a failing host never stops the others)."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetctl.config.hosts import Host, Inventory
from fleetctl.errors import FleetctlError
from fleetctl.model.result import HostResult
from fleetctl.ops import runlog
from fleetctl.transport import events
from fleetctl.transport.base import RemoteError, Transport, Unreachable
from fleetctl.transport.hostkeys import HostKeyError

HostOutcome = HostResult[Any]  # what fn answered on a host (detail), or why it did not


ProgressFn = Callable[[HostOutcome], None]
# how a Fleet makes a host's connection: (host, inventory, accept_new_host_keys) -> Transport
TransportFactory = Callable[[Host, Inventory, bool], Transport]


def ssh_transport(host: Host, inventory: Inventory, accept_new_host_keys: bool) -> Transport:
    if host.connection == "local":  # (inventory `connection: local`: this machine, no SSH)
        from fleetctl.transport.local import LocalTransport

        return LocalTransport(host, inventory, accept_new_host_keys=accept_new_host_keys)
    from fleetctl.transport.ssh import HostConnection  # paramiko is imported only to connect

    return HostConnection(host, inventory, accept_new_host_keys=accept_new_host_keys)

NOT_STARTED = "not started: interrupted (Ctrl-C)"
ABANDON_AFTER = 10.0  # seconds a host's thread may take to give up after its connection was cut
# how often run()'s watchdog looks at the running hosts' deadlines. A host that ends does not wake it
# (only the last one does, or an interrupt): a scan per ended host made a 1,000-host run cost
# ~N^2/2 deadline checks (tests/test_runner_scaling.py counts them)
WATCH_EVERY = 0.2

# at most this many handshakes ahead of the first run (Fleet.prefetch); a host none of them reached
# is connected by its run, as before
PREFETCH_THREADS = 64


@dataclass
class _Warm:
    """A host's connection opened ahead of its first run (Fleet.prefetch)."""

    claimed: bool = False  # a prefetch thread or the host's first run has taken it
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class Fleet:
    """The hosts of one command. Copies made with dataclasses.replace (a batch of a rolling deploy)
    share the connections, the interrupt flag and the per-host record."""

    inventory: Inventory
    hosts: list[Host]
    forks: int = 32
    accept_new_host_keys: bool = False
    progress: ProgressFn | None = None
    transport: TransportFactory = ssh_transport
    _conns: dict[str, Transport] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # set by the first Ctrl-C: no host starts anything new; hosts in flight finish or time out
    interrupt: threading.Event = field(default_factory=threading.Event)
    inflight: dict[str, Transport] = field(default_factory=dict)
    # per host: the last outcome of each run, and where it was when Ctrl-C came
    last: dict[str, HostOutcome] = field(default_factory=dict)
    at_interrupt: dict[str, str] = field(default_factory=dict)
    not_started: set[str] = field(default_factory=set)
    _warm: dict[str, _Warm] = field(default_factory=dict)  # Fleet.prefetch: per host
    wait_lock: float = 0.0  # --wait-lock: seconds an agent waits for a host lock another controller holds
    step: str = "run"  # what run() does now, for the run log (fleetctl/ops/runlog.py)
    _closed: bool = False

    def prefetch(self, ahead: Callable[[Transport], None] | None = None) -> None:
        """Start opening the hosts' connections in the background (`forks` at a time, at most
        PREFETCH_THREADS) while the command goes on loading what it needs (its playbook, its
        modules): on a fleet that time overlaps the handshakes (the hosts' sshd work, the network's round trips) instead of
        preceding them. Only the connection (and `ahead`, below): nothing else runs on a host before
        the command's first `run`. A host whose connection fails keeps that failure, and the first `run` reaching it
        reports it exactly as if it had connected then; a host no prefetch thread has reached yet
        when its run starts is connected by the run itself. Each handshake is bounded as in a run
        (its step's deadline is set when it starts, and the run's watchdog enforces it).
        `ahead(conn)`: what the command's first step does on a host that may be done as soon as it is
        connected and decides nothing by itself (the deploy's seal check: seal.check_ahead); the
        host's run waits for it; its failure is left for that step to meet."""
        hosts = [h for h in self.hosts if h.name not in self._warm]
        if not hosts or self._closed:
            return
        for h in hosts:
            self._warm[h.name] = _Warm()
        self.connection(hosts[0])  # the transport's modules imported here, not in many threads at once
        todo = iter(hosts)

        def worker() -> None:
            while True:
                with self._lock:
                    h = next(todo, None)
                    w = self._warm.get(h.name) if h is not None else None
                    if w is None:
                        return
                    if w.claimed:
                        continue
                    w.claimed = True
                    stop = self.interrupt.is_set() or self._closed
                if stop:  # the host's run (if any) connects it itself
                    w.done.set()
                    continue
                try:
                    conn = self.connection(h)
                    conn.connect()
                except BaseException as e:  # kept for the host's first run
                    w.error = e
                else:
                    if ahead is not None and not self.interrupt.is_set() and not self._closed:
                        try:
                            ahead(conn)
                        except Exception:  # (decides nothing: the host's step does it again)
                            pass
                finally:
                    w.done.set()

        for _ in range(max(1, min(self.forks, len(hosts), PREFETCH_THREADS))):
            threading.Thread(target=worker, name="fleetctl-prefetch", daemon=True).start()

    def _connect(self, host: Host, conn: Transport) -> None:
        """conn.connect(), or the outcome of its prefetch: waited for if in flight, its failure raised."""
        w = self._warm.get(host.name)
        if w is not None:
            with self._lock:
                mine = not w.claimed
                w.claimed = True
            if mine:
                w.done.set()
            else:
                w.done.wait()  # bounded: the handshake's step deadline, enforced by run's watchdog
                if w.error is not None:
                    error, w.error = w.error, None  # reported once; a later run connects afresh
                    raise error
        conn.connect()

    def connection(self, host: Host) -> Transport:
        with self._lock:
            c = self._conns.get(host.name)
            if c is None:
                c = self.transport(host, self.inventory, self.accept_new_host_keys)
                self._conns[host.name] = c
            return c

    def _one(self, host: Host, conn: Transport, fn: Callable[[Transport], Any]) -> HostOutcome:
        t0 = time.monotonic()
        try:
            self._connect(host, conn)
            data = fn(conn)
            out = HostOutcome(host.name, "ok", detail=data)
        except (Unreachable, HostKeyError) as e:
            out = HostOutcome(host.name, "unreachable", conn.aborted or e.line(), reference=e.reference)
        except RemoteError as e:
            out = HostOutcome(host.name, "unreachable" if e.kind == "timeout" else "failed",
                              conn.aborted or e.line(), debug=e.detail, reference=e.reference)
        except FleetctlError as e:
            out = HostOutcome(host.name, "failed", conn.aborted or e.line(), reference=e.reference)
        except Exception as e:  # a bug: report it on this host, keep going with the others
            out = HostOutcome(host.name, "failed", conn.aborted or f"internal error: {e.__class__.__name__}: {e}",
                              debug=traceback.format_exc(), reference="internal-error")
        if conn.aborted and out.ok:  # cut off just as it finished: it did finish
            conn.aborted = None
        elif conn.aborted:
            out.status = "unreachable"
            out.reference = "host-timeout"
        out.elapsed = time.monotonic() - t0
        return out

    def run(self, fn: Callable[[Transport], Any], hosts: Iterable[Host] | None = None) -> list[HostOutcome]:
        """Call fn(conn) for each host (connecting first); outcomes in inventory order.

        At most `forks` hosts at once. Every host is bounded: each of its steps by its own timeout
        (transport/ssh.py) and, as a backstop, by this thread's watchdog (the step's bound plus a
        grace, and the per-host `host_timeout`), which cuts the host's connection and reports the
        step that stalled; a host whose thread still does not return is given up on, so one host
        never holds up the others or the command. After `interrupt` is set no host starts."""
        targets = list(self.hosts if hosts is None else hosts)
        if not targets:
            return []
        results: dict[int, HostOutcome] = {}
        running: dict[int, tuple[Host, Transport]] = {}
        cut_at: dict[int, float] = {}
        cond = threading.Condition()
        todo = iter(range(len(targets)))

        def finish(i: int, out: HostOutcome) -> None:  # under cond
            if i in results:
                return
            results[i] = out
            running.pop(i, None)
            self.inflight.pop(out.host, None)
            self.last[out.host] = out
            events.emit("host-end", out.host, out.status)
            if self.progress:
                self.progress(out)
            if len(results) == len(targets) or self.interrupt.is_set():
                cond.notify_all()  # (the watchdog's own tick sees the rest)

        def worker() -> None:
            while True:
                with cond:
                    if self.interrupt.is_set():
                        return
                    i = next(todo, None)
                    if i is None:
                        return
                    host = targets[i]
                    conn = self.connection(host)
                    conn.begin_transaction()
                    running[i] = (host, conn)
                    self.inflight[host.name] = conn
                events.emit("host-start", host.name)
                step = self.step
                runlog.host_event(step, host.name, "start")
                out = self._one(host, conn, fn)
                runlog.host_event(step, host.name, "end", status=out.status, message=out.message,
                                  elapsed=round(out.elapsed, 3))
                with cond:
                    finish(i, out)

        def start_worker() -> None:
            # daemon threads: a host stuck beyond every bound must not keep the process alive
            threading.Thread(target=worker, name="fleetctl-host", daemon=True).start()

        for _ in range(max(1, min(self.forks, len(targets)))):
            start_worker()
        with cond:
            while len(results) < len(targets):
                if self.interrupt.is_set() and not running:
                    break
                cond.wait(WATCH_EVERY)
                now = time.monotonic()
                for i, (host, conn) in list(running.items()):
                    if i not in cut_at:
                        why = conn.overdue(now)
                        if why:
                            conn.abort(why)
                            cut_at[i] = now
                    elif now - cut_at[i] > ABANDON_AFTER:  # its thread did not come back: report it anyway
                        finish(i, HostOutcome(host.name, "unreachable", conn.aborted or "cut off",
                                              elapsed=now - cut_at[i], reference="host-timeout"))
                        start_worker()  # in place of the one left behind
            for i, host in enumerate(targets):
                if i not in results:
                    self.not_started.add(host.name)
                    finish(i, HostOutcome(host.name, "not-started", NOT_STARTED, reference="interrupted"))
        return [results[i] for i in range(len(targets))]

    def accepted_keys(self) -> list[str]:
        """One line per host key recorded on first use (--accept-new-host-keys) by this command."""
        with self._lock:
            conns = list(self._conns.values())
        return [k for c in conns for k in c.accepted_keys]

    def close(self) -> None:
        self._closed = True
        with self._lock:
            for name, w in self._warm.items():  # a handshake still in flight: cut it
                if w.claimed and not w.done.is_set() and name in self._conns:
                    self._conns[name].abort("closing")
        conns = list(self._conns.values())
        self._conns.clear()
        for c in conns:
            c.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


FDS_PER_HOST = 4  # its socket (and a jump host's), with room to spare
FDS_BASE = 256  # the controller's own files, wheels, the ledger


def raise_fd_limit(hosts: int) -> str | None:
    """Raise the soft RLIMIT_NOFILE toward the hard limit when `hosts` connections need it (each host
    keeps one connection open for the whole command). Returns a line for stderr if the limit is
    still too low, else None."""
    import resource

    need = FDS_BASE + FDS_PER_HOST * hosts
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        return (f"fleetctl: {hosts} hosts need about {need} open files but the limit is {soft} and cannot "
                f"be raised ({e}); raise it (ulimit -n) or use --limit for fewer hosts")
    if target < need:
        return (f"fleetctl: {hosts} hosts need about {need} open files but the hard limit is {hard} "
                f"(soft limit raised to it); raise it (ulimit -Hn) or use --limit for fewer hosts")
    return None
