"""The local ledger as the commands use it: an operation recorded from start to finish, and what only
the ledger knows (which playbook a launch used: a host's launch record does not name it)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fleetctl.ops.ledger import Ledger


class Recorded:
    """One operation in the ledger: started when made, finished (and the ledger closed) by finish()."""

    def __init__(self, op_id: str, kind: str, *, inventory: Path | None, playbook: Path | None,
                 args: dict[str, Any], hosts: list[str]) -> None:
        self.op_id = op_id
        self.ledger = Ledger()
        self.ledger.start(op_id, kind, inventory=inventory, playbook=playbook, args=args, hosts=hosts)

    def finish(self, ok: bool, rows: list[dict[str, Any]], op_id: str | None = None) -> None:
        try:
            self.ledger.finish(op_id or self.op_id, "ok" if ok else "failed", rows)
        finally:
            self.ledger.close()


def launch_playbooks(launch_ids: Iterable[str]) -> dict[str, str]:
    """launch id -> the playbook path it used, for the launches the ledger has (with a playbook)."""
    ids = list(dict.fromkeys(launch_ids))
    if not ids:
        return {}
    ledger = Ledger()
    try:
        found = {i: (ledger.get(i) or {}).get("playbook") for i in ids}
    finally:
        ledger.close()
    return {i: pb for i, pb in found.items() if pb}
