"""deploy, rollback, status, history (and the commands other modules fill in)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from fleetctl.commands.common import (
    DEFAULT_FORKS,
    AcceptNewOpt,
    DebugOpt,
    ForksOpt,
    InventoryOpt,
    JsonOpt,
    LimitOpt,
    emit_json,
    err,
    out,
)
from fleetctl.commands.context import RunContext, fleet_context
from fleetctl.commands.context import fmt_time as _ts
from fleetctl.commands.context import run_with_progress as _tick_run
from fleetctl.config.playbook import Playbook, load_playbook
from fleetctl.errors import EXIT_FAILED, EXIT_OK, InputError
from fleetctl.fleet import HostOutcome
from fleetctl.ledger import Ledger
from fleetctl.ops.deploy import apply_plan, build_plan, gather, new_op_id
from fleetctl.ops.rollback import apply_rollback, plan_rollback
from fleetctl.plan import Plan
from fleetctl.render import status_cell, table

PlaybookArg = Annotated[Path, typer.Argument(help="Playbook YAML, or a directory holding playbook.yaml.",
                                             show_default=False)]

STATE_STYLE = {"pristine": "cyan", "as-intended": "green", "drifted": "red", "missing": "red", "unsafe": "red",
               "original": "cyan", "as-deployed": "green", "change": "cyan", "noop": "green", "refused": "red",
               "unreachable": "red", "failed": "red", "changed": "green", "unchanged": "green",
               "skipped": "yellow", "ok": "green", "rolled-back": "yellow", "untouched": "yellow"}


def _s(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"




def render_plan(plan: Plan) -> None:
    t = table("plan", ["host", "SGLang", "file", "state", "action", "note"])
    for hp in plan.hosts:
        if not hp.files:
            t.add_row(hp.host, hp.version or "", "", "", _s(hp.status), hp.reason)
            continue
        for i, fp in enumerate(hp.files):
            t.add_row(hp.host if i == 0 else "", (hp.version or "") if i == 0 else "", fp.path, _s(fp.state),
                      fp.action, fp.note)
        if hp.coverage is not None:
            c = hp.coverage
            t.add_row("", "", "(worker that will run)", "covered" if c.covered else "[red]NOT covered[/]",
                      "refuse" if c.refused else "", c.reason)
        if hp.interrupted:
            t.add_row("", "", "(interrupted deploy)", _s("drifted"), "repair", hp.reason)
    out.print(t)
    for hp in plan.hosts:
        if hp.status in ("refused", "unreachable", "failed"):
            out.print(f"[red]{hp.status}[/] {hp.reason}")


def _udiff(a: bytes, b: bytes, la: str, lb: str) -> str:
    ta = a.decode("utf-8", "replace").splitlines(keepends=True)
    tb = b.decode("utf-8", "replace").splitlines(keepends=True)
    return "".join(difflib.unified_diff(ta, tb, la, lb))


def print_diffs(ctx: RunContext, plan: Plan) -> None:
    """Unified diffs, no size limit: remote vs intended; for drifted files also remote vs pristine."""
    from fleetctl import wheels

    for hp in plan.hosts:
        if not hp.files or hp.version not in plan.intended:
            continue
        it = plan.intended[hp.version]
        drifted = [f.path for f in hp.files if f.state == "drifted"]
        remote: dict[str, bytes | None] = {}
        if drifted:
            import base64

            host = next(h for h in ctx.fleet.hosts if h.name == hp.host)
            got = ctx.fleet.connection(host).agent("read_files", {"package_dir": hp.package_dir, "paths": drifted})
            remote = {k: (base64.b64decode(v) if v is not None else None) for k, v in got.items()}
        for fp in hp.files:
            if fp.state == "pristine":
                now = wheels.pristine_bytes(hp.version or "", fp.path)
            elif fp.state == "drifted":
                now = remote.get(fp.path) or b""
            else:
                continue
            label = f"{hp.host}:{fp.path}"
            out.print(_udiff(now, it[fp.path].data, f"{label} (on host)", f"{label} (intended)"),
                      markup=False, highlight=False)
            if fp.state == "drifted":
                pristine = wheels.pristine_bytes(hp.version or "", fp.path)
                out.print(_udiff(pristine, now, f"{label} (pristine {hp.version})", f"{label} (on host)"),
                          markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("deploy", help="Patch every host to the playbook's intended files: plan, backup, atomic swap, verify.")
    def deploy(
        playbook: PlaybookArg,
        inventory: InventoryOpt = None,
        limit: LimitOpt = None,
        forks: ForksOpt = DEFAULT_FORKS,
        check: bool = typer.Option(False, "--check", help="Show the plan and change nothing."),
        diff: bool = typer.Option(False, "--diff", help="Print unified diffs (remote vs intended; drifted: also vs pristine)."),
        force: bool = typer.Option(False, "--force", help="Replace drifted files too (their bytes are backed up)."),
        allow_uncovered: bool = typer.Option(False, "--allow-uncovered", help="Deploy even where the worker that will run is not patched."),
        restart: bool = typer.Option(False, "--restart", help="Rolling restart: per batch patch -> restart -> ready -> verify-logs."),
        serial: str | None = typer.Option(None, "--serial", help="With --restart: hosts per batch, N or P% (default: all at once)."),
        canary: str | None = typer.Option(None, "--canary", help="With --restart: size of the first batch, N or P%."),
        max_fail: str = typer.Option("0%", "--max-fail", help="With --restart: failed hosts a batch may have (P%) before the rollout stops and that batch is rolled back."),
        ready_timeout: float | None = typer.Option(None, "--timeout", min=0.1, help="With --restart: seconds to wait for each server to be ready."),
        json_out: JsonOpt = False,
        debug: DebugOpt = False,
        accept_new_host_keys: AcceptNewOpt = False,
    ) -> None:
        from fleetctl.ops.rolling import parse_count, parse_percent

        if (serial or canary) and not restart:
            raise InputError("--serial and --canary go with --restart", hint="add --restart")
        budget = parse_percent(max_fail, "--max-fail")
        pb = load_playbook(playbook)
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, pb))
            plan = build_plan(ctx.fleet, pb, gathered, force=force, allow_uncovered=allow_uncovered)
            if not json_out:
                render_plan(plan)
                if diff:
                    print_diffs(ctx, plan)
            bad_plan = [hp for hp in plan.hosts if hp.status in ("refused", "unreachable", "failed")]
            if check:
                if json_out:
                    emit_json({"command": "deploy", "check": True, "plan": plan.to_json(),
                               "elapsed": round(ctx.elapsed(), 3)})
                else:
                    n = sum(1 for hp in plan.hosts if hp.status == "change")
                    err.print(f"deploy --check: {len(plan.hosts)} hosts: {n} would change, "
                              f"{sum(1 for hp in plan.hosts if hp.status == 'noop')} as intended, "
                              f"{len(bad_plan)} refused/unreachable; nothing was changed ({ctx.elapsed():.2f}s)")
                raise typer.Exit(EXIT_FAILED if bad_plan else EXIT_OK)
            if restart:
                n = len(ctx.fleet.hosts)
                _rolling(ctx, pb, plan, parse_count(serial, n, "--serial"), parse_count(canary, n, "--canary"),
                         budget, ready_timeout, limit)
            op_id = new_op_id("d")
            ledger = Ledger()
            ledger.start(op_id, "deploy", inventory=ctx.inventory.path, playbook=pb.path,
                         args={"limit": limit, "force": force, "allow_uncovered": allow_uncovered})
            results = _tick_run(ctx, "deploy", lambda: apply_plan(ctx.fleet, plan, pb, op_id))
            rows = [results[h.name] for h in ctx.fleet.hosts if h.name in results]
            failed = [r for r in rows if r.status not in ("changed", "unchanged")]
            ledger.finish(op_id, "failed" if failed else "ok", [r.to_json() for r in rows])
            ledger.close()
            elapsed = ctx.elapsed()
            counts = {st: sum(1 for r in rows if r.status == st)
                      for st in ("changed", "unchanged", "refused", "unreachable", "failed")}
            summary = (f"deploy {op_id}: {len(rows)} hosts: "
                       + ", ".join(f"{n} {st}" for st, n in counts.items() if n or st in ("changed", "failed"))
                       + f" in {elapsed:.2f}s")
            if json_out:
                emit_json({"command": "deploy", "deploy_id": op_id, "plan": plan.to_json(),
                           "results": [r.to_json() for r in rows], "summary": summary, "elapsed": round(elapsed, 3)})
            else:
                t = table("result", ["host", "status", "deploy id", "what"])
                for r in rows:
                    t.add_row(r.host, _s(r.status), r.deploy_id or "", r.message + "".join(f"\n{n}" for n in r.notes))
                out.print(t)
                err.print(summary, markup=False)
            raise typer.Exit(EXIT_FAILED if failed else EXIT_OK)

    @app.command("rollback", help="Restore each host's files to their bytes before its last (or a named) deploy.")
    def rollback(
        inventory: InventoryOpt = None,
        limit: LimitOpt = None,
        forks: ForksOpt = DEFAULT_FORKS,
        to: str | None = typer.Option(None, "--to", help="Undo this deploy id and every later one on each host."),
        check: bool = typer.Option(False, "--check", help="Show what would be restored and change nothing."),
        force: bool = typer.Option(False, "--force", help="Restore files changed since the deploy too (a copy is kept)."),
        json_out: JsonOpt = False,
        debug: DebugOpt = False,
        accept_new_host_keys: AcceptNewOpt = False,
    ) -> None:
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, None))
            plans = plan_rollback(ctx.fleet, gathered, to, force)
            if not json_out:
                t = table("rollback plan", ["host", "deploys to undo", "file", "state", "action", "note"])
                for p in plans:
                    if not p.files:
                        t.add_row(p.host, ", ".join(p.deploy_ids), "", "", _s(p.status), p.reason)
                    for i, f in enumerate(p.files):
                        t.add_row(p.host if i == 0 else "", ", ".join(p.deploy_ids) if i == 0 else "", f["path"],
                                  _s(f["state"]), f["action"], p.reason if i == 0 and p.status == "refused" else "")
                out.print(t)
            bad = [p for p in plans if p.status in ("refused", "unreachable", "failed")]
            if check:
                if json_out:
                    emit_json({"command": "rollback", "check": True, "plan": [p.to_json() for p in plans]})
                else:
                    for p in bad:
                        out.print(f"[red]{p.status}[/] {p.reason}")
                raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)
            op_id = new_op_id("r")
            ledger = Ledger()
            ledger.start(op_id, "rollback", inventory=ctx.inventory.path, playbook=None,
                         args={"limit": limit, "to": to, "force": force})
            results = _tick_run(ctx, "rollback", lambda: apply_rollback(ctx.fleet, plans, op_id, force))
            rows = [results[h.name] for h in ctx.fleet.hosts]
            failed = [r for r in rows if r["status"] not in ("changed", "unchanged", "skipped")]
            ledger.finish(op_id, "failed" if failed else "ok", rows)
            ledger.close()
            summary = (f"rollback {op_id}: {len(rows)} hosts: {sum(1 for r in rows if r['status'] == 'changed')} "
                       f"restored, {sum(1 for r in rows if r['status'] in ('unchanged', 'skipped'))} nothing to do, "
                       f"{len(failed)} failed in {ctx.elapsed():.2f}s")
            if json_out:
                emit_json({"command": "rollback", "rollback_id": op_id, "plan": [p.to_json() for p in plans],
                           "results": rows, "summary": summary})
            else:
                t = table("result", ["host", "status", "what"])
                for r in rows:
                    t.add_row(r["host"], _s(r["status"]), r.get("message", "") + "".join(f"\n{n}" for n in r.get("notes", [])))
                out.print(t)
                err.print(summary, markup=False)
            raise typer.Exit(EXIT_FAILED if failed else EXIT_OK)

    @app.command("status", help="Per host: deploy state of the playbook's files, interrupted deploys, lock, servers.")
    def status(
        playbook: Annotated[Path | None, typer.Argument(help="Optional playbook: also classify its files.")] = None,
        inventory: InventoryOpt = None,
        limit: LimitOpt = None,
        forks: ForksOpt = DEFAULT_FORKS,
        json_out: JsonOpt = False,
        debug: DebugOpt = False,
        accept_new_host_keys: AcceptNewOpt = False,
    ) -> None:
        from fleetctl.facts import read_facts
        from fleetctl.ops.deploy import Gathered
        from fleetctl.ops.launch import server_status_facts

        pb: Playbook | None = load_playbook(playbook) if playbook else None
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            extra = sorted({f.path for files in (pb.versions.values() if pb else []) for f in files})
            outs = _tick_run(ctx, "facts", lambda: ctx.fleet.run(
                lambda c: read_facts(c, extra_files=extra, with_=["state", "servers"], gpus=False,
                                     profile=pb.launch if pb else None)))
            gathered = Gathered({o.host: o.data for o in outs if o.ok}, {o.host: o for o in outs})
            plan = build_plan(ctx.fleet, pb, gathered, allow_uncovered=True) if pb else None
            rows = status_rows(ctx, gathered, plan)
            servers = [s for o in outs if o.ok for s in server_status_facts(o.host, o.data)]
            for r in rows:
                r["servers"] = [s for s in servers if s["host"] == r["host"]]
                r["problems"] += [f"{s['instance']}: {p}" for s in r["servers"] for p in s["problems"]]
            problems = [r for r in rows if r["problems"]]
            if json_out:
                emit_json({"command": "status", "hosts": rows, "elapsed": round(ctx.elapsed(), 3)})
            else:
                t = table(None, ["host", "status", "SGLang", "last deploy", "files", "problems"])
                for r in rows:
                    t.add_row(r["host"], status_cell(r["status"]), r.get("version") or "",
                              r.get("last_deploy") or "", r.get("files") or "", "\n".join(r["problems"]))
                out.print(t)
                if servers:
                    st = table("servers", ["host", "instance", "running", "since", "port", "worker",
                                           "deploy at launch", "deploy on disk", "restart needed"])
                    for sv in servers:
                        st.add_row(sv["host"], sv["instance"], "[green]yes[/]" if sv["running"] else "no",
                                   _ts(sv["since"]), str(sv["port"] or ""), sv["worker"] or "",
                                   sv["deploy_at_launch"] or "-", sv["deploy_now"] or "-",
                                   "[red]YES[/]" if sv["restart_needed"] else "no")
                    out.print(st)
                err.print(f"status: {len(rows)} hosts, {len(problems)} with problems, "
                          f"{sum(1 for sv in servers if sv['running'])} server(s) running ({ctx.elapsed():.2f}s)",
                          markup=False)
            raise typer.Exit(EXIT_FAILED if problems else EXIT_OK)

    @app.command("history", help="The local ledger of deploys and rollbacks; 'history ID' shows one.")
    def history(
        op_id: Annotated[str | None, typer.Argument(help="An operation id to show in full.")] = None,
        limit_rows: int = typer.Option(30, "--last", help="How many operations to list."),
        json_out: JsonOpt = False,
    ) -> None:
        ledger = Ledger()
        try:
            if op_id:
                d = ledger.get(op_id)
                if d is None:
                    raise InputError(f"no operation {op_id} in {ledger.path}", hint="run 'fleetctl history' to list ids")
                if json_out:
                    emit_json(d)
                    raise typer.Exit(0)
                out.print(f"{d['kind']} {d['id']} by {d['user']}@{d['controller']} at {_ts(d['started'])}: {d['outcome']}")
                out.print(f"inventory {d['inventory']} (sha256 {str(d['inventory_sha256'])[:12]})")
                if d["playbook"]:
                    out.print(f"playbook  {d['playbook']} (sha256 {str(d['playbook_sha256'])[:12]})")
                t = table(None, ["host", "status", "message"])
                for h in d["hosts"]:
                    t.add_row(h["host"], _s(h["status"]), h["message"] or "")
                out.print(t)
            else:
                rows = ledger.list(limit_rows)
                if json_out:
                    emit_json({"ledger": str(ledger.path), "operations": rows})
                    raise typer.Exit(0)
                t = table(f"history ({ledger.path})", ["id", "kind", "started", "user", "hosts", "failed", "outcome"])
                for r in rows:
                    t.add_row(r["id"], r["kind"], _ts(r["started"]), r["user"], str(r["hosts"]), str(r["hosts_failed"]),
                              _s(r["outcome"] or "running"))
                out.print(t)
        finally:
            ledger.close()

    @app.command("explain", help="Say per host which SGLang worker class and file will run, and whether the playbook patches it.")
    def explain(
        playbook: PlaybookArg,
        inventory: InventoryOpt = None,
        limit: LimitOpt = None,
        forks: ForksOpt = DEFAULT_FORKS,
        json_out: JsonOpt = False,
        debug: DebugOpt = False,
        accept_new_host_keys: AcceptNewOpt = False,
    ) -> None:
        from fleetctl.coverage import coverage, host_coverage, instances, launch_env, launch_flags

        pb = load_playbook(playbook)
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, pb))
            rows: list[dict[str, Any]] = []
            for h in ctx.fleet.hosts:
                o = gathered.outcomes[h.name]
                if not o.ok:
                    rows.append({"host": h.name, "status": o.status, "reason": o.message, "covered": None,
                                 "worker_class": None, "worker_file": None, "disable_overlap_schedule": None})
                    continue
                f = gathered.facts[h.name]
                cov = host_coverage(h, f, pb)
                env = launch_env(h, pb)
                row: dict[str, Any] = {
                    "host": h.name, "status": "ok", "version": f.sglang_version,
                    "spec_v2_env": env.get("SGLANG_ENABLE_SPEC_V2", None),
                    "flags": {k: v for k, v in launch_flags(h, pb).items() if "speculative" in k or "overlap" in k},
                    "worker_class": cov.worker_class if cov else None,
                    "worker_file": cov.worker_file if cov else None,
                    "disable_overlap_schedule": cov.disable_overlap_schedule if cov else None,
                    "covered": cov.covered if cov else None,
                    "reason": cov.reason if cov else (f.sglang_error or "SGLang not found by the launch's python"),
                    "refused": cov.refused if cov else (f.sglang_error or "SGLang not found by the launch's python"),
                }
                if f.sglang_version:
                    row["instances"] = []
                    for inst in instances(h, pb):
                        ic = coverage(f.sglang_version, dict(inst.flags), dict(inst.effective_env), pb)
                        row["instances"].append({"instance": inst.name, "gpus": list(inst.gpus), "port": inst.port,
                                                 "worker_class": ic.worker_class, "worker_file": ic.worker_file,
                                                 "disable_overlap_schedule": ic.disable_overlap_schedule,
                                                 "covered": ic.covered, "reason": ic.reason, "refused": ic.refused})
                # the code import would load for the worker file, not only its source (bytecode)
                bc = f.bytecode_problem(cov.worker_file) if cov and cov.worker_file else None
                row["bytecode"] = bc
                row["notes"] = list(f.sglang_notes)
                if bc and (f.bytecode.get(cov.worker_file or "") or {}).get("loader") != "source":
                    row["refused"] = row["refused"] or bc
                elif bc:
                    row["notes"].append(f"{bc}: deploy removes it when it patches the file")
                for pf in pb.files_for(f.sglang_version or "") or []:
                    other = f.bytecode_problem(pf.path) if pf.path != (cov.worker_file if cov else None) else None
                    if other:
                        row["notes"].append(other)
                if f.sglang_version and pb.files_for(f.sglang_version) is None:
                    row["refused"] = (f"SGLang {f.sglang_version} has no patch set in {pb.path.name}; "
                                      f"supported: {', '.join(pb.supported())}")
                rows.append(row)
            bad = [r for r in rows if r["status"] != "ok" or r.get("refused")]
            if json_out:
                emit_json({"command": "explain", "playbook": str(pb.path), "hosts": rows})
            else:
                for r in rows:
                    if r["status"] != "ok":
                        out.print(f"{r['host']}: [red]{r['status']}[/] {escape(r['reason'])}")
                        continue
                    mark = "[green]ok[/]" if not r.get("refused") else "[red]REFUSED[/]"
                    insts = r.get("instances") or []
                    where = f" ({len(insts)} instances, each alike)" if len(insts) > 1 and all(
                        i["reason"] == insts[0]["reason"] for i in insts) else ""
                    out.print(f"{r['host']}{where}: {escape(r['reason'])} [{mark}]")
                    if len(insts) > 1 and not where:
                        for i in insts:
                            out.print(f"  {i['instance']} (GPUs {','.join(map(str, i['gpus']))}): {escape(i['reason'])}")
                    if r.get("refused") and r["refused"] != r["reason"]:
                        out.print(f"  {r['refused']}", markup=False, highlight=False)
                    for n in r.get("notes") or []:
                        out.print(f"  note: {n}", markup=False, highlight=False)
            raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


def _rolling(ctx: RunContext, pb: Playbook, plan: Plan, serial: int | None, canary: int | None, budget: float,
             ready_timeout: float | None, limit: str | None) -> None:
    from fleetctl.ops.rolling import rolling_deploy

    def progress(bi: int, rows: dict[str, Any]) -> None:
        if not ctx.json:
            bad = sum(1 for r in rows.values() if r.status != "ok")
            err.print(f"batch {bi}: {len(rows)} host(s), {bad} failed", markup=False)

    ledger = Ledger()
    res = rolling_deploy(ctx.fleet, pb, plan, serial=serial, canary=canary, max_fail=budget,
                         ready_timeout=ready_timeout, progress=progress)
    ledger.start(res.deploy_id, "deploy --restart", inventory=ctx.inventory.path, playbook=pb.path,
                 args={"limit": limit, "serial": serial, "canary": canary, "max_fail": budget})
    ledger.finish(res.deploy_id, "ok" if res.ok else "failed", [h.to_json() for h in res.hosts])
    ledger.close()
    summary = (f"deploy --restart {res.deploy_id}: {len(res.batches)} batch(es), "
               + ", ".join(f"{sum(1 for h in res.hosts if h.status == st)} {st}"
                           for st in ("ok", "failed", "unreachable", "refused", "rolled-back", "untouched")
                           if any(h.status == st for h in res.hosts))
               + (f"; stopped at batch {res.stopped_at} (over --max-fail {budget:g}%), that batch rolled back"
                  if res.stopped_at is not None else "")
               + f" in {ctx.elapsed():.2f}s")
    if ctx.json:
        emit_json({"command": "deploy", "restart": True, "plan": plan.to_json(), "rollout": res.to_json(),
                   "summary": summary})
    else:
        t = table("rollout", ["batch", "host", "status", "steps", "what"])
        for h in res.hosts:
            t.add_row(str(h.batch) + (" (canary)" if h.batch == 0 else ""), h.host, _s(h.status),
                      ", ".join(f"{k}: {v}" for k, v in h.steps.items()), h.message)
        out.print(t)
        err.print(summary, markup=False)
    raise typer.Exit(EXIT_OK if res.ok else EXIT_FAILED)




def status_rows(ctx: RunContext, gathered: Any, plan: Plan | None) -> list[dict[str, Any]]:
    rows = []
    by_plan = {hp.host: hp for hp in plan.hosts} if plan else {}
    for h in ctx.fleet.hosts:
        o: HostOutcome = gathered.outcomes[h.name]
        if not o.ok:
            rows.append({"host": h.name, "status": o.status, "problems": [o.message]})
            continue
        f = gathered.facts[h.name]
        st = f.extra.get("state") or {}
        deploys = st.get("deploys", [])
        problems = []
        interrupted = [m for m in deploys if m.get("state") in ("preparing", "applying", "rolling-back")]
        for m in interrupted:
            n_app = sum(1 for x in m["files"] if x.get("sha_now") == x.get("sha_after"))
            problems.append(f"interrupted deploy {m['id']}: {n_app} of {len(m['files'])} files patched "
                            f"(mixed); run 'fleetctl rollback' or 'fleetctl deploy' to repair")
        lock = st.get("lock")
        if lock:
            problems.append(f"{'stale ' if lock.get('stale') else ''}lock: {lock.get('op')} {lock.get('id')} by {lock.get('by')}")
        complete = [m for m in deploys if m.get("state") == "complete"]
        last = complete[-1] if complete else None
        files_desc = ""
        hp = by_plan.get(h.name)
        if hp is not None:
            counts: dict[str, int] = {}
            for fp in hp.files:
                counts[fp.state] = counts.get(fp.state, 0) + 1
            files_desc = ", ".join(f"{n} {s}" for s, n in counts.items())
            if hp.status in ("refused", "failed"):
                problems.append(hp.reason)
            states = set(counts)
            if {"pristine", "as-intended"} <= states and not interrupted:
                problems.append("mixed: some files patched, some original")
        rows.append({"host": h.name, "status": "ok", "version": f.sglang_version,
                     "last_deploy": last["id"] if last else None, "files": files_desc, "problems": problems,
                     "deploys": [{"id": m["id"], "state": m["state"]} for m in deploys]})
    return rows
