"""deploy, rollback, status, history (and the commands other modules fill in)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

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
from fleetctl.engine import engine
from fleetctl.errors import EXIT_FAILED, EXIT_OK, InputError
from fleetctl.hostnames import group, hosts_label, strip_host
from fleetctl.jsonout import host_row
from fleetctl.ledger import Ledger
from fleetctl.protocol.names import READ_FILES, WITH_DISCOVER, WITH_SERVERS, WITH_STATE
from fleetctl.render import hosts_cell, say, status_cell, table
from fleetctl.safetext import line, lines_cell, styled

if TYPE_CHECKING:  # the playbook (pydantic, yaml), the fleet and the transport (paramiko, fabric) are
    # imported by the commands that use them (issue 16.10: 'fleetctl history' never loads them)
    from fleetctl.config.playbook import Playbook
    from fleetctl.deploy_plan import Plan
    from fleetctl.protocol.answers import ReadFilesAnswer
    from fleetctl.runner import HostOutcome

PlaybookArg = Annotated[Path, typer.Argument(help="Playbook YAML, or a directory holding playbook.yaml.",
                                             show_default=False)]

STATE_STYLE = {"pristine": "cyan", "as-intended": "green", "drifted": "red", "missing": "red", "unsafe": "red",
               "original": "cyan", "as-deployed": "green", "change": "cyan", "noop": "green", "refused": "red",
               "unreachable": "red", "failed": "red", "changed": "green", "unchanged": "green",
               "skipped": "yellow", "ok": "green", "rolled-back": "yellow", "untouched": "yellow",
               "interrupted": "red", "pending": "yellow", "running": "yellow"}


def _s(state: str, width: int = 0) -> Text:
    """A state in its style, padded to `width` (columns of one line per file)."""
    return styled(state.ljust(width), STATE_STYLE.get(state, "white"))




def _plan_key(hp: Any) -> tuple[Any, ...]:
    c = hp.coverage
    return (hp.version, hp.status, strip_host(hp.host, hp.reason), tuple(hp.interrupted),
            tuple((fp.path, fp.state, fp.action, fp.note) for fp in hp.files),
            None if c is None else (c.covered, c.refused, c.reason, c.uncertain))


def render_plan(plan: Plan) -> None:
    """One block per distinct plan: hosts planned alike share it ("h01-h64 (64 hosts)"); one line
    per file (state, action, path, then its note), so a path is never cut at 80 columns."""
    groups = group((hp.host, _plan_key(hp)) for hp in plan.hosts)
    by_host = {hp.host: hp for hp in plan.hosts}
    say(out, styled("plan", "bold"), f": {len(plan.hosts)} host(s), {len(groups)} distinct plan(s)")
    for hosts, _ in groups:
        hp = by_host[hosts[0]]
        why = strip_host(hp.host, hp.reason)
        if not hp.files and hp.status in ("refused", "unreachable", "failed"):  # "failed h03: why"
            say(out, _s(hp.status), " ", hosts_label(hosts), ": ", why, indent=4)
            continue
        say(out, styled(hosts_label(hosts), "bold"), f": SGLang {hp.version or '?'}: ", _s(hp.status),
            *([": ", why] if why and not hp.files else []), indent=4)
        for fp in hp.files:
            say(out, "  ", _s(fp.state, 11), f" {fp.action:<7} ", fp.path, *([": ", fp.note] if fp.note else []),
                indent=24)
        c = hp.coverage
        if c is not None:
            if c.refused and hp.status != "refused":  # --allow-uncovered: say what will happen
                what = ("; --allow-uncovered: the files are patched, but the patched code will not run there "
                        "until the launch runs a worker the playbook patches")
                head = styled("NOT covered, deployed anyway", "yellow")
            elif c.refused:  # (covered, but not certain under --strict: "covered, refused")
                what, head = "", styled("covered, refused" if c.covered else "NOT covered, refused", "red")
            else:
                what, head = "", styled("covered", "green") if c.covered else styled("NOT covered", "red")
            say(out, "  worker that will run: ", head, ": ", c.reason, what, indent=4)
            if c.uncertain and not c.refused:  # --strict refuses it
                say(out, "  ", styled("warning:", "yellow"), " ", c.uncertain, "; --strict refuses such hosts",
                    indent=4)
        if hp.interrupted:
            say(out, "  ", _s("interrupted"), " deploy ", ", ".join(hp.interrupted), ": repaired first", indent=4)
    for hosts, _ in groups:
        hp = by_host[hosts[0]]
        if hp.status in ("refused", "unreachable", "failed") and hp.files:
            say(out, styled(hp.status, "red"), " ", hosts_label(hosts), ": ", strip_host(hp.host, hp.reason),
                indent=4)


def render_rollback_plan(plans: list[Any]) -> None:
    """As render_plan: one block per distinct rollback plan, a refusal on the file it is about."""
    def key(p: Any) -> tuple[Any, ...]:
        return (p.status, strip_host(p.host, p.reason), tuple(p.deploy_ids),
                tuple((f["path"], f["state"], f["action"]) for f in p.files))

    groups = group((p.host, key(p)) for p in plans)
    by_host = {p.host: p for p in plans}
    say(out, styled("rollback plan", "bold"), f": {len(plans)} host(s), {len(groups)} distinct plan(s)")
    for hosts, _ in groups:
        p = by_host[hosts[0]]
        why = strip_host(p.host, p.reason)
        undo = f": undo {', '.join(p.deploy_ids)}" if p.deploy_ids else ""
        on_file = next((f for f in p.files if f["state"] == "drifted"), None) if p.status == "refused" else None
        if not p.files and p.status in ("refused", "unreachable", "failed"):  # "failed h03: why"
            say(out, _s(p.status), " ", hosts_label(hosts), ": ", why, indent=4)
            continue
        say(out, styled(hosts_label(hosts), "bold"), undo, ": ", _s(p.status),
            *([": ", why] if why and on_file is None else []), indent=4)
        for f in p.files:
            note = why[len(f["path"]) + 1:] if why.startswith(f["path"] + " ") else why
            say(out, "  ", _s(f["state"], 11), f" {f['action']:<7} ", f["path"],
                *([": ", note] if f is on_file else []), indent=24)


def render_status(rows: list[dict[str, Any]]) -> None:
    """Hosts alike share a row; the state says whether the host has problems, listed under the table
    (one paragraph per distinct list, with the hosts it applies to)."""
    def state(r: dict[str, Any]) -> Text:
        if r["status"] != "ok":
            return status_cell(r["status"])
        return styled("problems", "red") if r["problems"] else styled("ok", "green")

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (state(r).plain, r.get("version") or "", r.get("last_deploy") or "", r.get("files") or "",
                tuple(strip_host(r["host"], p) for p in r["problems"]),
                tuple(strip_host(r["host"], n) for n in r.get("notes", [])))

    groups = group((r["host"], key(r)) for r in rows)
    by_host = {r["host"]: r for r in rows}
    t = table(None, ["host", "state", engine().display_name, "last deploy", "files"], whole=("last deploy",))
    for hosts, (_, version, last, files, _, _) in groups:
        t.add_row(hosts_cell(hosts), state(by_host[hosts[0]]), version, last, files)
    out.print(t)
    for hosts, (_, _, _, _, problems, notes) in groups:
        for p in problems:
            say(out, styled("problem", "red"), " ", hosts_label(hosts), ": ", p, indent=4)
        for n in notes:
            say(out, "note ", hosts_label(hosts), ": ", n, indent=4)


def render_explain(rows: list[dict[str, Any]]) -> None:
    """The explain sentence once per distinct answer, with the hosts it applies to."""
    def lines(r: dict[str, Any]) -> tuple[tuple[Any, ...], ...]:
        if r["status"] != "ok":
            return ((styled(r["status"], "red"), " ", strip_host(r["host"], r["reason"])),)
        mark = styled("ok", "green") if not r.get("refused") else styled("REFUSED", "red")
        insts = r.get("instances") or []
        alike = len(insts) > 1 and all(i["reason"] == insts[0]["reason"] for i in insts)
        got: list[tuple[Any, ...]] = [((f"({len(insts)} instances each) " if alike else ""), r["reason"],
                                       " [", mark, "]")]
        if len(insts) > 1 and not alike:
            got += [(f"  {i['instance']} (GPUs {','.join(map(str, i['gpus']))}): {i['reason']}",) for i in insts]
        if r.get("refused") and r["refused"] != r["reason"]:
            got.append((f"  {strip_host(r['host'], r['refused'])}",))
        got += [(f"  note: {n}",) for n in r.get("notes") or []]
        got += [(f"  warning: {n}",) for n in dict.fromkeys(n for i in insts for n in i.get("never_fires") or [])]
        return tuple(got)

    def plain(ls: tuple[tuple[Any, ...], ...]) -> tuple[str, ...]:
        return tuple(line(*ln).plain for ln in ls)

    by_host = {r["host"]: r for r in rows}
    for hosts, _ in group((r["host"], plain(lines(r))) for r in rows):
        first, *rest = lines(by_host[hosts[0]])
        say(out, styled(hosts_label(hosts), "bold"), ": ", *first, indent=4)
        for ln in rest:
            say(out, *ln, indent=4)


def _udiff(a: bytes, b: bytes, la: str, lb: str) -> str:
    ta = a.decode("utf-8", "replace").splitlines(keepends=True)
    tb = b.decode("utf-8", "replace").splitlines(keepends=True)
    return "".join(difflib.unified_diff(ta, tb, la, lb))


def print_diffs(ctx: RunContext, plan: Plan) -> None:
    """Unified diffs, no size limit: remote vs intended; for drifted files also remote vs pristine.
    An identical diff is shown once, under the hosts it applies to (issue 16.7)."""
    from fleetctl import wheels

    diffs: list[tuple[str, tuple[str, str]]] = []  # (host, (path, diff text))
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
            text = _udiff(now, it[fp.path].data, f"{fp.path} (on host)", f"{fp.path} (intended)")
            if fp.state == "drifted":
                pristine = wheels.pristine_bytes(hp.version or "", fp.path)
                text += _udiff(pristine, now, f"{fp.path} (pristine {hp.version})", f"{fp.path} (on host)")
            diffs.append((hp.host, (fp.path, text)))
    for hosts, (path, text) in group(diffs):
        say(out, styled("diff", "bold"), " ", path, " on ", hosts_label(hosts), ":")
        out.print(text, markup=False, highlight=False)  # never wrapped: a diff stays appliable


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
        strict: bool = typer.Option(False, "--strict", help="Refuse hosts where the worker that will run is not certain (the model's config.json cannot be read there)."),
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
        from fleetctl.config.playbook import load_playbook

        budget = validate.rolling(restart, serial=serial, canary=canary, max_fail=max_fail,
                                  ready_timeout=ready_timeout)
        validate.exclusive(diff=diff, json=json_out)
        pb = load_playbook(playbook)
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            from fleetctl.ops.deploy import apply_plan, build_plan, gather, new_op_id
            from fleetctl.ops.rolling import parse_count
            gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, pb))
            plan = build_plan(ctx.fleet, pb, gathered, force=force, allow_uncovered=allow_uncovered, strict=strict)
            if not json_out:
                render_plan(plan)
                if diff:
                    print_diffs(ctx, plan)
            bad_plan = [hp for hp in plan.hosts if hp.status in ("refused", "unreachable", "failed")]
            if check:
                if json_out:
                    emit_json("deploy", ok=not bad_plan, hosts=plan_hosts(plan.to_json()["hosts"]), check=True,
                              plan=plan.to_json(), elapsed=round(ctx.elapsed(), 3),
                              message=f"deploy --check: nothing was changed ({ctx.elapsed():.2f}s)")
                else:
                    err.print(line(f"deploy --check: {len(plan.hosts)} hosts: "
                                   + _counts([hp.status for hp in plan.hosts],
                                             {"change": "would change", "noop": "as intended"},
                                             always=("change", "noop"))
                                   + f"; nothing was changed ({ctx.elapsed():.2f}s)"))
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
                emit_json("deploy", op_id=op_id, ok=not failed, message=summary,
                          hosts=[host_row(r.to_json(), ok=r.status in ("changed", "unchanged")) for r in rows],
                          plan=plan.to_json(), elapsed=round(elapsed, 3),
                          restart_needed=reminder.to_json() if reminder else None)
            else:
                t = table("result", ["host", "status", "deploy id", "what"])
                for hosts, (st, did, what) in group(
                        (r.host, (r.status, r.deploy_id or "", tuple(strip_host(r.host, m) for m in [r.message, *r.notes])))
                        for r in rows):
                    t.add_row(hosts_cell(hosts), _s(st), did, lines_cell(what))
                out.print(t)
                err.print(line(f"deploy {op_id}: {len(rows)} hosts: "
                               + _counts([r.status for r in rows], {}, always=("changed", "failed"))
                               + f" in {elapsed:.2f}s"))
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
        from fleetctl.config.playbook import load_playbook
        to = validate.deploy_id(to)
        if playbook is not None and not from_pristine:
            raise InputError("--playbook goes with --from-pristine", hint="add --from-pristine, or drop --playbook")
        if from_pristine and (to or force or old_tree):
            raise InputError("--from-pristine restores files no deploy record explains; it takes no --to, --force "
                             "or --old-tree", hint="run the plain rollback separately")
        rpb = load_playbook(playbook) if playbook else None
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            from fleetctl.ops.deploy import gather, new_op_id
            from fleetctl.ops.rollback import apply_rollback, plan_rollback
            breaking = _break_lock_hosts(ctx, break_lock)
            gathered = _tick_run(ctx, "facts", lambda: gather(ctx.fleet, rpb, all_hashes=True))
            plans = plan_rollback(ctx.fleet, gathered, to, force, old_tree=old_tree, from_pristine=from_pristine,
                                  playbook=rpb)
            if to is not None and all(p.status == "skipped" for p in plans):
                raise InputError(f"deploy {to} is not on any of the {len(plans)} selected host(s)",
                                 hint="pick an id from 'fleetctl status' or 'fleetctl history', or widen --limit")
            if not json_out:
                render_rollback_plan(plans)
            bad = [p for p in plans if p.status in ("refused", "unreachable", "failed")]
            if check:
                if json_out:
                    emit_json("rollback", ok=not bad, hosts=plan_hosts([p.to_json() for p in plans]), check=True,
                              plan=[p.to_json() for p in plans], message="rollback --check: nothing was changed")
                else:
                    err.print(line(f"rollback --check: {len(plans)} hosts: "
                                   + _counts([p.status for p in plans], {"change": "would be restored",
                                                                         "noop": "nothing to do",
                                                                         "skipped": "not selected by --to"},
                                             always=("change",))
                                   + f"; nothing was changed ({ctx.elapsed():.2f}s)"))
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
                emit_json("rollback", op_id=op_id, ok=not failed, message=summary,
                          hosts=[host_row(r, ok=r["status"] in ("changed", "unchanged", "skipped")) for r in rows],
                          plan=[p.to_json() for p in plans],
                          restart_needed=reminder.to_json() if reminder else None)
            else:
                t = table("result", ["host", "status", "what"])
                for hosts, (st, what) in group(
                        (r["host"], (r["status"], tuple(strip_host(r["host"], m)
                                                        for m in [r.get("message", ""), *r.get("notes", [])])))
                        for r in rows):
                    t.add_row(hosts_cell(hosts), _s(st), lines_cell(what))
                out.print(t)
                err.print(line(f"rollback {op_id}: {len(rows)} hosts: "
                               + _counts([r["status"] for r in rows], {"changed": "restored"}, always=("changed",))
                               + f" in {ctx.elapsed():.2f}s"))
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
        from fleetctl.config.playbook import load_playbook

        pb: Playbook | None = load_playbook(playbook) if playbook else None
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            from fleetctl.facts import read_facts
            from fleetctl.ops.deploy import Gathered, build_plan
            from fleetctl.ops.discover import discover_request, restart_reminder, servers_from_facts
            from fleetctl.ops.launch import server_status_facts
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
                from fleetctl.patched_worker import host_coverage

                by_name = {h.name: h for h in ctx.fleet.hosts}
                for r in rows:
                    f = gathered.facts.get(r["host"])
                    cov = host_coverage(by_name[r["host"]], f, pb) if f else None
                    if cov is not None and cov.refused and pb.files_for(f.package_version or "") is not None:
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
                emit_json("status", ok=not problems, hosts=[
                    host_row(r, ok=not r["problems"], message="; ".join(r["problems"]),
                             state=r["status"] if r["status"] != "ok" else ("problems" if r["problems"] else "ok"))
                    for r in rows], summary={"servers_running": sum(1 for sv in servers if sv["running"]),
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
                n_other = sum(len(r["discovered"]) for r in rows)
                err.print(f"status: {len(rows)} hosts, {len(problems)} with problems, "
                          f"{sum(1 for sv in servers if sv['running'])} server(s) running"
                          + (f" (+{n_other} not started by fleetctl)" if n_other else "")
                          + f" ({ctx.elapsed():.2f}s)", markup=False)
                if reminder.servers:
                    err.print(reminder.line(str(ctx.inventory.path), str(playbook) if playbook else None),
                              markup=False, highlight=False)
            raise typer.Exit(EXIT_FAILED if problems else EXIT_OK)

    @app.command("history", help="The local ledger of deploys, rollbacks and launches; 'history ID' shows one.")
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
                    emit_json("history", op_id=d["id"], ok=True,
                              hosts=[host_row(h, ok=h["status"] in HISTORY_OK) for h in d["hosts"]],
                              message=f"{d['kind']} {d['id']}: {d['outcome'] or 'running'}",
                              operation={k: v for k, v in d.items() if k != "hosts"})
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
                for hosts, (st, msg) in group((h["host"], (h["status"], strip_host(h["host"], h["message"] or "")))
                                              for h in d["hosts"]):
                    t.add_row(hosts_cell(hosts), _s(st), msg)
                out.print(t)
                err.print(line(f"history {d['id']}: {len(d['hosts'])} hosts: "
                               + _counts([h["status"] for h in d["hosts"]], {})))
            else:
                rows = ledger.list(limit_rows)
                if json_out:
                    emit_json("history", ok=True, summary={"operations": len(rows)}, ledger=str(ledger.path),
                              operations=rows)
                    raise typer.Exit(0)
                t = table("history", ["id", "kind", "started", "user", "hosts", "outcome"],
                          whole=("id", "started"))
                for r in rows:
                    t.add_row(r["id"], r["kind"], lines_cell(_ts(r["started"]).split(" ", 1)), r["user"],
                              f"{r['hosts']}" + (f" ({r['hosts_failed']} failed)" if r["hosts_failed"] else ""),
                              _s(r["outcome"] or "running"))
                out.print(t)
                outcomes = [r["outcome"] or "running" for r in rows]
                err.print(line(f"history: {len(rows)} operation(s) shown (--last {limit_rows})"
                               + (": " + _counts(outcomes, {}) if rows else "")
                               + f"; 'fleetctl history ID' shows one; ledger {ledger.path}"))
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
        from fleetctl.config.playbook import load_playbook

        pb = load_playbook(playbook)
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            from fleetctl.ops.deploy import gather
            from fleetctl.ops.verify import never_fires
            from fleetctl.patched_worker import coverage, host_coverage, instances, launch_env, launch_flags
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
                    "host": h.name, "status": "ok", "version": f.package_version,
                    **engine().shown_env(env),
                    "flags": engine().shown_flags(launch_flags(h, pb)),
                    "worker_class": cov.worker_class if cov else None,
                    "worker_file": cov.worker_file if cov else None,
                    "disable_overlap_schedule": cov.disable_overlap_schedule if cov else None,
                    "covered": cov.covered if cov else None,
                    "reason": cov.reason if cov else (f.package_error or "SGLang not found by the launch's python"),
                    "refused": cov.refused if cov else (f.package_error or "SGLang not found by the launch's python"),
                }
                if f.package_version:
                    row["instances"] = []
                    for inst in instances(h, pb):
                        # the env the launch's python sees (an `env` prefix in the command included)
                        ic = coverage(f.package_version, dict(inst.flags), dict(inst.effective_env), pb, model=f.model)
                        args = (engine().resolve_worker(f.package_version, dict(inst.flags), dict(inst.effective_env),
                                                        model_arch=f.model.arch if f.model else None).resolved_args
                                if engine().is_known(f.package_version) else {})
                        row["instances"].append({"instance": inst.name, "gpus": list(inst.gpus), "port": inst.port,
                                                 "worker_class": ic.worker_class, "worker_file": ic.worker_file,
                                                 "disable_overlap_schedule": ic.disable_overlap_schedule,
                                                 "covered": ic.covered, "reason": ic.reason, "refused": ic.refused,
                                                 "never_fires": never_fires(pb, dict(args))})
                # the code import would load for the worker file, not only its source (bytecode)
                bc = f.bytecode_problem(cov.worker_file) if cov and cov.worker_file else None
                row["bytecode"] = bc
                row["notes"] = list(f.package_notes)
                row["model_architecture"] = f.model.arch if f.model else None
                if cov and cov.uncertain:
                    row["notes"].append(cov.uncertain)
                if bc and f.bytecode_loader(cov.worker_file or "") != "source":
                    row["refused"] = row["refused"] or bc
                elif bc:
                    row["notes"].append(f"{bc}: deploy removes it when it patches the file")
                for pf in pb.files_for(f.package_version or "") or []:
                    other = f.bytecode_problem(pf.path) if pf.path != (cov.worker_file if cov else None) else None
                    if other:
                        row["notes"].append(other)
                if f.package_version and pb.files_for(f.package_version) is None:
                    row["refused"] = (f"SGLang {f.package_version} has no patch set in {pb.path.name}; "
                                      f"supported: {', '.join(pb.supported())}")
                rows.append(row)
            bad = [r for r in rows if r["status"] != "ok" or r.get("refused")]
            if json_out:
                emit_json("explain", ok=not bad, playbook=str(pb.path), hosts=[
                    host_row(r, ok=r["status"] == "ok" and not r.get("refused"),
                             state=r["status"] if r["status"] != "ok" else ("refused" if r.get("refused") else "ok"))
                    for r in rows])
            else:
                render_explain(rows)
                err.print(line(f"explain: {len(rows)} hosts: "
                               + _counts(["refused" if r["status"] == "ok" and r.get("refused") else r["status"]
                                          for r in rows], {}, always=("ok",))))
            raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


def _counts(statuses: list[str], words: dict[str, str], always: tuple[str, ...] = ()) -> str:
    """ "3 changed, 1 refused, 2 unreachable": each status counted under its own name (a refusal is
    never counted as a failure), the `always` ones even at 0."""
    order = list(dict.fromkeys([*always, *words, "refused", "unreachable", "failed", *statuses]))
    return ", ".join(f"{statuses.count(st)} {words.get(st, st)}" for st in order
                     if st in always or statuses.count(st))


PLAN_BAD = ("refused", "unreachable", "failed")
HISTORY_OK = ("ok", "changed", "unchanged", "skipped")


def plan_hosts(rows: list[dict[str, Any]], blocking: set[str] | None = None) -> list[dict[str, Any]]:
    """--check and --any-errors-fatal: one envelope row per planned host (its plan row's fields kept)."""
    return [host_row(r, ok=r["status"] not in PLAN_BAD and r["host"] not in (blocking or set())) for r in rows]


def _restart_reminder(ctx: RunContext, pb: Playbook | None, changed: list[str],
                      files: list[str] | None = None) -> Any:
    """After files changed on these hosts: which servers there (launched by fleetctl or not) now run
    older code than the files on disk. None when nothing changed."""
    from fleetctl.ops.discover import discover_fleet, restart_reminder

    hosts = [h for h in ctx.fleet.hosts if h.name in set(changed)]
    if not hosts or ctx.fleet.interrupt.is_set():  # Ctrl-C: no new step on any host (its report says so)
        return None
    return restart_reminder(discover_fleet(ctx.fleet, pb, hosts, files))


def _fatal_refusal(command: str, plan: Any, bad: list[tuple[str, str, str]], json_out: bool) -> None:
    """--any-errors-fatal: some host cannot take part, so no host is changed (exit 1)."""
    msg = (f"{command}: --any-errors-fatal: {len(bad)} selected host(s) unreachable or refused at plan time "
           f"({bad[0][0]}: {bad[0][1]}); nothing was changed on any host")
    if json_out:
        blocking = {h for h, _, _ in bad}
        emit_json(command, ok=False, message=msg,
                  hosts=plan_hosts(plan["hosts"] if isinstance(plan, dict) else plan, blocking),
                  plan=plan, changed=False, any_errors_fatal=True,
                  blocking=[{"host": h, "status": st, "reason": why} for h, st, why in bad])
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
        emit_json("deploy", op_id=res.deploy_id, ok=res.ok, message=summary,
                  hosts=[host_row(h.to_json(), ok=h.status == "ok") for h in res.hosts],
                  summary={"batches": len(res.batches)}, restart=True, plan=plan.to_json(), rollout=res.to_json())
    else:
        t = table("rollout", ["batch", "host", "status", "steps", "what"])
        for hosts, (batch, st, steps, what) in group(
                (h.host, (h.batch, h.status, ", ".join(f"{k}: {v}" for k, v in h.steps.items()),
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
                         hint=f"name hosts of this command: {', '.join(sorted(selected))}")
    return names


def status_rows(ctx: RunContext, gathered: Any, plan: Plan | None) -> list[dict[str, Any]]:
    from fleetctl import hoststate

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
