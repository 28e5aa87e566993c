"""How deploy, rollback, status and explain show their results on a terminal: plans, diffs, tables.
Imported only when a command has a result to show (issue 16.10)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fleetctl.commands.common import out
from fleetctl.engines import engine
from fleetctl.model.hostnames import group, hosts_label, plural, strip_host
from fleetctl.model.result import OK_STATES, HostResult
from fleetctl.ui.render import hosts_cell, say, status_cell, table
from fleetctl.ui.safetext import line, styled

if TYPE_CHECKING:
    from fleetctl.commands.context import RunContext
    from fleetctl.model.explain import Explained
    from fleetctl.ops.rollback import RollbackPlan
    from fleetctl.ops.status import HostStatus
    from fleetctl.plan.deploy import HostPlan, Plan
    from fleetctl.protocol.answers import ReadFilesAnswer
    from fleetctl.ui.safetext import Text  # (rich's, as every ui helper returns it)

STATE_STYLE = {"pristine": "cyan", "as-intended": "green", "drifted": "red", "missing": "red", "unsafe": "red",
               "unwritable": "red", "original": "cyan", "as-deployed": "green", "change": "cyan", "noop": "green",
               "refused": "red",
               "unreachable": "red", "failed": "red", "changed": "green", "unchanged": "green",
               "skipped": "yellow", "ok": "green", "rolled-back": "yellow", "untouched": "yellow",
               "interrupted": "red", "pending": "yellow", "running": "yellow"}

def _s(state: str, width: int = 0) -> Text:
    """A state in its style, padded to `width` (columns of one line per file)."""
    return styled(state.ljust(width), STATE_STYLE.get(state, "white"))

def _plan_key(hp: Any) -> tuple[Any, ...]:
    c = hp.coverage
    return (hp.version, hp.status, strip_host(hp.host, hp.message), tuple(hp.interrupted),
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
        why = strip_host(hp.host, hp.message)
        if not hp.files and hp.status in ("refused", "unreachable", "failed"):  # "failed h03: why"
            say(out, _s(hp.status), " ", hosts_label(hosts), ": ", why, indent=4)
            continue
        say(out, styled(hosts_label(hosts), "bold"), f": SGLang {hp.version or '?'}: ", _s(hp.status),
            *([": ", why] if why and not hp.files else []), indent=4)
        for fp in hp.files:
            say(out, "  ", _s(fp.state, 11), f" {fp.action:<7} ", fp.path, *([": ", fp.note] if fp.note else []),
                indent=24)
        c = hp.coverage
        if c is not None and (c.refused or c.covered is not None or c.uncertain):  # nothing checked: no line
            if c.refused and hp.status != "refused":  # --allow-uncovered: say what will happen
                what = ("; --allow-uncovered: the files are patched, but the patched code will not run there "
                        "until the launch runs a worker the playbook patches")
                head = styled("NOT covered, deployed anyway", "yellow")
            elif c.refused:  # (covered, but not certain under --strict: "covered, refused")
                what, head = "", styled("covered, refused" if c.covered else "NOT covered, refused", "red")
            elif c.covered is None and c.uncertain:  # nothing certain: the uncertainty is the line
                what, head = "; --strict refuses such hosts", styled("not certain", "yellow")
            else:
                what, head = "", styled("covered", "green") if c.covered else styled("NOT covered", "red")
            alone = c.covered is None and bool(c.uncertain) and not c.refused
            say(out, "  what the launch runs: " if c.families and c.families[0].get("family") != engine().family_names[0]
                else "  worker that will run: ", head, ": ",
                c.reason if not alone or (c.uncertain or "").replace("not certain: ", "") == c.reason else c.uncertain,
                what, indent=4)
            if c.uncertain and not c.refused and not alone:  # --strict refuses it
                say(out, "  ", styled("warning:", "yellow"), " ", c.uncertain, "; --strict refuses such hosts",
                    indent=4)
        if hp.interrupted:
            say(out, "  ", _s("interrupted"), " deploy ", ", ".join(hp.interrupted), ": repaired first", indent=4)
        if hp.tree_owner and hp.files and hp.status in ("change", "noop"):  # (fleetctl/plan/trees.py)
            say(out, "  shared tree: ", why, indent=4)
        elif (hp.records_dir or hp.tree_members) and hp.files and hp.status in ("change", "noop"):
            say(out, "  shared tree: ", *(["one transaction for ", ", ".join(hp.tree_members)]
                                         if hp.tree_members else []),
                *(["; " if hp.tree_members else "", "recorded in ", hp.records_dir] if hp.records_dir else []),
                indent=4)
    for hosts, _ in groups:
        hp = by_host[hosts[0]]
        why = strip_host(hp.host, hp.message)
        c = hp.coverage
        if c is not None and c.refused and why == c.reason:
            continue  # said once already, on its "worker that will run" line
        if hp.status in ("refused", "unreachable", "failed") and hp.files:
            say(out, styled(hp.status, "red"), " ", hosts_label(hosts), ": ", why, indent=4)

def render_rollback_plan(plans: list[Any]) -> None:
    """As render_plan: one block per distinct rollback plan, a refusal on the file it is about."""
    def key(p: Any) -> tuple[Any, ...]:
        return (p.status, strip_host(p.host, p.message), tuple(p.deploy_ids),
                tuple((f["path"], f["state"], f["action"]) for f in p.files))

    groups = group((p.host, key(p)) for p in plans)
    by_host = {p.host: p for p in plans}
    say(out, styled("rollback plan", "bold"), f": {len(plans)} host(s), {len(groups)} distinct plan(s)")
    for hosts, _ in groups:
        p = by_host[hosts[0]]
        why = strip_host(p.host, p.message)
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

def render_status(rows: list[HostStatus]) -> None:
    """Hosts alike share a row; the state says whether the host has problems, listed under the table
    (one paragraph per distinct list, with the hosts it applies to)."""
    def state(r: HostStatus) -> Text:
        if r.status != "ok":
            return status_cell(r.status)
        return styled("problems", "red") if r.detail.problems else styled("ok", "green")

    def key(r: HostStatus) -> tuple[Any, ...]:
        d = r.detail
        return (state(r).plain, d.version or "", d.last_deploy or "", d.files or "",
                tuple(strip_host(r.host, p) for p in d.problems), tuple(strip_host(r.host, n) for n in d.notes))

    groups = group((r.host, key(r)) for r in rows)
    by_host = {r.host: r for r in rows}
    t = table(None, ["host", "state", engine().display_name, "last deploy", "files"], whole=("last deploy",))
    for hosts, (_, version, last, files, _, _) in groups:
        t.add_row(hosts_cell(hosts), state(by_host[hosts[0]]), version, last, files)
    out.print(t)
    for hosts, (_, _, _, _, problems, notes) in groups:
        for p in problems:
            say(out, styled("problem", "red"), " ", hosts_label(hosts), ": ", p, indent=4)
        for n in notes:
            say(out, "note ", hosts_label(hosts), ": ", n, indent=4)

def render_explain(rows: list[HostResult[Explained]]) -> None:
    """The explain sentence once per distinct answer, with the hosts it applies to."""
    def lines(r: HostResult[Explained]) -> tuple[tuple[Any, ...], ...]:
        ex = r.detail
        if not ex.answered:
            return ((styled(r.status, "red"), " ", strip_host(r.host, ex.reason)),)
        mark = (styled("REFUSED", "red") if ex.refused else
                styled("not certain", "yellow") if ex.covered is None and any(
                    f.get("covered") is None for f in ex.families) else styled("ok", "green"))
        insts = ex.instances or []
        alike = len(insts) > 1 and all(i.reason == insts[0].reason for i in insts)
        # a refusal for another cause than the reason (e.g. a worker the playbook patches, but the
        # server would refuse to start) gets its own line: never "patches it: yes" beside REFUSED
        apart = bool(ex.refused) and ex.refused != ex.reason
        got: list[tuple[Any, ...]] = [((f"({plural(len(insts), 'instance')} each) " if alike else ""), ex.reason,
                                       *(() if apart else (" [", mark, "]")))]
        if len(insts) > 1 and not alike:
            got += [(f"  {i.instance} (GPUs {','.join(map(str, i.gpus))}): {i.reason}",) for i in insts]
        if apart:
            got.append(("  [", mark, f"] {strip_host(r.host, ex.refused or '')}"))
        got += [(f"  note: {n}",) for n in ex.notes]
        got += [(f"  warning: {n}",) for n in dict.fromkeys(n for i in insts for n in i.never_fires)]
        return tuple(got)

    def plain(ls: tuple[tuple[Any, ...], ...]) -> tuple[str, ...]:
        return tuple(line(*ln).plain for ln in ls)

    by_host = {r.host: r for r in rows}
    for hosts, _ in group((r.host, plain(lines(r))) for r in rows):
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
    from fleetctl.engines import wheels
    from fleetctl.protocol.names import READ_FILES

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
            target = fp.ported if fp.ported is not None else it[fp.path].data
            text = _udiff(now, target, f"{fp.path} (on host)",
                          f"{fp.path} ({'ported onto the host' if fp.ported is not None else 'intended'})")
            if fp.state == "drifted":
                pristine = wheels.pristine_bytes(hp.version or "", fp.path)
                text += _udiff(pristine, now, f"{fp.path} (pristine {hp.version})", f"{fp.path} (on host)")
            diffs.append((hp.host, (fp.path, text)))
    for hosts, (path, text) in group(diffs):
        say(out, styled("diff", "bold"), " ", path, " on ", hosts_label(hosts), ":")
        from fleetctl.ui.safeconsole import Verbatim

        out.print(Verbatim(text))  # never wrapped, trailing blanks kept: a diff stays appliable


def _counts(statuses: list[str], words: dict[str, str], always: tuple[str, ...] = ()) -> str:
    """ "3 changed, 1 refused, 2 unreachable": each status counted under its own name (a refusal is
    never counted as a failure), the `always` ones even at 0."""
    order = list(dict.fromkeys([*always, *words, "refused", "unreachable", "failed", *statuses]))
    return ", ".join(f"{statuses.count(st)} {words.get(st, st)}" for st in order
                     if st in always or statuses.count(st))




def plan_hosts(plans: Sequence[HostPlan | RollbackPlan], blocking: set[str] | None = None) -> list[dict[str, Any]]:
    """--check and --any-errors-fatal: one envelope row per planned host, from its HostResult (its
    plan's fields kept); a blocking host's row is not ok."""
    return [p.row(ok=p.status in OK_STATES and p.host not in (blocking or set())) for p in plans]

