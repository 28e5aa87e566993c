"""The container of a connected host, as its runtime describes it (one command on the host)."""

from __future__ import annotations

from fleetctl.config.containers import ContainerSpec
from fleetctl.containers.inspect import INSPECT_CAP, ContainerError, ContainerInfo, parse
from fleetctl.transport.base import Transport

STDERR_SHOWN = 300  # characters of the runtime's last stderr line put in the one-line error


def spec_of(conn: Transport) -> ContainerSpec | None:
    return ContainerSpec.of(conn.host.container)


def inspect(conn: Transport, *, need_running: bool = True) -> ContainerInfo | None:
    """What the runtime says of the host's container (None: the host names none). ContainerError when
    the runtime cannot say (no such container, the client missing, refused) or, with need_running,
    when the container is not running (nothing can run inside it)."""
    spec = spec_of(conn)
    if spec is None:
        return None
    h = conn.host.name
    argv = spec.inspect_argv()
    ended: list[tuple[int | None, bytes]] = []
    out = conn.run_command(argv, f"inspecting {spec.label}", INSPECT_CAP, inside=False, failed=ended)
    if out is None:
        raise ContainerError(f"{h}: {spec.label}: the runtime's answer is over {INSPECT_CAP >> 20} MiB")
    if out.strip() in (b"", b"[]"):  # (docker and podman print [] for no such container)
        rc, err = ended[0] if ended else (None, b"")
        said = err.decode("utf-8", "replace")
        if conn.host.becomes:  # sudo's own refusal, said as become says it
            from fleetctl.transport import become

            why = become.diagnose(conn.host, said, rc)
            if why is not None:
                raise ContainerError(why[0], hint=why[1])
        last = next((ln.strip() for ln in reversed(said.splitlines()) if ln.strip()), "")
        last = "".join(c if c.isprintable() else "?" for c in last[:STDERR_SHOWN])
        raise ContainerError(f"{h}: {spec.label}: the runtime answered nothing (exit code {rc})"
                             + (f": {last}" if last else " (no such container, or the client cannot run there)"),
                             hint=f"run '{spec.shown(argv)}' on the host; fix 'container:' in the inventory")
    info = parse(h, spec, out)
    if need_running and not info.running:
        raise ContainerError(f"{h}: {spec.label} is not running (id {info.short_id}, image {info.image})",
                             hint=f"start it ('{spec.shown([*spec.command, 'start', spec.name])}' on the host)"
                             if spec.runtime != "kubectl" else "wait until the pod's container runs")
    return info
