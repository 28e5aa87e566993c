"""Per-host, per-phase timeline of one controller process (fleetctl or the lean push), in process.

    python bench/phases.py OUT.json -m fleetctl deploy PB -i INV --json
    python bench/phases.py OUT.json bench/lean_push.py JOB.json

Runs the tool in this interpreter (as `python -m MOD ...` or `python SCRIPT ...` would) after
placing a hook on the import system: when one of the modules below has been executed, some of its
functions are wrapped. A wrapper notes the time (monotonic), the CPU of the calling thread and of the
host's paramiko transport thread (Linux `pthread_getcpuclockid`) at entry and exit; the tool's code
is not changed and nothing is imported earlier than the tool imports it. Written at exit to OUT.json:
one record per call `[host, phase, start, end, cpu]` (seconds since this process started; cpu: the
two threads' CPU seconds in the call), the global steps (`[phase, start, end, process cpu]`), the
bytes the controller wrote to and read from each host's TCP connection (paramiko's Packetizer:
every SSH byte, banner and key exchange included) and the list of functions found and wrapped.

Phases (per host):
- connect: fleetctl's HostConnection.connect (its handshake slot, TCP, SSH) or the lean push's
  SSHClient.connect; inside it handshake (paramiko Transport.start_client: banner, key exchange,
  new keys) and auth (SSHClient._auth);
- channel: every channel opened (Transport.open_channel; `n` counts them);
- check: fleetctl's seal check exec (the no-op's one round trip; _gate_read), agent start
  (_agent_start: the hello, the code or its cache key), request:ACTION (one agent request: facts,
  deploy = the transaction with its re-hash of every file, rollback, ...);
- lean: hash (the first sha256sum), re-hash (the second), exec (other execs: the backup), transfer
  (SFTP put of one file);
- close: HostConnection.close / SSHClient.close.
Global (fleetctl): load_inventory, load_playbook, gather, build_plan, apply_plan, prefetch,
fleet close, ledger start/finish, and `exit` (the last record: the process' end).

A measuring tool: it adds a few microseconds per wrapped call; the bench runs every timed run
under it (bench.py --no-phases to run the tools bare).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import json
import os
import runpy
import sys
import threading
import time

T0 = time.monotonic()
_records: list[list] = []  # [host, phase, start, end, cpu]
_globals: list[list] = []  # [phase, start, end, process cpu]
_sent: dict[str, int] = {}
_recv: dict[str, int] = {}
_lock = threading.Lock()
_wrapped: list[str] = []
_local = threading.local()
_hash_calls: dict[str, int] = {}

# paramiko, per host (the host: the remote port of the transport's socket, "127.0.0.1:PORT")
PARAMIKO = {
    "paramiko.transport": [("Transport.start_client", "handshake"), ("Transport.open_channel", "channel")],
    "paramiko.client": [("SSHClient._auth", "auth"), ("SSHClient.connect", "ssh-connect"),
                        ("SSHClient.close", "ssh-close")],
    "paramiko.sftp_client": [("SFTPClient.put", "transfer")],
}
# fleetctl, per host (self.host.name)
FLEETCTL_HOST = {
    "fleetctl.transport.ssh": [("HostConnection.connect", "connect"), ("HostConnection.close", "close")],
    "fleetctl.transport.session": [("AgentTransport._gate_read", "check"), ("AgentTransport._agent_start", "agent start"),
                                   ("AgentTransport.agent", "request")],
}
# fleetctl, once per command
FLEETCTL_GLOBAL = {
    "fleetctl.config.inventory": ["load_inventory"],
    "fleetctl.config.playbook": ["load_playbook"],
    "fleetctl.config.playbook_cache": ["load"],
    "fleetctl.ops.deploy": ["gather", "build_plan", "apply_plan"],
    "fleetctl.ops.rollback": ["gather", "build_plan", "apply_plan", "rollback"],
    "fleetctl.ops.runner": ["Fleet.prefetch", "Fleet.close"],
    "fleetctl.ops.ledger": ["Ledger.start", "Ledger.finish"],
}
# the lean push, per host (its module is imported as `lean_push`)
LEAN = {"lean_push": [("_hashes", "hash"), ("_exec", "exec")]}


def now() -> float:
    return time.monotonic() - T0


def _thread_cpu(transport: object) -> float:
    """CPU seconds of the calling thread plus the transport's own thread (if it runs)."""
    cpu = time.thread_time()
    ident = getattr(transport, "ident", None)
    if ident is not None and ident != threading.get_ident() and getattr(transport, "is_alive", lambda: False)():
        try:
            cpu += time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (OSError, AttributeError, ValueError):
            pass
    return cpu


def _peer(sock: object) -> str | None:
    try:
        a = sock.getpeername()  # type: ignore[attr-defined]
        return f"{a[0]}:{a[1]}"
    except Exception:
        return None


def _transport_of(obj: object) -> object | None:
    t = getattr(obj, "_transport", None)  # SSHClient
    if t is not None:
        return t
    sock = getattr(obj, "sock", None)  # SFTPClient: its channel
    if hasattr(sock, "get_transport"):
        return sock.get_transport()
    if obj.__class__.__name__ == "Transport":
        return obj
    conn = getattr(obj, "_conn", None)  # fleetctl HostConnection
    client = getattr(conn, "client", None)
    return getattr(client, "_transport", None)


def _host_of(obj: object) -> str:
    h = getattr(obj, "host", None)
    name = getattr(h, "name", None)
    if isinstance(name, str):
        return name
    t = _transport_of(obj)
    sock = getattr(t, "sock", None)
    p = _peer(sock) if sock is not None else None
    if p:
        return p
    return getattr(_local, "host", None) or "?"


def _wrap_host(fn, phase: str):
    @functools.wraps(fn)
    def wrapper(self, *a, **kw):
        t = _transport_of(self)
        s, c = now(), _thread_cpu(t)
        host = _host_of(self)  # (a close has no transport after it; a connect none before it)
        try:
            return fn(self, *a, **kw)
        finally:
            t2 = _transport_of(self) or t
            if host == "?":
                host = _host_of(self)
            name = phase
            if phase == "request":
                name = f"request:{a[0] if a else kw.get('action')}"
            if phase == "hash":
                with _lock:
                    n = _hash_calls[host] = _hash_calls.get(host, 0) + 1
                name = "hash" if n == 1 else "re-hash"
            rec = [host, name, round(s, 6), round(now(), 6), round(_thread_cpu(t2) - c, 6)]
            with _lock:
                _records.append(rec)
    return wrapper


def _wrap_lean(fn, phase: str):
    """lean_push's module functions take the client first."""
    return _wrap_host(fn, phase)


def _wrap_global(fn, phase: str):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        s, c = now(), time.process_time()
        try:
            return fn(*a, **kw)
        finally:
            with _lock:
                _globals.append([phase, round(s, 6), round(now(), 6), round(time.process_time() - c, 6)])
    return wrapper


def _wrap_packetizer(mod) -> None:
    P = mod.Packetizer
    write_all, read_all = P.write_all, P.read_all

    def key(self) -> str:
        k = getattr(self, "_bench_peer", None)
        if k is None:
            k = _peer(getattr(self, "_Packetizer__socket", None)) or "?"
            self._bench_peer = k
        return k

    @functools.wraps(write_all)
    def w(self, out):
        k = key(self)
        with _lock:
            _sent[k] = _sent.get(k, 0) + len(out)
        return write_all(self, out)

    @functools.wraps(read_all)
    def r(self, n, check_rekey=False):
        got = read_all(self, n, check_rekey)
        k = key(self)
        with _lock:
            _recv[k] = _recv.get(k, 0) + len(got)
        return got

    P.write_all, P.read_all = w, r
    _wrapped.append("paramiko.packet:Packetizer.write_all/read_all")


def _patch(modname: str, mod) -> None:
    if modname == "paramiko.packet":
        _wrap_packetizer(mod)
        return
    for table, wrap in ((PARAMIKO, _wrap_host), (FLEETCTL_HOST, _wrap_host), (LEAN, _wrap_lean)):
        for qual, phase in table.get(modname, []):
            owner, attr = _resolve(mod, qual)
            if owner is not None:
                setattr(owner, attr, wrap(getattr(owner, attr), phase))
                _wrapped.append(f"{modname}:{qual}")
    for qual in FLEETCTL_GLOBAL.get(modname, []):
        owner, attr = _resolve(mod, qual)
        if owner is not None:
            short = modname.rsplit(".", 1)[-1]
            setattr(owner, attr, _wrap_global(getattr(owner, attr), f"{short}.{qual}"))
            _wrapped.append(f"{modname}:{qual}")


def _resolve(mod, qual: str):
    owner = mod
    parts = qual.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p, None)
        if owner is None:
            return None, None
    if not hasattr(owner, parts[-1]):
        return None, None
    return owner, parts[-1]


WATCHED = set(PARAMIKO) | set(FLEETCTL_HOST) | set(FLEETCTL_GLOBAL) | set(LEAN) | {"paramiko.packet"}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(self.name, module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WATCHED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, name)
        return spec


def _dump(out: str) -> None:
    _globals.append(["exit", round(now(), 6), round(now(), 6), round(time.process_time(), 6)])
    doc = {"records": _records, "globals": _globals, "sent": _sent, "recv": _recv, "wrapped": _wrapped,
           "process_cpu": round(time.process_time(), 6), "wall": round(now(), 6)}
    with open(out, "w") as fh:
        json.dump(doc, fh)


def main() -> None:
    out = sys.argv[1]
    rest = sys.argv[2:]
    sys.meta_path.insert(0, _Finder())
    atexit.register(_dump, out)
    if rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    elif os.path.basename(rest[0]) == "lean_push.py":  # imported as a module, so its functions can be wrapped
        sys.argv = rest
        sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))
        import lean_push

        sys.exit(lean_push.main())
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
