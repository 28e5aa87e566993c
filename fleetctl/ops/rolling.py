"""Rolling restarts: `deploy --restart [--serial N|P%] [--canary N] [--max-fail P%]`.

Per batch: patch -> restart -> readiness -> verify-logs. The first batch is the canary. When a
batch fails beyond the budget (unreachable hosts count as failed), stop, roll that batch back
(files, then a restart on the original code), leave later batches untouched.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.engines import engine
from fleetctl.errors import InputError
from fleetctl.model.result import HostResult

if TYPE_CHECKING:  # parse_count/parse_percent check options before any host: no transport imported
    from fleetctl.config.hosts import Host
    from fleetctl.config.playbook_model import Playbook
    from fleetctl.ops.deploy import Gathered
    from fleetctl.ops.runner import Fleet
    from fleetctl.plan.deploy import Plan


def parse_count(text: str | None, total: int, what: str) -> int | None:
    """'5' -> 5 hosts; '25%' -> ceil(25% of total), at least 1. None -> None."""
    if text is None:
        return None
    t = text.strip()
    try:
        if t.endswith("%"):
            pct = float(t[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            return max(1, math.ceil(total * pct / 100))
        n = int(t)
        if n < 1:
            raise ValueError
        return n
    except ValueError:
        raise InputError(f"{what} {text!r}: give a host count >= 1 or a percentage like 25%",
                         reference="option-invalid") from None


def parse_percent(text: str, what: str) -> float:
    t = text.strip().rstrip("%")
    try:
        v = float(t)
    except ValueError:
        raise InputError(f"{what} {text!r}: give a percentage like 0% or 20%", reference="option-invalid") from None
    if not 0 <= v <= 100:
        raise InputError(f"{what} {text!r}: must be between 0% and 100%", reference="option-invalid")
    return v


def batches(hosts: list[Host], serial: int | None, canary: int | None) -> list[list[Host]]:
    """The first batch is the canary (canary hosts, else one serial batch); then serial-sized batches."""
    rest = list(hosts)
    out: list[list[Host]] = []
    size = serial or len(rest) or 1
    first = canary or size
    if rest:
        out.append(rest[:first])
        rest = rest[first:]
    while rest:
        out.append(rest[:size])
        rest = rest[size:]
    return out


def original_code_playbook(pb: Playbook, version: str | None) -> Playbook:
    """The launch profile without flags the host's *unpatched* SGLang does not know (the patch's own
    flags): what a restart on the original code must pass."""
    from fleetctl.engines import wheels
    if not version:
        return pb
    res = engine().resolve_worker(version, dict(pb.launch.flags), {})
    text = wheels.pristine_bytes(version, engine().args_file).decode("utf-8", "replace")
    unknown = {f for f in res.unknown_flags if not engine().flag_registered(text, f)}
    if not unknown:
        return pb
    flags = {k: v for k, v in pb.launch.flags.items() if k not in unknown}
    return dataclasses.replace(pb, launch=dataclasses.replace(pb.launch, flags=flags))


@dataclass
class Rolled:
    """A host's part of a rollout (HostRoll's detail): its batch, and what each step said."""

    batch: int
    steps: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "steps": self.steps}


HostRoll = HostResult[Rolled]


@dataclass
class RollResult:
    deploy_id: str
    batches: list[list[str]]
    hosts: list[HostRoll]
    stopped_at: int | None = None  # index of the batch that broke the budget
    budget: float = 0.0

    @property
    def ok(self) -> bool:
        return self.stopped_at is None and all(h.status == "ok" for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {"deploy_id": self.deploy_id, "batches": self.batches, "stopped_at_batch": self.stopped_at,
                "max_fail_percent": self.budget, "hosts": [h.to_json() for h in self.hosts]}


def rolling_deploy(fleet: Fleet, pb: Playbook, plan: Plan, *, serial: int | None, canary: int | None,
                   max_fail: float, ready_timeout: float | None = None, progress: Any = None,
                   op_id: str | None = None) -> RollResult:
    from fleetctl.ops.deploy import apply_plan, new_op_id
    from fleetctl.ops.launch import launch_fleet
    from fleetctl.ops.verify import verify_fleet

    op_id = op_id or new_op_id("d")
    by_plan = {hp.host: hp for hp in plan.hosts}
    groups = batches(list(fleet.hosts), serial, canary)
    result = RollResult(op_id, [[h.name for h in b] for b in groups], [], budget=max_fail)
    for bi, batch in enumerate(groups):
        rows = {h.name: HostRoll(h.name, "ok", detail=Rolled(bi)) for h in batch}
        sub = dataclasses.replace(fleet, hosts=batch)  # shares the connections
        names = [h.name for h in batch]
        # 1. patch
        applied = apply_plan(sub, plan, pb, op_id, hosts=names)
        for n in names:
            a = applied[n]
            rows[n].detail.steps["deploy"] = a.status
            if a.status not in ("changed", "unchanged"):
                rows[n].status = "unreachable" if a.status == "unreachable" else (
                    "refused" if a.status == "refused" else "failed")
                rows[n].message = a.message
        live = [h for h in batch if rows[h.name].status == "ok"]
        # 2. restart + readiness
        if live:
            # the plan already held each host to the playbook's coverage (or --allow-uncovered)
            _, launches = launch_fleet(sub, pb, replace=True, timeout=ready_timeout, launch_id=f"l{op_id[1:]}-b{bi}",
                                       hosts=live, allow_uncovered=True)
            for r in launches:
                rows[r.host].detail.steps["launch"] = r.status
                if r.status != "ok" or any(i.status != "ready" for i in r.detail.instances):
                    rows[r.host].status = "unreachable" if r.status == "unreachable" else "failed"
                    bad = next((i for i in r.detail.instances if i.status != "ready"), None)
                    rows[r.host].message = (f"{bad.instance}: {bad.status}: {bad.message}" if bad else r.message)
        # 3. verify-logs
        live = [h for h in batch if rows[h.name].status == "ok"]
        if live:
            for hv in verify_fleet(dataclasses.replace(fleet, hosts=live), pb):
                rows[hv.host].detail.steps["verify-logs"] = "pass" if hv.ok else "fail"
                if not hv.ok:
                    rows[hv.host].status = "unreachable" if hv.status == "unreachable" else "failed"
                    detail = next((p for i in hv.detail.instances for p in getattr(i, "problems", [])), hv.message)
                    rows[hv.host].message = f"verify-logs: {detail}"
        failed = [r for r in rows.values() if r.status != "ok"]
        result.hosts += list(rows.values())
        if progress:
            progress(bi, rows)
        if failed and 100.0 * len(failed) / len(batch) > max_fail:
            result.stopped_at = bi
            _roll_back_batch(fleet, pb, plan, batch, op_id, rows, ready_timeout)
            for later in groups[bi + 1:]:
                result.hosts += [HostRoll(h.name, "untouched", "not started: an earlier batch failed beyond --max-fail",
                                          Rolled(groups.index(later))) for h in later]
            break
    # hosts refused by the plan are reported as such (they are part of a batch above)
    for r in result.hosts:
        hp = by_plan.get(r.host)
        if hp is not None and hp.status in ("refused", "unreachable", "failed") and r.status == "ok":
            r.status, r.message = hp.status, hp.message
    return result


def _roll_back_batch(fleet: Fleet, pb: Playbook, plan: Plan, batch: list[Host], op_id: str,
                     rows: dict[str, HostRoll], ready_timeout: float | None) -> None:
    from fleetctl.ops.deploy import gather, new_op_id
    from fleetctl.ops.launch import launch_fleet
    from fleetctl.ops.rollback import apply_rollback, plan_rollback

    sub = dataclasses.replace(fleet, hosts=batch)
    gathered: Gathered = gather(sub, None)
    plans = [p for p in plan_rollback(sub, gathered, op_id, force=False) if p.status == "change"]
    if plans:
        res = apply_rollback(sub, plans, new_op_id("r"), force=False, profile=pb.launch)
        for n, r in res.items():
            rows[n].detail.steps["rollback"] = r.status
    # restart on the original code (without the patch's own flags), where we can reach the host
    reachable = [h for h in batch if rows[h.name].status != "unreachable"]
    by_plan = {hp.host: hp for hp in plan.hosts}
    for h in reachable:
        version = by_plan.get(h.name).version if by_plan.get(h.name) else None
        orig = original_code_playbook(pb, version)
        _, launches = launch_fleet(dataclasses.replace(fleet, hosts=[h]), orig, replace=True, timeout=ready_timeout,
                                   launch_id=f"l{op_id[1:]}-undo", hosts=[h])
        for r in launches:
            rows[h.name].detail.steps["restart original"] = r.status
    for r in rows.values():
        r.status = "rolled-back" if r.status == "ok" else r.status
        if r.status != "rolled-back":
            r.message += " (batch rolled back)"
