"""Loopback ports for servers a test starts later (tests import it as `ports`, like agentpipe).

A port picked by binding port 0 comes from the kernel's ephemeral range (32768-60999 here), the
same range every outgoing connection takes its source port from: between the pick and the
server's bind, any of the suite's many SSH connections can take it, and the server then fails to
start (seen once as a launch "not ready" in 0.5 s). These come from the sandbox's own range
(fleetctl/sandbox/sshd.py PORT_RANGE, 20000-32000), which no outgoing connection uses."""

from __future__ import annotations

from fleetctl.sandbox.sshd import free_port as _free_port

_TAKEN: set[int] = set()


def free_port() -> int:
    """A loopback port nobody listens on now, not handed out before in this test process."""
    return _free_port(_TAKEN)


def free_ports(n: int) -> list[int]:
    return [free_port() for _ in range(n)]
