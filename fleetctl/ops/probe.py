"""Each host's own SGLang asked about each launch instance (`explain --probe`, and deploy's coverage
check on hosts whose inventory says `probe: true`). A fact gathered before the pure plan: the plan
reads the answers, it does not ask."""

from __future__ import annotations

from typing import Any

from fleetctl.config.playbook_model import Playbook
from fleetctl.engines import engine
from fleetctl.errors import ProbeInputError
from fleetctl.model.facts import read_facts
from fleetctl.model.instances import flag_argv, plan_instances
from fleetctl.ops.runner import Fleet, HostOutcome

COULD_NOT = "the host's SGLang could not be asked"  # (how the engine's probe_compare says so)


def probe_host(conn: Any, pb: Playbook) -> list[dict[str, Any]]:
    """Per launch instance of this host: the host's SGLang's answer and the verdict against the table."""
    from fleetctl.plan.intended import intended_data

    facts = read_facts(conn, extra_files=[], profile=pb.launch)
    # asked with the playbook's files as deploy writes them (before a deploy too): a flag the patch
    # adds is known, and the answer is about the code the launch will run
    overlay = intended_data(pb, facts.package_version) if facts.package_version else {}
    out: list[dict[str, Any]] = []
    for inst in plan_instances(conn.host, pb.launch):
        row: dict[str, Any] = {"instance": inst.name}
        try:
            hw = engine().probe_hardware(facts.gpus, inst.gpus)
        except ProbeInputError as e:
            row.update(agrees=None, line=f"{COULD_NOT}: {e}", probe=None)
            out.append(row)
            continue
        assert inst.launch is not None
        ans = engine().probe_host(conn, inst.launch.to_agent(), flag_argv(inst.flags), hw, overlay=overlay or None)
        version = ans.package_version or facts.package_version or "?"
        table = engine().resolve_worker(version, dict(inst.flags), dict(inst.launch.effective_env))
        agrees, said = engine().probe_compare(table, ans)
        row["overlay"] = sorted(overlay)  # the playbook's files the host's SGLang was asked with
        row.update(agrees=agrees, line=said, probe={
            "stage": ans.stage, "version": ans.package_version, "worker_class": ans.worker_class,
            "worker_file": ans.worker_file, "error": ans.error, "error_where": ans.error_where,
            "disable_overlap_schedule": ans.disable_overlap_schedule, "answered": ans.answered,
            "standin": ans.standin, "elapsed": ans.elapsed,
            "failed": ans.stage in ("import_failed", "probe_failed") or (agrees is None and said.startswith(COULD_NOT))})
        out.append(row)
    return out


def ask_hosts(fleet: Fleet, pb: Playbook, hosts: list[Any]) -> dict[str, HostOutcome]:
    """probe_host on these hosts (in parallel, each bounded by the probe's own timeout)."""
    if not hosts:
        return {}
    return {o.host: o for o in fleet.run(lambda c: probe_host(c, pb), hosts=hosts)}


def refusal(outcome: HostOutcome) -> str | None:
    """The one line that refuses a host after its probe (explain --probe and deploy say the same):
    the first disagreement with the table, or why the host's SGLang could not be asked; None if it
    agreed (or the table does not know the release and the probe answered)."""
    if not outcome.ok:
        return f"{COULD_NOT}: {outcome.message}"
    disagree = engine().probe_disagree
    for p in outcome.detail:
        if p["agrees"] is False:
            return p["line"] if p["line"].startswith(disagree) else f"{disagree}: {p['line']}"
        if p["agrees"] is None and (p["probe"] is None or p["probe"]["failed"]):
            return str(p["line"])
    return None
