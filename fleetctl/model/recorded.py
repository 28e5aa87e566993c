"""A host's result as the ledger kept it (`history ID`, `history show ID`): `HostResult[RecordedDetail]`.

The ledger (fleetctl/ops/ledger.py) stores each host's status, message and the operation's detail as
JSON; read back, they are a HostResult like the run's own rows, so the --json row has the same head.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl.model.result import HostResult


@dataclass
class RecordedDetail:
    """The operation's own detail of one host, as recorded (JSON; None where it recorded none)."""

    detail: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"detail": self.detail}


def recorded(row: Mapping[str, Any]) -> HostResult[RecordedDetail]:
    """One ledger host row ({host, status, message, detail}) as a HostResult (not timed: no elapsed)."""
    return HostResult(str(row["host"]), row["status"], str(row.get("message") or ""), RecordedDetail(row.get("detail")),
                      elapsed=None)
