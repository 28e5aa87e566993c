"""A host's container as the inventory names it, and the runtime commands fleetctl runs for it.

Every command is an argv list (joined with shell quoting by the transport): no inventory string
reaches a shell raw. The runtime's client is `command` (default: the runtime's own name), run on
the host by the login user (or through become, a layer outside this one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

RUNTIMES = ("docker", "podman", "kubectl")
# a container or pod name as docker, podman and Kubernetes accept them (and no option: no leading '-')
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63})?$")


@dataclass(frozen=True)
class ContainerSpec:
    runtime: str  # docker | podman | kubectl
    name: str  # the container (docker, podman) or the pod (kubectl)
    command: tuple[str, ...]  # the runtime's client on the host, as an argv prefix
    container: str | None = None  # kubectl: the pod's container (-c)
    namespace: str | None = None  # kubectl: -n
    context: str | None = None  # kubectl: --context
    user: str | None = None  # docker/podman: exec -u
    main_process: bool = False  # the SGLang server is the container's main process

    @classmethod
    def of(cls, d: dict[str, Any] | None) -> ContainerSpec | None:
        """The spec a resolved Host holds as a plain dict (config/hosts.py), or None."""
        if not d:
            return None
        return cls(runtime=d["runtime"], name=d["name"], command=tuple(d.get("command") or (d["runtime"],)),
                   container=d.get("container"), namespace=d.get("namespace"), context=d.get("context"),
                   user=d.get("user"), main_process=bool(d.get("main_process")))

    @property
    def label(self) -> str:
        """How messages name it: `docker container sglang`, `kubectl pod llm/sglang-0 (server)`."""
        if self.runtime == "kubectl":
            ns = f"{self.namespace}/" if self.namespace else ""
            return f"kubectl pod {ns}{self.name}" + (f" (container {self.container})" if self.container else "")
        return f"{self.runtime} container {self.name}"

    def _kube(self) -> list[str]:
        out = list(self.command)
        if self.context:
            out += ["--context", self.context]
        if self.namespace:
            out += ["-n", self.namespace]
        return out

    def exec_prefix(self) -> list[str]:
        """The argv that runs what follows it inside the container, stdin attached, no tty."""
        if self.runtime == "kubectl":
            return [*self._kube(), "exec", "-i", self.name, *(["-c", self.container] if self.container else []),
                    "--"]
        return [*self.command, "exec", "-i", *(["-u", self.user] if self.user else []), self.name]

    def inspect_argv(self) -> list[str]:
        """The argv that prints what the runtime knows of the container, as JSON (inspect.py reads it)."""
        if self.runtime == "kubectl":
            return [*self._kube(), "get", "pod", self.name, "-o", "json"]
        return [*self.command, "inspect", "--type", "container", self.name]

    def restart_argv(self) -> list[str] | None:
        """The argv that restarts the container's main process keeping its files (None: the runtime
        has none: a pod's container restarted by Kubernetes starts from its image again)."""
        if self.runtime == "kubectl":
            return None
        return [*self.command, "restart", self.name]

    def shown(self, argv: list[str]) -> str:
        import shlex

        return shlex.join(argv)
