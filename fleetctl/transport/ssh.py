"""SSH transport on Fabric/paramiko: one connection per host, reused for every step of a command.

Everything that touches a host goes through `HostConnection`: commands are argv lists joined with
shell quoting (no user string reaches a shell raw), timeouts are enforced here, and the remote
agent (fleetctl/remote) is run through `agent()`.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection

from fleetctl.config.inventory import Host, Inventory
from fleetctl.errors import FleetctlError
from fleetctl.protocol import parse_reply
from fleetctl.remote import agent_source
from fleetctl.transport.hostkeys import HostKeyError, StrictPolicy, fingerprint

BOOTSTRAP = (
    "import sys,os,marshal,hashlib\n"
    "i=sys.stdin.buffer\n"
    "n=int(i.read(10))\n"
    "s=i.read(n)\n"
    "g={'__name__':'fleetctl_agent'}\n"
    # compiling the agent costs far more than running it: keep the code object per agent hash and
    # interpreter in the host's private state dir (only a regular file owned by us, in a dir owned
    # by us that nobody else can write, is trusted; anything odd: compile afresh)
    "c=None;q=None\n"
    "try:\n"
    " r=os.path.expanduser(sys.argv[1]) if len(sys.argv)>1 and sys.argv[1] else None\n"
    " if r:\n"
    "  os.makedirs(r,0o700,exist_ok=True);t=os.stat(r)\n"
    "  if t.st_uid==os.getuid() and not t.st_mode&0o022:\n"
    "   q=os.path.join(r,'agent-%s.%s'%(hashlib.sha256(s).hexdigest()[:32],sys.implementation.cache_tag))\n"
    "   t=os.lstat(q)\n"
    "   if t.st_uid==os.getuid() and not t.st_mode&0o077 and t.st_mode&0o170000==0o100000:\n"
    "    f=open(q,'rb');c=marshal.loads(f.read());f.close()\n"
    "except Exception:\n"
    " c=None\n"
    "if c is None:\n"
    " c=compile(s,'fleetctl-agent','exec')\n"
    " if q:\n"
    "  try:\n"
    "   w=q+'.%d'%os.getpid();fd=os.open(w,os.O_WRONLY|os.O_CREAT|os.O_EXCL,0o600)\n"
    "   os.write(fd,marshal.dumps(c));os.close(fd);os.replace(w,q)\n"
    "  except Exception:\n"
    "   pass\n"
    "exec(c,g)\n"
    "k=i.read(1)\n"
    # optional secret-env block (b'E' + 10-digit length + JSON object): set in the agent's own
    # environment, so secret values never appear on a command line (ps, /proc/*/cmdline, audit logs)
    "if k==b'E':\n"
    " import json;m=int(i.read(10));os.environ.update(json.loads(i.read(m)));k=i.read(1)\n"
    # b'S': a session: framed requests (10-digit length + JSON) answered one by one until stdin
    # ends, so one process serves every step of a command on this host; else one request to EOF
    "if k==b'S':\n"
    " sys.exit(g['_serve'](i))\n"
    "sys.exit(g['_main'](k+i.read()))\n"
)

# paramiko logs a failed handshake with its traceback at ERROR; with no handler configured Python
# prints that on stderr. fleetctl reports every failure itself, on one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

CHUNK = 1 << 16
STDERR_TAIL = 1 << 16  # bytes of a remote stderr kept (its tail)
ABORT_GRACE = 5.0  # seconds a step may overrun its own timeout before the watchdog cuts the connection


class Unreachable(FleetctlError):
    """The host could not be reached or authenticated."""

    def __init__(self, message: str, *, hint: str | None = None, transient: bool = True) -> None:
        super().__init__(message, hint=hint)
        self.transient = transient


class RemoteError(FleetctlError):
    """A remote command or the agent failed on the host."""

    def __init__(self, message: str, *, kind: str = "failed", hint: str | None = None,
                 detail: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.kind = kind
        self.detail = detail


@dataclass
class CommandResult:
    argv: list[str]
    rc: int | None
    stdout: bytes
    stderr: bytes
    elapsed: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out


_configs: dict[str, Config] = {}
_config_lock = threading.Lock()


def _fabric_config(ssh_config: Path | None) -> Config:
    key = str(ssh_config or "")
    cfg = _configs.get(key)
    if cfg is None:
        cfg = Config(runtime_ssh_path=str(ssh_config)) if ssh_config else Config()
        _memoize_lookup(cfg.base_ssh_config)
        _configs[key] = cfg
    return cfg


def _memoize_lookup(ssh_config: paramiko.SSHConfig) -> None:
    """paramiko's SSHConfig.lookup walks every Host block (and asks the password database once per
    block): ~5 ms per host with a 256-host ssh_config, for each of 256 connections. Within one
    command the answer for a name does not change: look each name up once, hand out copies."""
    lookup = ssh_config.lookup
    seen: dict[str, paramiko.SSHConfigDict] = {}

    def cached(hostname: str) -> paramiko.SSHConfigDict:
        if hostname not in seen:
            seen[hostname] = lookup(hostname)
        return copy.deepcopy(seen[hostname])

    ssh_config.lookup = cached  # type: ignore[method-assign]


_known_hosts: dict[str, tuple[tuple[int, int], paramiko.HostKeys]] = {}
_known_hosts_lock = threading.Lock()


def _load_known_hosts(client: paramiko.SSHClient, path: Path) -> None:
    """client.load_host_keys(path), parsing the file once per command (while it is unchanged)
    instead of once per connection: a 256-line known_hosts costs ~7 ms to parse, 256 times."""
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    with _known_hosts_lock:
        got = _known_hosts.get(str(path))
        if got is None or got[0] != stamp:
            keys = paramiko.HostKeys()
            keys.load(str(path))
            got = _known_hosts[str(path)] = (stamp, keys)
    mine = client.get_host_keys()
    if hasattr(mine, "_entries"):
        mine._entries.extend(copy.copy(e) for e in got[1]._entries)
        client._host_keys_filename = str(path)  # what load_host_keys records
    else:  # another paramiko layout: the plain way
        client.load_host_keys(str(path))


def _open_kwargs(conn: Connection) -> dict[str, Any]:
    """What fabric's Connection.open() passes to SSHClient.connect, read from the connection and its
    (shared) config; call it under _config_lock."""
    kwargs = dict(conn.connect_kwargs, username=conn.user, hostname=conn.host, port=conn.port)
    if conn.connect_timeout:
        kwargs["timeout"] = conn.connect_timeout
    if "key_filename" in kwargs and not kwargs["key_filename"]:
        del kwargs["key_filename"]
    auth = conn.config.get("authentication") or {}
    strategy = auth.get("strategy_class") if hasattr(auth, "get") else None
    if strategy is not None:  # fabric >= 3.1 lets the config name an auth strategy: keep honouring it
        for key in ("allow_agent", "key_filename", "look_for_keys", "passphrase", "password", "pkey", "username"):
            kwargs.pop(key, None)
        kwargs["auth_strategy"] = strategy(ssh_config=conn.ssh_config, fabric_config=conn.config, username=conn.user)
    return kwargs


def _open(conn: Connection, kwargs: dict[str, Any]) -> None:
    """fabric's Connection.open() with the config already read: the gateway (ProxyJump, its own
    cloned config; or ProxyCommand), then paramiko's connect."""
    if conn.gateway:
        kwargs = {**kwargs, "sock": conn.open_gateway()}
    conn.client.connect(**kwargs)
    conn.transport = conn.client.get_transport()


def env_prefix(env: Mapping[str, str]) -> list[str]:
    return ["env", *[f"{k}={v}" for k, v in env.items()]] if env else []


class HostConnection:
    def __init__(self, host: Host, inventory: Inventory, *, accept_new_host_keys: bool = False) -> None:
        self.host = host
        self.inventory = inventory
        self.accept_new = accept_new_host_keys
        self._conn: Connection | None = None
        self.connect_seconds: float | None = None
        self.accepted_keys: list[str] = []
        self._agent_chan: paramiko.Channel | None = None
        self._agent_lock = threading.Lock()
        self._agent_out = bytearray()
        self._agent_err = bytearray()
        # what the host is doing now, for the watchdog (Fleet), reports and Ctrl-C: a step, the
        # monotonic time it must end by, and the line that reports it stalled
        self.step: str | None = None
        self.step_deadline: float | None = None
        self.step_stalled: str = ""
        self.txn_deadline: float | None = None  # the per-host deadline of the current host transaction
        self.aborted: str | None = None  # why the watchdog cut this host off (its line)
        self.done: list[str] = []  # agent actions this host answered, in order
        self._opening: Connection | None = None  # the connection being opened (the watchdog may cut it)

    # -- steps and deadlines --------------------------------------------------------------------

    def _begin(self, step: str, limit: float, stalled: str | None = None,
               grace: float = ABORT_GRACE) -> float:
        """Start a step that must end within `limit` seconds (the watchdog cuts it `grace` seconds
        later); returns its deadline."""
        if self.aborted:
            raise RemoteError(self.aborted, kind="timeout")
        deadline = time.monotonic() + limit
        self.step, self.step_deadline = step, deadline + grace
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
        """Cut this host off (from another thread): every wait on its connection ends at once and the
        host is reported with `why`. Closing runs in its own thread so the caller never waits."""
        if self.aborted:
            return
        self.aborted = why
        conns = [c for c in (self._opening, self._conn) if c is not None]
        conns += [c.gateway for c in conns if isinstance(c.gateway, Connection)]  # a stalled ProxyJump

        def cut() -> None:
            for c in conns:
                try:
                    t = c.client.get_transport()
                    if t is not None:
                        t.close()
                except Exception:
                    pass

        threading.Thread(target=cut, name=f"fleetctl-abort-{self.host.name}", daemon=True).start()

    # -- connecting ---------------------------------------------------------------------------

    @property
    def label(self) -> str:
        return self.host.name

    def _known_hosts(self, conn: Connection) -> Path:
        if self.host.known_hosts:
            return Path(self.host.known_hosts)
        ukh = conn.ssh_config.get("userknownhostsfile")
        if ukh:
            return Path(str(ukh).split()[0]).expanduser()
        return Path("~/.ssh/known_hosts").expanduser()

    def _prepare(self, conn: Connection, label: str) -> list[StrictPolicy]:
        policies = []
        kh = self._known_hosts(conn)
        client = conn.client
        if kh.exists():
            try:
                _load_known_hosts(client, kh)
            except (OSError, paramiko.SSHException) as e:
                raise HostKeyError(f"{label}: cannot read known_hosts {kh}: {e}") from None
        policy = StrictPolicy(kh, label, self.accept_new)
        client.set_missing_host_key_policy(policy)
        policies.append(policy)
        gw = conn.gateway
        if isinstance(gw, Connection):
            policies += self._prepare(gw, f"{label} (jump host {gw.original_host})")
        return policies

    CONNECT_TRIES = 3

    def connect(self) -> None:
        """Connect, retrying a transient failure (refused, reset, timed out, no session) twice with
        jitter: hundreds of handshakes at once can overrun sshd or the machine. Authentication and
        host-key failures are never retried."""
        for attempt in range(self.CONNECT_TRIES):
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
        with _config_lock:
            conn = Connection(
                target,
                user=h.user,
                port=h.port,
                config=_fabric_config(self.inventory.ssh_config),
                connect_timeout=max(1, round(h.connect_timeout)),
                connect_kwargs=kwargs,
            )
            open_kwargs = _open_kwargs(conn)
        policies = self._prepare(conn, h.name)
        where = f"{conn.user}@{conn.host}:{conn.port}"
        t0 = time.monotonic()
        self._begin("the SSH connection", h.connect_timeout,
                    f"{h.name}: no SSH connection to {where} within {h.connect_timeout:g}s "
                    "(TCP connect, SSH banner, key exchange and authentication)", grace=1.0)
        self._opening = conn
        try:
            _open(conn, open_kwargs)
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
        self.connect_seconds = time.monotonic() - t0
        transport = conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        self.accepted_keys = [p.accepted for p in policies if p.accepted]
        self._conn = conn

    def _connect_failed(self, conn: Connection, where: str) -> None:
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
            raise Unreachable(f"{h.name}: authentication failed for {where}: {e}",
                              hint="check 'user:' and 'identity_file:' in the inventory", transient=False) from None
        except TimeoutError:
            raise Unreachable(f"{h.name}: connection to {where} timed out after {h.connect_timeout:g}s",
                              hint="is the host up and the address right?", transient=False) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            msg = str(e) or e.__class__.__name__
            if msg == "Error reading SSH protocol banner":  # paramiko's words for: no banner in time
                raise Unreachable(f"{h.name}: no SSH banner from {where} within {h.connect_timeout:g}s",
                                  hint="is the host frozen or overloaded? raise connect_timeout if it is just slow",
                                  transient=False) from None
            refused = isinstance(e, paramiko.ssh_exception.NoValidConnectionsError)
            if refused:
                msg = "connection refused"
            # refused: nobody listens (definite); a handshake cut short (reset, no session) is what
            # an overloaded sshd does: worth another try
            raise Unreachable(f"{h.name}: cannot connect to {where}: {msg}",
                              hint="is sshd running there and the port right?", transient=not refused) from None

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
            if all(hasattr(chan, a) for a in ("_event_pending", "event", "event_ready", "remote_chanid")):
                m = paramiko.Message()
                m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
                m.add_int(chan.remote_chanid)
                m.add_string("exec")
                m.add_boolean(True)
                m.add_string(cmd)
                chan._event_pending()
                chan.transport._send_user_message(m)
                answered = chan.event.wait(limit)
                if answered and not chan.event_ready:  # refused, or the channel/connection closed
                    raise chan.transport.get_exception() or paramiko.SSHException("Channel closed.")
            else:  # another paramiko layout: its own call, in a thread we stop waiting for
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

    def _cap(self) -> int:
        return self.host.max_answer_bytes

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult:
        """Run argv on the host (quoted for the remote shell). Never raises on a non-zero exit; stdout
        beyond max_answer_bytes fails the host, stderr keeps its tail."""
        full = [*env_prefix(env or {}), *argv]
        cmd = shlex.join(full)
        limit = timeout if timeout is not None else self.host.command_timeout
        t0 = time.monotonic()
        chan = self._session(f"running {argv[0]}", self.host.command_timeout)
        out, err = bytearray(), bytearray()
        timed_out = False
        try:
            self._exec(chan, cmd, f"running {argv[0]}", self.host.command_timeout)
            deadline = self._begin(f"{argv[0]}", limit)
            chan.settimeout(max(0.001, deadline - time.monotonic()))
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                chan.settimeout(min(0.05, left))
                try:
                    data = chan.recv(CHUNK)
                except TimeoutError:
                    data = None
                if data:
                    out += data
                    if len(out) > self._cap():
                        raise RemoteError(f"{self.host.name}: output of {argv[0]} too large "
                                          f"(over {self._cap()} bytes > cap)", hint="max_answer_bytes in the inventory")
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(CHUNK)
                    del err[:-STDERR_TAIL]
                if data == b"":  # stdout ended: wait for the exit status without spinning
                    if chan.exit_status_ready():
                        break
                    time.sleep(0.01)
            rc = None if timed_out else chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as e:
            if self.aborted:
                raise RemoteError(self.aborted, kind="timeout") from None
            raise Unreachable(f"{self.host.name}: connection lost while running {argv[0]}: {e or e.__class__.__name__}") from None
        finally:
            self._end()
            chan.close()
        return CommandResult(list(full), rc, bytes(out), bytes(err), time.monotonic() - t0, timed_out)

    # -- the agent ----------------------------------------------------------------------------

    def _agent_start(self) -> paramiko.Channel:
        """Start the agent on the host in session mode: one process (one exec, one Python start)
        serves every agent request of this command on this host, until close(). Every step is
        bounded by command_timeout."""
        src = agent_source()
        data = b"%010d" % len(src) + src
        secret = {k: v for k, v in self.host.env.items() if k in self.host.secret_env_keys}
        if secret:  # over stdin, never on the command line
            block = json.dumps(secret).encode()
            data += b"E%010d" % len(block) + block
        data += b"S"
        public = {k: v for k, v in self.host.env.items() if k not in self.host.secret_env_keys}
        cache = self.host.state_dir.rstrip("/") + "/cache"
        # the python word again: the agent compares it with the launch's (an in-process probe, agent.py)
        cmd = shlex.join([*env_prefix(public), self.host.python, "-c", BOOTSTRAP, cache, self.host.python])
        limit = self.host.command_timeout
        chan = self._session("starting the agent", limit)
        self._exec(chan, cmd, "starting the agent", limit)
        deadline = self._begin("sending the agent to the host", limit,
                               f"{self.host.name}: the host took no agent code for {limit:g}s (sending the agent)")
        try:
            # if the process already ended (no such python), the first call says why
            self._send(chan, data, deadline)
        finally:
            self._end()
        self._agent_out.clear()
        self._agent_err.clear()
        return chan

    def _send(self, chan: paramiko.Channel, data: bytes, deadline: float) -> bool:
        """Write to the agent's stdin by `deadline`. False if its channel has ended (the process
        exited: its exit status and stderr tell why); a connection that is gone raises; a host that
        takes nothing for that long raises RemoteError(kind="timeout")."""
        chan.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            chan.sendall(data)
            return True
        except TimeoutError:
            raise RemoteError(self.step_stalled, kind="timeout") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            if self.aborted:
                raise RemoteError(self.aborted, kind="timeout") from None
            t = chan.get_transport()
            if t is not None and t.is_active():
                return False
            raise Unreachable(f"{self.host.name}: connection lost: {e or e.__class__.__name__}") from None

    def _agent_drop(self) -> None:
        chan, self._agent_chan = self._agent_chan, None
        if chan is not None:
            try:
                chan.shutdown_write()
            except Exception:
                pass
            chan.close()

    def _agent_answer(self, chan: paramiko.Channel, deadline: float, action: str) -> bytes | None:
        """The next framed answer; None if the agent's stdout ended first (the process is gone).
        Raises TimeoutError at the deadline, RemoteError for an answer over max_answer_bytes (read
        from its frame header, before any of it is kept) or stdout that is not a frame.

        Waits in paramiko's own channel buffer (no file descriptor, no select(): that fails for
        descriptors above 1024, i.e. for fleets of a few hundred hosts)."""
        out, err = self._agent_out, self._agent_err
        cap = self._cap()
        while True:
            if len(out) >= 10:
                head = bytes(out[:10])
                if not head.isdigit():  # something else wrote to stdout: not an answer
                    junk = bytes(out[:120])
                    out.clear()
                    raise RemoteError(f"{self.host.name}: '{action}' answered something that is not an agent "
                                      f"answer: {junk!r}", hint="does a login script print to stdout?")
                n = int(head)
                if n > cap:
                    out.clear()
                    raise RemoteError(f"{self.host.name}: answer to '{action}' too large ({n} bytes > cap {cap})",
                                      hint="raise max_answer_bytes in the inventory if the host is right")
                if len(out) >= 10 + n:
                    answer = bytes(out[10:10 + n])
                    del out[:10 + n]
                    return answer
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            # stdout data and EOF end the wait at once; stderr is drained at least every 50 ms
            chan.settimeout(min(0.05, left))
            try:
                data = chan.recv(CHUNK if len(out) < 10 else max(1, min(CHUNK, 10 + int(out[:10]) - len(out))))
            except TimeoutError:
                data = None
            if data:
                out += data
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(CHUNK)
                del err[:-STDERR_TAIL]  # keep the tail
            if data == b"":  # stdout ended: the process is gone (or the channel closed)
                return None

    def agent(self, action: str, payload: Mapping[str, Any] | None = None, *,
              timeout: float | None = None) -> Any:
        """Run one agent action with the host's python; return its result, checked and typed as
        fleetctl.protocol.ANSWERS[action] says, or raise RemoteError (InvalidAnswer if it does not fit)."""
        body = json.dumps({"action": action, **(payload or {})}).encode()
        limit = timeout if timeout is not None else self.host.command_timeout
        h = self.host.name
        with self._agent_lock:
            chan = self._agent_chan
            if chan is None or chan.closed or chan.eof_received:  # none yet, or it ended between requests
                self._agent_drop()
                chan = self._agent_chan = self._agent_start()
            deadline = self._begin(f"the '{action}' request", limit,
                                   f"{h}: '{action}' timed out: no answer within {limit:g}s")
            try:
                answer = self._agent_answer(chan, deadline, action) if self._send(chan, b"%010d" % len(body) + body, deadline) else None
            except TimeoutError:
                self._agent_drop()
                raise RemoteError(self.step_stalled, kind="timeout",
                                  hint="raise command_timeout in the inventory if the host is just slow") from None
            except RemoteError:
                self._agent_drop()
                raise
            except (paramiko.SSHException, OSError, EOFError) as e:
                self._agent_drop()
                if self.aborted:
                    raise RemoteError(self.aborted, kind="timeout") from None
                raise Unreachable(f"{h}: connection lost while running {action}: {e or e.__class__.__name__}") from None
            finally:
                self._end()
            if answer is None:  # the agent ended without answering: its exit status and stderr say why
                end = time.monotonic() + 5
                while not chan.exit_status_ready() and not chan.closed and time.monotonic() < end:
                    time.sleep(0.02)
                rc = chan.recv_exit_status() if chan.exit_status_ready() else None
                while chan.recv_stderr_ready():
                    self._agent_err += chan.recv_stderr(CHUNK)
                    del self._agent_err[:-STDERR_TAIL]
                stderr = self._agent_err.decode(errors="replace")
                self._agent_drop()
                if self.aborted:
                    raise RemoteError(self.aborted, kind="timeout")
                tail = stderr.strip().splitlines()
                why = tail[-1] if tail else f"exit code {rc}"
                if rc in (126, 127):
                    raise RemoteError(f"{h}: python interpreter {self.host.python!r} cannot run: {why}",
                                      kind="bad_python", hint="fix 'python:' for this host in the inventory")
                raise RemoteError(f"{h}: '{action}' failed: {why}", kind="failed", detail=stderr)
        reply = parse_reply(h, action, answer)  # the one check of what the host sent (fleetctl/protocol)
        if reply.error is not None:
            raise RemoteError(f"{h}: {reply.error}", kind=reply.kind, detail=reply.traceback)
        self.done.append(action)
        return reply.result

    def open_tcp(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> paramiko.Channel:
        """A direct-tcpip channel to host:port as seen from the remote machine (no port exposed)."""
        try:
            return self._transport().open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError(f"{self.host.name}: cannot reach {host}:{port} through SSH: {e}") from None
