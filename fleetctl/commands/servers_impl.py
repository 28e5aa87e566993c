"""launch, stop, verify-logs, servers once their options are parsed (declared in servers.py): the
servers and the proof from their logs (issue 5)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fleetctl.commands import validate
from fleetctl.commands.common import (
    emit_json,
    err,
    out,
)
from fleetctl.commands.context import RunContext, fleet_context, playbook_fleet
from fleetctl.commands.context import fmt_time as _ts
from fleetctl.commands.context import run_with_progress as _tick_run
from fleetctl.errors import EXIT_FAILED, EXIT_OK, InputError
from fleetctl.model.hostnames import group, hosts_label, plural, strip_host
from fleetctl.model.recorded import RecordedDetail
from fleetctl.ops import runlog
from fleetctl.ui.jsonout import rows as rows_json
from fleetctl.ui.render import hosts_cell, say, status_cell, table
from fleetctl.ui.safetext import line, lines_cell, safe, styled

if TYPE_CHECKING:  # the playbook, the fleet and the transport: imported by the command that runs
    from fleetctl.ops.launch import HostLaunch, LaunchPlan
    from fleetctl.ops.verify import HostVerify
    from fleetctl.ui.safetext import Text

STYLE = {"ready": "green", "ok": "green", "stopped": "green", "refused": "red", "failed": "red",
         "timeout": "red", "unreachable": "red", "skipped": "yellow", "not running": "yellow",
         "never launched": "yellow", "still running": "red", "running": "green", "PASS": "green", "FAIL": "red"}


def _s(state: str) -> Text:
    return styled(state, STYLE.get(state, "white"))






def render_launch(rows: list[HostLaunch]) -> None:
    """Instances alike share a row; what happened is said once per distinct message, under the table."""
    t = table("launch", ["host", "instance", "GPUs", "port", "status", "ready in", "worker"],
              whole=("instance", "worker"))
    cells: list[tuple[str, tuple[object, ...]]] = []
    whats: list[tuple[str, tuple[str, ...]]] = []
    for r in rows:
        if not r.detail.instances:
            cells.append((r.host, ("", "", "", r.status, "", "")))
            whats.append((r.host, (r.status, strip_host(r.host, r.message))))
        for it in r.detail.instances:
            cells.append((r.host, (it.instance, ",".join(map(str, it.gpus)), str(it.port), it.status,
                                   f"{it.seconds:.1f}s" if it.seconds is not None else "", it.worker.get("class") or "")))
            whats.append((r.host, (it.status, *(strip_host(r.host, m) for m in [it.message, *it.notes] if m))))
    for hosts, (inst, gpus, port, st, secs, worker) in group(cells):
        t.add_row(hosts_cell(hosts), inst, gpus, port, _s(str(st)), secs, worker)
    out.print(t)
    for hosts, (st, *msgs) in group(whats):
        for m in msgs:
            say(out, _s(st), " ", hosts_label(hosts), ": ", m, indent=4)
    for r in rows:
        for it in r.detail.instances:
            if it.tail:
                say(out, safe(f"{r.host} {it.instance}", "red"), f": last {len(it.tail)} log lines of {it.log}:",
                    indent=4)
                for ln in it.tail:  # each log line stays one line (a host cannot forge more)
                    out.print(line("    ", ln))


def render_launch_plan(plans: list[LaunchPlan]) -> None:
    """`launch --check`: per host and instance what would start (GPUs, port, worker) or why not, then
    the argv, env and cwd once per distinct launch, and what --replace would stop first."""
    t = table("launch --check", ["host", "instance", "GPUs", "port", "plan", "worker"], whole=("instance", "worker"))
    cells: list[tuple[str, tuple[object, ...]]] = []
    whats: list[tuple[str, tuple[str, ...]]] = []
    runs: list[tuple[str, tuple[str, str, str]]] = []
    for p in plans:
        st = p.status if p.status != "start" else "would start"
        if not p.instances:
            cells.append((p.host, ("", "", "", st, "")))
        for i in p.instances:
            cells.append((p.host, (i.instance, ",".join(map(str, i.gpus)), str(i.port), st,
                                   i.worker.get("class") or "")))
            msgs = [*i.problems, *i.notes, *i.warnings] or ([p.message] if p.status != "start" else [])
            whats.append((p.host, (st, *(strip_host(p.host, m) for m in msgs if m))))
            if p.status == "start":
                env = " ".join(f"{k}={v}" for k, v in i.env.items())
                runs.append((p.host, (shlex.join(i.argv), env, i.cwd)))
        if p.stop:
            whats.append((p.host, (st, f"stops first (--replace): {', '.join(p.stop)}; ports and GPUs "
                                       "are checked again after that")))
        if p.status != "start" and not p.instances:
            whats.append((p.host, (st, strip_host(p.host, p.message))))
    for hosts, (inst, gpus, port, st, worker) in group(cells):
        t.add_row(hosts_cell(hosts), inst, gpus, port, _s(str(st)), worker)
    out.print(t)
    for hosts, (st, *msgs) in group(whats):
        for m in msgs:
            say(out, _s(st), " ", hosts_label(hosts), ": ", m, indent=4)
    for hosts, (argv, env, cwd) in group(runs):
        say(out, hosts_label(hosts), ": ", argv, indent=4)
        say(out, "    env: ", env or "(none)", "; cwd: ", cwd, indent=8)


def _instances_label(hosts: list[str], names: list[str]) -> str:
    """ "h01-h06 (6 hosts) port-30000", or the instance names when they differ (few shown)."""
    uniq = list(dict.fromkeys(names))
    if len(hosts) == 1 and len(uniq) == 1:
        return f"{hosts[0]} {uniq[0]}"
    shown = ", ".join(uniq[:4]) + (f" and {len(uniq) - 4} more" if len(uniq) > 4 else "")
    return f"{hosts_label(hosts)} {shown}"


def render_verify(rows: list[HostVerify], markers: list[str]) -> None:
    """Rows alike (same instance, rank results, launch) share one row whatever their host; the launch
    and its arguments, and each distinct failure, are said once under the table with their hosts."""
    from fleetctl.ops.verify import collapse_ranks, rank_label

    t = table("verify-logs", ["host", "instance", "rank", *markers, "result"])
    plain: list[tuple[str, tuple[object, ...]]] = []
    for r in rows:
        if not r.detail.instances:
            plain.append((r.host, ("", (), None, r.status, strip_host(r.host, r.message))))
        for iv in r.detail.instances:
            ranks = tuple((rank_label(rc.ranks), tuple(bool(rc.markers.get(m)) for m in markers)) for rc in iv.ranks)
            plain.append((r.host, (iv.instance, ranks, iv.ok, "", "")))
    no_instances = []
    for hosts, (inst, ranks, ok, st, msg) in group(plain):
        if ok is None:
            t.add_row(hosts_cell(hosts), "", "", *["" for _ in markers], _s(st))
            if st in ("ok", "failed") and msg:  # (unreachable hosts are said by the command)
                no_instances.append((hosts, st, msg))
            continue
        res = _s("PASS" if ok else "FAIL")
        if not ranks:
            t.add_row(hosts_cell(hosts), inst, "", *["" for _ in markers], res)
        for k, (label, seen) in enumerate(ranks):
            cells = [styled("yes", "green") if y else styled("MISSING", "red") for y in seen]
            t.add_row(hosts_cell(hosts) if k == 0 else "", inst if k == 0 else "", label, *cells,
                      res if k == 0 else "")
    out.print(t)
    for hosts, st, msg in no_instances:
        say(out, _s(str(st)), " ", hosts_label(hosts), ": ", msg, indent=4)
    launches: list[tuple[str, tuple[str, str, str]]] = []
    for r in rows:
        for iv in r.detail.instances:
            args = ", ".join(f"{k}={v}" for k, v in iv.args.items() if v is not None)
            launches.append((r.host, (iv.launch_id or "-", "running" if iv.running else "NOT running", args)))
    for hosts, (lid, running, args) in group(launches):
        what = f"launch {lid}" if lid != "-" else "no launch record"
        say(out, f"{what} ({running}) on {hosts_label(hosts)}", *([": ", args] if args else []), indent=4)
    for r in rows:  # the playbook's verify.report lines (e.g. each switch of the feature): shown, never judged
        for iv in r.detail.instances:
            for pat, rep in iv.reports.items():
                say(out, f"{r.host} {iv.instance}: {rep['count']} line(s) with {pat!r}, the latest:", indent=4)
                for ln in rep["latest"]:
                    out.print(line(f"    | {ln}"))
    survived = [(r.host, (iv.instance, e)) for r in rows for iv in r.detail.instances if iv.ok
                for e in iv.explanation if "(reported, not a failure)" in e]
    for hosts, (inst, e) in group(survived):
        say(out, "note: ", _instances_label(hosts, [inst]), ": ", e, indent=4)
    fails: list[tuple[str, tuple[object, ...]]] = []
    names: dict[tuple[object, ...], list[str]] = {}
    for r in rows:
        for iv in r.detail.instances:
            if iv.ok:
                continue
            key = (tuple(iv.problems), tuple(iv.explanation), tuple(iv.forbidden), tuple(iv.tail), iv.log)
            fails.append((r.host, key))
            names.setdefault(key, []).append(iv.instance)
    for hosts, key in group(fails):
        problems, explanation, forbidden, tail, log = key
        say(out, styled("FAIL", "red"), " ", _instances_label(hosts, names[key]), ":", indent=4)
        for p in problems:
            say(out, f"  - {p}", indent=4)
        for e in explanation:  # (an entry that names its own kind, 'why: ...' / 'maybe: ...', keeps it)
            say(out, f"    {e}" if e.startswith(("why: ", "maybe: ")) else f"    why: {e}", indent=8)
        for ln in collapse_ranks(list(forbidden)):  # a line each rank logged: once
            out.print(line(f"    | {ln}"))
        if tail:
            say(out, f"    last {len(tail)} lines of {log}:", indent=8)
            for ln in tail:
                out.print(line(f"    | {ln}"))


def launch(*, playbook: Path, inventory: Path | None, limit: str | None, forks: int, replace: bool,
        timeout: float | None, drop_unknown_flags: bool, allow_uncovered: bool, json_out: bool, debug: bool,
        accept_new_host_keys: bool, check: bool = False) -> None:
    with playbook_fleet(playbook, inventory, limit, forks, command="launch", json=json_out, debug=debug,
                        accept_new_host_keys=accept_new_host_keys) as (pb, ctx):
        from fleetctl.config.launch_ready import launch_refusal

        refusal = launch_refusal(pb)
        if refusal:
            raise InputError(refusal, reference="launch-profile-invalid")
        if check:
            _launch_check(ctx, pb, replace=replace, drop_unknown_flags=drop_unknown_flags,
                          allow_uncovered=allow_uncovered)
        from fleetctl.ops.deploy import new_op_id
        from fleetctl.ops.launch import launch_fleet
        lid = new_op_id("l")
        from fleetctl.ops.record import Recorded

        record = Recorded(lid, "launch", inventory=ctx.inventory.path, playbook=pb.path,
                          args={"limit": limit, "replace": replace, "timeout": timeout},
                          hosts=[h.name for h in ctx.fleet.hosts])
        try:
            _, rows = _tick_run(ctx, "launch", lambda: launch_fleet(ctx.fleet, pb, replace=replace,
                                                                     timeout=timeout, launch_id=lid,
                                                                     drop_unknown_flags=drop_unknown_flags,
                                                                     allow_uncovered=allow_uncovered))
            bad = [r for r in rows if not r.ok]
            record.finish(not bad, [r.carry(RecordedDetail([i.to_json() for i in r.detail.instances])).to_json()
                                    for r in rows])
        finally:
            record.ledger.close()  # (also when interrupted: the ledger marks the launch so later)
        n = sum(len(r.detail.instances) for r in rows)
        ready = sum(1 for r in rows for i in r.detail.instances if i.status == "ready")
        summary = (f"launch {lid}: {plural(len(rows), 'host')}, {plural(n, 'instance')}: {ready} ready, {n - ready} not "
                   f"in {ctx.elapsed():.2f}s")
        runlog.result(rows_json(rows), op_id=lid)
        if json_out:
            emit_json("launch", op_id=lid, ok=not bad, message=summary,
                      hosts=rows_json(rows),
                      summary={"instances": n, "ready": ready}, elapsed=round(ctx.elapsed(), 3))
        else:
            render_launch(rows)
            err.print(summary, markup=False)
        raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)



def _launch_check(ctx: RunContext, pb: Any, **kw: bool) -> None:
    """launch --check: the same facts and plan as a launch, minus the apply."""
    from fleetctl.ops.launch import check_fleet

    plans = _tick_run(ctx, "facts", lambda: check_fleet(ctx.fleet, pb, **kw))
    bad = [p for p in plans if p.status != "start"]
    msg = (f"launch --check: {plural(len(plans), 'host')}: {len(plans) - len(bad)} would start, {len(bad)} would not; "
           f"nothing was started or stopped ({ctx.elapsed():.2f}s)")
    runlog.plan([p.to_json() for p in plans])
    runlog.result([p.row() for p in plans])
    if ctx.json:
        emit_json("launch", ok=not bad, check=True, message=msg,
                  hosts=[p.row() for p in plans],
                  elapsed=round(ctx.elapsed(), 3))
    else:
        render_launch_plan(plans)
        err.print(line(msg))
    raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


def verify_logs(*, playbook: Path, inventory: Path | None, limit: str | None, forks: int, json_out: bool, debug: bool,
        accept_new_host_keys: bool) -> None:
    with playbook_fleet(playbook, inventory, limit, forks, command="verify-logs", json=json_out, debug=debug,
                        accept_new_host_keys=accept_new_host_keys) as (pb, ctx):
        from fleetctl.ops.verify import verify_fleet
        rows = _tick_run(ctx, "verify-logs", lambda: verify_fleet(ctx.fleet, pb))
        bad = [r for r in rows if not r.ok]
        n_inst = sum(len(r.detail.instances) for r in rows)
        n_bad = sum(1 for r in rows for i in r.detail.instances if not i.ok)
        summary = (f"verify-logs: {plural(len(rows), 'host')}, {plural(n_inst, 'instance')}: {n_inst - n_bad} passed, "
                   f"{n_bad} failed, {sum(1 for r in rows if r.status not in ('ok', 'failed'))} unreachable "
                   f"in {ctx.elapsed():.2f}s")
        runlog.result(rows_json(rows))
        if json_out:
            emit_json("verify-logs", ok=not bad, message=summary,
                      hosts=rows_json(rows),
                      summary={"instances": n_inst, "instances_passed": n_inst - n_bad,
                               "instances_failed": n_bad},
                      markers=list(pb.verify.markers), elapsed=round(ctx.elapsed(), 3))
        else:
            render_verify(rows, list(pb.verify.markers))
            for r in rows:
                if r.status not in ("ok", "failed"):
                    out.print(line(styled(r.status, "red"), " ", r.message))
            err.print(summary, markup=False)
        raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)



def stop(*, playbook: Path | None, inventory: Path | None, limit: str | None, forks: int, instance: list[str] | None,
        timeout: float | None, json_out: bool, debug: bool, accept_new_host_keys: bool) -> None:
    if timeout is None and playbook:
        from fleetctl.config import playbook_cache

        timeout = playbook_cache.load(playbook).launch.stop_timeout
    t = timeout if timeout is not None else 30.0
    if instance is not None and not instance:
        raise InputError("--instance given without a name", reference="option-invalid")
    validate.instances(instance)
    with fleet_context(inventory, limit, forks, command="stop", json=json_out, debug=debug,
                       accept_new_host_keys=accept_new_host_keys) as ctx:
        from fleetctl.ops.launch import stop_fleet
        rows = _tick_run(ctx, "stop", lambda: stop_fleet(ctx.fleet, names=instance or None, timeout=t))
        bad = [r for r in rows if not r.ok]
        summary = (f"stop: {plural(len(rows), 'host')}: {sum(1 for r in rows for s in r.detail.instances if s.action == 'stopped')}"
                   f" servers stopped, {plural(len(bad), 'host')} failed in {ctx.elapsed():.2f}s")
        runlog.result(rows_json(rows))
        if json_out:
            emit_json("stop", ok=not bad, message=summary,
                      hosts=rows_json(rows),
                      summary={"stopped": sum(1 for r in rows for s in r.detail.instances if s.action == "stopped")})
        else:
            tb = table("stop", ["host", "instance", "pid", "result", "how"], whole=("instance",))
            stops: list[tuple[str, tuple[str, str, str, str]]] = []
            for r in rows:
                if not r.detail.instances:
                    stops.append((r.host, ("", "", r.status, strip_host(r.host, r.message)
                                           if r.status != "ok" else "nothing launched")))
                for s in r.detail.instances:
                    stops.append((r.host, (s.instance, str(s.pid or ""), s.action, s.how or "")))
            for hosts, (inst, pid, st, how) in group(stops):
                tb.add_row(hosts_cell(hosts), inst, pid, _s(st), how)
            out.print(tb)
            err.print(summary, markup=False)
        raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)



def servers(*, inventory: Path | None, limit: str | None, forks: int, discover: bool, json_out: bool, debug: bool,
        accept_new_host_keys: bool) -> None:
    with fleet_context(inventory, limit, forks, command="servers", json=json_out, debug=debug,
                       accept_new_host_keys=accept_new_host_keys) as ctx:
        from fleetctl.ops.launch import status_fleet
        if discover:
            _discover(ctx, json_out)
        rows = _tick_run(ctx, "servers", lambda: status_fleet(ctx.fleet))
        bad = [r for r in rows if not r.ok]
        if json_out:
            emit_json("servers", ok=not bad, hosts=rows_json(rows),
                      summary={"servers": sum(len(r.detail.servers) for r in rows),
                               "running": sum(1 for r in rows for sv in r.detail.servers if sv["running"])})
        else:
            tb = table("servers", ["host", "instance", "state", "worker", "deploy at launch"],
                       whole=("instance", "deploy at launch"))
            for r in rows:
                h, srv = r.host, r.detail.servers
                if not r.ok:
                    tb.add_row(h, "", status_cell(r.status), "", "")
                for k, s in enumerate(srv):
                    tb.add_row(h if k == 0 else "", lines_cell([s["instance"], f"pid {s['pid'] or '-'}"]),
                               _s("running" if s["running"] else "not running"),
                               lines_cell([s["worker"] or "", f"SGLang {s['version'] or '?'}"]),
                               lines_cell([s["deploy_at_launch"] or "(none)", f"since {_ts(s['since']) or '-'}"]))
            out.print(tb)
            for r in rows:
                h, srv = r.host, r.detail.servers
                if not r.ok:
                    say(out, _s(r.status), " ", h, ": ", strip_host(h, r.message), indent=4)
                for s in srv:
                    for p in s["problems"]:
                        say(out, f"{h} {s['instance']}: ", p, indent=4)
            n_srv = sum(len(r.detail.servers) for r in rows)
            err.print(line(f"servers: {plural(len(rows), 'host')}: {n_srv} server(s) launched by fleetctl, "
                           f"{sum(1 for r in rows for s in r.detail.servers if s['running'])} running, "
                           f"{plural(len(bad), 'host')} failed ({ctx.elapsed():.2f}s)"))
        raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


def _discover(ctx: RunContext, json_out: bool) -> None:
    from fleetctl.ops.discover import discover_fleet, restart_reminder

    found = _tick_run(ctx, "servers", lambda: discover_fleet(ctx.fleet))
    bad = [h for h in found if h.status != "ok"]
    reminder = restart_reminder(found, ctx.fleet.hosts)
    n = sum(len(h.detail.processes) for h in found)
    summary = (f"servers --discover: {plural(len(found), 'host')}: {n} server process(es), "
               f"{sum(1 for h in found for p in h.detail.processes if not p.instance)} not started by fleetctl, "
               f"{reminder.servers} running older code than the files on disk, {plural(len(bad), 'host')} failed "
               f"({ctx.elapsed():.2f}s)")
    if json_out:
        emit_json("servers", ok=not bad, message=summary,
                  hosts=rows_json(found),
                  summary={"servers": n, "not_fleetctl": sum(1 for h in found for p in h.detail.processes if not p.instance),
                           "restart_needed": reminder.servers},
                  discover=True, restart_needed=reminder.to_json())
    else:
        # one block per process (each its own pid): fits 80 columns, paths whole on their line
        say(out, styled("SGLang server processes", "bold"))
        quiet = group((h.host, (h.status, strip_host(h.host, h.message) if h.status != "ok" else ""))
                      for h in found if h.status != "ok" or not h.detail.processes)
        for h in found:
            for p in h.detail.processes:
                who = (f"started by fleetctl ({p.instance})" if p.instance
                       else styled("not started by fleetctl", "yellow"))
                say(out, styled(f"{h.host} pid {p.pid}", "bold"), f" port {','.join(map(str, p.ports)) or '-'}: ",
                    who, f", SGLang {p.version or '?'}, since {_ts(p.started) or '?'}", indent=4)
                code = (line(styled("OLDER than the files on disk", "red"), ": " + ", ".join(p.changed_files))
                        if p.stale else "current")
                say(out, f"    worker {p.worker.get('class') or '-'}; code ", code, indent=8)
                if p.log:
                    say(out, "    log ", p.log, indent=4)
                if not p.instance:
                    say(out, "    argv: ", " ".join(p.argv)[:500], indent=8)
                    say(out, f"    worker: {p.worker.get('reason', '')}", indent=8)
            if h.detail.truncated:
                say(out, f"{h.host}: (more processes: list cut)")
        for hosts, (st, msg) in quiet:
            if st == "ok":
                say(out, hosts_label(hosts), ": no SGLang server process", indent=4)
            else:
                say(out, _s(st), " ", hosts_label(hosts), ": ", msg, indent=4)
        err.print(summary, markup=False)
        if reminder.servers:
            from fleetctl.ops.record import launch_playbooks

            err.print(reminder.line(str(ctx.inventory.path), None, launch_playbooks(reminder.launch_ids)),
                      markup=False, highlight=False)
    raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)
