"""THE one computation of what a launch runs: interpreter, its options, environment and cwd.

facts, explain, deploy, status, launch and verify-logs all locate SGLang through it: the agent
runs fleetctl's probe (fleetctl/remote/probe.py) with this interpreter, these options, this
environment and this cwd, so "where sglang is imported from" is answered by the same python, in
the same environment, as the server's own `import sglang`.

Inputs: the launch command (inventory `launch_command`, else the playbook's `launch.command`,
`{python}` filled in), the playbook's `launch.env` overridden by the inventory's `env`, the host
basics inherited from the host's login session (INHERIT_FROM_HOST), and whatever an `env` prefix
in the command itself does (`env -i`, `env -u NAME`, `env NAME=value`). The command may pass
through simple wrappers (nohup, nice, numactl, taskset, stdbuf, ionice, chrt, setsid) before the
interpreter. A command whose interpreter cannot be told (a shell, a script, an unknown wrapper) is
reported as unresolved: never assumed to be the inventory's `python`.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

# Host basics a process needs that come from the HOST's own login session (never the controller):
# the server's environment is these (when set on the host) + playbook env + inventory env.
INHERIT_FROM_HOST = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

WRAPPERS = frozenset({"nohup", "nice", "numactl", "taskset", "stdbuf", "ionice", "chrt", "setsid"})
PYTHON_RE = re.compile(r"^python[0-9.]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# interpreter options that take a separate value word
OPTS_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})
FIX = ("start the launch command with {python} (or a python path), optionally after env NAME=value, "
       "nohup, nice, numactl or taskset")


@dataclass(frozen=True)
class LaunchSpec:
    words: tuple[str, ...]  # the command words ({python} filled in), before the flags
    env: dict[str, str]  # playbook launch.env + inventory env (+ CUDA_VISIBLE_DEVICES): what fleetctl passes
    secret_keys: frozenset[str] = frozenset()
    inherit: tuple[str, ...] = INHERIT_FROM_HOST
    interpreter: str | None = None
    options: tuple[str, ...] = ()
    target_kind: str | None = None  # module | script | code
    target: str | None = None
    command_env: dict[str, str] = field(default_factory=dict)  # `env NAME=value` in the command
    unset: tuple[str, ...] = ()  # `env -u NAME`
    clear: bool = False  # `env -i`
    problem: str | None = None  # why the interpreter cannot be told
    cwd: str | None = None  # launch.cwd (None: the launch env's HOME, else the SSH user's home)

    @property
    def effective_env(self) -> dict[str, str]:
        """What the python sees on top of the inherited host basics: the env fleetctl passes, then
        the command's own `env` prefix (what worker routing must read)."""
        base = {} if self.clear else {k: v for k, v in self.env.items() if k not in self.unset}
        base.update(self.command_env)
        return base

    @property
    def public_effective_env(self) -> dict[str, str]:
        secret = {k for k in self.secret_keys if k not in self.command_env}
        return {k: ("***" if k in secret else v) for k, v in self.effective_env.items()}

    def to_agent(self) -> dict[str, Any]:
        """The payload the agent's probe runs with (secret values included: it travels on stdin)."""
        return {"interpreter": self.interpreter, "options": list(self.options), "target_kind": self.target_kind,
                "target": self.target, "env": dict(self.env), "inherit": list(self.inherit),
                "command_env": dict(self.command_env), "unset": list(self.unset), "clear": self.clear,
                "cwd": self.cwd, "problem": self.problem}

    def describe(self) -> str:
        if self.problem:
            return f"unresolved: {self.problem}"
        opts = " ".join(self.options)
        return f"{self.interpreter}{' ' + opts if opts else ''} " + (
            f"-m {self.target}" if self.target_kind == "module" else str(self.target))


def env_overrides(wanted: dict[str, str], spec: LaunchSpec | None) -> list[str]:
    """What the launch command's own `env` prefix does to the environment the playbook and inventory
    set (`wanted`): one line per variable it clears, unsets or sets to another value."""
    if spec is None:
        return []
    out = []
    for k, v in wanted.items():
        if spec.clear and k not in spec.command_env:
            out.append(f"the launch command's 'env -i' drops {k}={v!r} that the playbook/inventory set")
        elif k in spec.unset and k not in spec.command_env:
            out.append(f"the launch command's 'env -u {k}' drops {k}={v!r} that the playbook/inventory set")
        elif k in spec.command_env and spec.command_env[k] != v:
            out.append(f"the launch command sets {k}={spec.command_env[k]!r}, overriding {k}={v!r} of the "
                       "playbook/inventory: the server runs with the command's value")
    return out


def _parse_env(words: list[str], i: int) -> tuple[int, dict[str, str], list[str], bool, str | None]:
    """`env [-i] [-u NAME]... [NAME=value]... CMD`: (index of CMD, set, unset, clear, problem)."""
    sets: dict[str, str] = {}
    unset: list[str] = []
    clear = False
    while i < len(words):
        a = words[i]
        if a in ("-i", "--ignore-environment", "-"):
            clear = True
            sets.clear()
            i += 1
        elif a in ("-u", "--unset"):
            if i + 1 >= len(words):
                return i, sets, unset, clear, f"'env {a}' lacks its NAME"
            unset.append(words[i + 1])
            sets.pop(words[i + 1], None)
            i += 2
        elif a.startswith("--unset="):
            unset.append(a.split("=", 1)[1])
            i += 1
        elif a.startswith("-u") and len(a) > 2:
            unset.append(a[2:])
            i += 1
        elif a == "--":
            i += 1
            break
        elif a.startswith("-"):
            return i, sets, unset, clear, f"env option {a!r} is not one fleetctl understands"
        elif "=" in a and ENV_NAME_RE.match(a.split("=", 1)[0]):
            k, v = a.split("=", 1)
            sets[k] = v
            i += 1
        else:
            break
    return i, sets, unset, clear, None


def _is_python(word: str, host_python: str) -> bool:
    return word == host_python or bool(PYTHON_RE.match(posixpath.basename(word)))


def launch_spec(words: list[str], host_python: str, env: dict[str, str],
                secret_keys: frozenset[str] = frozenset(), cwd: str | None = None) -> LaunchSpec:
    """Parse the launch command (already split into words, {python} filled in)."""
    base: dict[str, Any] = {"words": tuple(words), "env": dict(env), "secret_keys": secret_keys, "cwd": cwd}
    command_env: dict[str, str] = {}
    unset: list[str] = []
    clear = False

    def unresolved(why: str) -> LaunchSpec:
        return LaunchSpec(**base, command_env=command_env, unset=tuple(unset), clear=clear,
                          problem=f"cannot tell which python the launch command {' '.join(words)!r} runs: {why} "
                                  f"({FIX})")

    i = 0
    interp_at = None
    while i < len(words):
        w = words[i]
        name = posixpath.basename(w)
        if name == "env":
            i, sets, un, cl, problem = _parse_env(words, i + 1)
            if problem:
                return unresolved(problem)
            if cl:
                clear = True
                command_env.clear()
            for k in un:
                command_env.pop(k, None)
            unset += un
            command_env.update(sets)
            continue
        if _is_python(w, host_python):
            interp_at = i
            break
        if name in WRAPPERS:
            # skip the wrapper's own options up to the first word that is a python
            j = i + 1
            while (j < len(words) and not _is_python(words[j], host_python)
                   and posixpath.basename(words[j]) not in WRAPPERS | {"env"}):
                if not (words[j].startswith("-") or re.match(r"^[0-9a-fx,:-]+$", words[j])):
                    return unresolved(f"{name} runs {words[j]!r}, which is not a python")
                j += 1
            i = j
            continue
        if "=" in w and ENV_NAME_RE.match(w.split("=", 1)[0]):
            return unresolved(f"{w!r} is not a command (fleetctl runs no shell: use 'env {w}')")
        return unresolved(f"{w!r} is not a python interpreter fleetctl can see into")
    if interp_at is None:
        return unresolved("no python interpreter in it")
    interp = words[interp_at]
    options: list[str] = []
    kind = target = None
    j = interp_at + 1
    while j < len(words):
        a = words[j]
        if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
            kind, target = "module", (words[j + 1] if a == "-m" and j + 1 < len(words) else a[2:] or None)
            break
        if a == "-c" or (a.startswith("-c") and not a.startswith("--")):
            kind, target = "code", None
            break
        if a in OPTS_WITH_VALUE:
            options += words[j:j + 2]
            j += 2
            continue
        if a.startswith("-") and a != "-":
            options.append(a)
            j += 1
            continue
        kind, target = "script", a
        break
    if kind is None or (kind == "module" and not target):
        return unresolved(f"{interp} is given no module (-m) or script to run")
    return LaunchSpec(**base, interpreter=interp, options=tuple(options), target_kind=kind, target=target,
                      command_env=command_env, unset=tuple(unset), clear=clear)
