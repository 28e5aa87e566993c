"""The one JSON envelope every command's --json document has (docs/json.md, docs/schemas/).

    {"command": "deploy", "op_id": "d...", "ok": true, "message": "one line",
     "summary": {"hosts": 3, "ok": 2, "failed": 1, "states": {"changed": 2, "refused": 1}, ...},
     "hosts": [{"host": "h01", "ok": true, "state": "changed", "message": "...", ...}, ...],
     ...command-specific keys (plan, rollout, restart_needed, ...)}

`ok` at the top is true exactly when the command exits 0. `summary` holds counts only (integers,
and the per-state counts under "states"); the human sentence is `message`. Stdlib only: the CLI's
start-up stays light. The host rows come from fleetctl/model/result.py (HostResult.row).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleetctl.model.hostnames import strip_host
from fleetctl.model.result import HostResult, host_row

__all__ = ["HostResult", "counts", "envelope", "host_row", "rows"]

emitted = False  # this process printed its JSON document (cli.main prints one for an error otherwise)


def rows(results: Iterable[HostResult[Any]]) -> list[dict[str, Any]]:
    """The host rows of results (HostResult.row: ok is the status's)."""
    return [r.row() for r in results]


def counts(hosts: Iterable[Mapping[str, Any]], **extra: int) -> dict[str, Any]:
    """summary: how many hosts, how many ok / not ok, per state, plus the command's own counts."""
    rows = list(hosts)
    clash = set(extra) & {"hosts", "ok", "failed", "states"}
    if clash:
        raise ValueError(f"summary count(s) {sorted(clash)} clash with the host counts")
    states: dict[str, int] = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    n_ok = sum(1 for r in rows if r["ok"])
    return {"hosts": len(rows), "ok": n_ok, "failed": len(rows) - n_ok, "states": states,
            **{k: int(v) for k, v in extra.items()}}


def envelope(command: str, *, ok: bool, hosts: list[dict[str, Any]] | None = None, op_id: str | None = None,
             message: str | None = None, summary: Mapping[str, int] | None = None,
             **extra: Any) -> dict[str, Any]:
    """The document: the envelope keys, then the command's own top-level keys. `summary` adds the
    command's own counts to the host counts."""
    rows = list(hosts or [])
    totals = counts(rows, **dict(summary or {}))
    if not message:  # never empty: what the counts say
        message = (f"{command}: {totals['hosts']} host(s): {totals['ok']} ok, {totals['failed']} not"
                   if rows else f"{command}: {'ok' if ok else 'failed'}")
    return unprefixed({"command": command, "op_id": op_id, "ok": bool(ok), "message": message,
                       "summary": totals, "hosts": rows, **extra})


def unprefixed(value: Any, host: str | None = None) -> Any:
    """`value` with every string of a host's own entry (an object with a "host", and what it holds)
    rid of a leading "HOST: " naming that same host: the entry's `host` already says it (the text
    output keeps the prefix on a line of its own). A string that would be left empty stays whole."""
    if isinstance(value, dict):
        own = value.get("host")
        here = own if isinstance(own, str) and own else host
        return {k: (v if k == "host" else unprefixed(v, here)) for k, v in value.items()}
    if isinstance(value, list):
        return [unprefixed(v, host) for v in value]
    if host and isinstance(value, str):
        rest = strip_host(host, value)
        return rest if rest.strip() else value
    return value
