"""Per host, what `fleetctl status` reports: a pure reading of the facts and manifests each host sent
(interrupted deploys, locks, moved or reinstalled trees, files patched without a record, and with a
playbook its files' plan). No I/O, no rendering."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleetctl.config.hosts import Host
    from fleetctl.ops.runner import HostOutcome
    from fleetctl.plan.deploy import Plan


def status_rows(hosts: Sequence[Host], gathered: Any, plan: Plan | None) -> list[dict[str, Any]]:
    from fleetctl.model import hoststate, statefiles

    rows = []
    by_plan = {hp.host: hp for hp in plan.hosts} if plan else {}
    for h in hosts:
        o: HostOutcome = gathered.outcomes[h.name]
        if not o.ok:
            rows.append({"host": h.name, "status": o.status, "problems": [o.message]})
            continue
        f = gathered.facts[h.name]
        problems = []
        notes = [n for n in [hoststate.foreign_note(f)] if n]
        deploys = hoststate.own(f)  # another machine's records in a shared state dir are not this host's
        interrupted = hoststate.interrupted(f)
        for m in interrupted:
            n_app = sum(1 for x in m.files if x.sha_now == x.sha_after)
            problems.append(f"interrupted deploy {m.id}: {n_app} of {len(m.files)} files patched "
                            f"(mixed); run 'fleetctl rollback' or 'fleetctl deploy' to repair")
        lock = f.state.lock if f.state else None
        if lock:
            problems.append(hoststate.lock_problem(lock))
        problems += [hoststate.moved_msg(m) for m in hoststate.live(f) if m.moved]
        problems += _container_problems(h.name, f)
        problems += [hoststate.edited_msg(*e) for e in hoststate.edited(f)]
        gone = hoststate.gone(f)
        problems += [hoststate.gone_msg(m) + "; 'fleetctl rollback' closes its record, 'fleetctl deploy' "
                     "patches again" for m in gone]
        notes += statefiles.left_behind(f)  # a playbook's config no live record tracks any more
        pristine, why_not = hoststate.release_pristine(f.package_version)
        if pristine is None:
            notes.append(f"not checked against pristine sglang: {why_not}")
        else:
            loose = hoststate.unrecorded(f, pristine)
            if loose:
                problems.append(hoststate.unrecorded_msg(h.name, f.package_version, loose))
        complete = hoststate.on_disk(f)
        last = complete[-1] if complete else None
        files_desc = ""
        hp = by_plan.get(h.name)
        if hp is not None:
            counts: dict[str, int] = {}
            for fp in hp.files:
                counts[fp.state] = counts.get(fp.state, 0) + 1
            files_desc = ", ".join(f"{n} {s}" for s, n in counts.items())
            if hp.status in ("refused", "failed") and not any(fp.state == "no-record" for fp in hp.files):
                problems.append(hp.reason)  # (a file without a record is reported above, for every hashed file)
            states = set(counts)
            if {"pristine", "as-intended"} <= states and not interrupted:
                problems.append("mixed: some files patched, some original")
        rows.append({"host": h.name, "status": "ok", "version": f.package_version,
                     "last_deploy": last.id if last else None, "files": files_desc, "problems": problems,
                     "notes": notes, "gone": [m.id for m in gone],
                     "deploys": [{"id": m.id, "state": m.state} for m in deploys]})
    return rows


def _container_problems(host: str, f: Any) -> list[str]:
    """The container was re-created since the newest deploy that recorded it (any writer's record: a
    re-created container has another hostname, so its records read as another machine's)."""
    if f.container is None:
        return []
    from fleetctl.ops.container_advice import recreated, recreated_per_ledger

    for m in reversed(f.deploys()):
        if m.kind == "deploy" and m.state == "complete" and m.container:
            line = recreated(host, f.container, m.id, m.container)
            return [line] if line else []
    line = recreated_per_ledger(host, f.container)  # (no record on the host: it may have died with it)
    return [line] if line else []
