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


def launch_playbook(launch_ids: Iterable[str]) -> str | None:
    """The playbook path these launches used, when the ledger has them all and they used one."""
    ids = list(launch_ids)
    if not ids:
        return None
    ledger = Ledger()
    try:
        found = {(op or {}).get("playbook") for op in (ledger.get(i) for i in ids)}
    finally:
        ledger.close()
    return next(iter(found)) if len(found) == 1 and None not in found else None
