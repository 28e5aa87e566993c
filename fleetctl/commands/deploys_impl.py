"""deploy, rollback, status, history, explain: what each does once its options are parsed (the
options themselves are declared in deploys.py, which imports this module only when one of these
commands runs). Each calls its op, records it in the ledger (fleetctl/ops/record.py), then renders
(deploys_view.py) or emits the JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fleetctl.commands import validate
from fleetctl.commands.common import emit_json, err, out
from fleetctl.commands.context import RunContext, fleet_context, playbook_fleet
from fleetctl.commands.context import fmt_time as _ts
from fleetctl.commands.context import run_with_progress as _tick_run
from fleetctl.commands.deploys_view import (
    _counts,
    _s,
    plan_hosts,
    print_diffs,
    render_explain,
    render_plan,
    render_rollback_plan,
    render_status,
)
from fleetctl.engines import engine
from fleetctl.errors import EXIT_FAILED, EXIT_OK, InputError
from fleetctl.model.hostnames import group, plural, strip_host
from fleetctl.model.recorded import recorded
from fleetctl.model.result import HostResult
from fleetctl.ops import runlog
from fleetctl.ops.ledger import Ledger
from fleetctl.ops.record import Recorded
from fleetctl.ui.jsonout import rows as rows_json
from fleetctl.ui.render import hosts_cell, table
from fleetctl.ui.safetext import line, lines_cell, styled

if TYPE_CHECKING:
    from fleetctl.config.hosts import Host
    from fleetctl.config.playbook_model import Playbook
    from fleetctl.model.explain import Explained, ExplainedInstance
    from fleetctl.model.facts import HostFacts
    from fleetctl.model.instances import Instance
    from fleetctl.ops.rollback import RollbackPlan
    from fleetctl.plan.deploy import HostPlan, Plan


def _playbook_name(path: str | None) -> str:
    """A playbook as the history table shows it: its directory's name (the full path: history ID)."""
    if not path:
        return "-"
    p = Path(path)
    return p.parent.name if p.name in ("playbook.yaml", "playbook.yml") else p.name


def _load_playbook(path: Path) -> Playbook:
    """(pydantic and the playbook models are imported only by a command given a playbook, whose
    playbook was not loaded before from the same inputs: config/playbook_cache.py)"""
    from fleetctl.config import playbook_cache
    from fleetctl.model import suggest

    suggest.playbook = str(path)
    return playbook_cache.load(path)


def _seal_check_ahead(conn: Any) -> None:
    """(fleetctl.ops.seal is imported by the first connected host's prefetch thread, not before the input
    is read)"""
    from fleetctl.ops.seal import check_ahead

    check_ahead(conn)


def deploy(*, playbook: Path, inventory: Path | None, limit: str | None, forks: int, check: bool, diff: bool,
        force: bool, allow_uncovered: bool, strict: bool = False, restart: bool, serial: str | None, canary: str | None,
        max_fail: str | None, any_errors_fatal: bool, ready_timeout: float | None, break_lock: str | None,
        json_out: bool, debug: bool, accept_new_host_keys: bool, recheck: bool = False,
        port_onto_host: bool = False) -> None:
    if port_onto_host and (force or restart):
        raise InputError("--port-onto-host goes with neither --force nor --restart",
                         hint="port first (deploy --port-onto-host), then restart the servers",
                         reference="option-invalid")
    budget = validate.rolling(restart, serial=serial, canary=canary, max_fail=max_fail,
                              ready_timeout=ready_timeout)
    validate.exclusive(diff=diff, json=json_out)
    # the seal checks start as each host connects, while the playbook loads (they decide nothing there)
    with playbook_fleet(playbook, inventory, limit, forks, command="deploy", json=json_out, debug=debug,
                        accept_new_host_keys=accept_new_host_keys,
                        ahead=None if recheck else _seal_check_ahead) as (pb, ctx):
        from fleetctl.ops.deploy import apply_plan, build_plan, gather, new_op_id
        # seals (fleetctl/ops/seal.py): a host unchanged since its last deploy is re-checked without Python;
        # a rolling restart visits every host with the agent (its batches re-plan)
        # (--force, --port-onto-host: every hashed file is read, to name the siblings that are not the release's)
        gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, pb, probe=True, use_seals=not recheck,
                                                          make_seals=not check and not restart,
                                                          all_hashes=force or port_onto_host))
        plan = build_plan(ctx.fleet, pb, gathered, force=force, allow_uncovered=allow_uncovered, strict=strict)
        if port_onto_host:
            from fleetctl.ops.deploy import port_onto_hosts

            port_onto_hosts(ctx.fleet, plan, pb, gathered, allow_uncovered=allow_uncovered)
        runlog.plan(plan.to_json())
        if not json_out:
            render_plan(plan)
            if diff:
                print_diffs(ctx, plan)
        bad_plan = [hp for hp in plan.hosts if hp.status in ("refused", "unreachable", "failed")]
        if check:
            runlog.result(plan_hosts(plan.hosts))
            if json_out:
                emit_json("deploy", ok=not bad_plan, hosts=plan_hosts(plan.hosts), check=True,
                          plan=plan.to_json(), elapsed=round(ctx.elapsed(), 3),
                          message=f"deploy --check: nothing was changed ({ctx.elapsed():.2f}s)")
            else:
                err.print(line(f"deploy --check: {plural(len(plan.hosts), 'host')}: "
                               + _counts([hp.status for hp in plan.hosts],
                                         {"change": "would change", "noop": "as intended"},
                                         always=("change", "noop"))
                               + f"; nothing was changed ({ctx.elapsed():.2f}s)"))
            raise typer.Exit(EXIT_FAILED if bad_plan else EXIT_OK)
        if any_errors_fatal and bad_plan:
            _fatal_refusal("deploy", plan.hosts, plan.to_json(), bad_plan, json_out)
        if restart:
            from fleetctl.ops.rolling import parse_count

            n = len(ctx.fleet.hosts)
            _rolling(ctx, pb, plan, parse_count(serial, n, "--serial"), parse_count(canary, n, "--canary"),
                     budget, ready_timeout, limit)
        op_id = new_op_id("d")
        record = Recorded(op_id, "deploy", inventory=ctx.inventory.path, playbook=pb.path,
                          args={"limit": limit, "force": force, "allow_uncovered": allow_uncovered,
                                "port_onto_host": port_onto_host},
                          hosts=[h.name for h in ctx.fleet.hosts])
        breaking = _break_lock_hosts(ctx, break_lock)
        from fleetctl.ops.discover import discover_facts

        results = _tick_run(ctx, "deploy", lambda: apply_plan(ctx.fleet, plan, pb, op_id, break_lock=breaking,
                                                              seals=gathered.seals, facts=gathered.facts,
                                                              then_facts=lambda h: discover_facts(h, pb)))
        rows = [results[h.name] for h in ctx.fleet.hosts if h.name in results]
        failed = [r for r in rows if not r.ok]
        record.finish(not failed, [{**r.to_json(), **({"detail": {"container": r.detail.container}}
                                                      if r.detail.container else {})}
                                   for r in rows])
        elapsed = ctx.elapsed()
        counts = {st: sum(1 for r in rows if r.status == st)
                  for st in ("changed", "unchanged", "refused", "unreachable", "failed")}
        summary = (f"deploy {op_id}: {plural(len(rows), 'host')}: "
                   + ", ".join(f"{n} {st}" for st, n in counts.items() if n or st in ("changed", "failed"))
                   + f" in {elapsed:.2f}s")
        reminder = _restart_reminder(ctx, pb, [r.host for r in rows if r.status == "changed"],
                                     found={r.host: r.detail.servers for r in rows if r.detail.servers is not None})
        runlog.result(rows_json(rows), op_id=op_id)
        if json_out:
            emit_json("deploy", op_id=op_id, ok=not failed, message=summary,
                      hosts=rows_json(rows),
                      plan=plan.to_json(), elapsed=round(elapsed, 3),
                      restart_needed=reminder.to_json() if reminder else None)
        else:
            t = table("result", ["host", "status", "deploy id", "what"])
            for hosts, (st, did, what) in group(
                    (r.host, (r.status, r.detail.deploy_id or "", tuple(strip_host(r.host, m) for m in [r.message, *r.detail.notes])))
                    for r in rows):
                t.add_row(hosts_cell(hosts), _s(st), did, lines_cell(what))
            out.print(t)
            err.print(line(f"deploy {op_id}: {plural(len(rows), 'host')}: "
                           + _counts([r.status for r in rows], {}, always=("changed", "failed"))
                           + f" in {elapsed:.2f}s"))
            if reminder:
                err.print(reminder.line(str(ctx.inventory.path), str(playbook)), markup=False, highlight=False)
        raise typer.Exit(EXIT_FAILED if failed else EXIT_OK)



def rollback(*, inventory: Path | None, limit: str | None, forks: int, to: str | None, check: bool, force: bool,
        any_errors_fatal: bool, from_pristine: bool, playbook: Path | None, old_tree: bool, break_lock: str | None,
        json_out: bool, debug: bool, accept_new_host_keys: bool) -> None:
    to = validate.deploy_id(to)
    if playbook is not None and not from_pristine:
        raise InputError("--playbook goes with --from-pristine", hint="add --from-pristine, or drop --playbook",
                         reference="option-invalid")
    if from_pristine and (to or force or old_tree):
        raise InputError("--from-pristine restores files no deploy record explains; it takes no --to, --force "
                         "or --old-tree", hint="run the plain rollback separately", reference="option-invalid")
    rpb = _load_playbook(playbook) if playbook else None
    with fleet_context(inventory, limit, forks, command="rollback", json=json_out, debug=debug,
                       accept_new_host_keys=accept_new_host_keys) as ctx:
        from fleetctl.ops.deploy import gather, new_op_id
        from fleetctl.ops.rollback import apply_rollback, plan_rollback
        breaking = _break_lock_hosts(ctx, break_lock)
        gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, rpb, all_hashes=True))
        plans = plan_rollback(ctx.fleet, gathered, to, force, old_tree=old_tree, from_pristine=from_pristine,
                              playbook=rpb)
        if to is not None and all(p.status == "skipped" for p in plans):
            raise InputError(f"deploy {to} is not on any of the {len(plans)} selected host(s)",
                             hint="pick an id from 'fleetctl status' or 'fleetctl history', or widen --limit",
                             reference="deploy-id-unknown")
        runlog.plan([p.to_json() for p in plans])
        if not json_out:
            render_rollback_plan(plans)
        bad = [p for p in plans if p.status in ("refused", "unreachable", "failed")]
        if check:
            runlog.result(plan_hosts(plans))
            if json_out:
                emit_json("rollback", ok=not bad, hosts=plan_hosts(plans), check=True,
                          plan=[p.to_json() for p in plans], message="rollback --check: nothing was changed")
            else:
                err.print(line(f"rollback --check: {plural(len(plans), 'host')}: "
                               + _counts([p.status for p in plans], {"change": "would be restored",
                                                                     "noop": "nothing to do",
                                                                     "skipped": "not selected by --to"},
                                         always=("change",))
                               + f"; nothing was changed ({ctx.elapsed():.2f}s)"))
            raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)
        if any_errors_fatal and bad:
            _fatal_refusal("rollback", plans, [p.to_json() for p in plans], bad, json_out)
        op_id = new_op_id("r")
        record = Recorded(op_id, "rollback", inventory=ctx.inventory.path, playbook=None,
                          args={"limit": limit, "to": to, "force": force, "from_pristine": from_pristine,
                                "old_tree": old_tree, "break_lock": break_lock},
                          hosts=[h.name for h in ctx.fleet.hosts])
        from fleetctl.ops.discover import discover_facts

        touched = sorted({f["path"] for p in plans for f in p.files})
        found: dict[str, Any] = {}
        results = _tick_run(ctx, "rollback", lambda: apply_rollback(
            ctx.fleet, plans, op_id, force, old_tree=old_tree, break_lock=breaking,
            profile=rpb.launch if rpb else None, then_facts=lambda h: discover_facts(h, None, touched),
            servers=found))
        rows = [results[h.name] for h in ctx.fleet.hosts]
        failed = [r for r in rows if not r.ok]
        record.finish(not failed, [r.to_json() for r in rows])
        from fleetctl.ops import seal

        for h in ctx.fleet.hosts:  # their seals no longer hold: the next deploy need not check them
            if results[h.name].status != "unchanged":
                seal.forget(h)
        summary = (f"rollback {op_id}: {plural(len(rows), 'host')}: {sum(1 for r in rows if r.status == 'changed')} "
                   f"restored, {sum(1 for r in rows if r.status in ('unchanged', 'skipped'))} nothing to do, "
                   f"{len(failed)} failed in {ctx.elapsed():.2f}s")
        reminder = _restart_reminder(ctx, None, [r.host for r in rows if r.status == "changed"], touched,
                                     found=found)
        runlog.result(rows_json(rows), op_id=op_id)
        if json_out:
            emit_json("rollback", op_id=op_id, ok=not failed, message=summary,
                      hosts=rows_json(rows),
                      plan=[p.to_json() for p in plans],
                      restart_needed=reminder.to_json() if reminder else None)
        else:
            t = table("result", ["host", "status", "what"])
            for hosts, (st, what) in group(
                    (r.host, (r.status, tuple(strip_host(r.host, m) for m in [r.message, *r.detail.notes])))
                    for r in rows):
                t.add_row(hosts_cell(hosts), _s(st), lines_cell(what))
            out.print(t)
            err.print(line(f"rollback {op_id}: {plural(len(rows), 'host')}: "
                           + _counts([r.status for r in rows], {"changed": "restored"}, always=("changed",))
                           + f" in {ctx.elapsed():.2f}s"))
            if reminder:
                from fleetctl.ops.record import launch_playbooks

                err.print(reminder.line(str(ctx.inventory.path), str(rpb.path) if rpb else None,
                                        launch_playbooks(reminder.launch_ids)), markup=False, highlight=False)
        raise typer.Exit(EXIT_FAILED if failed else EXIT_OK)



def status(*, playbook: Path | None, inventory: Path | None, limit: str | None, forks: int, json_out: bool,
        debug: bool, accept_new_host_keys: bool) -> None:
    pb: Playbook | None = _load_playbook(playbook) if playbook else None
    with fleet_context(inventory, limit, forks, command="status", json=json_out, debug=debug,
                       accept_new_host_keys=accept_new_host_keys) as ctx:
        from fleetctl.model.facts import read_facts
        from fleetctl.ops.deploy import Gathered, build_plan
        from fleetctl.ops.discover import discover_request, restart_reminder, servers_from_facts
        from fleetctl.ops.launch import server_status_facts
        from fleetctl.ops.status import status_row, status_rows
        from fleetctl.protocol.names import WITH_DISCOVER, WITH_SERVERS, WITH_STATE
        extra = sorted({f.path for files in (pb.versions.values() if pb else []) for f in files})
        reqs = {h.name: discover_request(h.launch_command, pb) for h in ctx.fleet.hosts}
        outs = _tick_run(ctx, "facts", lambda: ctx.fleet.run(
            lambda c: read_facts(c, extra_files=extra, with_=[WITH_STATE, WITH_SERVERS, WITH_DISCOVER], gpus=False,
                                 payload=reqs[c.host.name], profile=pb.launch if pb else None)))
        gathered = Gathered({o.host: o.detail for o in outs if o.ok}, {o.host: o for o in outs})
        plan = build_plan(ctx.fleet, pb, gathered, allow_uncovered=True) if pb else None
        rows = status_rows(ctx.fleet.hosts, gathered, plan)
        servers = [s for o in outs if o.ok for s in server_status_facts(o.host, o.detail)]
        found = {o.host: servers_from_facts(o.host, o.detail, reqs[o.host]) for o in outs if o.ok}
        if pb is not None:  # which worker the launch will run vs what the playbook patches
            from fleetctl.plan.patched_worker import host_coverage

            by_name = {h.name: h for h in ctx.fleet.hosts}
            for r in rows:
                f = gathered.facts.get(r.host)
                cov = host_coverage(by_name[r.host], f, pb) if f else None
                if cov is not None and cov.refused and pb.files_for(f.package_version or "") is not None:
                    r.detail.problems.append(f"uncovered: {cov.refused}")
        mains = [h for h in ctx.fleet.hosts if h.container and h.container.get("main_process")
                 and gathered.outcomes[h.name].ok]
        if mains:  # a server that is its container's main process: healthy? (its container's log, /health)
            from fleetctl.ops.verify import main_process_health

            for o in ctx.fleet.run(main_process_health, mains):
                d = next(x for x in rows if x.host == o.host).detail
                mp = d.main_process = o.detail if o.ok else {"healthy": False, "problems": [o.message]}
                d.problems += mp["problems"]
                if mp["healthy"]:
                    d.notes.append(
                        f"the server is container {mp['container']}'s main process: healthy (ready line since its "
                        f"start {mp['started_at']}" + (f", GET /health 200 on port {mp['port']}" if mp["port"] else "")
                        + ")")
        for r in rows:
            d = r.detail
            d.servers = [s for s in servers if s["host"] == r.host]
            d.problems += [f"{s['instance']}: {p}" for s in d.servers for p in s["problems"]]
            hs = found.get(r.host)
            d.discovered = [p.to_json() for p in hs.detail.processes if not p.instance] if hs else []
            d.problems += [f"pid {p['pid']} (not started by fleetctl) runs code older than the files on disk: "
                              f"{', '.join(p['changed_files'])} changed after it started"
                              for p in d.discovered if p["stale"]]
            d.problems += [f"{s['instance']}: runs deploy {s['deploy_at_launch']}, which is no longer on "
                              f"disk: a restart would lose the patch" for s in d.servers
                              if s["running"] and s["deploy_at_launch"] in d.gone]
        problems = [r for r in rows if r.detail.problems]
        reminder = restart_reminder(list(found.values()), ctx.fleet.hosts)
        status_hosts = [status_row(r) for r in rows]
        runlog.result(status_hosts)
        if json_out:
            emit_json("status", ok=not problems, hosts=status_hosts, summary={"servers_running": sum(1 for sv in servers if sv["running"]),
                                         "restart_needed": reminder.servers},
                      elapsed=round(ctx.elapsed(), 3), restart_needed=reminder.to_json())
        else:
            render_status(rows)
            if servers:
                st = table("servers", ["host", "instance", "running", "worker", "deploy at launch / on disk",
                                       "restart"], whole=("instance", "worker", "deploy at launch / on disk"))
                for hosts, (inst, running, worker, at, now, restart) in group(
                        (sv["host"], (sv["instance"], bool(sv["running"]), sv["worker"] or "",
                                      sv["deploy_at_launch"] or "-", sv["deploy_now"] or "-",
                                      bool(sv["restart_needed"]))) for sv in servers):
                    st.add_row(hosts_cell(hosts), inst, styled("yes", "green") if running else "no", worker,
                               lines_cell([at, "(same on disk)" if now == at else now]),
                               styled("YES", "red") if restart else "no")
                out.print(st)
            n_other = sum(len(r.detail.discovered) for r in rows)
            err.print(f"status: {plural(len(rows), 'host')}, {len(problems)} with problems, "
                      f"{sum(1 for sv in servers if sv['running'])} server(s) running"
                      + (f" (+{n_other} not started by fleetctl)" if n_other else "")
                      + f" ({ctx.elapsed():.2f}s)", markup=False)
            if reminder.servers:
                from fleetctl.ops.record import launch_playbooks

                err.print(reminder.line(str(ctx.inventory.path), str(playbook) if playbook else None,
                                        launch_playbooks(reminder.launch_ids)), markup=False, highlight=False)
        raise typer.Exit(EXIT_FAILED if problems else EXIT_OK)



def history_command(*, op_id: str | None, run_id: str | None, limit_rows: int, log_file: str | None,
                    json_out: bool) -> None:
    """`history`, `history ID`, `history show ID`."""
    if op_id == "show":
        if run_id is None:
            raise InputError("history show: which run?", hint="give its id: 'fleetctl history show ID' "
                             "('fleetctl history' lists them)", reference="usage-error")
        history_show(ident=run_id, log_file=log_file, json_out=json_out)
        return
    if run_id is not None:
        raise InputError(f"history: unexpected {run_id!r} after {op_id!r}",
                         hint=f"'fleetctl history {op_id}' or 'fleetctl history show {op_id}'", reference="usage-error")
    history(op_id=op_id, limit_rows=limit_rows, json_out=json_out)


def history_show(*, ident: str, log_file: str | None, json_out: bool) -> None:
    """`history show ID`: the ledger's entry (when ID is an operation there) and the run's events
    from the run log (fleetctl/ops/runlog.py), one line each: what happened, per host, in order."""
    import json as _json

    path = Path(log_file).expanduser() if log_file else runlog.default_path()
    events = runlog.read_events(path, ident)
    ledger = Ledger()
    try:
        op_ids = [e.get("op_id") for e in events if e.get("op_id")]
        entry = ledger.get(ident) or (ledger.get(op_ids[0]) if op_ids else None)
    finally:
        ledger.close()
    if not events and entry is None:
        raise InputError(f"no run {ident} in {path} nor in the ledger",
                         hint="'fleetctl history' lists the ledger's ids; a run's id is in its run log "
                              "(--log-file FILE if the command was given one)", reference="run-id-unknown")
    if json_out:
        emit_json("history", op_id=entry["id"] if entry else None, ok=True,
                  hosts=[recorded(h).row() for h in entry["hosts"]] if entry else [],
                  message=f"{len(events)} event(s) of run {ident} in {path}", run_log=str(path), events=events,
                  operation={k: v for k, v in entry.items() if k != "hosts"} if entry else None)
        raise typer.Exit(0)
    if entry is not None:
        out.print(line(f"{entry['kind']} {entry['id']} by {entry['user']}@{entry['controller']} at "
                       f"{_ts(entry['started'])}: {entry['outcome'] or 'running'}"))
    for e in events:
        ev = e.get("event")
        what = {k: v for k, v in e.items() if k not in ("run", "seq", "t", "event", "command")}
        if ev == "host":
            text = (f"{what.get('host')} {what.get('step')} {what.get('phase')}"
                    + (f": {what.get('status')}{' ' + what['message'] if what.get('message') else ''} "
                       f"({what.get('elapsed')}s)"
                       if what.get("phase") == "end" else ""))
        elif ev == "result":
            text = "; ".join(f"{h['host']}: {h['state']}" + (f" ({h['message']})" if h["message"] and not h["ok"]
                                                              else "") for h in what.get("hosts", []))
        elif ev == "plan":
            text = f"{len(_json.dumps(what.get('plan'), default=str))} bytes of plan (--json shows it)"
        else:
            text = ", ".join(f"{k}={v}" for k, v in what.items() if k not in ("hosts",) and v not in (None, [], ""))
            if ev == "start":
                text += f", hosts={','.join(h['host'] for h in what.get('hosts', []))}"
        out.print(line(f"{_ts(e.get('t'))} {e.get('command')} {ev}: ", text))
    err.print(line(f"history show {ident}: {len(events)} event(s) from {path}"))


def history(*, op_id: str | None, limit_rows: int, json_out: bool) -> None:
    ledger = Ledger()
    try:
        if op_id:
            d = ledger.get(op_id)
            if d is None:
                raise InputError(f"no operation {op_id} in {ledger.path}", hint="run 'fleetctl history' to list ids",
                                 reference="op-id-unknown")
            if json_out:
                emit_json("history", op_id=d["id"], ok=True,
                          hosts=[recorded(h).row() for h in d["hosts"]],
                          message=f"{d['kind']} {d['id']}: {d['outcome'] or 'running'}",
                          operation={k: v for k, v in d.items() if k != "hosts"})
                raise typer.Exit(0)
            from fleetctl.model.suggest import quote

            out.print(line(f"{d['kind']} {d['id']} by {d['user']}@{d['controller']} at {_ts(d['started'])}: "
                           f"{d['outcome'] or 'running'}"))
            if d["outcome"] == "interrupted":
                pending = [h["host"] for h in d["hosts"] if h["status"] == "pending"]
                out.print(line(f"interrupted: controller process {d['pid']} on {d['controller']} ended before it "
                               f"recorded a result (found gone at {_ts(d['interrupted_seen'])}); "
                               f"{len(pending)} host(s) without a result: {', '.join(pending) or '-'}. "
                               + (f"Run 'fleetctl status -i {quote(d['inventory'])}' to see them; "
                                  if d["inventory"] else "")
                               + "the next deploy or rollback repairs an interrupted transaction."))
            out.print(line(f"inventory {d['inventory']} (sha256 {str(d['inventory_sha256'])[:12]})"))
            if d["playbook"]:
                out.print(line(f"playbook  {d['playbook']} (sha256 {str(d['playbook_sha256'])[:12]})"))
            t = table(None, ["host", "status", "message"])
            for hosts, (st, msg) in group((h["host"], (h["status"], strip_host(h["host"], h["message"] or "")))
                                          for h in d["hosts"]):
                t.add_row(hosts_cell(hosts), _s(st), msg)
            out.print(t)
            err.print(line(f"history {d['id']}: {plural(len(d['hosts']), 'host')}: "
                           + _counts([h["status"] for h in d["hosts"]], {})))
        else:
            rows = ledger.list(limit_rows)
            if json_out:
                emit_json("history", ok=True, summary={"operations": len(rows)}, ledger=str(ledger.path),
                          operations=rows)
                raise typer.Exit(0)
            # id, kind and playbook in one cell (fits 80 columns: every column whole but the user)
            t = table("history", ["operation / playbook", "started", "user", "hosts", "outcome"],
                      whole=("operation / playbook", "started", "hosts", "outcome"))

            def hosts_of(r: dict[str, Any]) -> Any:
                return lines_cell([str(r["hosts"]), *([f"{r['hosts_failed']} failed"] if r["hosts_failed"] else [])])

            # a run of no-op operations (deploys/rollbacks that changed no host) is one row: what they
            # were, how many, from when to when (--json lists each, with "noop": true)
            k = 0
            while k < len(rows):
                r = rows[k]
                j = k
                while r["noop"] and j + 1 < len(rows) and rows[j + 1]["noop"] and \
                        (rows[j + 1]["kind"], rows[j + 1]["playbook"]) == (r["kind"], r["playbook"]):
                    j += 1
                what = f"{r['kind']} {_playbook_name(r['playbook'])}"
                if j > k:
                    last = rows[j]
                    t.add_row(lines_cell([f"{last['id']}..{r['id'][-4:]}", what]),
                              lines_cell([_ts(last["started"]), "to " + _ts(r["started"]).split(" ", 1)[1]]),
                              r["user"], hosts_of(r), _s(f"no-op x{j - k + 1}"))
                else:
                    t.add_row(lines_cell([r["id"], what]), lines_cell(_ts(r["started"]).split(" ", 1)), r["user"],
                              hosts_of(r), _s("no-op" if r["noop"] else (r["outcome"] or "running")))
                k = j + 1
            out.print(t)
            outcomes = [r["outcome"] or "running" for r in rows]
            err.print(line(f"history: {len(rows)} operation(s) shown (--last {limit_rows})"
                           + (": " + _counts(outcomes, {}) if rows else "")
                           + (f"; 'fleetctl history {rows[0]['id']}' shows one" if rows else "")
                           + f"; ledger {ledger.path}"))
    finally:
        ledger.close()



def _explain_instance(ex: Explained, f: HostFacts, pb: Playbook, inst: Instance) -> ExplainedInstance:
    """One launch instance of `explain`'s host: its worker and coverage, and what the launch itself
    does that verify-logs would only find afterwards (refusals and notes go on the host's `ex`)."""
    from fleetctl.model.explain import ExplainedInstance
    from fleetctl.model.launchspec import env_overrides
    from fleetctl.ops.verify import never_fires
    from fleetctl.plan.intended import intended_data
    from fleetctl.plan.patched_worker import coverage, named_files

    assert f.package_version is not None
    # the env the launch's python sees (an `env` prefix in the command included)
    named = named_files(f, pb, dict(inst.flags))
    ienv = f.judged_env(dict(inst.effective_env))  # after the interpreter's start-up hooks
    ic = coverage(f.package_version, dict(inst.flags), ienv, pb, model=f.model,
                  draft=f.draft_model, files=named)
    args = (engine().resolve_worker(f.package_version, dict(inst.flags), ienv,
                                    model_arch=f.model.arch if f.model else None, files=named).resolved_args
            if engine().is_known(f.package_version) else {})
    # what the launch itself does that verify-logs would only find afterwards: a log level
    # hiding INFO (launch refuses it), a launch command overriding the playbook's env
    hidden = engine().log_visibility_problems(dict(args), ienv) if args else []
    ex.refused = ex.refused or (hidden[0] if hidden else None)
    # a check the patch adds to the argument file that refuses this launch (the crash, before it)
    bad_value = (engine().patched_refusal(f.package_version, intended_data(pb, f.package_version), args)
                 if args and not ic.refused else None)
    if bad_value:
        ex.refused = ex.refused or (f"the playbook's patched {engine().args_file} refuses this "
                                    f"launch: {bad_value}")
    read = engine().launch_file_note(f.package_version, dict(inst.flags), named)
    ex.note(*hidden[1:], *env_overrides(dict(inst.env), inst.launch), *([read] if read else []))
    return ExplainedInstance(inst.name, list(inst.gpus), inst.port, ic.worker_class, ic.worker_file,
                             ic.disable_overlap_schedule, ic.covered, ic.reason, ic.refused,
                             never_fires(pb, dict(args)))


def _explain_row(h: Host, f: HostFacts, pb: Playbook) -> HostResult[Explained]:
    """`explain`'s answer for one reachable host: which worker its launch runs and whether the playbook
    patches it, per instance too, with the notes and refusals that explain it."""
    from fleetctl.model.explain import Explained
    from fleetctl.model.facts import (
        locate_notes,  # here: facts is heavy, status/rollback load this module
    )
    from fleetctl.plan.patched_worker import host_coverage, instances, launch_env, launch_flags

    cov = host_coverage(h, f, pb)
    env = f.judged_env(launch_env(h, pb))  # after the interpreter's start-up hooks
    missing = f.package_error or "SGLang not found by the launch's python"
    ex = Explained(cov.reason if cov else missing, version=f.package_version, shown_env=engine().shown_env(env),
                   flags=engine().shown_flags(launch_flags(h, pb)),
                   worker_class=cov.worker_class if cov else None, worker_file=cov.worker_file if cov else None,
                   disable_overlap_schedule=cov.disable_overlap_schedule if cov else None,
                   covered=cov.covered if cov else None, refused=cov.refused if cov else missing,
                   families=cov.families if cov else [])
    if f.package_version:
        ex.instances = [_explain_instance(ex, f, pb, inst) for inst in instances(h, pb)]
    # the code import would load for the worker file, not only its source (bytecode)
    bc = f.bytecode_problem(cov.worker_file) if cov and cov.worker_file else None
    ex.bytecode = bc
    ex.notes = [*f.package_notes, *locate_notes(f), *ex.notes]
    ex.startup_env = f.hook_notes()
    ex.model_architecture = f.model.arch if f.model else None
    if cov and cov.uncertain and cov.covered is None and not cov.refused and cov.families:
        ex.reason = cov.uncertain  # nothing certain to say first: the line is the uncertainty (not a note again)
    elif cov and cov.uncertain:
        ex.notes.append(cov.uncertain)
    if bc and f.bytecode_loader(cov.worker_file or "") != "source":
        ex.refused = ex.refused or bc
    elif bc:
        ex.notes.append(f"{bc}: deploy removes it when it patches the file")
    for pf in pb.files_for(f.package_version or "") or []:
        other = f.bytecode_problem(pf.path) if pf.path != (cov.worker_file if cov else None) else None
        if other:
            ex.notes.append(other)
    if f.package_version and pb.files_for(f.package_version) is None:
        ex.refused = (engine().playbook_refusal(pb, f.package_version)
                      or f"SGLang {f.package_version} has no patch set in {pb.path.name}; "
                      f"supported: {', '.join(pb.supported())}")
        if not _speaks_of_workers(pb):  # a playbook that never patches a worker hears nothing of them
            ex.reason = ex.refused
    for inst in instances(h, pb):  # a steps=0 slot the launch's batch limit never reaches
        ex.note(*engine().playbook_warnings(pb, dict(inst.flags)))
    return HostResult(h.name, "refused" if ex.refused else "ok", ex.reason, ex)


def _speaks_of_workers(pb: Playbook) -> bool:
    """Does the playbook patch a speculative worker in some release (or ask for the check)?"""
    if pb.covers.worker:
        return True
    for v in pb.versions:
        workers = set(engine().worker_files(v).values()) if engine().is_known(v) else set()
        if any(pf.path in workers for pf in pb.files_for(v) or []):
            return True
    return False


def explain(*, playbook: Path, inventory: Path | None, limit: str | None, forks: int, json_out: bool, debug: bool,
        accept_new_host_keys: bool, probe: bool = False) -> None:
    with playbook_fleet(playbook, inventory, limit, forks, command="explain", json=json_out, debug=debug,
                        accept_new_host_keys=accept_new_host_keys) as (pb, ctx):
        from fleetctl.model.explain import Explained
        from fleetctl.ops.deploy import gather

        gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, pb))
        rows: list[HostResult[Explained]] = []
        for h in ctx.fleet.hosts:
            o = gathered.outcomes[h.name]
            rows.append(o.carry(Explained(o.message, answered=False)) if not o.ok
                        else _explain_row(h, gathered.facts[h.name], pb))
        if probe:
            from fleetctl.commands.probe import add_probe_answers

            add_probe_answers(ctx, pb, gathered, rows)
        for r in rows:  # a host that answered: the playbook serves it, or it is refused (and why)
            if r.detail.answered:
                r.status = "refused" if r.detail.refused else "ok"
        explained = [r.row() for r in rows]
        runlog.result(explained)
        if json_out:
            emit_json("explain", ok=all(r.ok for r in rows), playbook=str(pb.path), hosts=explained)
        else:
            render_explain(rows)
            err.print(line(f"explain: {plural(len(rows), 'host')}: "
                           + _counts([r.status for r in rows], {}, always=("ok",))))
        raise typer.Exit(EXIT_OK if all(r.ok for r in rows) else EXIT_FAILED)


def _restart_reminder(ctx: RunContext, pb: Playbook | None, changed: list[str],
                      files: list[str] | None = None, found: dict[str, Any] | None = None) -> Any:
    """After files changed on these hosts: which servers there (launched by fleetctl or not) now run
    older code than the files on disk. None when nothing changed. `found`: hosts whose servers were
    already read right after their change (the deploy's `then_facts`); the others are asked now."""
    if not changed:
        return None
    found = found or {}
    from fleetctl.ops.discover import discover_fleet, restart_reminder  # (a no-op deploy never needs it)

    hosts = [h for h in ctx.fleet.hosts if h.name in set(changed) and h.name not in found]
    if hosts and ctx.fleet.interrupt.is_set():  # Ctrl-C: no new step on any host (its report says so)
        return None
    more = discover_fleet(ctx.fleet, pb, hosts, files) if hosts else []
    return restart_reminder([found[h] for h in changed if h in found] + more, ctx.fleet.hosts)


def _fatal_refusal(command: str, plans: Sequence[HostPlan | RollbackPlan], plan: Any,
                   bad: Sequence[HostPlan | RollbackPlan], json_out: bool) -> None:
    """--any-errors-fatal: some host cannot take part, so no host is changed (exit 1). `plan`: the
    plan document (--json's `plan`), `bad`: the plans of the hosts that block."""
    msg = (f"{command}: --any-errors-fatal: {len(bad)} selected host(s) unreachable or refused at plan time "
           f"({bad[0].host}: {bad[0].message}); nothing was changed on any host")
    blocking = {p.host for p in bad}
    runlog.result(plan_hosts(plans, blocking))
    if json_out:
        emit_json(command, ok=False, message=msg, hosts=plan_hosts(plans, blocking),
                  plan=plan, changed=False, any_errors_fatal=True,
                  blocking=[{**p.head(), "reason": p.message} for p in bad])
    else:
        err.print(line(msg))
    raise typer.Exit(EXIT_FAILED)


def _rolling(ctx: RunContext, pb: Playbook, plan: Plan, serial: int | None, canary: int | None, budget: float,
             ready_timeout: float | None, limit: str | None) -> None:
    from fleetctl.ops.deploy import new_op_id
    from fleetctl.ops.rolling import rolling_deploy

    def progress(bi: int, rows: dict[str, Any]) -> None:
        if not ctx.json:
            bad = sum(1 for r in rows.values() if r.status != "ok")
            err.print(f"batch {bi}: {len(rows)} host(s), {bad} failed", markup=False)

    op_id = new_op_id("d")
    record = Recorded(op_id, "deploy --restart", inventory=ctx.inventory.path, playbook=pb.path,
                      args={"limit": limit, "serial": serial, "canary": canary, "max_fail": budget},
                      hosts=[h.name for h in ctx.fleet.hosts])
    res = rolling_deploy(ctx.fleet, pb, plan, serial=serial, canary=canary, max_fail=budget,
                         ready_timeout=ready_timeout, progress=progress, op_id=op_id)
    record.finish(res.ok, [h.to_json() for h in res.hosts], op_id=res.deploy_id)
    summary = (f"deploy --restart {res.deploy_id}: {len(res.batches)} batch(es), "
               + ", ".join(f"{sum(1 for h in res.hosts if h.status == st)} {st}"
                           for st in ("ok", "failed", "unreachable", "refused", "rolled-back", "untouched")
                           if any(h.status == st for h in res.hosts))
               + (f"; stopped at batch {res.stopped_at} (over --max-fail {budget:g}%), that batch rolled back"
                  if res.stopped_at is not None else "")
               + f" in {ctx.elapsed():.2f}s")
    runlog.result(rows_json(res.hosts), op_id=res.deploy_id)
    if ctx.json:
        emit_json("deploy", op_id=res.deploy_id, ok=res.ok, message=summary,
                  hosts=rows_json(res.hosts),
                  summary={"batches": len(res.batches)}, restart=True, plan=plan.to_json(), rollout=res.to_json())
    else:
        t = table("rollout", ["batch", "host", "status", "steps", "what"])
        for hosts, (batch, st, steps, what) in group(
                (h.host, (h.detail.batch, h.status, ", ".join(f"{k}: {v}" for k, v in h.detail.steps.items()),
                          strip_host(h.host, h.message))) for h in res.hosts):
            t.add_row(str(batch) + (" (canary)" if batch == 0 else ""), hosts_cell(hosts), _s(st), steps, what)
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
                         hint=f"name hosts of this command: {', '.join(sorted(selected))}", reference="option-invalid")
    return names

