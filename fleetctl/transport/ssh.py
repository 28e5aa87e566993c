"""SSH transport on paramiko (and Fabric where a host needs it): one connection per host, reused
for every step of a command.

`HostConnection` is the SSH implementation of `transport.base.Transport`: connect (strict host keys,
ProxyJump, bounded handshake), run the agent (its argv joined with shell quoting, no user string
reaches a shell raw) over a session channel (`SshPipe`; the session itself is transport/session.py),
forward a port. The fabric/paramiko internals it uses are in transport/internals.py. A host with
no gateway is reached with paramiko alone (transport/direct.py: fabric and invoke are imported only
for a ProxyJump/ProxyCommand, a fabric config file or an ssh_config `Match exec`).
"""

from __future__ import annotations

import logging
import random
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.config.hosts import Host, Inventory
from fleetctl.transport import internals
from fleetctl.transport.base import RemoteError, Unreachable
from fleetctl.transport.direct import DirectConnection, direct_connection
from fleetctl.transport.hostkeys import HostKeyError, KnownHosts, StrictPolicy, fingerprint, lookup_name
from fleetctl.transport.internals import paramiko
from fleetctl.transport.session import (
    CHUNK,
    STDERR_TAIL,
    AgentTransport,
    PipeLost,
    env_prefix,
)
from fleetctl.transport.slots import Slots

if TYPE_CHECKING:
    from fabric import Config, Connection

__all__ = ["HostConnection", "RemoteError", "Unreachable", "env_prefix"]


def __getattr__(name: str) -> Any:
    if name == "BOOTSTRAP":  # (session.py builds it on first use)
        from fleetctl.transport import session

        return session.bootstrap_text()
    raise AttributeError(name)

# paramiko logs a failed handshake with its traceback at ERROR; with no handler configured Python
# prints that on stderr. fleetctl reports every failure itself, on one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


_configs: dict[str, Config] = {}
_config_lock = threading.Lock()

# At most this many handshakes in flight in this process at once. A thousand at once (`-f 1000`)
# share the controller's and the hosts' CPUs until some pass connect_timeout though every host
# answers (seen at N=1,000 on 2 CPUs: one host of 1,000 cut after 10 s); a handshake's deadline
# starts when it has its slot. Network round trips still overlap 128 deep.
HANDSHAKES_AT_ONCE = 128
_handshakes = Slots(HANDSHAKES_AT_ONCE)


def _fabric_config(ssh_config: Path | None) -> Config:
    key = str(ssh_config or "")
    cfg = _configs.get(key)
    if cfg is None:
        from fabric import Config  # imports invoke: only for a host that needs fabric

        internals.with_invoke()
        cfg = Config(runtime_ssh_path=str(ssh_config)) if ssh_config else Config()
        internals.memoize_lookup(cfg.base_ssh_config)
        _configs[key] = cfg
    return cfg


_known_hosts: dict[str, tuple[tuple[int, int], KnownHosts]] = {}
_known_hosts_lock = threading.Lock()


def _load_known_hosts(client: paramiko.SSHClient, path: Path, name: str, *, share: bool = False) -> None:
    """client.load_host_keys(path), parsing the file once per command (while it is unchanged)
    instead of once per connection (a 256-line known_hosts costs ~7 ms to parse, 256 times), and
    giving the client only the entries its lookups of `name` find (hostkeys.KnownHosts)."""
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    with _known_hosts_lock:
        got = _known_hosts.get(str(path))
        if got is None or got[0] != stamp:
            got = _known_hosts[str(path)] = (stamp, KnownHosts.load(path))
    if not internals.add_host_keys(client, got[1].entries_for(name), str(path), share=share):
        client.load_host_keys(str(path))  # another paramiko layout: the plain way


# paramiko's transport thread waits on its socket in 0.1 s steps (to notice a close, a keepalive or a
# rekey): 10 wakeups a second per host, each taking the GIL; at 1,000 hosts that is 10,000 a second
# and most of the controller's CPU (a 120 s deploy spent ~35 s of CPU there). After the handshake
# fleetctl's waits do not depend on it (channels wake their readers when closed; a cut transport is
# closed by the watchdog), so each host's transport thread waits in 1 s steps.
TRANSPORT_POLL = 1.0


def _calm(transport: paramiko.Transport) -> None:
    """Let an established transport's thread wake once a second instead of ten times (a real socket
    only: a ProxyJump channel or ProxyCommand keeps paramiko's own timing)."""
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket):
        try:
            sock.settimeout(TRANSPORT_POLL)
        except OSError:
            pass


def _is_jump(gateway: object) -> bool:
    """A ProxyJump gateway (fabric's Connection to the jump host; a ProxyCommand is a string)."""
    return gateway is not None and not isinstance(gateway, str) and hasattr(gateway, "client")


class SshPipe:
    """The agent's stdin/stdout/stderr over one SSH session channel (a `session.Pipe`).

    Waits in paramiko's own channel buffer (no file descriptor, no select(): that fails for
    descriptors above 1024, i.e. for fleets of a few hundred hosts)."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan

    def send(self, data: bytes, deadline: float) -> bool:
        chan = self.chan
        chan.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            # a view: paramiko's sendall slices off what each packet took, and a slice of bytes is a
            # copy of the rest (a 340 KB deploy request: ~2 MB copied, a second copy alive per host)
            chan.sendall(memoryview(data))
            return True
        except TimeoutError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as e:
            t = chan.get_transport()
            if t is not None and t.is_active():
                return False  # the process exited: its exit status and stderr tell why
            raise PipeLost(str(e) or e.__class__.__name__) from None

    def recv(self, n: int, wait: float) -> bytes | None:
        self.chan.settimeout(wait)
        try:
            return self.chan.recv(n)
        except TimeoutError:
            return None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise PipeLost(str(e) or e.__class__.__name__) from None

    def stderr(self) -> bytes:
        out = bytearray()
        while self.chan.recv_stderr_ready():
            out += self.chan.recv_stderr(CHUNK)
            del out[:-STDERR_TAIL]
        return bytes(out)

    def ended(self) -> bool:
        return self.chan.closed or self.chan.eof_received

    def exit_status(self, wait: float) -> int | None:
        end = time.monotonic() + wait
        while not self.chan.exit_status_ready() and not self.chan.closed and time.monotonic() < end:
            time.sleep(0.02)
        return self.chan.recv_exit_status() if self.chan.exit_status_ready() else None

    def close(self) -> None:
        try:
            self.chan.shutdown_write()
        except Exception:
            pass
        self.chan.close()


class HostConnection(AgentTransport):
    """The SSH `Transport`: Fabric/paramiko, strict host keys, ProxyJump, every step bounded."""

    def __init__(self, host: Host, inventory: Inventory, *, accept_new_host_keys: bool = False) -> None:
        super().__init__(host)
        self.inventory = inventory
        self.accept_new = accept_new_host_keys
        self._conn: Connection | DirectConnection | None = None
        self._opening: Connection | DirectConnection | None = None  # being opened (the watchdog may cut it)

    def _cut(self) -> None:
        """Close every transport of this host (its jump host's too) in a thread of its own."""
        conns = [c for c in (self._opening, self._conn) if c is not None]
        conns += [c.gateway for c in conns if _is_jump(c.gateway)]  # a stalled ProxyJump

        def cut() -> None:
            for c in conns:
                try:
                    if isinstance(c, DirectConnection):
                        c.cut()
                        continue
                    t = c.client.get_transport()
                    if t is not None:
                        t.close()
                except Exception:
                    pass

        threading.Thread(target=cut, name=f"fleetctl-abort-{self.host.name}", daemon=True).start()
        _handshakes.wake()  # (if it waits for a handshake slot, it stops)

    # -- connecting ---------------------------------------------------------------------------

    def _known_hosts(self, conn: Connection | DirectConnection) -> Path:
        if self.host.known_hosts:
            return Path(self.host.known_hosts)
        ukh = conn.ssh_config.get("userknownhostsfile")
        if ukh:
            return Path(str(ukh).split()[0]).expanduser()
        return Path("~/.ssh/known_hosts").expanduser()

    def _prepare(self, conn: Connection | DirectConnection, label: str) -> list[StrictPolicy]:
        policies = []
        kh = self._known_hosts(conn)
        client = conn.client
        if kh.exists():
            try:
                _load_known_hosts(client, kh, lookup_name(conn.host, conn.port),
                                  share=not self.accept_new)  # (only accept_new adds keys)
            except (OSError, ValueError, paramiko.SSHException) as e:  # (ValueError: not text)
                raise HostKeyError(f"{label}: cannot read known_hosts {kh}: {e}") from None
        policy = StrictPolicy(kh, label, self.accept_new)
        client.set_missing_host_key_policy(policy)
        policies.append(policy)
        gw = conn.gateway
        if _is_jump(gw):
            policies += self._prepare(gw, f"{label} (jump host {gw.original_host})")
        return policies

    CONNECT_TRIES = 3

    def connect(self) -> None:
        """Connect, retrying a transient failure (refused, reset, timed out, no session) twice with
        jitter: hundreds of handshakes at once can overrun sshd or the machine (an sshd that had no CPU
        to start the session before connect_timeout sends no banner: issue 34.3)
        Authentication and host-key failures are never retried. Each attempt waits for a handshake
        slot (HANDSHAKES_AT_ONCE) before its connect_timeout starts."""
        for attempt in range(self.CONNECT_TRIES):
            self._attempt = attempt + 1
            try:
                self._connect_once()
                return
            except Unreachable as e:
                if e.transient is False or attempt == self.CONNECT_TRIES - 1:
                    raise
                time.sleep(random.uniform(0.2, 1.0) * (attempt + 1))

    def _connect_once(self) -> None:
        if self._conn is not None and self._conn.is_connected:
            return
        h = self.host
        target = h.name if h.from_ssh_config else h.address
        kwargs: dict[str, Any] = {"banner_timeout": h.connect_timeout, "auth_timeout": h.connect_timeout}
        if h.identity_file:
            kwargs["key_filename"] = [h.identity_file]
        # fabric's Config (shared by every connection to keep the parsed ssh_config once) is not
        # safe to touch from many threads: a Connection built in one thread can catch the config
        # half-merged in another (seen at N=128: "No attribute or config key found for
        # 'authentication'"). So everything that reads it, including what Connection.open() would
        # read, happens under the lock; the network part runs outside it.
        timeout = max(1, round(h.connect_timeout))
        conn: Connection | DirectConnection | None
        with _config_lock:
            conn = direct_connection(target, self.inventory.ssh_config, user=h.user, port=h.port,
                                     connect_timeout=timeout, connect_kwargs=kwargs)
            if conn is not None:
                open_kwargs = conn.open_kwargs()
            else:
                from fabric import Connection

                conn = Connection(
                    target,
                    user=h.user,
                    port=h.port,
                    config=_fabric_config(self.inventory.ssh_config),
                    connect_timeout=timeout,
                    connect_kwargs=kwargs,
                )
                open_kwargs = internals.open_kwargs(conn)
        policies = self._prepare(conn, h.name)
        where = f"{conn.user}@{conn.host}:{conn.port}"
        slots = _handshakes
        if not slots.acquire(lambda: bool(self.aborted)):  # (a host cut off or a fleet closing: _cut wakes it)
            raise RemoteError(self.aborted or "cut off", kind="timeout")
        try:
            self._opening = conn  # before _begin's check of `aborted`: a cut from now on finds it
            try:
                # the watchdog's backstop, a second connect_timeout: paramiko bounds each phase
                # (TCP connect, banner, key exchange, authentication) by connect_timeout itself and
                # says which one failed, and such a failure is tried again (connect). At N=1,000
                # on 2 CPUs a 1 s grace cut handshakes whose host had answered in time while the
                # controller's thread waited for the CPU (13 of the 20 unreachable hosts recorded)
                grace = max(1.0, float(h.connect_timeout))
                self._begin("the SSH connection", h.connect_timeout,
                            f"{h.name}: no SSH connection to {where} within {h.connect_timeout + grace:g}s "
                            "(TCP connect, SSH banner, key exchange and authentication)", grace=grace)
            except BaseException:
                self._opening = None
                raise
            try:
                if isinstance(conn, DirectConnection):
                    conn.open(open_kwargs)
                else:
                    internals.open_connection(conn, open_kwargs)
            except HostKeyError:
                raise
            except Exception:
                if self.aborted:  # the watchdog cut a stalled handshake
                    try:
                        conn.close()
                    except Exception:
                        pass
                    raise RemoteError(self.aborted, kind="timeout") from None
                self._connect_failed(conn, where)
            finally:
                self._opening = None
                self._end()
                # recorded even if authentication then failed: the user is told either way
                self.accepted_keys += [p.accepted for p in policies
                                       if p.accepted and p.accepted not in self.accepted_keys]
        finally:
            slots.release()
        transport = conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
            _calm(transport)
        self._conn = conn

    def _connect_failed(self, conn: Connection | DirectConnection, where: str) -> None:
        """Re-raise the exception being handled as one line naming the host."""
        h = self.host
        try:
            raise
        except paramiko.BadHostKeyException as e:
            raise HostKeyError(
                f"{h.name}: host key of {e.hostname}{'' if ']:' in e.hostname else f':{conn.port}'} CHANGED: got {e.key.get_name()} {fingerprint(e.key)}, "
                f"known_hosts has {fingerprint(e.expected_key)}",
                hint="possible man-in-the-middle; if the host was reinstalled, remove its old entry from known_hosts",
            ) from None
        except paramiko.AuthenticationException as e:
            if str(e).startswith("Authentication timeout"):  # no answer in time: not a refusal
                # (the host answered the key exchange: a loaded host or controller, worth another try)
                raise Unreachable(f"{h.name}: no answer to authentication from {where} within "
                                  f"{h.connect_timeout:g}s",
                                  hint="is the host or this machine overloaded? raise connect_timeout, or lower "
                                       "--forks", transient=True) from None
            raise Unreachable(f"{h.name}: authentication failed for {where}: {e}",
                              hint="check 'user:' and 'identity_file:' in the inventory", transient=False) from None
        except TimeoutError:
            raise Unreachable(f"{h.name}: connection to {where} timed out after {h.connect_timeout:g}s",
                              hint="is the host up and the address right?", transient=False) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            msg = str(e) or e.__class__.__name__
            if msg == "Error reading SSH protocol banner":  # paramiko's words for: no banner in time
                tries = getattr(self, "_attempt", 1)
                raise Unreachable(f"{h.name}: no SSH banner from {where} within {h.connect_timeout:g}s"
                                  + (f" (asked {tries} times)" if tries > 1 else ""),
                                  hint="is the host frozen or overloaded? raise connect_timeout if it is just slow",
                                  transient=True) from None
            refused = isinstance(e, paramiko.ssh_exception.NoValidConnectionsError)
            hint = "is sshd running there and the port right?"
            if refused:
                msg = "connection refused"
            elif isinstance(e, (EOFError, ConnectionResetError)) or msg == "No existing session":
                # the server hung up after its banner: what an sshd past its MaxStartups or
                # LoginGraceTime does (seen at N=1,000 with every host's login shell busy)
                tries = getattr(self, "_attempt", 1)
                msg = "the host closed the connection during the SSH handshake" + (
                    f" (asked {tries} times)" if tries > 1 else "")
                hint = ("is the host or this machine overloaded? lower --forks, or raise connect_timeout "
                        "(sshd drops handshakes past its MaxStartups or LoginGraceTime)")
            # refused: nobody listens (definite); a handshake cut short (reset, no session) is what
            # an overloaded sshd does: worth another try
            raise Unreachable(f"{h.name}: cannot connect to {where}: {msg}", hint=hint,
                              transient=not refused) from None

    def close(self) -> None:
        self._agent_drop()
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def __enter__(self) -> HostConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ------------------------------------------------------------------------------

    def _transport(self) -> paramiko.Transport:
        self.connect()
        assert self._conn is not None
        t = self._conn.client.get_transport()
        if t is None or not t.is_active():
            raise Unreachable(f"{self.host.name}: connection lost")
        return t

    def _session(self, why: str, limit: float) -> paramiko.Channel:
        """Open a session channel within `limit` seconds."""
        deadline = self._begin(f"the session request ({why})", limit)
        try:
            chan = self._transport().open_session(timeout=limit)
        except (paramiko.SSHException, OSError, EOFError) as e:
            if self.aborted:
                raise RemoteError(self.aborted, kind="timeout") from None
            if time.monotonic() >= deadline - 0.05 or "Timeout opening channel" in str(e):
                raise RemoteError(self.step_stalled, kind="timeout") from None
            raise Unreachable(f"{self.host.name}: cannot open a session: {e or e.__class__.__name__}") from None
        finally:
            self._end()
        return chan

    def _exec(self, chan: paramiko.Channel, cmd: str, why: str, limit: float) -> None:
        """chan.exec_command(cmd), but waiting at most `limit` seconds for the host's answer (paramiko
        waits on the channel's event with no timeout: a host that stops answering right there would
        hang the command forever). Raises RemoteError(kind="timeout") naming the step."""
        self._begin(f"the exec request ({why})", limit)
        try:
            answered = internals.send_exec(chan, cmd, limit)
            if answered is None:  # another paramiko layout: its own call, in a thread we stop waiting for
                failed: list[BaseException] = []
                done = threading.Event()

                def go() -> None:
                    try:
                        chan.exec_command(cmd)
                    except BaseException as e:
                        failed.append(e)
                    finally:
                        done.set()

                threading.Thread(target=go, name=f"fleetctl-exec-{self.host.name}", daemon=True).start()
                answered = done.wait(limit)
                if failed:
                    raise failed[0]
            if not answered:
                chan.close()
                raise RemoteError(self.step_stalled, kind="timeout",
                                  hint="is the host frozen or its network dropping packets?")
        except (paramiko.SSHException, OSError, EOFError) as e:
            chan.close()
            if self.aborted:
                raise RemoteError(self.aborted, kind="timeout") from None
            raise Unreachable(f"{self.host.name}: connection lost at the exec request ({why}): "
                              f"{e or e.__class__.__name__}") from None
        finally:
            self._end()

    def _start_pipe(self, argv: list[str], limit: float) -> SshPipe:
        chan = self._session("starting the agent", limit)
        self._exec(chan, shlex.join(argv), "starting the agent", limit)
        return SshPipe(chan)

    def open_tcp(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> paramiko.Channel:
        """A direct-tcpip channel to host:port as seen from the remote machine (no port exposed)."""
        try:
            return self._transport().open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError(f"{self.host.name}: cannot reach {host}:{port} through SSH: {e}") from None
