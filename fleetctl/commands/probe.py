"""`explain --probe`: each host's own SGLang asked about each launch instance, next to the table's answer."""

from __future__ import annotations

from typing import Any

from fleetctl.config.playbook_model import Playbook
from fleetctl.model.explain import Explained
from fleetctl.model.result import HostResult
from fleetctl.ops.probe import ask_hosts, probe_host, refusal

__all__ = ["add_probe_answers", "probe_host"]


def add_probe_answers(ctx: Any, pb: Playbook, gathered: Any, rows: list[HostResult[Explained]]) -> None:
    """Ask the hosts that answered facts; a disagreement, or a probe that could not run, refuses the host."""
    ok_hosts = [h for h in ctx.fleet.hosts if gathered.outcomes[h.name].ok]
    outcomes = ask_hosts(ctx.fleet, pb, ok_hosts)
    for r in rows:
        o = outcomes.get(r.host)
        if o is None:
            continue
        if o.ok:
            r.detail.probe = o.detail
            r.detail.notes.extend(f"probe {p['instance']}: {p['line']}" + (
                f" (asked with the playbook's {', '.join(p['overlay'])} as deploy writes them)" if p.get("overlay")
                else "") for p in o.detail)
        r.detail.refused = r.detail.refused or refusal(o)
