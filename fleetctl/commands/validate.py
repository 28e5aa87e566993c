"""Option checks every command runs before it loads facts or connects to any host.

Each check raises InputError (exit 2) with one line naming the option and the fix, so a typo in
an option never costs a round trip to the fleet (issue 16.3).
"""

from __future__ import annotations

import re

from fleetctl.errors import InputError

# new_op_id(): <prefix><YYYYmmdd>-<HHMMSS>-<hex>; 'd' for deploys (also rolling ones)
DEPLOY_ID = re.compile(r"d\d{8}-\d{6}-[0-9a-f]{2,16}")
OP_ID = re.compile(r"[a-z]\d{8}-\d{6}-[0-9a-f]{2,16}")
INSTANCE = re.compile(r"port-\d{1,5}")  # fleetctl names every instance after its port
SGLANG_VERSION = re.compile(r"\d+(\.\d+){1,3}((\.|-)?(post|dev|rc|a|b)\d*)*")


def deploy_id(value: str | None, option: str = "--to") -> str | None:
    """A deploy id's shape (hosts may know ids this controller's ledger never saw, so only the shape)."""
    if value is None:
        return None
    v = value.strip()
    if DEPLOY_ID.fullmatch(v):
        return v
    if OP_ID.fullmatch(v):
        raise InputError(f"{option} {value!r} is not a deploy id (deploy ids start with 'd')",
                         hint="pick a deploy from 'fleetctl history' or 'fleetctl status'",
                         reference="deploy-id-invalid")
    raise InputError(f"{option} {value!r} is not a deploy id (like d20260101-120000-ab12)",
                     hint="pick one from 'fleetctl history' or 'fleetctl status'", reference="deploy-id-invalid")


def rolling(restart: bool, *, serial: str | None, canary: str | None, max_fail: str | None,
            ready_timeout: float | None) -> float:
    """deploy's rolling options: they go with --restart and have the right shape. Returns the budget."""
    given = [name for name, v in (("--serial", serial), ("--canary", canary), ("--max-fail", max_fail),
                                  ("--timeout", ready_timeout)) if v is not None]
    if given and not restart:
        raise InputError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --restart",
                         hint="add --restart for a rolling restart, or drop " + ", ".join(given),
                         reference="option-invalid")
    if not restart:
        return 0.0  # no rolling options to check (ops.rolling is imported by a --restart only)
    from fleetctl.ops.rolling import parse_count, parse_percent

    parse_count(serial, 1, "--serial")  # the shape now; the count once the hosts are known
    parse_count(canary, 1, "--canary")
    return parse_percent(max_fail if max_fail is not None else "0%", "--max-fail")


def instances(names: list[str] | None) -> list[str] | None:
    if names is None:
        return None
    for n in names:
        if not INSTANCE.fullmatch(n):
            hint = f"did you mean port-{n}? " if n.isdigit() and len(n) <= 5 else ""
            raise InputError(f"--instance {n!r}: not an instance name",
                             hint=hint + "instance names look like port-30000 ('fleetctl servers' lists them)",
                             reference="option-invalid")
    return names


def sglang_version(value: str, option: str = "--sglang") -> str:
    if not SGLANG_VERSION.fullmatch(value.strip()):
        raise InputError(f"{option} {value!r}: not an SGLang release number", hint="e.g. 0.5.9 or 0.5.5.post3",
                         reference="option-invalid")
    return value.strip()


def known_release(value: str, option: str) -> str:
    """A release number the engine's own table has (a command that needs fleetctl's knowledge of the
    release: its workers, flags, launch): anything else is refused here, before any wheel is asked of
    the package registry."""
    from fleetctl.engines import engine

    v = sglang_version(value, option)
    eng = engine()
    if not eng.is_known(v):
        known = eng.known_versions()
        raise InputError(f"{option} {v}: fleetctl does not know {eng.display_name} {v} (it knows {known[0]} .. "
                         f"{known[-1]})", hint="pass the release your edits were made on; to add a release to fleetctl: "
                         f"{eng.add_release_hint}",
                         reference="release-unknown")
    return v


def exclusive(**given: bool) -> None:
    """At most one of these flags (names as keyword arguments, '_' for '-')."""
    on = ["--" + k.replace("_", "-") for k, v in given.items() if v]
    if len(on) > 1:
        raise InputError(f"{' and '.join(on)} do not go together", hint=f"keep one of {', '.join(on)}",
                         reference="option-invalid")
