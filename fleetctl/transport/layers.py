"""The remote command as layers: what the host's login shell runs for an argv fleetctl built.

    ssh  ->  [become: sudo -n -u USER]  ->  [container exec: docker exec -i NAME]  ->  env K=V python ...

Each layer is a function argv -> argv that puts its own prefix in front of what it is given, so
layers compose in any combination and every word stays an argv word (the transport joins the
final list with shell quoting). The innermost layer is applied first. `inside=False` leaves out
the container layer: a command about the container itself (inspect, restart) runs on the host.
A layer keeps the agent's stdin/stdout a plain byte pipe: no tty, no prompt, nothing printed.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetctl.config.hosts import Host

Layer = Callable[[Host, list[str]], list[str]]


def container_layer(host: Host, argv: list[str]) -> list[str]:
    """Run `argv` inside the host's container (its runtime's exec, stdin attached, no tty)."""
    if not host.container:
        return argv
    from fleetctl.config.containers import ContainerSpec

    spec = ContainerSpec.of(host.container)
    assert spec is not None
    return [*spec.exec_prefix(), *argv]


def become_layer(host: Host, argv: list[str]) -> list[str]:
    """For a host whose SGLang is in a container: the runtime's client run through sudo (become), so a
    login user outside the docker group reaches the container. (Without a container, become wraps the
    interpreter itself, and only it: session.agent_argv; the user inside a container is the runtime's
    `container.user`.)"""
    if not (host.becomes and host.container):
        return argv
    from fleetctl.transport import become

    return become.wrap(host, argv)


# innermost first: what runs in the container, then what runs on the host around it
INSIDE: tuple[Layer, ...] = (container_layer,)
HOST: tuple[Layer, ...] = (become_layer,)


def remote_argv(host: Host, argv: list[str], *, inside: bool = True) -> list[str]:
    """`argv` wrapped by every layer the host needs, innermost first."""
    out = list(argv)
    for layer in (*INSIDE, *HOST) if inside else HOST:
        out = layer(host, out)
    return out
