"""An in-process host for tests of ops: the Transport (fleetctl/transport/base.py) whose "remote
process" is the REAL agent's request handler run in this process on a temporary host directory.
No sshd, no ssh, no subprocess for the agent (httpx's MockTransport is the model).

What is real: the controller's whole session (transport/session.py AgentTransport: the hello, the
code block shipped and compiled, on-demand parts, the framing, every bound and the one check of
every answer), the agent's code exactly as shipped (the stripped, compressed source, compiled and
exec'd into a fresh namespace per session, as the bootstrap does on a host; its cache in the host's
state dir kept and verified the same way), its answers, the files it writes, and every process it
starts (the launch probe, servers, nvidia-smi, git, the seal check's `sh -c`) with the host's
environment.

What stands in for the process boundary, per agent session (so hosts in threads do not share it):
  * `os.environ` (and environb, getenv, path.expanduser) is the host's login environment (given),
    the inventory's `env` prefix and the secret env sent over stdin; a child the agent starts
    without `env=` (supervisorctl, git, journalctl) gets that environment too (its `subprocess`);
  * `sys.argv` is the bootstrap's, with no interpreter word: the agent never runs the launch probe
    in its own process (agent.py same_start), which would see this process's imports;
  * `sys.executable` and `sys.path` are the host python's (asked once per python and environment);
    the host's python must be this interpreter or a venv of it (the agent runs on this one);
  * `os.uname()`'s nodename is the host's given hostname (FakeHosts.hostname), if any: another
    machine to the agent, as a host whose sshd runs in its own UTS namespace is;
  * a test may rewrite each framed answer on its way to stdout (FakeHosts.rewrite): what a hostile
    `python:` wrapper around the real agent does on a real host (tests/data/hostile_agent.py);
  * `os._exit` and a SIGSTOP of its own pid (test fault points) freeze the session's thread as a
    dead process would be, never this process; the agent's pid is this process's, so tests that
    kill or stop agent processes, hold locks across processes or read pids stay on sshd.

Transport-only behaviour (ssh, login shells, the check-then-agent gate, become, containers,
ProxyJump) is not here: those tests keep the real sshd sandbox (the `fleet` marker). This module is
test-only (tests/), not fleetctl/transport/: its stand-ins share one process between the controller
and its "hosts", which no real use may do.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import json
import marshal
import os
import posixpath
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from fleetctl.config.hosts import Host, Inventory
from fleetctl.transport.base import RemoteError, Unreachable
from fleetctl.transport.local import ProcessPipe, open_loopback
from fleetctl.transport.session import BOOTSTRAP, HELLO, AgentTransport

CHUNK = 1 << 16


# ---------------------------------------------------------------------------- the host's python


@functools.cache
def _python_facts(exe: str, env_key: tuple[tuple[str, str], ...]) -> tuple[str, list[str]]:
    """(sys.executable, sys.path) of the host python `exe` started with that environment; checked
    to be this interpreter's version (the agent runs on this one)."""
    env = dict(env_key)
    p = subprocess.run([exe, "-c", "import sys,json;print(json.dumps([sys.executable,sys.path,list(sys.version_info[:2])]))"],
                       capture_output=True, text=True, env=env, timeout=60, check=True)
    executable, path, ver = json.loads(p.stdout)
    if tuple(ver) != tuple(sys.version_info[:2]):
        raise AssertionError(f"fake host python {exe} is {ver}, not this interpreter's "
                             f"{sys.version_info[:2]}: give it a real host (sshd) instead")
    return executable, path


# python start variables that decide sys.path
_PATH_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONUSERBASE", "HOME", "PATH")


class _Frozen(BaseException):
    """Raised nowhere: the thread of a "dead" agent process waits on forever (see _die)."""


class AgentProcess:
    """One agent "process": the bootstrap's work (hello, code, env block, session) and the agent's
    namespace, serving framed requests from a thread of its own. A `session.Pipe`."""

    _code_memo: ClassVar[dict[str, Any]] = {}
    _memo_lock = threading.Lock()

    def __init__(self, host: str, env: dict[str, str], args: list[str], nodename: str | None = None,
                 rewrite: Callable[[bytes], bytes] | None = None) -> None:
        self.host = host
        self.env = env  # the process's os.environ
        self.args = args  # the bootstrap's argv after -c: CACHE PYTHON KEY MAGIC CODEKEY
        self.nodename = nodename  # its uname nodename, where the host is given another (FakeHosts.hostname)
        self.rewrite = rewrite  # what stands between the agent and its stdout (FakeHosts.rewrite)
        self._in = bytearray()
        self._out = bytearray()
        self._cv = threading.Condition()
        self._eof = False  # stdin closed by the controller
        self._ended = False  # the process has ended (stdout closed)
        self._rc: int | None = None
        self._err = bytearray()
        self._dead = threading.Event()  # os._exit / SIGKILL: nothing runs on
        python = args[1]
        found = shutil.which(python, path=env.get("PATH", os.defpath)) if "/" not in python else python
        if not found or not os.access(found, os.X_OK):
            self._end(127, f"sh: 1: {python}: not found\n".encode())
            return
        self.executable, self.path = _python_facts(found, tuple(sorted(
            (k, v) for k, v in env.items() if k in _PATH_VARS)))
        # the process's pid: a real process that lives as long as this session (so locks, temp
        # names and liveness checks see one pid per agent, alive while it runs, gone after); `cat`
        # on a pipe of ours, so it ends with this process too
        self.standin = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.standin.pid
        self._hello = self._look_in_cache()
        with self._cv:
            self._out += self._hello
        threading.Thread(target=self._run, daemon=True, name=f"fakehost-agent-{host}").start()

    # -- the bootstrap (transport/session.py BOOTSTRAP), in plain Python --------------------------

    def _cache(self) -> str | None:
        d = posixpath.expanduser(self.args[0]) if not self.args[0].startswith("~") else \
            self.env.get("HOME", "") + self.args[0][1:]
        try:
            os.makedirs(d, 0o700, exist_ok=True)
            st = os.stat(d)
        except OSError:
            return None
        return d if st.st_uid == os.getuid() and not st.st_mode & 0o022 else None

    def _names(self) -> list[str]:
        key, magic, ckey = self.args[2], self.args[3], self.args[4]
        mine = _magic()
        return ([f"{ckey}.{sys.implementation.cache_tag}"] if magic == mine and ckey else []) + [f"{key}.src"]

    def _look_in_cache(self) -> bytes:
        self._code = None
        d = self._cache()
        for n in self._names() if d else []:
            f = os.path.join(d, "agent-" + n)  # type: ignore[arg-type]
            try:
                st = os.lstat(f)
                if st.st_uid != os.getuid() or st.st_mode & 0o077 or not (st.st_mode & 0o170000 == 0o100000):
                    continue
                with open(f, "rb") as fh:
                    b = fh.read()
            except OSError:
                continue
            if hashlib.sha256(b).hexdigest()[:32] == n[:32]:
                self._code = self._compiled(b) if n.endswith(".src") else marshal.loads(b)
                break
        return HELLO + (b"C" if self._code is not None else b"N") + _magic().encode() + b"%02x" % self._parts_here(d)

    def _parts_here(self, d: str | None) -> int:
        """The bootstrap's bits of the on-demand parts in the cache (argv after CODEKEY)."""
        bits, tag = 0, sys.implementation.cache_tag
        for i, key in enumerate(self.args[5:13]):
            for n in (f"{key}.{tag}", f"{key}.src") if d and tag else ():
                try:
                    st = os.lstat(os.path.join(d, "part-" + n))
                except OSError:
                    continue
                if st.st_uid == os.getuid() and not st.st_mode & 0o077 and st.st_mode & 0o170000 == 0o100000:
                    bits |= 1 << i
        return bits

    def _compiled(self, src: bytes) -> tuple[Any, Any, str]:
        k = hashlib.sha256(src).hexdigest()
        with self._memo_lock:
            got = self._code_memo.get(k)
        if got is None:
            from fleetctl.remote import compile_locked

            a, _, b = src.partition(b"\0")
            got = (compile_locked(a, "fleetctl-agent"), compile_locked(b, "fleetctl-probe"), b.decode())
            with self._memo_lock:
                self._code_memo[k] = got
        return got

    def _keep(self, src: bytes) -> None:
        d = self._cache()
        key = self.args[2]
        if d is None or hashlib.sha256(src).hexdigest()[:32] != key:
            return
        n, data = key + ".src", src
        names = self._names()
        if len(names) == 2:
            e = marshal.dumps(self._compiled(src), 2)
            if hashlib.sha256(e).hexdigest()[:32] == names[0][:32]:
                n, data = names[0], e
        w = os.path.join(d, f"agent-{n}.{os.getpid()}.{threading.get_ident()}")
        try:
            fd = os.open(w, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, data)
            os.close(fd)
            os.replace(w, os.path.join(d, "agent-" + n))
        except OSError:
            pass

    # -- stdin, as the bootstrap reads it -------------------------------------------------------------

    def _read(self, n: int) -> bytes:
        """n bytes of stdin (fewer at its end), waiting for the controller."""
        with self._cv:
            while len(self._in) < n and not self._eof:
                self._cv.wait()
            data = bytes(self._in[:n])
            del self._in[:n]
            return data

    def _run(self) -> None:
        try:
            self._serve()
        except _Frozen:
            return
        except BaseException as e:  # the bootstrap's own failure: a traceback on stderr, exit 1
            import traceback

            self._end(1, traceback.format_exc().encode() + f"{e}\n".encode())

    def _serve(self) -> None:
        if self._code is None:
            kind = self._read(1)
            blob = self._read(int(self._read(10) or b"0"))
            import lzma
            import zlib

            src = lzma.decompress(blob) if kind == b"L" else zlib.decompress(blob) if kind == b"Z" else blob
            self._code = self._compiled(src)
            self._keep(src)
        code, probe_code, probe_source = self._code
        ns = self._namespace(probe_code, probe_source)
        exec(code, ns)
        k = self._read(1)
        if k == b"E":
            self.env.update(marshal.loads(self._read(int(self._read(10)))))
            k = self._read(1)
        if k != b"S":  # fleetctl always asks for a session
            self._end(1, b"fakehost: only session mode is served\n")
            return
        handle = ns.get("handle_request") or ns["_handle"]
        while True:
            head = self._read(10)
            if len(head) < 10:
                self._end(0)
                return
            answer = handle(self._read(int(head)))
            if self.rewrite is not None:
                answer = self.rewrite(answer)
            if self._killed():
                raise _Frozen
            with self._cv:
                self._out += b"%010d" % len(answer) + answer
                self._cv.notify_all()

    def _end(self, rc: int, err: bytes = b"") -> None:
        with self._cv:
            if self._ended:
                return
            self._rc = rc
            self._err += err
            self._ended = True
            self._cv.notify_all()
        standin = getattr(self, "standin", None)
        if standin is not None and standin.poll() is None:
            standin.kill()
            standin.wait()

    def _killed(self) -> bool:
        """Its pid was killed from outside (a test): the process is gone, its answer in flight too
        (the thread may still finish the request's work: a real process would stop at once)."""
        if self._ended:
            return self._dead.is_set()
        rc = self.standin.poll() if hasattr(self, "standin") else None
        if rc is None:
            return False
        self._dead.set()
        self._end(rc if rc < 0 else -9)
        return True

    def _die(self, rc: int | None) -> None:
        """os._exit or a signal to itself: the process is gone (rc) or frozen (None) at once; its
        thread never runs on (no finally block runs, as in a dead process)."""
        self._dead.set()
        if rc is not None:
            self._end(rc)
        else:
            os.kill(self.pid, signal.SIGSTOP)
        threading.Event().wait()
        raise _Frozen

    # -- the agent's view of its process ------------------------------------------------------------

    def _namespace(self, probe_code: Any, probe_source: str) -> dict[str, Any]:
        fake_os, fake_sys, fake_sp = _OsView(self), _SysView(self), _SubprocessView(self)

        def imp(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
            if level == 0 and name in ("os", "os.path") and not fromlist:
                return fake_os
            if level == 0 and name == "sys":
                return fake_sys
            if level == 0 and name == "subprocess":
                return fake_sp
            if level == 0 and name in ("os", "os.path") and fromlist:
                return fake_os if name == "os" else fake_os.path
            return builtins.__import__(name, globals, locals, fromlist, level)

        def comp(source: Any, filename: Any, mode: str, *a: Any, **kw: Any) -> Any:
            from fleetctl.remote import _AST_LOCK

            with _AST_LOCK:  # (a parse at a time: agent parts compiled by several host threads)
                return compile(source, filename, mode, *a, **kw)

        bi = dict(builtins.__dict__, __import__=imp, compile=comp)
        return {"__name__": "fleetctl_agent", "__builtins__": bi, "PROBE_CODE": probe_code,
                "PROBE_SOURCE": probe_source}

    # -- session.Pipe ---------------------------------------------------------------------------------

    def send(self, data: bytes, deadline: float) -> bool:
        if self._killed():
            return False
        with self._cv:
            if self._ended or self._eof:
                return False
            self._in += data
            self._cv.notify_all()
        return True

    def recv(self, n: int, wait: float) -> bytes | None:
        end = time.monotonic() + max(0.0, wait)
        with self._cv:
            while not self._out and not self._ended:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)
            data = bytes(self._out[:n])
            del self._out[:n]
            return data  # b"" once ended and drained

    def stderr(self) -> bytes:
        with self._cv:
            out = bytes(self._err)
            self._err.clear()
            return out

    def ended(self) -> bool:
        return self._ended or self._killed()

    def exit_status(self, wait: float) -> int | None:
        end = time.monotonic() + wait
        with self._cv:
            while not self._ended and time.monotonic() < end:
                self._cv.wait(max(0.0, end - time.monotonic()))
            return self._rc

    def close(self) -> None:
        """The controller closed stdin: the agent ends after the request in flight (its pid with
        it); a frozen one is killed (transport/local.py does the same to a process)."""
        with self._cv:
            self._eof = True
            self._cv.notify_all()
            frozen = self._dead.is_set() and not self._ended
        if frozen:
            self._end(-9)


def _magic() -> str:
    from importlib.util import MAGIC_NUMBER

    return MAGIC_NUMBER.hex()


class _PathView(types.ModuleType):
    """os.path with the host's HOME for `~`."""

    def __init__(self, proc: AgentProcess) -> None:
        super().__init__("posixpath")
        self._proc = proc

    def __getattr__(self, name: str) -> Any:
        return getattr(posixpath, name)

    def expanduser(self, path: Any) -> Any:
        home = self._proc.env.get("HOME")
        if isinstance(path, str) and home and (path == "~" or path.startswith("~/")):
            return home.rstrip("/") + path[1:] if home != "/" else path[1:] or "/"
        return posixpath.expanduser(path)


class _OsView(types.ModuleType):
    """The `os` an agent process sees: its own environment; _exit and signals to itself end or
    freeze its session, not this process."""

    def __init__(self, proc: AgentProcess) -> None:
        super().__init__("os")
        self._proc = proc
        self.environ = proc.env
        self.path = _PathView(proc)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @property
    def environb(self) -> dict[bytes, bytes]:
        return {os.fsencode(k): os.fsencode(v) for k, v in self._proc.env.items()}

    def getenv(self, key: str, default: Any = None) -> Any:
        return self._proc.env.get(key, default)

    def getpid(self) -> int:
        return self._proc.pid

    def uname(self) -> os.uname_result:
        u = os.uname()
        name = self._proc.nodename
        return u if name is None else os.uname_result((u.sysname, name, u.release, u.version, u.machine))

    def _exit(self, rc: int) -> None:
        self._proc._die(rc)

    def kill(self, pid: int, sig: int) -> None:
        if pid == self._proc.pid and sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
            self._proc._die(None if sig == signal.SIGSTOP else -sig)
        os.kill(pid, sig)


class _SubprocessView(types.ModuleType):
    """The `subprocess` an agent process sees: a child started without `env=` inherits the agent
    process's environment (the host's login one), as on a host, not this test process's."""

    def __init__(self, proc: AgentProcess) -> None:
        super().__init__("subprocess")
        self._proc = proc

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def _kw(self, kw: dict[str, Any]) -> dict[str, Any]:
        if kw.get("env") is None:
            kw["env"] = dict(self._proc.env)
        return kw

    def Popen(self, *a: Any, **kw: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(*a, **self._kw(kw))

    def run(self, *a: Any, **kw: Any) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(*a, **self._kw(kw))

    def call(self, *a: Any, **kw: Any) -> int:
        return subprocess.call(*a, **self._kw(kw))

    def check_call(self, *a: Any, **kw: Any) -> int:
        return subprocess.check_call(*a, **self._kw(kw))

    def check_output(self, *a: Any, **kw: Any) -> Any:
        return subprocess.check_output(*a, **self._kw(kw))


class _SysView(types.ModuleType):
    """The `sys` an agent process sees: the bootstrap's argv (no interpreter word), the host
    python's executable and path."""

    def __init__(self, proc: AgentProcess) -> None:
        super().__init__("sys")
        a = proc.args
        self.argv = ["-c", a[0], "", *a[2:]]
        self.executable = proc.executable
        self.path = list(proc.path)

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)


# ---------------------------------------------------------------------------- the transport


def strip_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """`env K=V ... cmd` -> ({K: V}, cmd)."""
    env: dict[str, str] = {}
    if argv and argv[0] == "env":
        i = 1
        while i < len(argv) and "=" in argv[i]:
            k, _, v = argv[i].partition("=")
            env[k] = v
            i += 1
        argv = argv[i:]
    return env, argv


class FakeHosts:
    """What the in-process hosts of a test look like from outside: each host's login environment
    (what an SSH session there would have), and which hosts are down (unreachable)."""

    def __init__(self) -> None:
        self.login_env: dict[str, dict[str, str]] = {}
        self.down: set[str] = set()
        self.started: dict[str, list[list[str]]] = {}  # per host, every argv started (agent or command)
        self.agents: dict[str, list[AgentProcess]] = {}  # per host, every agent session started
        # per host, the hostname its agent sees (uname's nodename): another machine to the agent, as
        # a real host whose sshd runs in its own UTS namespace is (the boot id stays this machine's)
        self.hostname: dict[str, str] = {}
        # per host, a rewrite of every answer its agent frames on stdout (a hostile wrapper's, as a
        # `python:` wrapper around the real agent would do on a real host)
        self.rewrite: dict[str, Callable[[bytes], bytes]] = {}

    def env_for(self, host: Host) -> dict[str, str]:
        env = self.login_env.get(host.name)
        return dict(env) if env is not None else account_env()

    def transport(self, host: Host, inventory: Inventory, accept_new_host_keys: bool = False) -> FakeHostTransport:
        return FakeHostTransport(host, self)


class FakeHostTransport(AgentTransport):
    """A `Transport` to an in-process host: the agent (bootstrap argv) runs as an AgentProcess;
    any other command (the seal check, a container's runtime) as a local process with the host's
    login environment. `open_tcp` reaches loopback directly."""

    # no check-then-agent gate: the seal check runs as its own command (run_command), the path a
    # transport without one takes (seal.check); the gate itself is transport behaviour (sshd tests)
    check_ahead = None  # type: ignore[assignment]
    check_then_agent = None  # type: ignore[assignment]

    def __init__(self, host: Host, hosts: FakeHosts) -> None:
        super().__init__(host)
        self.hosts = hosts
        self._pipes: list[Any] = []

    def connect(self) -> None:
        if self.aborted:
            raise RemoteError(self.aborted, kind="timeout")
        if self.host.name in self.hosts.down:
            raise Unreachable(f"{self.host.name}: cannot connect to {self.host.address}:{self.host.port}: "
                              "Connection refused (the fake host is down)")

    def _start_pipe(self, argv: list[str], limit: float) -> Any:
        if self.host.name in self.hosts.down:
            raise Unreachable(f"{self.host.name}: connection lost (the fake host is down)")
        self.hosts.started.setdefault(self.host.name, []).append(list(argv))
        extra, cmd = strip_env(argv)
        env = {**self.hosts.env_for(self.host), **extra}
        if len(cmd) >= 3 and cmd[1] == "-c" and cmd[2] == BOOTSTRAP:
            args = [*cmd[3:], *[""] * max(0, 5 - len(cmd[3:]))]  # all of them: the parts' keys follow the 5th
            pipe: Any = AgentProcess(self.host.name, env, args,
                                     self.hosts.hostname.get(self.host.name), self.hosts.rewrite.get(self.host.name))
            self.hosts.agents.setdefault(self.host.name, []).append(pipe)
        else:
            exe = shutil.which(cmd[0], path=env.get("PATH", os.defpath)) or cmd[0]
            proc = subprocess.Popen([exe, *cmd[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, cwd=env.get("HOME") or "/",
                                    start_new_session=True)
            pipe = ProcessPipe(proc)
        self._pipes.append(pipe)
        return pipe

    def _cut(self) -> None:
        for p in self._pipes:
            if isinstance(p, ProcessPipe):
                if p.proc.poll() is None:
                    p.proc.kill()
            else:
                p.close()

    def open_tcp(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
        return open_loopback(self.host.name, "a fake host", port, host, timeout)

    def close(self) -> None:
        self._agent_drop()
        self._pipes = [p for p in self._pipes if not p.ended()]


@contextmanager
def installed(hosts: FakeHosts | None = None) -> Iterator[FakeHosts]:
    """Within: every Fleet a command builds with its default transport (SSH) connects to in-process
    hosts instead (the `fake_sandbox` fixture, tests/conftest.py)."""
    from fleetctl.transport import ssh

    hosts = hosts or FakeHosts()
    saved = ssh.HostConnection
    ssh.HostConnection = lambda host, inventory, accept_new_host_keys=False: hosts.transport(  # type: ignore[misc,assignment]
        host, inventory, accept_new_host_keys)
    try:
        yield hosts
    finally:
        ssh.HostConnection = saved  # type: ignore[misc]


def account_env() -> dict[str, str]:
    """What sshd gives every session of this account before the host's SetEnv (no SSH_* here)."""
    import pwd

    pw = pwd.getpwuid(os.getuid())
    return {"USER": pw.pw_name, "LOGNAME": pw.pw_name, "HOME": pw.pw_dir, "SHELL": pw.pw_shell or "/bin/sh",
            "PATH": "/usr/local/bin:/usr/bin:/bin"}


def add_sandbox(hosts: FakeHosts, sb: Any) -> None:
    """The hosts of a sandbox built without sshd (lifecycle.up(..., sshd_hosts=False)), each with the
    environment its sshd would give a session (lifecycle.session_env)."""
    from fleetctl.sandbox import lifecycle

    for h in sb.hosts.values():
        hosts.login_env[h.name] = {**account_env(), **lifecycle.session_env(sb.dir, h)}


@contextmanager
def sandbox(d: Any, fake: FakeHosts | None = None, **kw: Any) -> Iterator[Any]:
    """A sandbox built without sshd (lifecycle.up(..., sshd_hosts=False)) whose hosts are in `fake`
    (a new FakeHosts if None), also `sb.fake` (`sb.fake.down.add("h02")`: unreachable). Nothing is
    installed here: a module-scoped sandbox is reached through `installed(sb.fake)` in each test's own
    fixture, so a test of the same module that uses real sshd hosts keeps SSH. Taken down (its
    servers stopped) at the end, also on failure."""
    from fleetctl.sandbox import lifecycle

    try:
        sb = lifecycle.up(d, sshd_hosts=False, **kw)
        sb.fake = fake if fake is not None else FakeHosts()  # type: ignore[attr-defined]
        add_sandbox(sb.fake, sb)  # type: ignore[attr-defined]
        yield sb
    finally:
        report = lifecycle.down(d, missing_ok=True)
        if report.survivors:
            raise RuntimeError(f"fake sandbox {d}: processes outlived SIGKILL: {report.survivors}")
