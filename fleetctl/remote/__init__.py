"""Code that runs ON the hosts, with the host's own Python (stdlib only, Python >= 3.8).

The agent is split by concern into parts that share ONE namespace on the host, concatenated in the
order of CORE: core (serve loop, framing, bounded run), files (the one atomic write), locate (launch
locating), hostfacts (the facts action), lock, records (manifests, state files, shared trees),
transaction (deploy, rollback), seal. Each part names what it takes from the others in an
`if __name__ != "fleetctl_agent":` import block (no `_private` name crosses files: tests check it),
which makes it an ordinary module locally (tests, an in-process host) and is dropped from what is
shipped. The bootstrap that starts it is bootstrap.py's function, turned into the `-c` string.

Shipped small: the source stripped of docstrings, comments and those import blocks (`stripped`,
with the stdlib's ast), the launch probe's after a NUL byte, compressed (lzma, zlib where the host's
python lacks lzma), and executed by the interpreter the inventory names. The host keeps it in its
state dir keyed by the hash of what was sent (`agent_key`), or, where its python compiles it to
exactly the controller's code (same bytecode magic; marshal format 2 has no refcount-dependent
back-references, so the bytes are reproducible), that compiled form keyed by its hash
(transport/session.py compiled_agent); either is verified by its hash before use, so a cache
someone changed is never run: the code is sent again. One agent process per host answers every
call of a command (session mode: framed marshal requests, JSON answers, see core.py).
Nothing is installed on hosts. The on-demand parts (ON_DEMAND: serverfacts.py, the facts of a host's
servers; servers.py, engine_probe.py, gpucheck.py, what starts, waits for and stops them) come with
the first request that needs them (core.py load_part), cached and verified the same way. Each part registers its actions in ACTIONS. faults.py is a test harness's part, never
shipped by fleetctl.
"""

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def cache(fn: F) -> F:
    """functools.cache, computed once: the first caller computes, callers at the same moment wait
    for it. (functools.cache alone lets every thread that misses compute: a 64-host deploy's first
    facts made 64 threads parse, compile and compress the same parts at once, ~3 s of CPU and
    ~1 GB; tests/test_agent_build_once.py)"""
    cached = functools.cache(fn)
    lock = threading.RLock()

    @functools.wraps(fn)
    def once(*args: Any) -> Any:
        with lock:
            return cached(*args)

    once.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return once  # type: ignore[return-value]

# the parts are read from this package's own directory (importlib.resources would add ~20 ms of
# imports to every command; fleetctl is never run from a zip)
_HERE = Path(__file__).parent

# what the first contact ships, in this order (a part's module-level code uses only earlier parts)...
CORE = ("core.py", "atomic.py", "files.py", "locate.py", "hostfacts.py", "lock.py", "records.py", "transaction.py", "seal.py")
# ... and what a request brings along the first time this agent process needs it (transport/session.py):
# its actions and facts hooks are read from its source (actions_of). Nothing in the core names these.
# serverfacts (the read-only `servers` and `discover` facts hooks) is apart because a deploy that
# changes a host asks for them (its restart reminder): ~4 KB and ~5 ms of the host's compile where the
# whole servers part is ~14 KB and ~15-20 ms
ON_DEMAND = {"serverfacts": ("serverfacts.py",), "servers": ("servers.py", "engine_probe.py", "gpucheck.py")}
# the parts a part's code calls into (loaded before it: earlier in ON_DEMAND)
PART_NEEDS = {"servers": ("serverfacts",)}
# parts only a test harness sends (tests/faulthook.py): never in ON_DEMAND, so fleetctl never loads them
TEST_PARTS = {"faults": ("faults.py",)}
PARTS = (*CORE, *(n for names in ON_DEMAND.values() for n in names))
PROBE = "probe.py"  # run by the agent as `-c` under the launch's interpreter: shipped as a string
# one parse at a time: ast.parse from several host threads at once fails in CPython 3.11/3.12
# ("SystemError: AST constructor recursion depth mismatch"), seen in a 4-host deploy
_AST_LOCK = threading.Lock()


def _parse(text: str) -> Any:
    import ast

    with _AST_LOCK:
        return ast.parse(text)


STRIP_VERSION = 2  # what _strip drops (2: docstrings, comments, local-only blocks): part of the kept text's key


def stripped(text: str) -> str:
    """`text` (Python 3.8 grammar) without docstrings, comments and local-only blocks (`if __name__
    != "fleetctl_agent":`, which the host never runs): parsed and written back by the stdlib's ast
    (what runs is the same tree; line numbers in tracebacks are the stripped text's).
    Kept in the controller's cache dir by the hash of `text` and this interpreter's version (~0.1 s
    of CPU a command otherwise: every command that starts an agent needs the shipped source's hash)."""
    import hashlib
    import sys

    key = hashlib.sha256(f"{sys.version}\0{STRIP_VERSION}\0{text}".encode()).hexdigest()[:32]
    kept = _kept_stripped(key)
    if kept is not None:
        return kept
    out = _strip(text)
    _keep_stripped(key, out)
    return out


# where the controller keeps stripped texts, handed in by the agent's user (transport/session.py:
# the cache dir's agent/), so that remote/ imports nothing of fleetctl; none handed in: stripped each time
_keep_dir: list[Callable[[], Path]] = []


def keep_stripped_in(where: Callable[[], Path]) -> None:
    """Keep stripped texts in the directory `where()` names (asked on each use: it may change)."""
    _keep_dir[:] = [where]


def _kept_file(key: str) -> Path | None:
    return _keep_dir[0]() / f"stripped-{key}.py" if _keep_dir else None


def _kept_stripped(key: str) -> str | None:
    """A stripped text kept before, only from a regular 0600 file of ours in a 0700-ish dir of ours
    (the trust the compiled agent's cache asks, transport/session.py _read_compiled), whose last line
    names the key it was kept under; else None."""
    import os
    import stat

    f = _kept_file(key)
    if f is None:
        return None
    try:
        d = os.stat(f.parent)
        if not stat.S_ISDIR(d.st_mode) or d.st_uid != os.getuid() or d.st_mode & 0o022:
            return None
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    body, _, last = data.rpartition("# fleetctl-stripped ")
    return body if last == key + "\n" else None


def _keep_stripped(key: str, text: str) -> None:
    f = _kept_file(key)
    if f is not None:
        keep_file(f, f"{text}# fleetctl-stripped {key}\n".encode())


def keep_file(f: Path, data: bytes) -> None:
    """Write one of the controller's own cache files (0600, in a 0700 dir, renamed into place);
    best effort: without it the thing is built again next time."""
    import os
    import threading

    try:
        f.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = f.with_name(f"{f.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, f)
    except OSError:
        tmp.unlink(missing_ok=True)


def _local_only(node: Any) -> bool:
    """`if __name__ != "fleetctl_agent":`, a part's local import block (never true on the host)."""
    import ast

    t = node.test if isinstance(node, ast.If) else None
    return isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__" \
        and isinstance(t.ops[0], ast.NotEq) and isinstance(t.comparators[0], ast.Constant) \
        and t.comparators[0].value == "fleetctl_agent" and not node.orelse


def _strip(text: str) -> str:
    import ast

    tree = _parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and any(_local_only(s) for s in body):
            node.body = [s for s in body if not _local_only(s)] or [ast.Pass()]  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    with _AST_LOCK:
        return ast.unparse(tree) + "\n"


@cache
def agent_text() -> bytes:
    """The agent's core, stripped and concatenated: the code the host compiles first."""
    return _text(CORE)


def _text(names: tuple[str, ...]) -> bytes:
    return b"\n".join(stripped((_HERE / name).read_text(encoding="utf-8")).encode("utf-8")
                      for name in names if (_HERE / name).is_file())


@cache
def part_text(part: str) -> bytes:
    """An on-demand part (ON_DEMAND, or a test harness's: TEST_PARTS), stripped: what the host
    compiles into the agent's namespace."""
    return _text(ON_DEMAND[part] if part in ON_DEMAND else TEST_PARTS[part])


def compile_locked(text: bytes | str, name: str) -> Any:
    """compile() under the same lock (it parses too)."""
    with _AST_LOCK:
        return compile(text, name, "exec", dont_inherit=True, optimize=0)


@cache
def part_key(part: str) -> str:
    import hashlib

    return hashlib.sha256(part_text(part)).hexdigest()[:32]


@cache
def part_packed(part: str, kind: str) -> bytes:
    """part_text compressed: 'L' lzma, 'Z' zlib."""
    return _pack(part_text(part), kind)


@cache
def actions_of(part: str) -> frozenset[str]:
    """The agent actions and facts hooks (a facts request's "with") a part registers: the keys of
    its `ACTIONS.update({...})` and `EXTRA_FACTS[...] =`, read from its source."""
    import ast

    names: set[str] = set()
    for name in ON_DEMAND[part]:
        for node in ast.walk(_parse((_HERE / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ACTIONS":
                names.update(k.value for k in node.args[0].keys if isinstance(k, ast.Constant))  # type: ignore[attr-defined]
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "EXTRA_FACTS" \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.ctx, ast.Store):
                names.add(node.slice.value)
    return frozenset(names)


@cache
def agent_source() -> bytes:
    """What is shipped (before compression): the agent's code, NUL, the launch probe's code (NUL
    never occurs in Python source: the bootstrap splits there)."""
    return agent_text() + b"\0" + probe_source().encode("utf-8")


@cache
def probe_source() -> str:
    return stripped((_HERE / PROBE).read_text(encoding="utf-8"))


@cache
def packed(kind: str) -> bytes:
    """agent_source() compressed as the host asked: 'L' lzma (an xz stream), 'Z' zlib."""
    return _pack(agent_source(), kind)


def _pack(data: bytes, kind: str) -> bytes:
    if kind == "L":
        import lzma

        # (pb=0: text has no 4-byte alignment; ~110 bytes fewer; the filter is in the xz header)
        return lzma.compress(data, filters=[{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME,
                                                       "pb": 0}])
    import zlib

    return zlib.compress(data, 9)


@cache
def agent_key() -> str:
    """The shipped agent's cache key on hosts (BOOTSTRAP): sha256 of agent_source(), 32 hex digits."""
    import hashlib

    return hashlib.sha256(agent_source()).hexdigest()[:32]
