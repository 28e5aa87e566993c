"""A transport to this machine, without SSH: the real agent runs as a local subprocess of the host's
`python` (inventory), over pipes, against whatever directories the inventory names (a temporary
"host" in tests). Same session, framing, bounds and answer checks as SSH (transport/session.py);
only the byte pipe differs. Used for fast tests of ops, and by `fleetctl` for an inventory host with
`connection: local` (a GPU machine that runs fleetctl itself, e.g. one with no sshd).
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import threading
import time

from fleetctl.config.hosts import Host, Inventory
from fleetctl.transport.base import RemoteError, Unreachable
from fleetctl.transport.session import CHUNK, STDERR_TAIL, AgentTransport, PipeLost


class ProcessPipe:
    """A local process's stdin/stdout/stderr as a `session.Pipe` (stderr collected by a thread)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin and proc.stdout and proc.stderr
        self.proc = proc
        self._in = proc.stdin.fileno()
        self._out = proc.stdout.fileno()
        os.set_blocking(self._in, False)
        self._eof = False
        self._err = bytearray()
        self._err_lock = threading.Lock()
        threading.Thread(target=self._drain, args=(proc.stderr,), daemon=True,
                         name=f"fleetctl-local-stderr-{proc.pid}").start()

    def _drain(self, f: object) -> None:
        fd = f.fileno()  # type: ignore[attr-defined]
        while True:
            try:
                chunk = os.read(fd, CHUNK)
            except OSError:
                return
            if not chunk:
                return
            with self._err_lock:
                self._err += chunk
                del self._err[:-STDERR_TAIL]

    def _wait(self, fd: int, events: int, wait: float) -> bool:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, events)
            return bool(sel.select(max(0.0, wait)))

    def send(self, data: bytes, deadline: float) -> bool:
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not self._wait(self._in, selectors.EVENT_WRITE, left):
                continue
            try:
                n = os.write(self._in, view)
            except BlockingIOError:
                continue
            except (BrokenPipeError, ValueError, OSError):
                return False  # the process is gone: its exit status and stderr tell why
            view = view[n:]
        return True

    def recv(self, n: int, wait: float) -> bytes | None:
        if self._eof:
            return b""
        if not self._wait(self._out, selectors.EVENT_READ, wait):
            return None
        try:
            data = os.read(self._out, n)
        except OSError as e:
            raise PipeLost(str(e)) from None
        if not data:
            self._eof = True
        return data

    def stderr(self) -> bytes:
        with self._err_lock:
            out = bytes(self._err)
            self._err.clear()
        return out

    def ended(self) -> bool:
        return self._eof or self.proc.poll() is not None

    def exit_status(self, wait: float) -> int | None:
        try:
            rc = self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            return None
        time.sleep(0.05)  # let the stderr thread read what the process wrote last
        return rc

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:  # an agent ends at the end of its stdin; one that does not (stopped, stuck) is killed
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def open_loopback(name: str, what: str, port: int, host: str, timeout: float) -> socket.socket:
    """A TCP connection from this machine to one of its own loopback ports (a host that is this
    machine reaches nothing else): `what` names the transport in the refusal."""
    if not host.startswith("127.") and host != "localhost":
        raise RemoteError(f"{name}: {what} only reaches loopback, not {host}")
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise RemoteError(f"{name}: cannot reach {host}:{port}: {e}") from None


class LocalTransport(AgentTransport):
    """The agent of `host` run as a local subprocess (no shell: argv as is). `open_tcp` connects to
    the loopback port directly."""

    def __init__(self, host: Host, inventory: Inventory | None = None, *, accept_new_host_keys: bool = False) -> None:
        super().__init__(host)
        self.inventory = inventory
        self._procs: list[subprocess.Popen[bytes]] = []

    def connect(self) -> None:
        if self.aborted:
            raise RemoteError(self.aborted, kind="timeout")

    def _start_pipe(self, argv: list[str], limit: float) -> ProcessPipe:
        env = dict(os.environ)
        if argv and argv[0] == "env":  # the public env, as `env K=V ... python` would set it
            i = 1
            while i < len(argv) and "=" in argv[i]:
                k, _, v = argv[i].partition("=")
                env[k] = v
                i += 1
            argv = argv[i:]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, start_new_session=True)
        except OSError as e:
            raise RemoteError(f"{self.host.name}: python interpreter {self.host.python!r} cannot run: {e}",
                              kind="bad_python", hint="fix 'python:' for this host in the inventory") from None
        self._procs.append(proc)
        return ProcessPipe(proc)

    def _cut(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()

    def open_tcp(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
        return open_loopback(self.host.name, "the local transport", port, host, timeout)

    def close(self) -> None:
        self._agent_drop()
        self._procs = [p for p in self._procs if p.poll() is None]

    def __enter__(self) -> LocalTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["LocalTransport", "ProcessPipe", "Unreachable"]
