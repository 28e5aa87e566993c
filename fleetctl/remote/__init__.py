"""Code that runs ON the hosts, with the host's own Python (stdlib only, Python >= 3.8).

The agent is sent over the SSH channel's stdin (its source, or the controller's compiled code where
the host's python has the same bytecode magic) and executed by the interpreter the inventory names;
the code is cached in the host's state dir, keyed by the source's hash, and then not sent again (the
bootstrap's hello says so: transport/session.py). One agent process per host answers
every call of a command (session mode: framed marshal requests, JSON answers, see agent.py).
Nothing is installed on hosts. It is the concatenation of `agent.py` (core, protocol, facts)
and the `agent_*.py` parts, each of which registers its actions in ACTIONS. Locally every part
imports as a normal module for tests.
"""

from functools import cache
from pathlib import Path

# the parts are read from this package's own directory (importlib.resources would add ~20 ms of
# imports to every command; fleetctl is never run from a zip)
_HERE = Path(__file__).parent

PARTS = ("agent.py", "agent_deploy.py", "agent_servers.py", "agent_probe.py", "agent_seal.py")
PROBE = "probe.py"  # run by the agent as `-c` under the launch's interpreter: shipped as a string


@cache
def agent_source() -> bytes:
    chunks = []
    for name in PARTS:
        f = _HERE / name
        if f.is_file():
            chunks.append(f.read_bytes())
    chunks.append(f"PROBE_SOURCE = {probe_source()!r}\n".encode())
    return b"\n\n".join(chunks)


@cache
def probe_source() -> str:
    return (_HERE / PROBE).read_text(encoding="utf-8")


@cache
def agent_key() -> str:
    """The compiled agent's cache key on hosts (BOOTSTRAP): sha256 of the source, 32 hex digits."""
    import hashlib

    return hashlib.sha256(agent_source()).hexdigest()[:32]
