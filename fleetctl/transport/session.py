"""The agent session, over any byte pipe: the bootstrap the host's python runs, what is sent on
its stdin (agent source, secret env, session mode), and the framing of requests and answers
(10-digit length + marshal data to the agent, 10-digit length + JSON from it). A transport only supplies a `Pipe` to a process it started with
`agent_command()`'s argv; everything else about the agent is here, once.
"""

from __future__ import annotations

import marshal
import os
import shlex
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fleetctl.config.hosts import Host
from fleetctl.remote import agent_key, agent_text, keep_file, keep_stripped_in, packed
from fleetctl.remote import cache as once
from fleetctl.transport.base import RemoteError, Steps, Unreachable
from fleetctl.transport.layers import remote_argv


def agent_cache_dir() -> Path:
    """The controller's own copies of the agent (stripped texts, compiled forms): the cache dir's agent/."""
    from fleetctl.engines.wheels import cache_dir

    return cache_dir() / "agent"


keep_stripped_in(agent_cache_dir)  # the agent builder (remote/) is handed where to keep what it strips


@once
def bootstrap_text() -> str:
    """What the host's python runs with -c to start the agent: fleetctl/remote/bootstrap.py's
    function, turned into a string once per process (BOOTSTRAP)."""
    from fleetctl.remote.bootstrap import command_text

    return command_text()


def __getattr__(name: str) -> Any:
    if name == "BOOTSTRAP":  # (built on first use: an ast pass that a command without hosts never pays)
        return bootstrap_text()
    raise AttributeError(name)


# what check_then_agent's script ends with: one line from stdin, "go" execs the agent ("$@")
GATE = '; IFS= read -r fleetctl_go || exit 0; [ "$fleetctl_go" = go ] || exit 0; exec "$@"'
HELLO = b"FLAGENT"
# + 'C' (cached there), 'N' (send code, lzma) or 'Z' (zlib) + its bytecode magic, hex + the on-demand
# parts in its cache (two hex digits: bit i for the i-th of ON_DEMAND, remote/bootstrap.py)
HELLO_SIZE = len(HELLO) + 1 + 8 + 2
# what a login script (a banner in ~/.bashrc, a module system's notice) may print on stdout before the
# command runs: skipped up to this many bytes, as the seal check skips what comes before its first mark
LOGIN_NOISE_MAX = 64 << 10


def find_hello(buf: bytes | bytearray) -> int:
    """Where the first whole, well-formed hello starts in `buf`; -1 if none is there (yet)."""
    j = buf.find(HELLO)
    while 0 <= j <= len(buf) - HELLO_SIZE:
        if buf[j + len(HELLO):j + len(HELLO) + 1] in (b"C", b"N", b"Z") \
                and not bytes(buf[j + len(HELLO) + 1:j + HELLO_SIZE]).strip(b"0123456789abcdef"):
            return j
        j = buf.find(HELLO, j + 1)
    return -1


CHUNK = 1 << 16
# the longest a waiting host thread sleeps between looks at its stderr and deadline: stdout data and
# its end wake it at once. (At 0.05 s, 64 threads waiting out a slow login shell woke ~1,300 times a
# second: ~0.3 s of controller CPU per command.) A stderr flood is still drained 2x a second, within
# paramiko's 2 MiB channel window.
POLL = 0.5
STDERR_TAIL = 1 << 16  # bytes of a remote stderr kept (its tail)


def env_prefix(env: Mapping[str, str]) -> list[str]:
    return ["env", *[f"{k}={v}" for k, v in env.items()]] if env else []


# names a POSIX shell gives a meaning of its own (or keeps read-only): set by `env`, never by the
# script's own `export`
SHELL_NAMES = frozenset({"ENV", "IFS", "PS1", "PS2", "PS4", "OPTIND", "OPTARG", "PPID", "LINENO", "SHELLOPTS",
                         "UID", "EUID", "GROUPS", "FUNCNAME", "CDPATH", "PWD", "OLDPWD", "_", "RANDOM", "SRANDOM",
                         "SECONDS", "HISTCMD", "EPOCHSECONDS", "EPOCHREALTIME"})


def sh_argv(env: Mapping[str, str], script: str, args: Sequence[str] = ()) -> list[str]:
    """`sh -c SCRIPT sh ARGS...` with `env` in sh's environment: exported by the script itself (the
    names are the inventory's, checked as shell names; the values quoted), which spares the host the
    exec of `env` in front of sh; through `env` when a name is one the shell treats specially."""
    tail = ["sh", *args] if args else []  # ($0, then the script's "$@")
    if any(k in SHELL_NAMES or k.startswith("BASH") for k in env):
        return [*env_prefix(env), "sh", "-c", script, *tail]
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
    return ["sh", "-c", exports + script, *tail]


def agent_command(host: Host) -> tuple[list[str], bytes]:
    """The argv that starts the agent on `host` in session mode, and what to write to its stdin
    after the code block (code_block()): the secret env (over stdin, never on the command line), b'S'."""
    data = b""
    # through become, all of the env goes over stdin: sudo resets a command's environment, and a
    # sudoers rule names the interpreter, not `env`
    secret = {k: v for k, v in host.env.items() if k in host.secret_env_keys or host.becomes}
    if secret:
        block = marshal.dumps({str(k): str(v) for k, v in secret.items()}, 4)
        data += b"E%010d" % len(block) + block
    data += b"S"
    prefix, rest = agent_argv(host)
    return remote_argv(host, prefix + rest), data


def agent_argv(host: Host) -> tuple[list[str], list[str]]:
    """The agent's command as (the inventory's public env prefix, `python -c BOOTSTRAP ...`). With
    become, the second is the same command run through sudo (transport/become.py: a wrapper layer of
    the argv) and there is no env prefix (agent_command sends the env over stdin)."""
    from fleetctl.transport import become

    cache = host.state_dir.rstrip("/") + "/cache"
    # the python word again: the agent compares it with the launch's (an in-process probe, remote/locate.py);
    # the source's cache key, so the host need not hash it
    magic, ckey = compiled_agent_key()
    argv = [host.python, "-c", bootstrap_text(), cache, host.python, agent_key(), magic, ckey, *part_keys()]
    if host.becomes:  # (in a container, become wraps the runtime's exec instead: transport/layers.py)
        return [], argv if host.container else become.wrap(host, argv)
    return env_prefix(command_line_env(host)), argv


@once
def part_keys() -> tuple[str, ...]:
    """The source keys of the agent's on-demand parts, in ON_DEMAND's order: the bootstrap's hello
    says which of them the host has cached (hello_parts)."""
    from fleetctl.remote import ON_DEMAND, part_key

    return tuple(part_key(p) for p in ON_DEMAND)


def hello_parts(hello: bytes) -> set[str]:
    """The on-demand parts a hello says are in the host's cache (said, not trusted: load_part hashes
    them)."""
    from fleetctl.remote import ON_DEMAND

    try:
        bits = int(hello[HELLO_SIZE - 2:HELLO_SIZE], 16)
    except ValueError:
        return set()
    return {p for i, p in enumerate(ON_DEMAND) if bits >> i & 1}


def command_line_env(host: Host) -> dict[str, str]:
    """The inventory's env of `host` that may appear on a command line (not its secret values; none
    through become, which sends it over stdin)."""
    if host.becomes:
        return {}
    return {k: v for k, v in host.env.items() if k not in host.secret_env_keys}


_compiled_lock = threading.Lock()
_compiled: list[tuple[str, bytes]] = []  # (this interpreter's bytecode magic, hex; the agent compiled here)


def compiled_agent() -> tuple[str, bytes]:
    """The agent's code compiled by this interpreter, with the launch probe's (marshal of the two code
    objects), and its bytecode magic: a host whose python has the same magic loads it (~1 ms)
    instead of compiling the sources (~60 + ~8 ms of CPU). Compiled once per fleetctl version and
    interpreter on this machine too (~57 ms of the controller's CPU): kept in the cache dir
    (`compiled_cache_file`), trusted as the hosts trust theirs."""
    with _compiled_lock:
        if not _compiled:
            import sys
            from importlib.util import MAGIC_NUMBER

            magic = MAGIC_NUMBER.hex() if sys.implementation.name == "cpython" else "none"
            f = compiled_cache_file()
            data = _read_compiled(f) if f is not None else None
            if data is None:
                from fleetctl.remote import compile_locked, probe_source

                code = compile_locked(agent_text(), "fleetctl-agent")
                probe = compile_locked(probe_source(), "fleetctl-probe")
                # format 2: no back-references, whose use depends on this process's refcounts; so
                # a host's python of the same magic compiling the shipped source writes these bytes
                data = marshal.dumps((code, probe, probe_source()), 2)
                if f is not None:
                    keep_file(f, data)  # no cache: compiled again next time
            _compiled.append((magic, data))
        return _compiled[0]


@once
def compiled_agent_key() -> tuple[str, str]:
    """This interpreter's bytecode magic and the hash of its compiled agent (once per process, not
    per host)."""
    magic, code = compiled_agent()
    return magic, code_key(code)


def compiled_cache_file() -> Path | None:
    """Where this interpreter's compiled agent is kept: the cache dir's `agent/`, named by the agent's
    cache key (its source, which holds the probe's) and the interpreter's cache tag (None: no tag)."""
    import sys

    tag = sys.implementation.cache_tag
    if not tag:
        return None
    return agent_cache_dir() / f"{agent_key()}.{tag}.marshal"


def _private(st: os.stat_result, *, regular: bool) -> bool:
    kind = stat.S_ISREG(st.st_mode) if regular else stat.S_ISDIR(st.st_mode)
    return kind and st.st_uid == os.getuid() and not st.st_mode & (0o077 if regular else 0o022)


def _read_compiled(f: Path) -> bytes | None:
    """The cached compiled agent, only from a regular 0600 file of ours in a dir of ours nobody else
    can write (what the hosts' bootstrap trusts), holding the two code objects; else None."""
    try:
        if not _private(os.stat(f.parent), regular=False):
            return None
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not _private(os.fstat(fd), regular=True):
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read()
        got = marshal.loads(data)
    except (OSError, ValueError, EOFError, TypeError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    ok = type(got) is tuple and len(got) == 3 and all(type(c).__name__ == "code" for c in got[:2]) \
        and type(got[2]) is str
    return data if ok else None


def code_key(code: bytes) -> str:
    """The host's cache key of the compiled agent (BOOTSTRAP's CODEKEY): sha256 of its bytes, 32 hex."""
    import hashlib

    return hashlib.sha256(code).hexdigest()[:32]


def code_block(hello: bytes) -> bytes:
    """What follows the host's hello on the agent's stdin: nothing if it has the code cached; else
    the shipped source (agent_source: stripped) compressed as the hello asks, b'L' (lzma) or b'Z'
    (zlib) + 10-digit length + the compressed bytes."""
    kind = hello[len(HELLO):len(HELLO) + 1]
    if kind == b"C":
        return b""
    k = "L" if kind == b"N" else "Z"
    blob = packed(k)
    return k.encode() + b"%010d" % len(blob) + blob


def _plain(o: Any) -> Any:
    """`o` as the plain types marshal writes and the agent expects, converted as JSON would see them:
    tuples as lists, str/int/float subclasses (enums) as their value, keys as strings; bytes as bytes
    (a file's content, raw: a third smaller than base64, and nothing to decode there)."""
    t = type(o)
    if t is str or t is int or t is float or t is bool or t is bytes or o is None:
        return o
    if isinstance(o, Mapping):
        return {(k if type(k) is str else _key(k)): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if isinstance(o, str):
        return str.__str__(o)
    if isinstance(o, bool):
        return bool(o)
    if isinstance(o, int):
        return int(o)
    if isinstance(o, float):
        return float(o)
    raise TypeError(f"an agent request cannot hold {type(o).__name__}")


def _key(k: Any) -> str:
    if isinstance(k, str):
        return str.__str__(k)
    if k is True or k is False or k is None:
        return {True: "true", False: "false", None: "null"}[k]
    if isinstance(k, (int, float)):
        return repr(float(k)) if isinstance(k, float) else str(int(k))
    raise TypeError(f"an agent request key cannot be {type(k).__name__}")


def encode_request(action: str, request: Mapping[str, Any] | None = None) -> bytes:
    """One request as the agent reads it: marshal format 4 (Python 3.4+ reads it; no json import on
    the host) of plain dict/list/str/int/float/bool/None."""
    return marshal.dumps(_plain({"action": action, **(request or {})}), 4)


def parts_for(action: str, request: Mapping[str, Any], loaded: set[str]) -> list[str]:
    """The on-demand parts of the agent (fleetctl/remote ON_DEMAND) a request needs that the agent
    has not loaded: the part registers its action, or a facts hook it asks for (its "with", or its
    "then_facts"' "with")."""
    from fleetctl.remote import ON_DEMAND, PART_NEEDS, actions_of

    want = {action, *(request.get("with") or ())}
    after = request.get("then_facts")
    if isinstance(after, Mapping):
        want.update(after.get("with") or ())
    need = {p for p in ON_DEMAND if want & actions_of(p)}
    need.update(n for p in list(need) for n in PART_NEEDS.get(p, ()))
    return [p for p in ON_DEMAND if p in need and p not in loaded]


@once
def part_code_key(part: str) -> str:
    """What a host whose python has this interpreter's bytecode magic keeps of a part: the hash of
    its compiled code (marshal format 2, reproducible; see compiled_agent)."""
    from fleetctl.remote import compile_locked, part_text

    code = compile_locked(part_text(part), "fleetctl-part")
    return code_key(marshal.dumps(code, 2))


def with_parts(request: Mapping[str, Any] | None, parts: list[str], hello: bytes,
               send: set[str] | frozenset[str]) -> dict[str, Any]:
    """`request` with the agent's "_load" entries for `parts` (remote/core.py load_part): keys, and the
    compressed code of those in `send`."""
    out = dict(request or {})
    if not parts:
        return out
    from fleetctl.remote import part_key, part_packed

    magic, _ = compiled_agent()
    same = hello[len(HELLO) + 1:HELLO_SIZE - 2].decode("ascii", "replace") == magic
    kind = "Z" if hello[len(HELLO):len(HELLO) + 1] == b"Z" else "L"
    out["_load"] = [*(out.get("_load") or ()),
                    *({"key": part_key(p), "code": part_code_key(p) if same else "",
                       "blob": kind.encode() + part_packed(p, kind) if p in send else None} for p in parts)]
    return out


class PipeLost(Exception):
    """The link under the pipe is gone (not just the process at its far end)."""


class Pipe(Protocol):
    """The agent process's stdin/stdout/stderr, as a transport carries them."""

    def send(self, data: bytes, deadline: float) -> bool:
        """Write all of `data` by `deadline`. False if the process has ended (its exit status and
        stderr tell why); TimeoutError if it takes nothing for that long; PipeLost if the link is gone."""
        ...

    def recv(self, n: int, wait: float) -> bytes | None:
        """Up to n bytes of stdout; None if none came within `wait` seconds, b'' at its end."""
        ...

    def stderr(self) -> bytes:
        """The stderr available now (never waits)."""
        ...

    def ended(self) -> bool:
        """The process has ended or its stdout is closed (checked before a request)."""
        ...

    def exit_status(self, wait: float) -> int | None:
        """Its exit status, waiting at most `wait` seconds; None if unknown."""
        ...

    def close(self) -> None: ...


@dataclass
class _Ahead:
    """A check run ahead of the command's first step (AgentTransport.check_ahead)."""

    script: str
    pipe: Pipe | None = None  # waiting at its gate; None if the check ended otherwise
    output: bytes | None = None  # its output through `end`
    after: bytes = b""  # what came after it
    error: Exception | None = None  # what it met, raised by the check that takes it


class AgentTransport(Steps):
    """A transport that runs the agent through a `Pipe`: the session (one process per host per
    command), its bounds, and the one check of every answer (fleetctl/protocol). Subclasses
    supply `_start_pipe(argv, limit)` and `_cut()`."""

    def __init__(self, host: Host) -> None:
        super().__init__()
        self.host = host
        self.accepted_keys: list[str] = []
        self._agent_pipe: Pipe | None = None
        self._agent_lock = threading.Lock()
        self._agent_out = bytearray()
        self._no_hello = False  # the agent's process ended before its hello (_agent_ended says so)
        self._agent_err = bytearray()
        self._ahead: _Ahead | None = None  # a check run ahead (check_ahead)
        self._hello_got = b""  # the running agent's hello (what it had cached, its bytecode magic)
        self._parts_in: set[str] = set()  # on-demand parts the running agent has loaded

    def _start_pipe(self, argv: list[str], limit: float) -> Pipe:
        raise NotImplementedError

    def _lost(self, where: str, e: BaseException) -> Exception:
        """The error for a link lost at `where` (the watchdog's line if it cut the host)."""
        if self.aborted:
            return RemoteError(self.aborted, kind="timeout")
        return Unreachable(f"{self.host.name}: connection lost {where}: {e or e.__class__.__name__}")

    def _cap(self) -> int:
        return self.host.max_answer_bytes

    def _agent_start(self, pipe: Pipe | None = None, ahead: bytes = b"") -> Pipe:
        """Start the agent in session mode: one process serves every agent request of this command
        on this host, until close(). Every step is bounded by command_timeout. `pipe`: a process
        that is about to exec the agent (check_then_agent), `ahead` what it already sent."""
        argv, data = agent_command(self.host)
        limit = self.host.command_timeout
        if pipe is None:
            pipe = self._start_pipe(argv, limit)
        self._agent_out.clear()
        self._agent_err.clear()
        self._agent_out += ahead
        deadline = self._begin("sending the agent to the host", limit,
                               f"{self.host.name}: the agent did not start within {limit:g}s (no hello from its python, or it took no code)")
        self._no_hello = False
        with self._step_on(pipe, "sending the agent"):
            hello = self._hello(pipe, deadline)
            # if the process already ended (no such python), the first call says why
            self._hello_got, self._parts_in = hello or b"", set()
            if hello is not None:
                pipe.send(code_block(hello) + data, deadline)
            else:
                self._no_hello = True
        return pipe

    def _hello(self, pipe: Pipe, deadline: float) -> bytes | None:
        """The bootstrap's HELLO_SIZE bytes on stdout (is the code cached there, its bytecode magic),
        after at most LOGIN_NOISE_MAX bytes a login script printed before the command ran (a banner
        in ~/.bashrc: skipped); None if stdout ended first (the process is gone: the first request
        says why). Raises TimeoutError at the deadline, RemoteError when no hello comes within the
        bound."""
        out = self._agent_out
        prompts = 0  # sudo's prompts answered (become with --ask-become-pass)
        while True:
            i = find_hello(out)
            # the bound is on where the hello starts, not on what one read brought: a loaded machine
            # may get the whole banner and the hello in one read
            if i > LOGIN_NOISE_MAX or (i < 0 and len(out) > LOGIN_NOISE_MAX + HELLO_SIZE):
                junk = bytes(out[:120])
                out.clear()
                pipe.close()
                raise RemoteError(f"{self.host.name}: the agent's start answered something that is not its hello: "
                                  f"{junk!r}", hint="does a login script print to stdout? (more than "
                                  f"{LOGIN_NOISE_MAX >> 10} KiB before the agent's hello)")
            if i >= 0:
                hello = bytes(out[i:i + HELLO_SIZE])
                del out[:i + HELLO_SIZE]
                return hello
            if self.host.becomes:
                prompts = self._become_prompt(pipe, deadline, prompts)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            # (nothing comes after the hello until the controller sends the code: reading ahead is safe)
            data = pipe.recv(CHUNK, min(POLL, left))
            if data == b"":
                return None
            if data:
                out += data
            self._keep_stderr(pipe)

    def _become_prompt(self, pipe: Pipe, deadline: float, answered: int) -> int:
        """sudo -S asked for the become password (its prompt on stderr, transport/become.py PROMPT):
        send it, once, to sudo's stdin; a second prompt means sudo did not take it (the process is
        closed: sudo ends, no agent). Returns the prompts answered."""
        from fleetctl.transport import become

        pw = become.password()
        if pw is None:
            return answered
        seen = self._agent_err.count(become.PROMPT_MARK)
        if seen <= answered:
            return answered
        if seen > 1:
            pipe.close()
            raise RemoteError(f"{self.host.name}: sudo did not accept the become password to become "
                              f"{self.host.become_as}", kind="failed",
                              hint="rerun with --ask-become-pass and the login user's sudo password")
        pipe.send(pw + b"\n", deadline)
        return seen

    def _agent_drop(self) -> None:
        pipe, self._agent_pipe = self._agent_pipe, None
        if pipe is not None:
            pipe.close()
        self._ahead_drop()

    def _ahead_drop(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.pipe is not None:
            ahead.pipe.close()  # (its sh reads end of input at the gate: it ends, no agent)

    @contextmanager
    def _step_on(self, pipe: Pipe, where: str) -> Iterator[None]:
        """Within: a step's deadline passed (TimeoutError) or its link lost closes `pipe` and raises
        the step's error; the step ends either way."""
        try:
            yield
        except TimeoutError:
            pipe.close()
            raise RemoteError(self.step_stalled, kind="timeout") from None
        except PipeLost as e:
            pipe.close()
            raise self._lost(where, e) from None
        finally:
            self._end()

    def _keep_stderr(self, pipe: Pipe) -> None:
        err = pipe.stderr()
        if err:
            self._agent_err += err
            del self._agent_err[:-STDERR_TAIL]  # keep the tail

    def _agent_answer(self, pipe: Pipe, deadline: float, action: str) -> bytes | None:
        """The next framed answer; None if the agent's stdout ended first (the process is gone).
        Raises TimeoutError at the deadline, RemoteError for an answer over max_answer_bytes (read
        from its frame header, before any of it is kept) or stdout that is not a frame."""
        out = self._agent_out
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
            # stdout data and EOF end the wait at once; stderr is drained at least every POLL seconds
            data = pipe.recv(CHUNK if len(out) < 10 else max(1, min(CHUNK, 10 + int(out[:10]) - len(out))),
                             min(POLL, left))
            if data:
                out += data
            self._keep_stderr(pipe)
            if data == b"":  # stdout ended: the process is gone (or the link closed)
                return None

    def _agent_ended(self, pipe: Pipe, action: str) -> RemoteError:
        """Why the agent ended without answering: its exit status and stderr."""
        rc = pipe.exit_status(5.0)
        self._keep_stderr(pipe)
        stderr = self._agent_err.decode(errors="replace")
        self._agent_drop()
        h = self.host.name
        if self.aborted:
            return RemoteError(self.aborted, kind="timeout")
        tail = stderr.strip().splitlines()
        why = tail[-1] if tail else f"exit code {rc}"
        if self.host.becomes:
            from fleetctl.transport import become

            said = become.diagnose(self.host, stderr, rc)
            if said is not None:
                return RemoteError(said[0], kind="failed", hint=said[1], detail=stderr)
        if rc in (126, 127):
            return RemoteError(f"{h}: python interpreter {self.host.python!r} cannot run: {why}",
                               kind="bad_python", hint="fix 'python:' for this host in the inventory")
        if self._no_hello and self.host.container:  # the runtime's exec ended first
            from fleetctl.config.containers import ContainerSpec

            spec = ContainerSpec.of(self.host.container)
            assert spec is not None
            said = f"; its stderr ends: {why}" if tail else ", nothing on stderr"
            return RemoteError(f"{h}: the agent never started in {spec.label}: the runtime's exec ended (exit code "
                               f"{rc}) before its hello{said}", kind="failed", detail=stderr,
                               hint=f"is the container running and {self.host.python!r} a python inside it? "
                                    f"('{spec.shown(spec.inspect_argv())}' on the host says)")
        if self._no_hello:  # the command ended before the agent's bootstrap said a word
            said = f"; its stderr ends: {why}" if tail else ", nothing on stderr"
            return RemoteError(f"{h}: the agent never started: the remote command ended (exit code {rc}) "
                               f"before its hello{said}", kind="failed", detail=stderr,
                               hint=f"does a login script end the shell (an `exit` in ~/.bashrc), or is "
                                    f"{self.host.python!r} not a python that runs what it is given?")
        return RemoteError(f"{h}: '{action}' failed: {why}", kind="failed", detail=stderr)

    def _gate_read(self, script: str, end: bytes, why: str, cap: int) -> tuple[Pipe | None, bytes | None, bytes]:
        """Start `sh -c SCRIPT` + GATE (the agent's own command after it) and read its output through
        `end`: (the pipe, now waiting at the gate; the output; what came after it), or (None, None,
        b"") if the output did not end so within `cap` bytes or the process ended first."""
        rest = agent_argv(self.host)[1]
        full = remote_argv(self.host, sh_argv(command_line_env(self.host), script + GATE, rest))
        limit = self.host.command_timeout
        pipe = self._start_pipe(full, limit)
        deadline = self._begin(why, limit, f"{self.host.name}: {why}: no end within {limit:g}s")
        out = bytearray()
        with self._step_on(pipe, why):
            while True:
                i = out.find(end, max(0, len(out) - len(end) - CHUNK))
                if i >= 0:
                    return pipe, bytes(out[:i + len(end)]), bytes(out[i + len(end):])
                if len(out) > cap:
                    pipe.close()
                    return None, None, b""
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                data = pipe.recv(CHUNK, min(POLL, left))
                if data == b"":
                    pipe.close()
                    return None, None, b""
                if data:
                    out += data
                self._keep_stderr(pipe)

    def check_ahead(self, script: str, end: bytes, why: str, cap: int) -> None:
        """Run a check_then_agent check now, ahead of the command's first step (Fleet.prefetch, while
        the command loads its playbook), and keep its process waiting at the gate. The check_then_agent
        call with the same script then takes its output (or raises what it met, as it would have),
        and an agent() call before any such check takes the process as the agent ("go"). Nothing is
        decided here; a process nobody takes ends at close()."""
        with self._agent_lock:
            if self._agent_pipe is not None or self._ahead is not None:
                return
            try:
                pipe, output, after = self._gate_read(script, end, why, cap)
            except (RemoteError, Unreachable) as e:
                self._ahead = _Ahead(script, error=e)
                return
            self._ahead = _Ahead(script, pipe, output, after)

    def check_then_agent(self, script: str, end: bytes, why: str, cap: int,
                         need_agent: Callable[[bytes], bool]) -> bytes | None:
        """One exec for a check and, when needed, the agent after it: `sh -c SCRIPT` (the inventory's
        env applied as for the agent) writes its output up to `end`, then reads one line from stdin;
        on "go" it execs the agent's own command (agent_command), which then serves this session.
        need_agent(output) decides. Returns the output (through `end`), or None if it did not end
        so within `cap` bytes or the process ended first (no agent was started: the next agent()
        starts one the usual way). Saves a host whose check fails a second exec (its login shell).
        A check of the same script already run ahead (check_ahead) is taken instead of a new one."""
        with self._agent_lock:
            if self._agent_pipe is not None and not self._agent_pipe.ended():  # (already started)
                return None
            ahead, self._ahead = self._ahead, None
            self._agent_drop()
            if ahead is not None and ahead.script == script and not (ahead.pipe is not None and ahead.pipe.ended()):
                if ahead.error is not None:
                    raise ahead.error
                pipe, output, after = ahead.pipe, ahead.output, ahead.after
            else:
                if ahead is not None and ahead.pipe is not None:
                    ahead.pipe.close()
                pipe, output, after = self._gate_read(script, end, why, cap)
            if pipe is None or output is None:
                return None
            limit = self.host.command_timeout
            deadline = self._begin(why, limit, f"{self.host.name}: {why}: no end within {limit:g}s")
            with self._step_on(pipe, why):
                if not need_agent(output):
                    pipe.send(b"no\n", deadline)
                    pipe.close()
                    return output
                if not pipe.send(b"go\n", deadline):
                    pipe.close()
                    return output
            self._agent_pipe = self._agent_start(pipe, after)
            return output

    def run_command(self, argv: list[str], why: str, cap: int, timeout: float | None = None, *,
                    inside: bool = True, failed: list[tuple[int | None, bytes]] | None = None,
                    merge_stderr: bool = False) -> bytes | None:
        """Run `argv` on the host (not the agent; through the login shell over SSH) to its end and
        return its stdout, or None if that exceeds `cap` bytes (the process is then closed). Bounded by
        `timeout` (else command_timeout) like every step. inside: in the host's container when it
        names one (transport/layers.py); False: on the host itself (the runtime's own commands).
        failed: a list the command's (exit status, stderr tail) is appended to when it ends.
        merge_stderr: its stderr comes in the stdout too (a POSIX sh on the host, outside every layer,
        joins them: a container's log is both streams)."""
        limit = timeout if timeout is not None else self.host.command_timeout
        full = remote_argv(self.host, argv, inside=inside)
        if merge_stderr:
            full = ["sh", "-c", 'exec "$@" 2>&1', "sh", *full]
        pipe = self._start_pipe(full, limit)
        deadline = self._begin(why, limit, f"{self.host.name}: {why}: no end within {limit:g}s")
        out = bytearray()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteError(self.step_stalled, kind="timeout")
                data = pipe.recv(CHUNK, min(POLL, left))
                if data == b"":
                    if failed is not None:  # the caller wants to know why it printed what it did
                        failed.append((pipe.exit_status(min(5.0, max(0.1, deadline - time.monotonic()))),
                                       pipe.stderr()[-STDERR_TAIL:]))
                    return bytes(out)
                if data:
                    out += data
                    if len(out) > cap:
                        return None
        except PipeLost as e:
            raise self._lost(why, e) from None
        finally:
            self._end()
            pipe.close()

    def _agent_from(self, ahead: _Ahead | None) -> Pipe | None:
        """The agent, from a check run ahead whose process waits at its gate ("go"); None if there is
        none (or it is gone)."""
        if ahead is None or ahead.pipe is None:
            return None
        pipe = ahead.pipe
        limit = self.host.command_timeout
        deadline = self._begin("starting the agent", limit)
        try:
            sent = not pipe.ended() and pipe.send(b"go\n", deadline)
        except (TimeoutError, PipeLost):
            sent = False
        finally:
            self._end()
        if not sent:
            pipe.close()
            return None
        return self._agent_start(pipe, ahead.after)

    def agent(self, action: str, request: Mapping[str, Any] | None = None, *,
              timeout: float | None = None) -> Any:
        """Run one agent action with the host's python; return its result, checked and typed as
        fleetctl.protocol.ANSWERS[action] says, or raise RemoteError (InvalidAnswer if it does not fit)."""
        limit = timeout if timeout is not None else self.host.command_timeout
        h = self.host.name
        with self._agent_lock:
            answer, parts = self._agent_call(action, request, limit, h, send_parts=False)
        from fleetctl.protocol import parse_reply  # (not before the first answer: ~20 ms of imports)

        reply = parse_reply(h, action, answer)  # the one check of what the host sent (fleetctl/protocol)
        if reply.error is not None and reply.kind == "need_part" and parts:
            # the host had no verified copy of a part (new, or its cache changed): sent with the request
            with self._agent_lock:
                answer, parts = self._agent_call(action, request, limit, h, send_parts=True)
            reply = parse_reply(h, action, answer)
        if reply.error is not None:
            raise RemoteError(f"{h}: {reply.error}", kind=reply.kind, detail=reply.traceback)
        self._parts_in.update(parts)
        self.done.append(action)
        return reply.result

    def _agent_call(self, action: str, request: Mapping[str, Any] | None, limit: float, h: str, *,
                    send_parts: bool) -> tuple[bytes, list[str]]:
        """One request and its framed answer (under _agent_lock), with the on-demand parts of the
        agent it needs and the running agent has not loaded (`parts_for`): their code when
        `send_parts` or the hello did not say they are cached there, else their keys only."""
        pipe = self._agent_pipe
        if pipe is None or pipe.ended():  # none yet, or it ended between requests
            ahead, self._ahead = self._ahead, None
            self._agent_drop()
            pipe = self._agent_pipe = self._agent_from(ahead) or self._agent_start()
        parts = parts_for(action, request or {}, self._parts_in)
        # the code of each part the hello did not say is cached there (all of them after need_part:
        # a cached copy that did not hash to its key)
        send = set(parts) if send_parts else set(parts) - hello_parts(self._hello_got)
        body = encode_request(action, with_parts(request, parts, self._hello_got, send))
        frame = b"%010d" % len(body) + body
        del body  # (a deploy's request holds its files: one copy of them per host in flight, not two)
        deadline = self._begin(f"the '{action}' request", limit,
                               f"{h}: '{action}' timed out: no answer within {limit:g}s")
        try:
            sent = pipe.send(frame, deadline)
            answer = self._agent_answer(pipe, deadline, action) if sent else None
        except TimeoutError:
            self._agent_drop()
            raise RemoteError(self.step_stalled, kind="timeout",
                              hint="raise command_timeout in the inventory if the host is just slow") from None
        except RemoteError:
            self._agent_drop()
            raise
        except PipeLost as e:
            self._agent_drop()
            raise self._lost(f"while running {action}", e) from None
        finally:
            self._end()
        if answer is None:  # the agent ended without answering: its exit status and stderr say why
            raise self._agent_ended(pipe, action)
        return answer, parts
