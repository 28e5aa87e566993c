"""The ssh_config, parsed once per command with paramiko (invoke kept out), for both of its users:
the inventory (host names may be its Host aliases) and the transport (transport/direct.py resolves
each host from it as fabric's Connection would).

paramiko is imported here, on the config floor, so that the transport takes the parse from config
and config never reaches up into the transport. Every fleetctl module imports paramiko from here
(through transport/internals.py on the transport floor)."""

from __future__ import annotations

import copy
import os
import re
import sys
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType


def _import_paramiko() -> ModuleType:
    """`import paramiko` with invoke kept out. paramiko.config imports invoke whenever it is
    installed (fabric needs it, so it is), only to run an ssh_config `Match exec` command; invoke in
    turn imports unittest.mock, asyncio and ssl: ~70 ms of CPU on every command. With invoke set to
    None in sys.modules for the duration, paramiko records the ImportError and raises it only if a
    `Match exec` is looked up; `with_invoke()` puts invoke back when a host goes through fabric
    (which imports invoke anyway), and transport/direct.py sends every ssh_config with a
    `Match exec` that way."""
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        import paramiko as mod

        return mod
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` raises ImportError
    try:
        import paramiko as mod
    finally:
        if "invoke" in sys.modules and sys.modules["invoke"] is None:
            del sys.modules["invoke"]
    return mod


paramiko = _import_paramiko()
PARAMIKO_CONFIG_INVOKE = ("invoke", "invoke_import_error")  # paramiko.config's module globals


def with_invoke() -> None:
    """Give paramiko.config the invoke it was kept from (an ssh_config `Match exec` needs it)."""
    import invoke
    import paramiko.config as pc

    if getattr(pc, PARAMIKO_CONFIG_INVOKE[0], None) is None:
        setattr(pc, PARAMIKO_CONFIG_INVOKE[0], invoke)
        setattr(pc, PARAMIKO_CONFIG_INVOKE[1], None)


# what fabric's Config() reads when no ssh_config is given, in its order
USER_SSH_CONFIG = "~/.ssh/config"
SYSTEM_SSH_CONFIG = "/etc/ssh/ssh_config"
_MATCH_EXEC = re.compile(r"^\s*match\b[^\n#]*\bexec\b", re.IGNORECASE | re.MULTILINE)

_parsed: dict[str, tuple[paramiko.SSHConfig, bool]] = {}  # ssh_config path ("": the defaults) -> (config, has Match exec)


def ssh_config(path: Path | None) -> tuple[paramiko.SSHConfig, bool]:
    """The ssh_config fabric's Config(runtime_ssh_path=path) (or Config()) would hold, parsed once
    per command, and whether it has a `Match exec`. Call under the caller's config lock."""
    try:  # (one process may run several commands: tests, a long-lived caller) re-read when it changed
        st = os.stat(path) if path else None
    except OSError:
        st = None
    key = f"{path or ''}:{st.st_mtime_ns}:{st.st_size}:{st.st_ino}" if st else str(path or "")
    got = _parsed.get(key)
    if got is None:
        cfg = paramiko.SSHConfig()
        has_exec = False
        files = [str(path)] if path else [os.path.expanduser(USER_SSH_CONFIG), SYSTEM_SSH_CONFIG]
        for f in files:
            if path or os.path.isfile(f):  # an inventory's ssh_config must exist; the defaults may not
                with open(f) as fd:
                    text = fd.read()
                cfg.parse(StringIO(text))
                has_exec = has_exec or bool(_MATCH_EXEC.search(text))
        memoize_lookup(cfg)
        got = _parsed[key] = (cfg, has_exec)
    return got


def memoize_lookup(ssh_config: paramiko.SSHConfig) -> None:
    """paramiko's SSHConfig.lookup walks every Host block (and asks the password database once per
    block): ~5 ms per host with a 256-host ssh_config, for each of 256 connections. Within one
    command the answer for a name does not change: look each name up once, hand out copies."""
    lookup = ssh_config.lookup
    seen: dict[str, paramiko.SSHConfigDict] = {}

    def cached(hostname: str) -> paramiko.SSHConfigDict:
        if hostname not in seen:
            seen[hostname] = lookup(hostname)
        return copy.deepcopy(seen[hostname])

    ssh_config.lookup = cached  # type: ignore[method-assign]
