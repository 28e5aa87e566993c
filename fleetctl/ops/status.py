"""Per host, what `fleetctl status` reports: a pure reading of the facts and manifests each host sent
(interrupted deploys, locks, moved or reinstalled trees, files patched without a record, and with a
playbook its files' plan). No I/O, no rendering."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.model.result import HostResult

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleetctl.config.hosts import Host
    from fleetctl.ops.runner import HostOutcome
    from fleetctl.plan.deploy import Plan


@dataclass
class HostState:
    """What status reads on a host (HostStatus's detail): its release, deploys, problems and notes,
    and the servers the command adds (fleetctl/commands: servers, discovered, main_process)."""

    version: str | None = None
    last_deploy: str | None = None
    files: str = ""  # with a playbook: its files' states counted ("2 as-intended")
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)  # deploys whose files are no longer on disk
    deploys: list[dict[str, Any]] = field(default_factory=list)  # {id, state}
    servers: list[dict[str, Any]] = field(default_factory=list)
    discovered: list[dict[str, Any]] = field(default_factory=list)
    main_process: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "last_deploy": self.last_deploy, "files": self.files,
                "problems": self.problems, "notes": self.notes, "gone": self.gone, "deploys": self.deploys,
                "servers": self.servers, "discovered": self.discovered,
                **({"main_process": self.main_process} if self.main_process is not None else {})}


HostStatus = HostResult[HostState]


def status_row(r: HostStatus) -> dict[str, Any]:
    """The --json row: ok when the host answered with no problem, state `problems` when it has some."""
    return r.row(ok=r.ok and not r.detail.problems, message="; ".join(r.detail.problems),
                 state="problems" if r.ok and r.detail.problems else None)


def status_rows(hosts: Sequence[Host], gathered: Any, plan: Plan | None) -> list[HostStatus]:
    from fleetctl.model import hoststate, statefiles

    rows: list[HostStatus] = []
    by_plan = {hp.host: hp for hp in plan.hosts} if plan else {}
    for h in hosts:
        o: HostOutcome = gathered.outcomes[h.name]
        if not o.ok:
            rows.append(o.carry(HostState(problems=[o.message])))
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
                problems.append(hp.message)  # (a file without a record is reported above, for every hashed file)
            states = set(counts)
            if {"pristine", "as-intended"} <= states and not interrupted:
                problems.append("mixed: some files patched, some original")
        rows.append(HostResult(h.name, "ok", "", HostState(
            f.package_version, last.id if last else None, files_desc, problems, notes, [m.id for m in gone],
            [{"id": m.id, "state": m.state} for m in deploys]), o.elapsed))
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
