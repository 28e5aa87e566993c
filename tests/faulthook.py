"""The one hook through which tests put fault points into the agent: the faults part
(fleetctl/remote/faults.py), sent with a request as an on-demand part (`_load`, compressed with zlib,
which every host's python reads), together with the request's `_fault` that it reads. fleetctl never
sends either: production code only calls the agent's `fault_point`, inert without this part.

- `faulted(request, fault)`: a request that carries the fault (a one-shot agent: tests run it as
  `python -c BOOTSTRAP` with the request on stdin);
- `faults_on({host: fault})`: within it, every deploy/rollback request of those hosts carries its
  fault (AgentTransport.agent, the one request path of every transport);
- `DRIVER`: a controller process (`python -c DRIVER FAULTS_JSON fleetctl-args...`) with faults_on.
- in process: `import fleetctl.remote.faults` installs the hook into the local core module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ACTIONS = ("deploy", "rollback")


def faults_load() -> dict[str, Any]:
    from fleetctl.remote import part_key, part_packed

    return {"key": part_key("faults"), "code": "", "blob": b"Z" + part_packed("faults", "Z")}


def faulted(request: Mapping[str, Any], fault: Any) -> dict[str, Any]:
    return {**request, "_fault": fault, "_load": [*(request.get("_load") or []), faults_load()]}


@contextmanager
def faults_on(faults: Mapping[str, Any], actions: tuple[str, ...] = ACTIONS) -> Iterator[None]:
    from fleetctl.transport.session import AgentTransport

    orig = AgentTransport.agent

    def agent(self: AgentTransport, action: str, request: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        f = faults.get(self.host.name)
        if f is not None and action in actions:
            request = faulted(request or {}, f)
        return orig(self, action, request, **kw)

    AgentTransport.agent = agent  # type: ignore[method-assign]
    try:
        yield
    finally:
        AgentTransport.agent = orig  # type: ignore[method-assign]


DRIVER = f"""\
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from faulthook import faults_on
from fleetctl.cli import main
with faults_on(json.loads(sys.argv[1])):
    code = main(sys.argv[2:])
sys.exit(code)
"""
