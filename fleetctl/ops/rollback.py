"""Rollback: restore each host's files to the bytes recorded before a deploy, from the remote
manifests alone (any controller can roll back)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetctl.config.hosts import Host
from fleetctl.config.playbook_model import LaunchProfile, Playbook
from fleetctl.engines import engine, wheels
from fleetctl.model import hoststate
from fleetctl.model.facts import HostFacts
from fleetctl.model.instances import host_launch_spec
from fleetctl.model.result import Decided, HostResult
from fleetctl.ops.deploy import Gathered, lock_bound, who
from fleetctl.ops.runner import Fleet
from fleetctl.protocol import names
from fleetctl.protocol.answers import DeployAnswer, RollbackAnswer
from fleetctl.protocol.schema import to_json
from fleetctl.transport.base import Transport


@dataclass
class RollbackPlan(Decided):
    """One host's rollback, decided from its manifests: change, noop, refused, unreachable, failed or
    skipped, why in its message."""

    deploy_ids: list[str] = field(default_factory=list)  # newest first
    files: list[dict[str, Any]] = field(default_factory=list)  # path, deploy, state, action
    interrupted: list[str] = field(default_factory=list)
    expect_live: list[str] = field(default_factory=list)  # this machine's live deploys when planned
    pristine_version: str | None = None  # --from-pristine: the release whose pristine bytes are restored
    package_dir: str | None = None
    records_dir: str | None = None  # the deploys undone are recorded beside a shared tree (fleetctl/plan/trees.py)
    tree: str | None = None  # the real path of the tree this host imports
    tree_owner: str | None = None  # another selected host on the same tree undoes it, once
    tree_members: list[str] = field(default_factory=list)
    lane: tuple[Any, ...] = ()  # the machine and state dir its transaction locks (fleetctl/plan/trees.py lane_key)

    def fields(self) -> dict[str, Any]:
        """The plan's own fields in its row ("reason": the message, as rows said before it was one)."""
        return {"reason": self.message, "deploy_ids": self.deploy_ids,
                "files": self.files, "interrupted": self.interrupted,
                **({"shared_tree": {"owner": self.tree_owner or self.host, "hosts": self.tree_members,
                                    "records_dir": self.records_dir}}
                   if self.tree_members or self.records_dir else {})}


@dataclass
class RolledBack:
    """What a rollback did on a host (HostRollback's detail)."""

    notes: list[str] = field(default_factory=list)
    rollbacks: list[Any] | None = None  # the agent's answer per deploy undone, as JSON (the row's "detail")

    def to_json(self) -> dict[str, Any]:
        return {"notes": self.notes, **({"detail": self.rollbacks} if self.rollbacks is not None else {})}


HostRollback = HostResult[RolledBack]


def _restore_rows(rp: RollbackPlan, chosen: list[Any], force: bool) -> list[str]:
    """Each applied file of the deploys to undo (newest first) as a row of `rp.files`: its state now
    and what the rollback does with it. Returns why files are refused (drifted, no --force)."""
    refused: list[str] = []
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
    return refused


def _plan_host(h: Host, gathered: Gathered, to: str | None, force: bool, *, old_tree: bool, from_pristine: bool,
               playbook: Playbook | None) -> RollbackPlan:
    """One host's rollback plan from its gathered facts."""
    o = gathered.outcomes[h.name]
    if not o.ok:
        return RollbackPlan(h.name, "unreachable" if o.status == "unreachable" else "failed", o.message,
                            reference=o.reference)
    facts = gathered.facts[h.name]
    manifests = hoststate.own(facts)  # never another machine's records (a shared state dir)
    rp = RollbackPlan(h.name, "noop")
    rp.expect_live = [m.id for m in hoststate.live(facts)]
    rp.interrupted = [m.id for m in hoststate.interrupted(facts)]
    gone = hoststate.gone(facts)
    pristine, why_not = hoststate.release_pristine(facts.package_version)
    loose = hoststate.unrecorded(facts, pristine) if pristine is not None else []
    if from_pristine:
        _plan_from_pristine(rp, h.name, facts, loose, pristine, why_not, playbook)
        return rp
    if loose and not hoststate.live(facts):
        rp.status = "refused"
        rp.message = hoststate.unrecorded_msg(h.name, facts.package_version, loose)
        return rp
    # fleetctl's own recorded deploys are undone from their backups whatever else differs from the
    # release (a checkout that moved on): those files are left as they are, and named
    loose_note = ([f"{len(loose)} other file(s) differ from sglang {facts.package_version} with no deploy record "
                   f"and are left as they are ({', '.join(loose[:4])}{' ...' if len(loose) > 4 else ''})"]
                  if loose else [])
    live = hoststate.live(facts)
    if to is not None:
        ids = [m.id for m in manifests]
        if to not in ids:
            rp.status = "skipped"
            rp.message = f"deploy {to} never changed this host"
            return rp
        start = ids.index(to)
        chosen = [m for m in manifests[start:] if m in live]
    else:
        chosen = live[-1:]
    chosen = list(reversed(chosen))
    where = {m.shared for m in chosen}
    if len(where) > 1:
        rp.status = "refused"
        rp.message = (f"{h.name}: the deploys to undo are recorded in two places (its state_dir and beside "
                     f"its shared tree, {next(x for x in where if x)}); roll back with --to, one place at a time")
        return rp
    shared_dir = next(iter(where)) if where else None
    if shared_dir is None and not chosen and any(m.shared for m in live):
        shared_dir = next(m.shared for m in live if m.shared)
    if shared_dir:
        rp.records_dir = shared_dir
        rp.tree = facts.state.tree.real if facts.state and facts.state.tree else None
    rp.expect_live = [m.id for m in live if m.shared == shared_dir]
    rp.interrupted = [m.id for m in hoststate.interrupted(facts) if m.shared == shared_dir]
    moved = [m for m in chosen if m.moved]
    if moved and not old_tree:
        mv = moved[0].moved
        rp.status = "refused"
        rp.message = (f"{h.name}: {hoststate.moved_msg(moved[0])}; nothing was changed; rerun with --old-tree "
                     f"to restore {mv.patched if mv else '?'} anyway")
        return rp
    notes = [hoststate.gone_msg(m) + ": its record will be closed, nothing restored (its backups belong "
                                     "to what was there before)" for m in gone]
    if not chosen:
        lock = facts.state.lock if facts.state else None
        stale = lock is not None and lock.stale
        rp.status = "change" if rp.interrupted or stale or gone else "noop"
        rp.message = ("interrupted deploy will be repaired" if rp.interrupted else
                     f"a stale lock ({lock.holder()}) will be cleared" if lock is not None and stale
                     else "; ".join(notes) if notes else
                     (f"deploy {to} is already rolled back" if to else "nothing to roll back"))
        return rp
    rp.deploy_ids = [m.id for m in chosen]
    refused = _restore_rows(rp, chosen, force)
    if refused:
        rp.status = "refused"
        rp.message = f"{h.name}: {refused[0]}; rerun with --force to overwrite it (a copy is kept)"
    else:
        rp.status = "change"
        rp.message = "; ".join(notes + loose_note)
    return rp


def plan_rollback(fleet: Fleet, gathered: Gathered, to: str | None, force: bool, *, old_tree: bool = False,
                  from_pristine: bool = False, playbook: Playbook | None = None) -> list[RollbackPlan]:
    plans = []
    for h in fleet.hosts:
        plans.append(_plan_host(h, gathered, to, force, old_tree=old_tree, from_pristine=from_pristine,
                                playbook=playbook))
    _plan_shared_trees(plans, gathered, [h.name for h in fleet.hosts])
    from fleetctl.plan.trees import lane_key

    inv = {h.name: h for h in fleet.hosts}
    for rp in plans:
        rp.lane = lane_key(inv[rp.host], gathered.facts.get(rp.host))
    return plans


def _plan_shared_trees(plans: list[RollbackPlan], gathered: Gathered, order: list[str]) -> None:
    """Hosts on one package tree (fleetctl/plan/trees.py) roll it back once: the first that has something
    to undo (else the first) does; the others report its transaction."""
    from fleetctl.plan.trees import group_trees

    groups = group_trees(order, gathered.facts)
    by_name = {rp.host: rp for rp in plans}
    done: set[int] = set()
    for g in groups.values():
        if id(g) in done or len(g.members) < 2:
            continue
        done.add(id(g))
        members = [by_name[m] for m in g.members]
        if any(rp.pristine_version is not None for rp in members):
            continue  # --from-pristine: each host's own plan (the files are checked under the lock)
        ok = [rp for rp in members if rp.status in ("change", "noop")]
        if not ok:
            continue
        owner = next((rp for rp in ok if rp.deploy_ids), ok[0])
        for rp in members:
            rp.tree_members = list(g.members)
            if rp is owner or rp.status not in ("change", "noop"):
                continue
            rp.tree_owner = owner.host
            rp.status, rp.deploy_ids, rp.files = owner.status, list(owner.deploy_ids), owner.files
            rp.records_dir = owner.records_dir
            said = f"shares its package tree {g.tree.real} with {owner.host}: rolled back once, by {owner.host}"
            rp.message = f"{said}; {owner.message}" if owner.message else said


def _plan_from_pristine(rp: RollbackPlan, host: str, facts: HostFacts, loose: list[str],
                        pristine: dict[str, str] | None, why_not: str, playbook: Playbook | None) -> None:
    """rollback --from-pristine: put the release's pristine bytes back into the files that differ from
    them with no record (a deploy whose state dir is gone); recorded deploys are left to a plain rollback."""
    if pristine is None:
        rp.status = "refused"
        rp.message = f"{host}: no pristine bytes for sglang {facts.package_version}: {why_not}"
        return
    rp.pristine_version = facts.package_version
    rp.package_dir = facts.package_dir
    stated = {f.path: f.sha256 for f in (playbook.files_for(facts.package_version or "") or [])} if playbook else {}
    if loose and playbook is None:
        rp.status = "refused"
        rp.message = (f"{host}: {len(loose)} file(s) differ from sglang {facts.package_version}'s pristine bytes with no "
                     f"record ({', '.join(loose[:3])}{', ...' if len(loose) > 3 else ''}); --from-pristine writes only the "
                     "files a playbook patches, where they hold its patched bytes: name it with -p PLAYBOOK")
        return
    others = [rel for rel in loose if rel not in stated]
    loose = [rel for rel in loose if rel in stated]
    intended = None
    try:
        from fleetctl.plan.intended import intended_for

        intended = intended_for(playbook, facts.package_version or "") if playbook else None
    except Exception:  # a playbook whose pristine bytes are wrong is refused when they are checked
        intended = None
    if intended:
        foreign = [rel for rel in loose if rel in intended and facts.files[rel].sha256 != intended[rel].sha_intended]
        if foreign:
            rp.status = "refused"
            rp.message = (f"{host}: {', '.join(foreign)} hold(s) neither sglang {facts.package_version}'s bytes nor "
                         f"{playbook.name if playbook else 'the playbook'}'s patched bytes of them (a checkout that moved "
                         "on, or an edit); fleetctl does not write that release's bytes over a file that is not that "
                         "release's. Nothing was changed")
            return
    left = ""
    if others:
        left = ("; " + f"{len(others)} other file(s) differ from sglang {facts.package_version}'s pristine bytes with no "
                    f"record and are left alone (not files the playbook patches): {', '.join(others[:5])}"
                    f"{', ...' if len(others) > 5 else ''}")
    for rel in loose:
        ff = facts.files[rel]
        rp.files.append({"path": rel, "deploy": None, "state": "no-record", "action": "restore-pristine",
                         "sha_now": ff.sha256, "sha_before": pristine[rel], "sha_stated": stated.get(rel)})
    rp.status = "change" if loose else "noop"
    rp.message = (f"{len(loose)} file(s) without a record will get sglang {facts.package_version}'s pristine bytes"
                 if loose else "no file the playbook patches differs from pristine without a record") + left


def apply_rollback(fleet: Fleet, plans: list[RollbackPlan], op_id: str, force: bool, *, old_tree: bool = False,
                   break_lock: set[str] | frozenset[str] = frozenset(),
                   profile: LaunchProfile | None = None,
                   then_facts: Callable[[Host], tuple[dict[str, Any], dict[str, Any]]] | None = None,
                   servers: dict[str, Any] | None = None) -> dict[str, HostRollback]:
    """Undo per host what its plan says. Hosts with nothing to do are visited too: 'nothing to roll back'
    is said only after the agent saw, under the host lock, the same deploys the plan saw. The agent
    locates sglang as the launch (`profile`, else the default one) imports it, as the plan's facts did,
    and asks that python for its pycache prefix (the restored files' cached bytecode is removed).
    then_facts / servers: as apply_plan's (fleetctl/ops/deploy.py): a host with deploys to undo also
    answers which of its servers now run older code, put in `servers` by host."""
    todo = {p.host: p for p in plans if p.status in ("change", "noop")}
    results: dict[str, HostRollback] = {}
    for p in plans:
        if p.host not in todo:
            results[p.host] = HostResult(p.host, p.status, p.message, RolledBack())
    # the pristine bytes are checked (wheel RECORD, playbook sha256) before any host is written
    pristine: dict[tuple[str, str], bytes] = {}
    for p in todo.values():
        for f in p.files:
            if f["action"] == "restore-pristine":
                key = (p.pristine_version or "", f["path"])
                if key not in pristine:
                    pristine[key] = wheels.verified_pristine(key[0], key[1], f.get("sha_stated"))

    riders = {n: p for n, p in todo.items() if p.tree_owner is not None}
    for n in riders:
        del todo[n]

    def one(conn: Transport) -> HostRollback:
        p = todo[conn.host.name]
        extra: dict[str, Any] = {"break_lock": True} if conn.host.name in break_lock else {}
        if fleet.wait_lock:
            extra["wait_lock"] = fleet.wait_lock
        if p.records_dir:  # undone where it was recorded: beside the shared tree (fleetctl/plan/trees.py)
            extra["shared_tree"] = p.tree or True
        extra["launch"] = host_launch_spec(conn.host, profile).to_agent()
        if p.pristine_version is not None:
            return _restore_pristine(conn, p, op_id, pristine, extra)
        disc = None
        if then_facts is not None and servers is not None and p.deploy_ids:
            extra["then_facts"], disc = then_facts(conn.host)
        from fleetctl.plan.trees import lane, lane_key

        with lane(p.lane or lane_key(conn.host, None)):  # (another inventory entry for this machine and state dir: one at a time)
            res: RollbackAnswer = conn.agent(names.ROLLBACK, {
                "state_dir": p.records_dir or conn.host.state_dir, "deploy_ids": p.deploy_ids, "force": force,
                "rollback_id": op_id, "by": who(), "engine": engine().agent_facts(),
                "package_dir": conn.host.sglang_dir, "expect_live": p.expect_live, "old_tree": old_tree,
                "entry": conn.host.name, **extra},
                timeout=lock_bound(conn, float(extra.get("wait_lock") or 0)))
        restored = [f for r in res.rollbacks for f in r.files if f.action in ("restored", "removed")]
        bad = [f for r in res.rollbacks for f in r.files if f.action == "refused"]
        msg = (f"{len(restored)} file(s) restored from {', '.join(p.deploy_ids)}" if p.deploy_ids else
               "; ".join(res.notes) or "nothing to roll back (checked under the host lock)")
        changed = bool(p.deploy_ids) or bool(res.notes)
        if disc is not None and servers is not None:
            from fleetctl.ops.discover import servers_after

            servers[conn.host.name] = servers_after(conn.host.name, res, disc)
        return HostResult(conn.host.name, "failed" if bad else ("changed" if changed else "unchanged"),
                          msg if not bad else f"{bad[0].path}: {bad[0].why}",
                          RolledBack(list(res.notes), to_json(res.rollbacks)))

    for o in fleet.run(one, [h for h in fleet.hosts if h.name in todo]):
        results[o.host] = o.detail if o.ok else o.carry(RolledBack())
    for n, p in riders.items():
        own = results.get(p.tree_owner or "")
        if own is None:
            results[n] = HostResult(n, "skipped", f"its tree is rolled back by {p.tree_owner}", RolledBack())
            continue
        said = f"the tree it shares with {p.tree_owner}"
        results[n] = HostResult(n, own.status if own.status in ("changed", "unchanged", "refused") else "failed",
                                f"{said}: rolled back once, by {p.tree_owner}: {own.message}",
                                RolledBack(list(own.detail.notes)))
    return results


def _restore_pristine(conn: Transport, p: RollbackPlan, op_id: str, pristine: dict[tuple[str, str], bytes],
                      extra: dict[str, Any]) -> HostRollback:
    """One transaction like a deploy's (lock, backups of the bytes there now, manifest, atomic swaps,
    re-hash), whose target is the pristine bytes; its record is closed as `restored-pristine`."""
    files = [{"path": f["path"], "sha_before": f["sha_now"], "sha_after": f["sha_before"],
              "content": pristine[(p.pristine_version or "", f["path"])]}
             for f in p.files if f["action"] == "restore-pristine"]
    res: DeployAnswer = conn.agent(names.DEPLOY, {
        "state_dir": conn.host.state_dir, "deploy_id": op_id, "kind": "restore-pristine",
        "package_dir": p.package_dir, "version": p.pristine_version, "by": who(), "host": conn.host.name,
        "files": files, "verify_paths": [f["path"] for f in files], **extra},
        timeout=lock_bound(conn, float(extra.get("wait_lock") or 0)))
    final = res.final
    bad = [f"{f['path']} hashes {(final.get(f['path']) or 'missing')[:12]}, expected {f['sha_after'][:12]}"
           for f in files if final.get(f["path"]) != f["sha_after"]]
    if bad:
        return HostResult(conn.host.name, "failed", "verification failed: " + "; ".join(bad),
                          RolledBack(list(res.notes)))
    return HostResult(conn.host.name, "changed" if files else "unchanged",
                      f"{len(files)} file(s) restored to pristine sglang {p.pristine_version} (record {op_id})"
                      if files else "; ".join(res.notes) or "nothing to restore",
                      RolledBack(list(res.notes)))
