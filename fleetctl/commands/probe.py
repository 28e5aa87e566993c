"""`explain --probe`: each host's own SGLang asked about each launch instance, next to the table's answer."""

from __future__ import annotations

from typing import Any

from fleetctl.config.playbook import Playbook
from fleetctl.engine import engine
from fleetctl.errors import ProbeInputError
from fleetctl.facts import read_facts
from fleetctl.instances import flag_argv, plan_instances


def probe_host(conn: Any, pb: Playbook) -> list[dict[str, Any]]:
    """Per launch instance of this host: the host's SGLang's answer and the verdict against the table."""
    facts = read_facts(conn, extra_files=[], profile=pb.launch)
    out: list[dict[str, Any]] = []
    for inst in plan_instances(conn.host, pb.launch):
        row: dict[str, Any] = {"instance": inst.name}
        try:
            hw = engine().probe_hardware(facts.gpus, inst.gpus)
        except ProbeInputError as e:
            row.update(agrees=None, line=f"the host's SGLang could not be asked: {e}", probe=None)
            out.append(row)
            continue
        assert inst.launch is not None
        ans = engine().probe_host(conn, inst.launch.to_agent(), flag_argv(inst.flags), hw)
        version = ans.package_version or facts.package_version or "?"
        table = engine().resolve_worker(version, dict(inst.flags), dict(inst.launch.effective_env))
        agrees, said = engine().probe_compare(table, ans)
        row.update(agrees=agrees, line=said, probe={
            "stage": ans.stage, "version": ans.package_version, "worker_class": ans.worker_class,
            "worker_file": ans.worker_file, "error": ans.error, "error_where": ans.error_where,
            "disable_overlap_schedule": ans.disable_overlap_schedule, "answered": ans.answered,
            "standin": ans.standin, "elapsed": ans.elapsed, "failed": ans.stage in ("import_failed", "probe_failed")})
        out.append(row)
    return out


def add_probe_answers(ctx: Any, pb: Playbook, gathered: Any, rows: list[dict[str, Any]]) -> None:
    """Ask the hosts that answered facts; a disagreement, or a probe that could not run, refuses the host."""
    ok_hosts = [h for h in ctx.fleet.hosts if gathered.outcomes[h.name].ok]
    outcomes = {o.host: o for o in ctx.fleet.run(lambda c: probe_host(c, pb), hosts=ok_hosts)}
    disagree = engine().probe_disagree
    for r in rows:
        o = outcomes.get(r["host"])
        if o is None:
            continue
        if not o.ok:
            r["refused"] = r.get("refused") or f"the host's SGLang could not be asked: {o.message}"
            continue
        r["probe"] = o.data
        notes = r.setdefault("notes", [])
        for p in o.data:
            notes.append(f"probe {p['instance']}: {p['line']}")
            if p["agrees"] is False and not r.get("refused"):
                r["refused"] = p["line"] if p["line"].startswith(disagree) else f"{disagree}: {p['line']}"
            elif p["agrees"] is None and (p["probe"] is None or p["probe"]["failed"]) and not r.get("refused"):
                r["refused"] = p["line"]
