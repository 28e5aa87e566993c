"""Every command fleetctl suggests runs as printed (issue 30.6).

A suggestion is written as `'fleetctl SUB ARGS'` (in single quotes: the one recognisable form, in
text and in --json). Deep code often cannot know the inventory (or the playbook) the user gave, so
it writes `'fleetctl rollback'`; `complete` finishes each such suggestion with the command's own
inputs (`-i INVENTORY`, and the playbook where the command takes one) when the text is printed.
A suggestion that still cannot run as printed (a playbook nobody named) loses its quotes and says
what is missing, so no quoted suggestion is a usage error. Stdlib only: the CLI's start-up stays light.
"""

from __future__ import annotations

import re
import shlex

# fleet commands (they take -i) and those of them that take a playbook argument
FLEET = {"facts", "deploy", "rollback", "status", "launch", "stop", "servers", "verify-logs", "explain"}
NEEDS_PLAYBOOK = {"deploy", "launch", "verify-logs", "explain"}
_SUGGESTION = re.compile(r"'fleetctl ([a-z][a-z-]*)((?: [^']*)?)'")

inventory: str | None = None  # the command's -i (set from argv by cli.main)
playbook: str | None = None  # the command's playbook (set where the command loads it)


def quote(arg: str) -> str:
    """One argument for a suggestion: as is when the shell takes it so, else in double quotes (a
    suggestion is itself inside single quotes)."""
    if shlex.quote(arg) == arg:
        return arg
    return '"' + "".join("\\" + c if c in '\\"$`' else c for c in arg) + '"'


def set_from_argv(args: list[str]) -> None:
    """Take -i/--inventory from the command line (before any parsing: an error line printed by
    the parser itself or by validation may carry a suggestion too)."""
    global inventory, playbook
    inventory = playbook = None
    for i, a in enumerate(args):
        if a in ("-i", "--inventory") and i + 1 < len(args):
            inventory = args[i + 1]
        elif a.startswith("--inventory="):
            inventory = a.split("=", 1)[1]


def _complete_one(m: re.Match[str]) -> str:
    sub, rest = m.group(1), m.group(2)
    if sub not in FLEET:
        return m.group(0)
    try:
        args = shlex.split(rest)
    except ValueError:
        return m.group(0)
    has_inv = any(a in ("-i", "--inventory") or a.startswith("--inventory=") for a in args)
    positional = [a for k, a in enumerate(args) if not a.startswith("-")
                  and not (k > 0 and args[k - 1] in ("-i", "--inventory", "--limit", "-l", "--instance", "--to",
                                                     "-f", "--forks", "--timeout"))]
    missing = []
    for k, a in enumerate(args):  # a placeholder (PLAYBOOK, INVENTORY, ID): the command's own value, or missing
        if re.fullmatch(r"[A-Z][A-Z_]+", a):
            value = playbook if a == "PLAYBOOK" else inventory if a in ("INV", "INVENTORY") else None
            if value is None:
                missing.append(a)
            else:
                args[k] = value
    if not has_inv:
        if inventory is None:
            missing.append("-i INVENTORY")
        else:
            args = ["-i", inventory, *args]
    if sub in NEEDS_PLAYBOOK and not positional:
        if playbook is None:
            missing.append("its playbook")
        else:
            args = [*args, playbook]
    cmd = " ".join(["fleetctl", sub, *(quote(a) for a in args)])
    if missing:  # cannot run as printed: not written as a suggestion (no quotes), the words as they were
        inv = f" -i {quote(inventory)}" if inventory is not None and not has_inv else ""
        pb = " PLAYBOOK" if "its playbook" in missing else ""
        return f"fleetctl {sub}{rest}{inv}{pb}"
    return f"'{cmd}'"


def complete(text: str) -> str:
    """`text` with each suggested fleetctl command made runnable as printed (see the module)."""
    if "'fleetctl " not in text:
        return text
    return _SUGGESTION.sub(_complete_one, text)


def complete_doc(value: object) -> object:
    """complete() over every string of a JSON document (dicts, lists)."""
    if isinstance(value, str):
        return complete(value)
    if isinstance(value, dict):
        return {k: complete_doc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [complete_doc(v) for v in value]
    return value
