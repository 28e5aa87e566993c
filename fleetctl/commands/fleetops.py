"""deploy, rollback, status, history (and the commands other modules fill in)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from fleetctl import hoststate
from fleetctl.commands import validate
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
from fleetctl.protocol.answers import ReadFilesAnswer
from fleetctl.protocol.names import READ_FILES, WITH_DISCOVER, WITH_SERVERS, WITH_STATE
from fleetctl.render import status_cell, table
from fleetctl.safetext import line, lines_cell, styled

PlaybookArg = Annotated[Path, typer.Argument(help="Playbook YAML, or a directory holding playbook.yaml.",
                                             show_default=False)]

STATE_STYLE = {"pristine": "cyan", "as-intended": "green", "drifted": "red", "missing": "red", "unsafe": "red",
               "original": "cyan", "as-deployed": "green", "change": "cyan", "noop": "green", "refused": "red",
               "unreachable": "red", "failed": "red", "changed": "green", "unchanged": "green",
               "skipped": "yellow", "ok": "green", "rolled-back": "yellow", "untouched": "yellow",
               "interrupted": "red", "pending": "yellow", "running": "yellow"}


def _s(state: str) -> Text:
    return styled(state, STATE_STYLE.get(state, "white"))




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
            t.add_row("", "", "(worker that will run)", "covered" if c.covered else styled("NOT covered", "red"),
                      "refuse" if c.refused else "", c.reason)
        if hp.interrupted:
            t.add_row("", "", "(interrupted deploy)", _s("drifted"), "repair", hp.reason)
    out.print(t)
    for hp in plan.hosts:
        if hp.status in ("refused", "unreachable", "failed"):
            out.print(line(styled(hp.status, "red"), " ", hp.reason))


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
            got: ReadFilesAnswer = ctx.fleet.connection(host).agent(
                READ_FILES, {"package_dir": hp.package_dir, "paths": drifted})
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
        max_fail: str | None = typer.Option(None, "--max-fail", help="With --restart: failed hosts a batch may have (P%) before the rollout stops and that batch is rolled back (default 0%)."),
        any_errors_fatal: bool = typer.Option(False, "--any-errors-fatal", help="Change no host at all if any selected host is unreachable or refused at plan time."),
        ready_timeout: float | None = typer.Option(None, "--timeout", min=0.1, help="With --restart: seconds to wait for each server to be ready."),
        break_lock: str | None = typer.Option(None, "--break-lock", help="Comma list of hosts whose lock, held by another machine sharing their state dir, may be taken over."),
        json_out: JsonOpt = False,
        debug: DebugOpt = False,
        accept_new_host_keys: AcceptNewOpt = False,
    ) -> None:
        from fleetctl.ops.rolling import parse_count

        budget = validate.rolling(restart, serial=serial, canary=canary, max_fail=max_fail,
                                  ready_timeout=ready_timeout)
        validate.exclusive(diff=diff, json=json_out)
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
            if any_errors_fatal and bad_plan:
                _fatal_refusal("deploy", plan.to_json(), [(hp.host, hp.status, hp.reason) for hp in bad_plan],
                               json_out)
            if restart:
                n = len(ctx.fleet.hosts)
                _rolling(ctx, pb, plan, parse_count(serial, n, "--serial"), parse_count(canary, n, "--canary"),
                         budget, ready_timeout, limit)
            op_id = new_op_id("d")
            ledger = Ledger()
            ledger.start(op_id, "deploy", inventory=ctx.inventory.path, playbook=pb.path,
                         args={"limit": limit, "force": force, "allow_uncovered": allow_uncovered},
                         hosts=[h.name for h in ctx.fleet.hosts])
            breaking = _break_lock_hosts(ctx, break_lock)
            results = _tick_run(ctx, "deploy", lambda: apply_plan(ctx.fleet, plan, pb, op_id, break_lock=breaking))
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
            reminder = _restart_reminder(ctx, pb, [r.host for r in rows if r.status == "changed"])
            if json_out:
                emit_json({"command": "deploy", "deploy_id": op_id, "plan": plan.to_json(),
                           "results": [r.to_json() for r in rows], "summary": summary, "elapsed": round(elapsed, 3),
                           "restart_needed": reminder.to_json() if reminder else None})
            else:
                t = table("result", ["host", "status", "deploy id", "what"])
                for r in rows:
                    t.add_row(r.host, _s(r.status), r.deploy_id or "", lines_cell([r.message, *r.notes]))
                out.print(t)
                err.print(summary, markup=False)
                if reminder:
                    err.print(reminder.line(str(ctx.inventory.path), str(playbook)), markup=False, highlight=False)
            raise typer.Exit(EXIT_FAILED if failed else EXIT_OK)

    @app.command("rollback", help="Restore each host's files to their bytes before its last (or a named) deploy.")
    def rollback(
        inventory: InventoryOpt = None,
        limit: LimitOpt = None,
        forks: ForksOpt = DEFAULT_FORKS,
        to: str | None = typer.Option(None, "--to", help="Undo this deploy id and every later one on each host."),
        check: bool = typer.Option(False, "--check", help="Show what would be restored and change nothing."),
        force: bool = typer.Option(False, "--force", help="Restore files changed since the deploy too (a copy is kept)."),
        any_errors_fatal: bool = typer.Option(False, "--any-errors-fatal", help="Change no host at all if any selected host is unreachable or refused at plan time."),
        from_pristine: bool = typer.Option(False, "--from-pristine", help="Restore the release's pristine bytes (controller's wheel cache, checked against the wheel's RECORD) into files that differ from them with no deploy record."),
        playbook: Path | None = typer.Option(None, "--playbook", "-p", help="With --from-pristine: also check its files, and the pristine bytes against its sha256."),
        old_tree: bool = typer.Option(False, "--old-tree", help="Restore a deploy in the tree it patched even though this python now imports another one."),
        break_lock: str | None = typer.Option(None, "--break-lock", help="Comma list of hosts whose lock, held by another machine sharing their state dir, may be taken over."),
        json_out: JsonOpt = False,
        debug: DebugOpt = False,
        accept_new_host_keys: AcceptNewOpt = False,
    ) -> None:
        to = validate.deploy_id(to)
        if playbook is not None and not from_pristine:
            raise InputError("--playbook goes with --from-pristine", hint="add --from-pristine, or drop --playbook")
        if from_pristine and (to or force or old_tree):
            raise InputError("--from-pristine restores files no deploy record explains; it takes no --to, --force "
                             "or --old-tree", hint="run the plain rollback separately")
        rpb = load_playbook(playbook) if playbook else None
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            breaking = _break_lock_hosts(ctx, break_lock)
            gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, rpb, all_hashes=True))
            plans = plan_rollback(ctx.fleet, gathered, to, force, old_tree=old_tree, from_pristine=from_pristine,
                                  playbook=rpb)
            if to is not None and all(p.status == "skipped" for p in plans):
                raise InputError(f"deploy {to} is not on any of the {len(plans)} selected host(s)",
                                 hint="pick an id from 'fleetctl status' or 'fleetctl history', or widen --limit")
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
                        out.print(line(styled(p.status, "red"), " ", p.reason))
                raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)
            if any_errors_fatal and bad:
                _fatal_refusal("rollback", [p.to_json() for p in plans], [(p.host, p.status, p.reason) for p in bad],
                               json_out)
            op_id = new_op_id("r")
            ledger = Ledger()
            ledger.start(op_id, "rollback", inventory=ctx.inventory.path, playbook=None,
                         args={"limit": limit, "to": to, "force": force, "from_pristine": from_pristine,
                               "old_tree": old_tree, "break_lock": break_lock},
                         hosts=[h.name for h in ctx.fleet.hosts])
            results = _tick_run(ctx, "rollback", lambda: apply_rollback(ctx.fleet, plans, op_id, force,
                                                                        old_tree=old_tree, break_lock=breaking,
                                                                        profile=rpb.launch if rpb else None))
            rows = [results[h.name] for h in ctx.fleet.hosts]
            failed = [r for r in rows if r["status"] not in ("changed", "unchanged", "skipped")]
            ledger.finish(op_id, "failed" if failed else "ok", rows)
            ledger.close()
            summary = (f"rollback {op_id}: {len(rows)} hosts: {sum(1 for r in rows if r['status'] == 'changed')} "
                       f"restored, {sum(1 for r in rows if r['status'] in ('unchanged', 'skipped'))} nothing to do, "
                       f"{len(failed)} failed in {ctx.elapsed():.2f}s")
            touched = sorted({f["path"] for p in plans for f in p.files})
            reminder = _restart_reminder(ctx, None, [r["host"] for r in rows if r["status"] == "changed"], touched)
            if json_out:
                emit_json({"command": "rollback", "rollback_id": op_id, "plan": [p.to_json() for p in plans],
                           "results": rows, "summary": summary,
                           "restart_needed": reminder.to_json() if reminder else None})
            else:
                t = table("result", ["host", "status", "what"])
                for r in rows:
                    t.add_row(r["host"], _s(r["status"]), lines_cell([r.get("message", ""), *r.get("notes", [])]))
                out.print(t)
                err.print(summary, markup=False)
                if reminder:
                    err.print(reminder.line(str(ctx.inventory.path), None), markup=False, highlight=False)
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
        from fleetctl.ops.discover import discover_request, restart_reminder, servers_from_facts
        from fleetctl.ops.launch import server_status_facts

        pb: Playbook | None = load_playbook(playbook) if playbook else None
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            extra = sorted({f.path for files in (pb.versions.values() if pb else []) for f in files})
            reqs = {h.name: discover_request(h.launch_command, pb) for h in ctx.fleet.hosts}
            outs = _tick_run(ctx, "facts", lambda: ctx.fleet.run(
                lambda c: read_facts(c, extra_files=extra, with_=[WITH_STATE, WITH_SERVERS, WITH_DISCOVER], gpus=False,
                                     payload=reqs[c.host.name], profile=pb.launch if pb else None)))
            gathered = Gathered({o.host: o.data for o in outs if o.ok}, {o.host: o for o in outs})
            plan = build_plan(ctx.fleet, pb, gathered, allow_uncovered=True) if pb else None
            rows = status_rows(ctx, gathered, plan)
            servers = [s for o in outs if o.ok for s in server_status_facts(o.host, o.data)]
            found = {o.host: servers_from_facts(o.host, o.data, reqs[o.host]) for o in outs if o.ok}
            if pb is not None:  # which worker the launch will run vs what the playbook patches
                from fleetctl.coverage import host_coverage

                by_name = {h.name: h for h in ctx.fleet.hosts}
                for r in rows:
                    f = gathered.facts.get(r["host"])
                    cov = host_coverage(by_name[r["host"]], f, pb) if f else None
                    if cov is not None and cov.refused and pb.files_for(f.sglang_version or "") is not None:
                        r["problems"].append(f"uncovered: {cov.refused}")
            for r in rows:
                r["servers"] = [s for s in servers if s["host"] == r["host"]]
                r["problems"] += [f"{s['instance']}: {p}" for s in r["servers"] for p in s["problems"]]
                hs = found.get(r["host"])
                r["discovered"] = [p.to_json() for p in hs.processes if not p.instance] if hs else []
                r["problems"] += [f"pid {p['pid']} (not started by fleetctl) runs code older than the files on disk: "
                                  f"{', '.join(p['changed_files'])} changed after it started"
                                  for p in r["discovered"] if p["stale"]]
                r["problems"] += [f"{s['instance']}: runs deploy {s['deploy_at_launch']}, which is no longer on "
                                  f"disk: a restart would lose the patch" for s in r["servers"]
                                  if s["running"] and s["deploy_at_launch"] in r.get("gone", [])]
            problems = [r for r in rows if r["problems"]]
            reminder = restart_reminder(list(found.values()))
            if json_out:
                emit_json({"command": "status", "hosts": rows, "elapsed": round(ctx.elapsed(), 3),
                           "restart_needed": reminder.to_json()})
            else:
                t = table(None, ["host", "status", "SGLang", "last deploy", "files", "problems"])
                for r in rows:
                    t.add_row(r["host"], status_cell(r["status"]), r.get("version") or "",
                              r.get("last_deploy") or "", r.get("files") or "",
                              lines_cell(r["problems"] + [f"note: {n}" for n in r.get("notes", [])]))
                out.print(t)
                if servers:
                    st = table("servers", ["host", "instance", "running", "since", "port", "worker",
                                           "deploy at launch", "deploy on disk", "restart needed"])
                    for sv in servers:
                        st.add_row(sv["host"], sv["instance"], styled("yes", "green") if sv["running"] else "no",
                                   _ts(sv["since"]), str(sv["port"] or ""), sv["worker"] or "",
                                   sv["deploy_at_launch"] or "-", sv["deploy_now"] or "-",
                                   styled("YES", "red") if sv["restart_needed"] else "no")
                    out.print(st)
                n_other = sum(len(r["discovered"]) for r in rows)
                err.print(f"status: {len(rows)} hosts, {len(problems)} with problems, "
                          f"{sum(1 for sv in servers if sv['running'])} server(s) running"
                          + (f" (+{n_other} not started by fleetctl)" if n_other else "")
                          + f" ({ctx.elapsed():.2f}s)", markup=False)
                if reminder.servers:
                    err.print(reminder.line(str(ctx.inventory.path), str(playbook) if playbook else None),
                              markup=False, highlight=False)
            raise typer.Exit(EXIT_FAILED if problems else EXIT_OK)

    @app.command("history", help="The local ledger of deploys and rollbacks; 'history ID' shows one.")
    def history(
        op_id: Annotated[str | None, typer.Argument(help="An operation id to show in full.")] = None,
        limit_rows: int = typer.Option(30, "--last", min=1, help="How many operations to list."),
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
                out.print(line(f"{d['kind']} {d['id']} by {d['user']}@{d['controller']} at {_ts(d['started'])}: "
                               f"{d['outcome'] or 'running'}"))
                if d["outcome"] == "interrupted":
                    pending = [h["host"] for h in d["hosts"] if h["status"] == "pending"]
                    out.print(line(f"interrupted: controller process {d['pid']} on {d['controller']} ended before it "
                                   f"recorded a result (found gone at {_ts(d['interrupted_seen'])}); "
                                   f"{len(pending)} host(s) without a result: {', '.join(pending) or '-'}. "
                                   "Run 'fleetctl status -i INV' to see them; the next deploy or rollback repairs "
                                   "an interrupted transaction."))
                out.print(line(f"inventory {d['inventory']} (sha256 {str(d['inventory_sha256'])[:12]})"))
                if d["playbook"]:
                    out.print(line(f"playbook  {d['playbook']} (sha256 {str(d['playbook_sha256'])[:12]})"))
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
        from fleetctl.ops.verify import never_fires
        from fleetctl.sglang import is_known, resolve_worker

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
                        # the env the launch's python sees (an `env` prefix in the command included)
                        ic = coverage(f.sglang_version, dict(inst.flags), dict(inst.effective_env), pb)
                        args = (resolve_worker(f.sglang_version, dict(inst.flags), dict(inst.effective_env)).resolved_args
                                if is_known(f.sglang_version) else {})
                        row["instances"].append({"instance": inst.name, "gpus": list(inst.gpus), "port": inst.port,
                                                 "worker_class": ic.worker_class, "worker_file": ic.worker_file,
                                                 "disable_overlap_schedule": ic.disable_overlap_schedule,
                                                 "covered": ic.covered, "reason": ic.reason, "refused": ic.refused,
                                                 "never_fires": never_fires(pb, dict(args))})
                # the code import would load for the worker file, not only its source (bytecode)
                bc = f.bytecode_problem(cov.worker_file) if cov and cov.worker_file else None
                row["bytecode"] = bc
                row["notes"] = list(f.sglang_notes)
                if bc and f.bytecode_loader(cov.worker_file or "") != "source":
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
                        out.print(line(r["host"], ": ", styled(r["status"], "red"), " ", r["reason"]))
                        continue
                    mark = styled("ok", "green") if not r.get("refused") else styled("REFUSED", "red")
                    insts = r.get("instances") or []
                    where = f" ({len(insts)} instances, each alike)" if len(insts) > 1 and all(
                        i["reason"] == insts[0]["reason"] for i in insts) else ""
                    out.print(line(r["host"], where, ": ", r["reason"], " [", mark, "]"))
                    if len(insts) > 1 and not where:
                        for i in insts:
                            out.print(line(f"  {i['instance']} (GPUs {','.join(map(str, i['gpus']))}): {i['reason']}"))
                    if r.get("refused") and r["refused"] != r["reason"]:
                        out.print(line(f"  {r['refused']}"))
                    for n in r.get("notes") or []:
                        out.print(line(f"  note: {n}"))
                    for note in dict.fromkeys(n for i in insts for n in i.get("never_fires") or []):
                        out.print(line(f"  warning: {note}"))
            raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


def _restart_reminder(ctx: RunContext, pb: Playbook | None, changed: list[str],
                      files: list[str] | None = None) -> Any:
    """After files changed on these hosts: which servers there (launched by fleetctl or not) now run
    older code than the files on disk. None when nothing changed."""
    from fleetctl.ops.discover import discover_fleet, restart_reminder

    hosts = [h for h in ctx.fleet.hosts if h.name in set(changed)]
    if not hosts:
        return None
    return restart_reminder(discover_fleet(ctx.fleet, pb, hosts, files))


def _fatal_refusal(command: str, plan: Any, bad: list[tuple[str, str, str]], json_out: bool) -> None:
    """--any-errors-fatal: some host cannot take part, so no host is changed (exit 1)."""
    msg = (f"{command}: --any-errors-fatal: {len(bad)} selected host(s) unreachable or refused at plan time "
           f"({bad[0][0]}: {bad[0][1]}); nothing was changed on any host")
    if json_out:
        emit_json({"command": command, "plan": plan, "changed": False, "any_errors_fatal": True,
                   "blocking": [{"host": h, "status": st, "reason": why} for h, st, why in bad], "summary": msg})
    else:
        err.print(line(msg))
    raise typer.Exit(EXIT_FAILED)


def _rolling(ctx: RunContext, pb: Playbook, plan: Plan, serial: int | None, canary: int | None, budget: float,
             ready_timeout: float | None, limit: str | None) -> None:
    from fleetctl.ops.rolling import rolling_deploy

    def progress(bi: int, rows: dict[str, Any]) -> None:
        if not ctx.json:
            bad = sum(1 for r in rows.values() if r.status != "ok")
            err.print(f"batch {bi}: {len(rows)} host(s), {bad} failed", markup=False)

    op_id = new_op_id("d")
    ledger = Ledger()
    ledger.start(op_id, "deploy --restart", inventory=ctx.inventory.path, playbook=pb.path,
                 args={"limit": limit, "serial": serial, "canary": canary, "max_fail": budget},
                 hosts=[h.name for h in ctx.fleet.hosts])
    res = rolling_deploy(ctx.fleet, pb, plan, serial=serial, canary=canary, max_fail=budget,
                         ready_timeout=ready_timeout, progress=progress, op_id=op_id)
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




def _break_lock_hosts(ctx: RunContext, value: str | None) -> set[str]:
    """--break-lock h01,h02: each a selected host (a lock is broken per host, never fleet-wide)."""
    if not value:
        return set()
    names = {n.strip() for n in value.split(",") if n.strip()}
    selected = {h.name for h in ctx.fleet.hosts}
    unknown = sorted(names - selected)
    if unknown:
        raise InputError(f"--break-lock names {', '.join(unknown)}, not a selected host",
                         hint=f"name hosts of this command: {', '.join(sorted(selected))}")
    return names


def status_rows(ctx: RunContext, gathered: Any, plan: Plan | None) -> list[dict[str, Any]]:
    rows = []
    by_plan = {hp.host: hp for hp in plan.hosts} if plan else {}
    for h in ctx.fleet.hosts:
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
        gone = hoststate.gone(f)
        problems += [hoststate.gone_msg(m) + "; 'fleetctl rollback' closes its record, 'fleetctl deploy' "
                     "patches again" for m in gone]
        pristine, why_not = hoststate.release_pristine(f.sglang_version)
        if pristine is None:
            notes.append(f"not checked against pristine sglang: {why_not}")
        else:
            loose = hoststate.unrecorded(f, pristine)
            if loose:
                problems.append(hoststate.unrecorded_msg(h.name, f.sglang_version, loose))
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
        rows.append({"host": h.name, "status": "ok", "version": f.sglang_version,
                     "last_deploy": last.id if last else None, "files": files_desc, "problems": problems,
                     "notes": notes, "gone": [m.id for m in gone],
                     "deploys": [{"id": m.id, "state": m.state} for m in deploys]})
    return rows
