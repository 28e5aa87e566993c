"""How an SGLang server process looks from /proc: the command lines that start one, the environment
variables that change what it runs, and its flags read back from its argv.

Entry points (read off the wheels): `python -m sglang.launch_server`, the `sglang` console script's
`serve` subcommand (`sglang = sglang.cli.main:main`), `python -m sglang.cli.main serve`, and
`python .../sglang/launch_server.py`.
"""

from __future__ import annotations

import shlex
from typing import Any

from fleetctl.engines.sglang import releases as R

SERVER_MODULES = ("sglang.launch_server", "sglang.cli.main serve")
SERVER_SCRIPTS = ("sglang serve",)
SERVER_PATHS = ("sglang/launch_server.py",)

# the environment that decides which code runs (routing, import path, bytecode, model lookup)
ROUTING_ENV_PREFIXES = ("SGLANG_", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PYTHONPYCACHEPREFIX",
                        "PYTHONDONTWRITEBYTECODE", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")

# a log line's time (the host's local time), as the agent reads it to drop replayed lines
LOG_STAMP_RE = r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})"
LOG_STAMP_FMT = "%Y-%m-%d %H:%M:%S"

_BOOL_OPTIONS = frozenset(o for f in R.FLAGS if f.type == "bool" for o in f.options)


def match_rules(launch_command: str | None = None) -> dict[str, list[str]]:
    """What the agent matches command lines against. A host's own `launch_command` that runs a
    module (`{python} -m my.wrapper`) adds that module, so servers started that way are found too."""
    modules = list(SERVER_MODULES)
    if launch_command:
        try:
            words = shlex.split(launch_command)
        except ValueError:
            words = []
        for i, w in enumerate(words[:-1]):
            if w == "-m" and words[i + 1] not in modules:
                modules.append(words[i + 1])
    return {"modules": modules, "scripts": list(SERVER_SCRIPTS), "paths": list(SERVER_PATHS)}


def server_flags(argv: list[str], modules: list[str] | None = None) -> dict[str, Any]:
    """The launch flags in a server's argv (after its entry point), as `--name: value` (True for a
    switch). Bool options of the flag table never take a value; others take the next word unless it
    is itself an option."""
    start = 0
    mods = {m.partition(" ")[0]: m.partition(" ")[2] for m in (modules or list(SERVER_MODULES))}
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv) and argv[i + 1] in mods:
            start = i + 2 + (1 if mods[argv[i + 1]] and i + 2 < len(argv) and argv[i + 2] == mods[argv[i + 1]] else 0)
            break
        if a.endswith("/launch_server.py") or (a.rsplit("/", 1)[-1] == "sglang" and i + 1 < len(argv)
                                               and argv[i + 1] == "serve"):
            start = i + (2 if a.rsplit("/", 1)[-1] == "sglang" else 1)
            break
    flags: dict[str, Any] = {}
    rest = argv[start:]
    i = 0
    while i < len(rest):
        a = rest[i]
        i += 1
        if not a.startswith("--"):
            continue
        name, eq, value = a.partition("=")
        if eq:
            flags[name] = value
        elif name in _BOOL_OPTIONS or i >= len(rest) or rest[i].startswith("--"):
            flags[name] = True
        else:
            flags[name] = rest[i]
            i += 1
    return flags


# --log-level sets the root logger's level (logging.basicConfig in configure_logger); the marker and
# the ready line are INFO. SGLANG_LOGGING_CONFIG_PATH makes configure_logger load a dictConfig instead
# of its own format and level (read off srt/utils/common.py of the wheels).
QUIET_LEVELS = ("warning", "warn", "error", "critical", "fatal")
LOGGING_CONFIG_ENV = "SGLANG_LOGGING_CONFIG_PATH"


def log_visibility_problems(resolved_args: dict[str, Any], env: dict[str, str]) -> list[str]:
    """Why this launch's log could not show the INFO lines fleetctl proves things with."""
    out = []
    level = str(resolved_args.get("log_level") or "info").lower()
    if level in QUIET_LEVELS:
        out.append(f"--log-level {level} hides INFO lines: neither the patch's marker nor the ready line would "
                   "be logged, so nothing could be verified (use info or debug)")
    if env.get(LOGGING_CONFIG_ENV):
        out.append(f"{LOGGING_CONFIG_ENV} replaces SGLang's log format and levels with "
                   f"{env[LOGGING_CONFIG_ENV]!r}: fleetctl could not read ranks, the marker or the ready line "
                   "from the log (unset it in the launch env)")
    return out
