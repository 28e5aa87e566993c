"""Seals: a no-op deploy re-checked without starting Python on the host.

At the end of a deploy (changed or not), still under the host lock, the agent returns a seal
(fleetctl/remote/seal.py lists the paths: the launch interpreter's lookup, sys.path entries
and .pth files, modules loaded at start, the package, its dist-info, the planned files with their
dirs and bytecode, the model config, the host lock and the deploy manifests): those paths, the text
`stat` and `sha256sum` print for them, the facts, taken so that the facts describe exactly that
snapshot, and a digest of the agent's environment (its login environment plus the inventory's
public env: what `env -0` prints in the check). The controller keeps it here, per host.

The next deploy (or deploy --check) of the same host with the same facts request (playbook files,
launch, inventory settings, agent code: the seal's key) runs ONE plain command on the host: `env -0`,
`stat` and `sha256sum` of those paths (`check_argv`; a deploy starts it as soon as the host is
connected, while its playbook loads: `check_ahead`). If its output is byte for byte what the seal
recorded (the environment compared as a digest, without the variables that change per connection),
nothing the facts depended on changed, so the facts are the seal's (checked as any agent answer is)
and the plan is built from them. A host whose plan is then a no-op is done: its files were just
hashed. Anything else (any difference, a wrapper interpreter, a seal made by other code,
`deploy --recheck`) takes the full path: the agent.

Nothing here trusts a location without checking it: the check re-reads, on the host, every
directory whose entries decide the import, every file whose content decides it, and the bytes of
the planned files. What it cannot see is said in docs/reliability.md G13 (a .pth or sitecustomize
that reads files outside the paths listed; two writes to one file within one tick of the kernel
clock around the snapshot).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.config.hosts import Host
from fleetctl.transport.base import Transport

if TYPE_CHECKING:  # (fleetctl.protocol is imported by check(): check_ahead runs before it is needed)
    from fleetctl.protocol.answers import Seal

VERSION = 1
CHECK_CAP = 4 << 20  # bytes of check output (a seal names at most 4,000 paths)
RETRY_UNSEALABLE = 24 * 3600  # seconds: a host that could not be sealed is asked again after this
# per connection, not per host: left out of the environment digest
EPHEMERAL = frozenset({"_", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SHLVL", "OLDPWD", "PWD"})
STAT_FORMAT = "%n\\t%d %i %s %f %.9Z %.9Y\\n"
MARK = "FLEETCTL-SEAL-"


@dataclass
class Checked:
    """What the check of one host found."""

    key: str = ""
    request: dict[str, Any] | None = None  # the facts request the seal is for
    make: bool = False  # this command's deploy asks the agent for a new seal
    facts: Any = None  # the seal's facts answer when everything matched
    seal: dict[str, Any] | None = None  # the stored seal that matched
    why: str = ""  # why the full path was taken


def store_dir() -> Path:
    from fleetctl.config.paths import state_dir

    return state_dir() / "seals"


def _host_file(host: Host) -> Path:
    ident = json.dumps([host.name, host.address, host.port, host.user, host.python, host.state_dir])
    return store_dir() / (hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json")


@functools.cache
def _code_id() -> str:
    from fleetctl import __version__
    from fleetctl.remote import agent_source

    return f"{__version__} {hashlib.sha256(agent_source()).hexdigest()}"


def seal_key(host: Host, request: dict[str, Any]) -> str:
    """What a seal is valid for: the host's identity, the facts request (playbook files, launch,
    env, model), the agent code and this fleetctl."""
    doc = {"v": VERSION, "code": _code_id(),
           "host": [host.name, host.address, host.port, host.user, host.python, host.state_dir,
                    sorted(host.env.items()), host.container],
           "request": request}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def load(host: Host, key: str) -> dict[str, Any] | None:
    """The stored seal (or unsealable marker) of `host` for `key`; None if there is none or it is
    for another key, another version or unreadable."""
    try:
        doc = json.loads(_host_file(host).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("v") != VERSION or doc.get("key") != key:
        return None
    return doc


def _write(host: Host, doc: dict[str, Any]) -> None:
    d = store_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    f = _host_file(host)
    tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(doc))  # (json.dump encodes in Python, chunk by chunk: ~10x slower)
    os.replace(tmp, f)


def save(host: Host, key: str, seal: Seal, op_id: str) -> None:
    _write(host, {"v": VERSION, "key": key, "env": seal.env, "paths": seal.paths, "files": seal.files,
                  "stat": seal.stat, "sha": seal.sha, "facts": seal.facts, "op_id": op_id, "at": time.time()})


def save_unsealable(host: Host, key: str, why: str) -> None:
    _write(host, {"v": VERSION, "key": key, "why": why, "at": time.time()})


def forget(host: Host) -> None:
    try:
        _host_file(host).unlink()
    except OSError:
        pass


def check_argv(host: Host, paths: list[str], files: list[str], stat: str | None = None) -> list[str]:
    """The one command of a check: the login environment as the agent would get it (the inventory's
    public env on top), then `stat` of every path and `sha256sum` of every file; each part after a
    NUL-framed marker. Every path is quoted."""
    from fleetctl.transport.session import command_line_env, sh_argv

    return sh_argv(command_line_env(host), check_script(paths, files, stat))


END = f"\x00{MARK}END\x00".encode()
# the longest sealed stat text the check carries to compare on the host (a command line is one
# argument of the login shell: Linux takes at most 128 KiB for it)
STAT_INLINE_MAX = 48 << 10


def check_script(paths: list[str], files: list[str], stat: str | None = None) -> str:
    """The check as one `sh -c` script (its output ends with END). `stat`: the seal's stat text;
    when the host's differs, the script prints no hashes (the check has failed already: a host that
    changed pays no `sha256sum`, a process that loads OpenSSL); the controller still compares all of
    the output. Without it (or past STAT_INLINE_MAX) the files are always hashed."""
    q = " ".join(shlex.quote(p) for p in paths)
    h = " ".join(shlex.quote(f) for f in files)
    gate = isinstance(stat, str) and len(stat) <= STAT_INLINE_MAX and bool(paths) and bool(files)
    if gate:
        # `; echo x` and ${s%x}: a command substitution drops trailing newlines, the text must not
        stats = (f"s=$(stat --printf={shlex.quote(STAT_FORMAT)} -- {q} 2>/dev/null; echo x); s=${{s%x}}; "
                 "printf '%s' \"$s\"; ")
    else:
        stats = f"stat --printf={shlex.quote(STAT_FORMAT)} -- {q} 2>/dev/null; " if paths else ""
    sums = f"sha256sum -- {h} 2>/dev/null; " if files else ""
    if gate:
        sums = f"if [ \"$s\" = {shlex.quote(stat or '')} ]; then {sums}fi; "
    return (f"printf '\\000{MARK}BEGIN\\000'; env -0; printf '\\000{MARK}STAT\\000'; " + stats
            + f"printf '\\000{MARK}SHA\\000'; " + sums
            + f"printf '\\000{MARK}END\\000'")


def drop_names(host: Host) -> frozenset[str]:
    """Variables left out of the environment digest: per connection (EPHEMERAL), the locale Python
    coerces in its own environment (LC_CTYPE, PEP 538), and the inventory's secret env (the agent
    gets it over stdin, the check never does; its values are in the seal's key, hashed)."""
    return EPHEMERAL | {"LC_CTYPE"} | frozenset(host.secret_env_keys)


def env_digest(entries: list[bytes], drop: frozenset[str]) -> str:
    """sha256 of the sorted NAME=value entries whose NAME is not in `drop` (what the agent computes
    over its own environment: remote/seal.py)."""
    keep = sorted(e for e in entries if e and e.split(b"=", 1)[0].decode("latin-1") not in drop)
    return hashlib.sha256(b"\x00".join(keep)).hexdigest()


BEGIN = f"\x00{MARK}BEGIN\x00".encode()


def parse_check(out: bytes, drop: frozenset[str]) -> tuple[str, str, str] | None:
    """(env digest, stat text, sha text) of a check's output; None if it is not one. What a login
    script printed before the check ran (up to LOGIN_NOISE_MAX bytes before its BEGIN mark) is not
    the check's."""
    from fleetctl.transport.session import LOGIN_NOISE_MAX

    i = out.find(BEGIN)
    if i < 0 or i > LOGIN_NOISE_MAX:
        return None
    parts = out[i + len(BEGIN):].split(b"\x00" + MARK.encode())
    if len(parts) != 4 or not parts[1].startswith(b"STAT\x00") or not parts[2].startswith(b"SHA\x00") \
            or parts[3] != b"END\x00":
        return None
    digest = env_digest(parts[0].split(b"\x00"), drop)
    try:
        return digest, parts[1][5:].decode("utf-8"), parts[2][4:].decode("utf-8")
    except UnicodeDecodeError:
        return None


CHECK_WHY = "the seal check (stat, sha256sum)"


def check_ahead(conn: Transport) -> None:
    """Run in the prefetch (runner.py Fleet.prefetch), while the command still loads its playbook:
    the check of the host's stored seal, whatever its key (the key needs the playbook), its process
    kept waiting at the gate (AgentTransport.check_ahead). check() takes its output when that seal is
    this command's (the same script); otherwise the host's first agent request takes the process as
    its agent. It decides nothing: the output is judged by check() as if it had just been read."""
    host = conn.host
    ahead = getattr(conn, "check_ahead", None)
    if ahead is None or host.probe or host.becomes:
        return
    try:
        doc = json.loads(_host_file(host).read_text())
    except (OSError, ValueError):
        return
    if not isinstance(doc, dict) or doc.get("v") != VERSION or "why" in doc:
        return
    paths, files = doc.get("paths", []), doc.get("files", [])
    if not (isinstance(paths, list) and isinstance(files, list)
            and all(isinstance(p, str) for p in paths + files)):
        return
    ahead(check_script(paths, files, doc.get("stat")), END, CHECK_WHY, CHECK_CAP)


def check(conn: Transport, key: str, request: dict[str, Any], *, use: bool = True) -> Checked:
    """Check `conn`'s host against its stored seal for `key` (one command on the host, run only
    when there is a seal). use=False (deploy --recheck): never take the seal's facts. The result
    says whether this command's deploy should make a seal (`make`)."""
    host = conn.host
    if host.becomes:  # the check would run as the login user, the agent as another: never sealed
        return Checked(key=key, request=request, make=False,
                       why="not sealable: the agent runs as another user (become)")
    stored = load(host, key)
    ck = Checked(key=key, request=request, make=True)
    if stored is not None and "why" in stored:
        if time.time() - float(stored.get("at") or 0) < RETRY_UNSEALABLE:
            ck.make, ck.why = False, f"not sealable: {stored['why']}"
            return ck
        stored = None
    if stored is None or not use:
        ck.why = "no seal" if stored is None else "--recheck"
        return ck
    paths, files = stored.get("paths", []), stored.get("files", [])
    why = CHECK_WHY

    judged: dict[bytes | None, bool] = {}

    def differs(out: bytes | None) -> bool:
        """Whether the check's output is not the seal's (why: ck.why); each output judged once."""
        if out in judged:
            return judged[out]
        judged[out] = True
        got = parse_check(out, drop_names(host)) if out is not None else None
        if got is None:
            ck.why = "the check's output is not a check's (stat/sha256sum missing or different?)"
        elif got[0] != stored.get("env"):
            ck.why = "the login environment changed"
        elif got[1] != stored.get("stat") or got[2] != stored.get("sha"):
            ck.why = _first_difference(stored.get("stat") or "", got[1]) or "a planned file's bytes changed"
        else:
            judged[out] = False
        return judged[out]

    gated = getattr(conn, "check_then_agent", None)
    if gated is not None:
        # one exec: where the check fails, the same process goes on to start the agent (which the
        # caller then asks for the facts), instead of a second login shell
        out = gated(check_script(paths, files, stored.get("stat")), END, why, CHECK_CAP, differs)
    else:
        out = conn.run_command(check_argv(host, paths, files, stored.get("stat")), why, CHECK_CAP)
    if differs(out):
        return ck
    from fleetctl.protocol import names, parse_result

    ck.facts = parse_result(host.name, names.FACTS, stored.get("facts"))  # checked as any facts answer
    ck.seal = stored
    return ck


def _first_difference(was: str, now: str) -> str:
    a = {ln.split("\t", 1)[0]: ln for ln in was.splitlines()}
    b = {ln.split("\t", 1)[0]: ln for ln in now.splitlines()}
    for p in sorted(a.keys() | b.keys()):
        if a.get(p) != b.get(p):
            what = "appeared" if p not in a else "is gone" if p not in b else "changed"
            return f"{p} {what} since the seal"
    return ""
