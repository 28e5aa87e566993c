"""gpu-check once its options are parsed (declared in gpucheck.py): plan or run, render one table
(or the --json document)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fleetctl.commands.common import emit_json, err, out
from fleetctl.commands.context import playbook_fleet
from fleetctl.commands.context import run_with_progress as _tick_run
from fleetctl.errors import EXIT_FAILED, EXIT_OK
from fleetctl.model.hostnames import plural
from fleetctl.ops import runlog
from fleetctl.ui.render import say, table
from fleetctl.ui.safetext import line, styled

if TYPE_CHECKING:
    from fleetctl.ops.gpu_check import CheckPlan, HostCheck
    from fleetctl.ui.safetext import Text  # (rich's, as every ui helper returns it)

STYLE = {"passed": "green", "ok": "green", "run": "green", "would run": "green", "failed": "red",
         "refused": "red", "unreachable": "red", "interrupted": "yellow", "skipped": "yellow"}


def _s(state: str) -> Text:
    return styled(state, STYLE.get(state, "white"))


def gpu_check(*, playbook: Path, inventory: Path | None, limit: str | None, forks: int, timeout: float | None,
              check: bool, json_out: bool, debug: bool, accept_new_host_keys: bool) -> None:
    with playbook_fleet(playbook, inventory, limit, forks, command="gpu-check", json=json_out, debug=debug,
                        accept_new_host_keys=accept_new_host_keys) as (pb, ctx):
        from fleetctl.ops import gpu_check as ops

        if check:
            plans = _tick_run(ctx, "facts", lambda: ops.plan_fleet(ctx.fleet, pb))
            bad = [p for p in plans if p.status != "run"]
            msg = (f"gpu-check --check: {plural(len(plans), 'host')}: {len(plans) - len(bad)} would run, {len(bad)} would "
                   f"not; nothing was made or started ({ctx.elapsed():.2f}s)")
            runlog.plan([p.to_json() for p in plans])
            runlog.result([p.row() for p in plans])
            if json_out:
                emit_json("gpu-check", ok=not bad, check=True, message=msg,
                          hosts=[p.row() for p in plans],
                          elapsed=round(ctx.elapsed(), 3))
            else:
                render_plan(plans)
                err.print(line(msg))
            raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)
        rows = _tick_run(ctx, "gpu-check", lambda: ops.check_fleet(ctx.fleet, pb, timeout=timeout))
        bad = [r for r in rows if not r.ok]
        summary = (f"gpu-check: {plural(len(rows), 'host')}: {len(rows) - len(bad)} passed, {len(bad)} not "
                   f"in {ctx.elapsed():.2f}s")
        runlog.result([r.row() for r in rows])
        if json_out:
            emit_json("gpu-check", ok=not bad, message=summary,
                      hosts=[r.row() for r in rows],
                      summary={"passed": len(rows) - len(bad)}, elapsed=round(ctx.elapsed(), 3))
        else:
            render_results(rows)
            err.print(line(summary))
        raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


def render_plan(plans: list[CheckPlan]) -> None:
    t = table("gpu-check --check", ["host", "version", "GPU", "torch", "threshold", "concurrency", "plan"])
    for p in plans:
        st = "would run" if p.status == "run" else p.status
        gpu = f"{p.gpu['index']}: {p.gpu['name']}" if p.gpu else ""
        torch = (p.torch or {}).get("torch") or ""
        th = f"{p.threshold['value']}" if p.threshold else ""
        t.add_row(p.host, p.version or "", gpu, str(torch), th, ", ".join(map(str, p.concurrency)), _s(st))
    out.print(t)
    for p in plans:
        if p.status != "run":
            say(out, _s(p.status), " ", p.host, ": ", p.message, indent=4)
            continue
        for ph in p.phases:
            say(out, p.host, " ", ph.name, " (", ph.about, "): ", shlex.join(ph.argv), indent=4)
            say(out, "    env: ", " ".join(f"{k}={v}" for k, v in ph.env.items()) or "(none)", indent=8)
        for n in (p.phases[0].notes if p.phases else []) + p.notes:
            say(out, "    note: ", n, indent=8)


def _tok(v: Any) -> str:
    return f"{v:.0f}" if isinstance(v, (int, float)) else ""


def render_results(rows: list[HostCheck]) -> None:
    """ONE table: a row per host and server (spec-on, spec-off, dynamic), tokens/s at each concurrency."""
    concs = sorted({c for r in rows for c in r.detail.concurrency})
    t = table("gpu-check", ["host", "server", "ready in", "marker", *[f"tok/s C={c}" for c in concs], "outputs",
                            "result"])
    for r in rows:
        if not r.detail.phases:
            t.add_row(r.host, "", "", "", *["" for _ in concs], "", _s(r.status))
            continue
        same = r.detail.outputs.get("identical")
        for i, ph in enumerate(r.detail.phases):
            outputs = "" if ph.status != "ok" else ("same" if same else ("DIFFER" if same is False else ""))
            t.add_row(r.host if i == 0 else "", ph.name, f"{ph.ready_s:.0f}s" if ph.ready_s is not None else "",
                      "yes" if ph.marker else ("-" if ph.status == "ok" else ""),
                      *[_tok(ph.tok_s(c)) for c in concs], outputs,
                      _s(ph.status) if i < len(r.detail.phases) - 1 else _s(r.status))
    out.print(t)
    for r in rows:
        say(out, _s(r.status), " ", r.host, ": ", r.message or r.status, indent=4)
        dyn = next((p for p in r.detail.phases if p.name == "dynamic"), None)
        if dyn and dyn.marker:
            say(out, "    marker: ", dyn.marker[0], indent=8)
        if dyn and dyn.switches:
            say(out, "    switch: ", dyn.switches[-1], indent=8)
        for ph in r.detail.phases:
            for ln in ph.tail[-10:]:
                out.print(line("    ", ph.name, ": ", ln))
        for n in r.detail.notes:
            say(out, "    note: ", n, indent=8)
        c = r.detail.cleanup
        if c:
            stopped = ", ".join(f"{s['instance']} pid {s['pid']} ({s['how']})" for s in c.get("stopped") or []
                                if s.get("action") != "not running")
            say(out, "    cleanup: ", "removed " if c.get("removed") else "NOT removed ", str(c.get("dir")),
                f"; stopped {stopped}" if stopped else "", indent=8)
