"""One host's result, for every operation: `HostResult[T]`.

The words a host's status can be are spelled here once (`Status`), with which of them count as ok
(`OK_STATES`); each operation keeps only its own typed detail `T` (a deploy's files and id, a launch's
instances, ...). The --json host row (docs/json.md) is made here too, from the result, so every
command's rows have the same head: host, ok, state, message, status, then the detail's own fields.
Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, get_args

Status = Literal[
    # a host that did what was asked
    "ok",  # a read or a check answered; a launch ready; a batch that went through
    "changed",  # files (or servers) were changed
    "unchanged",  # already as asked: nothing to change
    "skipped",  # nothing asked of this host (not selected by --to, its tree handled by another host)
    # a plan's decision for a host that can go ahead (--check shows it)
    "change", "noop", "start",
    "run",  # gpu-check --check: the check would run on this host
    "passed",  # gpu-check: the check ran on this host and passed
    # a host that did not
    "refused",  # decided against before anything changed (drift, a lock, an uncovered worker, ...)
    "failed",  # an error on the host
    "unreachable",  # no connection
    "not-started",  # interrupted (Ctrl-C) before its turn
    "interrupted",  # gpu-check: interrupted (Ctrl-C) while it ran; what it made was removed
    "rolled-back",  # --restart: its batch broke the budget and was rolled back
    "untouched",  # --restart: a later batch, not started after one broke the budget
    "problems",  # status: reachable, with problems
    "pending",  # history: an operation's host with no result recorded (the operation was interrupted)
]
STATES: tuple[str, ...] = get_args(Status)
OK_STATES = frozenset({"ok", "changed", "unchanged", "skipped", "change", "noop", "start", "run", "passed"})
# a host that answered nothing useful: no detail from it
NO_ANSWER = frozenset({"failed", "unreachable", "not-started"})


T = TypeVar("T")
U = TypeVar("U")


@dataclass
class HostResult(Generic[T]):
    """What one operation did, or decided, on one host: the host, its status, one human line, the
    operation's own detail, seconds spent."""

    host: str
    status: Status
    message: str = ""
    detail: T = None  # type: ignore[assignment]  # the operation's own; None where the host gave none
    elapsed: float | None = 0.0  # None: not timed (a plan's decision, a result read back from the ledger)
    debug: str | None = field(default=None, repr=False)  # traceback or remote stderr, shown with --debug
    reference: str | None = None  # why it failed, as docs/errors.md names it (errors.py FleetctlError.reference)

    @property
    def ok(self) -> bool:
        return self.status in OK_STATES

    def carry(self, detail: U) -> HostResult[U]:
        """This result with another detail: a host's failure, passed on by the operation that asked."""
        return HostResult(self.host, self.status, self.message, detail, self.elapsed, self.debug, self.reference)

    def head(self) -> dict[str, Any]:
        """host, status, message, elapsed: what every result says, whatever its detail (elapsed only
        where it was timed)."""
        return {"host": self.host, "status": self.status, "message": self.message,
                **({"elapsed": round(self.elapsed, 3)} if self.elapsed is not None else {}),
                **({"reference": self.reference} if self.reference and not self.ok else {})}

    def fields(self) -> dict[str, Any]:
        """The detail's own JSON fields: its to_json() ({} for a detail without one: a raw answer)."""
        to_json = getattr(self.detail, "to_json", None)
        return dict(to_json()) if to_json is not None else {}

    def to_json(self) -> dict[str, Any]:
        """host, status, message, the detail's fields, elapsed: the row recorded in the ledger and run log."""
        head = self.head()
        elapsed = {"elapsed": head.pop("elapsed")} if "elapsed" in head else {}
        return {**head, **self.fields(), **elapsed}

    def row(self, *, ok: bool | None = None, message: str | None = None, state: Status | None = None
            ) -> dict[str, Any]:
        """The --json host row (docs/json.md): host, ok, state, message, then status and the rest."""
        return host_row(self.to_json(), ok=self.ok if ok is None else ok, state=state or self.status,
                        message=message)


@dataclass
class Decided(HostResult[None]):
    """A plan's decision for one host (deploy's `HostPlan`, rollback's, launch's and gpu-check's plans
    subclass it), itself that host's `HostResult`: host, status, message and reference are the
    result's, each plan adds only its own fields and says which of them its row shows (`fields()`).
    Not timed."""

    elapsed: float | None = None

    def fields(self) -> dict[str, Any]:
        return {}


def host_row(row: Mapping[str, Any], *, ok: bool | None = None, state: str | None = None, message: str | None = None,
             host: str | None = None) -> dict[str, Any]:
    """One host's --json entry from a plain row: host, ok, state, message first, then the row's own
    fields (kept as they are). ok defaults to whether the row's "status" is one of OK_STATES; state
    to the row's "status"; message to its "message", else its "reason"; never empty: at least the
    state."""
    if ok is None:
        ok = row.get("status") in OK_STATES
    extra = {k: v for k, v in row.items() if k not in ("host", "ok", "state", "message")}
    st = state if state is not None else row.get("status")
    msg = message if message is not None else row.get("message", row.get("reason"))
    state_ = str(st if st is not None else ("ok" if ok else "failed"))
    return {"host": str(host if host is not None else row["host"]), "ok": bool(ok), "state": state_,
            "message": str(msg) if msg else state_, **extra}
