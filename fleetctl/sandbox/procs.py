"""Process bookkeeping for the sandbox, read from /proc: parents, liveness, ownership, stopping.

Every process the sandbox stops is named by pid and confirmed to belong to the sandbox first
(its sshd config path on the command line, a descendant of one of its sshd listeners, or the
`FLEETCTL_SANDBOX_DIR=<dir>` marker in its environment). Nothing is ever matched by name alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MARKER_VAR = "FLEETCTL_SANDBOX_DIR"

# sshd listeners this Python process started: polled so that they never linger as zombies
_children: dict[int, subprocess.Popen[bytes]] = {}


def track(proc: subprocess.Popen[bytes]) -> None:
    _children[proc.pid] = proc


def reap() -> None:
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            del _children[pid]


@dataclass(frozen=True)
class ProcStat:
    ppid: int
    state: str
    pgrp: int
    start_ticks: int


def stat(pid: int) -> ProcStat | None:
    """Fields of /proc/<pid>/stat, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return ProcStat(ppid=int(rest[1]), state=rest[0].decode(), pgrp=int(rest[2]), start_ticks=int(rest[19]))
    except (IndexError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    """True if `pid` runs (a zombie or a dead process is not alive)."""
    if not pid or pid <= 0:
        return False
    if pid in _children:
        reap()
    st = stat(pid)
    return st is not None and st.state not in ("Z", "X", "x")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def has_marker(pid: int, sandbox_dir: Path) -> bool:
    return f"{MARKER_VAR}={sandbox_dir}".encode() in environ(pid)


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def parent_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for pid in all_pids():
        st = stat(pid)
        if st is not None:
            out[pid] = st.ppid
    return out


def group_members(pgid: int) -> set[int]:
    """Live processes in process group `pgid`."""
    out = set()
    for pid in all_pids():
        st = stat(pid)
        if st is not None and st.pgrp == pgid and st.state not in ("Z", "X", "x"):
            out.add(pid)
    return out


def descendants(roots: Iterable[int], parents: dict[int, int] | None = None) -> set[int]:
    """All processes below `roots` (the roots excluded)."""
    parents = parent_map() if parents is None else parents
    kids: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        kids.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in found:
                found.add(k)
                todo.append(k)
    return found


def own_lineage() -> set[int]:
    """This process and its ancestors: never to be signalled."""
    parents = parent_map()
    out: set[int] = set()
    pid = os.getpid()
    while pid and pid not in out:
        out.add(pid)
        pid = parents.get(pid, 0)
    return out


def marked(sandbox_dir: Path) -> set[int]:
    """Processes whose environment carries this sandbox's marker."""
    return {pid for pid in all_pids() if has_marker(pid, sandbox_dir)} - own_lineage()


@dataclass
class Stopped:
    pid: int
    what: str
    signal: str  # TERM, KILL, or "" if it was already gone
    gone: bool


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _wait_gone(pids: set[int], deadline: float) -> set[int]:
    left = set(pids)
    while left and time.monotonic() < deadline:
        left = {p for p in left if alive(p)}
        if left:
            time.sleep(0.02)
    return {p for p in left if alive(p)}


def stop(targets: dict[int, str], timeout: float = 5.0, kill_timeout: float = 3.0) -> list[Stopped]:
    """SIGTERM every pid in `targets` (pid -> description), SIGKILL what outlives `timeout`, verify.

    `targets` must only hold pids already confirmed to belong to the sandbox.
    """
    safe = {p: w for p, w in targets.items() if p not in own_lineage()}
    sent: dict[int, str] = {}
    for pid in sorted(safe):
        if alive(pid) and _signal(pid, signal.SIGTERM):
            sent[pid] = "TERM"
    left = _wait_gone(set(sent), time.monotonic() + timeout)
    for pid in left:
        if _signal(pid, signal.SIGKILL):
            sent[pid] = "KILL"
    left = _wait_gone(left, time.monotonic() + kill_timeout)
    reap()
    return [Stopped(pid=p, what=safe[p], signal=sent.get(p, ""), gone=p not in left) for p in sorted(safe)]
