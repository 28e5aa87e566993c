"""A server that is its container's main process (`container.main_process: true`).

Such a server is restarted by restarting the container through its runtime (`docker|podman restart
NAME`, on the host, through become when the host has it): a restart keeps the container's files,
so the patched ones, and starts the image's command again. Its log is the container's own output
(`docker|podman logs --timestamps --since START NAME`), read on the host, untrusted: bounded in
bytes and time, every line's runtime timestamp checked against this start of the container (a line
from an earlier start, or one without a readable time, does not count), non-printable characters
replaced, lines cut. A pod's container restarted by Kubernetes starts from its image again: a
restart is refused with that reason.
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetctl.config.containers import ContainerSpec
from fleetctl.containers.inspect import ContainerError, ContainerInfo

if TYPE_CHECKING:
    from fleetctl.transport.base import Transport

LOG_CAP = 16 << 20  # bytes of the container's output read per look
LINE_MAX = 4000  # characters kept of one line
POLL = 0.5  # seconds between two looks at the log while waiting for the ready line
# RFC 3339 as docker/podman print it (inspect's StartedAt, logs --timestamps): nanoseconds, Z or an offset
_STAMP_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def epoch(stamp: str | None) -> float | None:
    """An RFC 3339 time as the runtimes print it, as epoch seconds (None: not one)."""
    m = _STAMP_RE.match(stamp or "")
    if not m:
        return None
    try:
        t = float(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None
    if m.group(2):
        t += int(m.group(2)) / 10 ** len(m.group(2))
    z = m.group(3)
    if z != "Z":
        sign = 1 if z[0] == "+" else -1
        t -= sign * (int(z[1:3]) * 3600 + int(z[4:6]) * 60)
    return t


def spec_main(conn: Transport) -> ContainerSpec | None:
    """The host's container spec when its server is the container's main process (else None)."""
    spec = ContainerSpec.of(conn.host.container)
    return spec if spec is not None and spec.main_process else None


def refusal(spec: ContainerSpec) -> str | None:
    """Why fleetctl cannot restart this main process (None: it can)."""
    if spec.restart_argv() is None:
        return (f"the server is {spec.label}'s main process, and a restart of a pod's container starts it from "
                f"its image: the patch would not run; build it into the image ('fleetctl patch dockerfile')")
    return None


@dataclass
class ContainerLog:
    """The container's output since its current start, as fleetctl counts it."""

    info: ContainerInfo
    since: float | None  # this start (epoch seconds)
    lines: list[str] = field(default_factory=list)  # without the runtime's timestamp, printable
    older: int = 0  # lines stamped before this start (replayed, or an earlier start): not counted
    unstamped: int = 0  # lines without a readable runtime time: not counted
    over_cap: bool = False


def read_log(conn: Transport, spec: ContainerSpec, info: ContainerInfo, timeout: float | None = None) -> ContainerLog:
    """The container's output (stdout and stderr) since `info`'s start, as counted above."""
    since = epoch(info.started_at)
    out = ContainerLog(info, since)
    if since is None:  # no start time: nothing can be attributed to this start
        return out
    # (the start as the runtime printed it: RFC 3339, checked above, which docker and podman both take)
    argv = [*spec.command, "logs", "--timestamps", "--since", str(info.started_at), spec.name]
    got = conn.run_command(argv, f"reading {spec.label}'s log", LOG_CAP, timeout, inside=False, merge_stderr=True)
    if got is None:
        out.over_cap = True
        return out
    for raw in got.decode("utf-8", "replace").splitlines():
        stamp, _, text = raw.partition(" ")
        t = epoch(stamp)
        if t is None:
            out.unstamped += 1
            continue
        if t < since:
            out.older += 1
            continue
        text = "".join(c if c.isprintable() else "?" for c in text[:LINE_MAX])
        out.lines.append(text)
    return out


def restart(conn: Transport, spec: ContainerSpec, ready_line: str, timeout: float) -> tuple[ContainerLog, float]:
    """Restart the container and wait until its main process logs `ready_line` (since this start).
    Returns its log at that point and the seconds it took. ContainerError when the runtime refuses,
    the container is re-created or stops, or the line does not come within `timeout`."""
    from fleetctl.containers.host import inspect

    why = refusal(spec)
    if why is not None:
        raise ContainerError(f"{conn.host.name}: {why}")
    h = conn.host.name
    before = inspect(conn, need_running=False)
    assert before is not None
    argv = spec.restart_argv()
    assert argv is not None
    t0 = time.monotonic()
    ended: list[tuple[int | None, bytes]] = []
    conn.run_command(argv, f"restarting {spec.label}", 1 << 16, max(timeout, conn.host.command_timeout),
                     inside=False, failed=ended)
    rc, err = ended[0] if ended else (None, b"")
    if rc != 0:
        last = next((ln.strip() for ln in reversed(err.decode("utf-8", "replace").splitlines()) if ln.strip()), "")
        last = "".join(c if c.isprintable() else "?" for c in last[:300])
        raise ContainerError(f"{h}: '{spec.shown(argv)}' failed (exit code {rc})" + (f": {last}" if last else ""),
                             hint=f"run '{spec.shown(argv)}' on the host to see why")
    while True:
        now = inspect(conn, need_running=False)
        assert now is not None
        if now.id != before.id:
            raise ContainerError(f"{h}: {spec.label} is another container after the restart (id {before.short_id} "
                                 f"then, {now.short_id} now): it was re-created, the patch went with the old one")
        if not now.running:
            log = read_log(conn, spec, now)
            tail = " | ".join(log.lines[-3:])
            raise ContainerError(f"{h}: {spec.label}'s main process ended after the restart"
                                 + (f"; its last lines: {tail}" if tail else ""),
                                 hint=f"read '{spec.shown([*spec.command, 'logs', spec.name])}' on the host")
        log = read_log(conn, spec, now)
        if any(ready_line in ln for ln in log.lines):
            return log, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise ContainerError(f"{h}: {spec.label} restarted, but its main process logged no ready line within "
                                 f"{timeout:g}s", hint="read its log on the host; raise --ready-timeout if it loads "
                                 "a large model")
        time.sleep(POLL)
