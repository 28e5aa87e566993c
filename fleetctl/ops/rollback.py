"""Rollback: restore each host's files to the bytes recorded before a deploy, from the remote
manifests alone (any controller can roll back)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.fleet import Fleet
from fleetctl.ops.deploy import Gathered, who
from fleetctl.protocol import names
from fleetctl.protocol.answers import RollbackAnswer
from fleetctl.protocol.schema import to_json
from fleetctl.transport.ssh import HostConnection


@dataclass
class RollbackPlan:
    host: str
    status: str  # change | noop | refused | unreachable | failed | skipped
    reason: str = ""
    deploy_ids: list[str] = field(default_factory=list)  # newest first
    files: list[dict[str, Any]] = field(default_factory=list)  # path, deploy, state, action
    interrupted: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "reason": self.reason, "deploy_ids": self.deploy_ids,
                "files": self.files, "interrupted": self.interrupted}


def plan_rollback(fleet: Fleet, gathered: Gathered, to: str | None, force: bool) -> list[RollbackPlan]:
    plans = []
    for h in fleet.hosts:
        o = gathered.outcomes[h.name]
        if not o.ok:
            plans.append(RollbackPlan(h.name, "unreachable" if o.status == "unreachable" else "failed", o.message))
            continue
        facts = gathered.facts[h.name]
        manifests = facts.deploys()
        rp = RollbackPlan(h.name, "noop")
        rp.interrupted = [m.id for m in facts.interrupted()]
        live = [m for m in manifests if m.state == "complete"]
        if to is not None:
            ids = [m.id for m in manifests]
            if to not in ids:
                rp.status = "skipped"
                rp.reason = f"deploy {to} never changed this host"
                plans.append(rp)
                continue
            start = ids.index(to)
            chosen = [m for m in manifests[start:] if m.state == "complete"]
        else:
            chosen = live[-1:]
        chosen = list(reversed(chosen))
        if not chosen:
            lock = facts.state.lock if facts.state else None
            stale = lock is not None and lock.stale
            rp.status = "change" if rp.interrupted or stale else "noop"
            rp.reason = ("interrupted deploy will be repaired" if rp.interrupted else
                         f"a stale lock ({lock.holder()}) will be cleared" if lock is not None and stale else
                         (f"deploy {to} is already rolled back" if to else "nothing to roll back"))
            plans.append(rp)
            continue
        rp.deploy_ids = [m.id for m in chosen]
        refused = []
        for m in chosen:
            for f in m.files:
                if f.status != "applied":
                    continue
                now = f.sha_now
                if now == f.sha_before:
                    state, action = "original", "none"
                elif now == f.sha_after:
                    state, action = "as-deployed", "restore"
                else:
                    state, action = "drifted", "force" if force else "refuse"
                    if not force:
                        refused.append(f"{f.path} changed since deploy {m.id}")
                rp.files.append({"path": f.path, "deploy": m.id, "state": state, "action": action,
                                 "sha_now": now, "sha_before": f.sha_before})
        if refused:
            rp.status = "refused"
            rp.reason = f"{h.name}: {refused[0]}; rerun with --force to overwrite it (a copy is kept)"
        else:
            rp.status = "change"
        plans.append(rp)
    return plans


def apply_rollback(fleet: Fleet, plans: list[RollbackPlan], op_id: str, force: bool) -> dict[str, dict[str, Any]]:
    todo = {p.host: p for p in plans if p.status == "change"}
    results: dict[str, dict[str, Any]] = {}
    for p in plans:
        if p.host not in todo:
            status = {"noop": "unchanged", "skipped": "skipped"}.get(p.status, p.status)
            results[p.host] = {"host": p.host, "status": status, "message": p.reason}

    def one(conn: HostConnection) -> dict[str, Any]:
        p = todo[conn.host.name]
        res: RollbackAnswer = conn.agent(names.ROLLBACK, {
            "state_dir": conn.host.state_dir, "deploy_ids": p.deploy_ids, "force": force, "rollback_id": op_id,
            "by": who()})
        restored = [f for r in res.rollbacks for f in r.files if f.action == "restored"]
        bad = [f for r in res.rollbacks for f in r.files if f.action == "refused"]
        msg = (f"{len(restored)} file(s) restored from {', '.join(p.deploy_ids)}" if p.deploy_ids else
               "; ".join(res.notes) or "nothing to restore")
        return {"host": conn.host.name, "status": "failed" if bad else "changed",
                "message": msg if not bad else f"{bad[0].path}: {bad[0].why}",
                "notes": res.notes, "detail": to_json(res.rollbacks)}

    for o in fleet.run(one, [h for h in fleet.hosts if h.name in todo]):
        results[o.host] = o.data if o.ok else {"host": o.host, "status": o.status, "message": o.message}
    return results
