"""verify-logs: prove from each server's CURRENT launch log, per host, instance and rank, that the
patched code runs; when it does not, say why (worker routing, file on disk, restart, timing).

The grep runs on the host (agent `server_grep`): only matching lines come back, bounded. Every
SGLang fact (ranks, line format, dump, worker routing) comes from the engine (`fleetctl.engines.base`).
"""

from __future__ import annotations

import calendar
import posixpath
import time
from dataclasses import dataclass, field
from typing import Any

from fleetctl.config.playbook_model import CRASH_SIGNS, Playbook
from fleetctl.engines import engine
from fleetctl.model.facts import bytecode_problem
from fleetctl.model.instances import Instance
from fleetctl.model.result import HostResult
from fleetctl.ops.exits import exited_line
from fleetctl.ops.launch import http_get, instances_by_host, predates_deploy
from fleetctl.ops.runner import Fleet
from fleetctl.protocol import names
from fleetctl.protocol.answers import (
    DeployOnDisk,
    InstanceState,
    LaunchRecord,
    LoadedCheck,
    LocateAnswer,
    ServerGrepAnswer,
    WorkerCheck,
)
from fleetctl.transport.base import RemoteError, Transport

REPORT_ARGS = engine().report_args  # the engine's; a playbook adds its own (covers.report_args)
MAX_SHOWN = 5
REPORT_SHOWN = 3  # latest verify.report lines shown per instance and pattern


def rank_label(ranks: dict[str, int]) -> str:
    return " ".join(f"{k}{v}" for k, v in ranks.items()) or "(tp=1: no rank prefix)"


@dataclass
class RankCheck:
    ranks: dict[str, int]
    markers: dict[str, bool]

    @property
    def ok(self) -> bool:
        return all(self.markers.values())

    def to_json(self) -> dict[str, Any]:
        return {"rank": rank_label(self.ranks), "ranks": self.ranks, "markers": self.markers, "ok": self.ok}


@dataclass
class InstanceVerify:
    host: str
    instance: str
    port: int
    ok: bool = False
    running: bool = False
    launch_id: str | None = None
    since: float | None = None
    version: str | None = None
    log: str | None = None
    ready: bool = False
    args: dict[str, Any] = field(default_factory=dict)
    ranks: list[RankCheck] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)
    worker: dict[str, Any] = field(default_factory=dict)
    exited: dict[str, Any] | None = None  # the server ended on its own: {"returncode", "ended_at", ...}
    tail: list[str] = field(default_factory=list)  # the log's last lines, when the server has ended
    # the playbook's verify.report lines of this launch: {pattern: {"count": n, "latest": [lines]}}
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "instance": self.instance, "port": self.port, "ok": self.ok,
                "running": self.running, "launch_id": self.launch_id, "since": self.since,
                "version": self.version, "log": self.log, "ready": self.ready, "args": self.args,
                "ranks": [r.to_json() for r in self.ranks], "forbidden": self.forbidden,
                "problems": self.problems, "explanation": self.explanation, "worker": self.worker,
                "exited": self.exited, "tail": self.tail, "reports": self.reports}


@dataclass
class Verified:
    """Each instance's verdict on a host (HostVerify's detail); the host's status is "failed" when one failed."""

    instances: list[InstanceVerify] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"instances": [i.to_json() for i in self.instances]}


HostVerify = HostResult[Verified]


def _report_and_forbidden(iv: InstanceVerify, pb: Playbook, lines: dict[str, list[Any]], matches: dict[str, Any]) -> None:
    """The playbook's verify.report lines (counted, the latest shown) and forbidden lines (a problem, or
    reported only when a crash sign was logged by a server that is still up and ready) on `iv`."""
    for p in pb.verify.report:
        seen = lines.get(p, [])
        got = matches.get(p)
        # the agent keeps the first max_per_pattern lines and counts them all
        count = len(seen) + max(0, (got.count - len(got.lines)) if got is not None else 0)
        if count:
            iv.reports[p] = {"count": count, "latest": [ln.raw for ln in seen[-REPORT_SHOWN:]]}
    for f in pb.verify.forbidden:
        got = matches.get(f)
        if got is not None and got.count:
            iv.forbidden += got.lines[:MAX_SHOWN]
            if f in CRASH_SIGNS and iv.running and iv.ready:  # logged and survived: reported, not failed
                iv.explanation.append(f"the server logged {got.count} {f!r} line(s) and is still running "
                                      f"(reported, not a failure): {got.lines[0]}")
            else:
                iv.problems.append(f"forbidden {f!r}: {got.count} line(s) in this launch's log")


def _missing_markers(iv: InstanceVerify, pb: Playbook, rec: LaunchRecord, version: str, models: Any,
                     lines: dict[str, list[Any]] | None = None) -> None:
    """A problem per marker missing on some rank (unless the server died first), and why the patched
    code may not have run: what this launch runs against what the playbook patches."""
    missing = [(r, m) for r in iv.ranks for m, ok in r.markers.items() if not ok]
    if missing and iv.exited is None:  # a server that died before logging it says nothing of the patch
        by_marker: dict[str, list[str]] = {}
        for r, m in missing:
            by_marker.setdefault(m, []).append(rank_label(r.ranks))
        for m, where in by_marker.items():
            n_ok = len(iv.ranks) - len(where)
            iv.problems.append(f"marker {m!r} missing on {', '.join(where)}"
                               + (f" (present on the other {n_ok} rank(s))" if n_ok else ""))
            bare = sum(1 for ln in (lines or {}).get(m, []) if not ln.ranks)
            if bare:  # a print(): SGLang's log format is the logger's, so its line names no rank
                iv.explanation.append(
                    f"why: {m!r} is in the log {bare} time(s) on lines that name no rank (a print(), not "
                    "SGLang's logger): which rank printed it cannot be told; log it with logger.info, or "
                    f"declare it under covers.markers with per_rank: false (then one line proves it)")
        if engine().is_known(version) and pb.versions.get(version):
            # the reason the patched code may not have run: what this launch runs vs what the playbook patches
            from fleetctl.plan.patched_worker import coverage

            cov = coverage(version, dict(rec.flags), dict(rec.env), pb)
            if models is not None and any(f.get("family") == engine().family_names[1] and f.get("covered") is None
                                          for f in cov.families):
                # the model implementation depends on config.json: read it on the host, as explain does
                model, draft = models()
                cov = coverage(version, dict(rec.flags), dict(rec.env), pb, model=model, draft=draft)
            if cov.refused:
                iv.explanation.append(f"why: this launch does not run what the playbook patches: {cov.refused}")
            elif cov.uncertain:
                iv.explanation.append(f"maybe: {cov.uncertain}")


def _check_instance(iv: InstanceVerify, st: InstanceState, pb: Playbook, deploy_now: DeployOnDisk | None,
                    tz_offset: int | None = None, models: Any = None) -> None:
    """Fill iv from the agent's state + matches for one instance (no host access)."""
    rec = st.record
    markers = list(pb.verify.markers)
    if rec is None:
        iv.problems.append("server not running: never launched by fleetctl here (no launch record)")
        return
    iv.running = st.running
    iv.launch_id, iv.log, iv.version = rec.launch_id, rec.log, rec.version
    iv.since = rec.process_started or rec.launched_at
    stopped = rec.state in ("stopped", "stop-failed")  # by `fleetctl stop`: not a crash
    if not iv.running and stopped:
        iv.problems.append(f"server not running: launch {iv.launch_id} ({rec.state})")
    elif st.wrapper_only:  # judged by its server process, not by a wrapper that outlived it
        iv.problems.append(f"server not running: launch {iv.launch_id} (its server process {rec.server_pid or '?'} "
                           f"is gone; only its launch wrapper, pid {rec.pid}, still runs)")
    if not st.log_exists:
        if not iv.running and not stopped and not st.wrapper_only:
            iv.problems.append(f"server not running: launch {iv.launch_id}")
        iv.problems.append(f"the launch's log {iv.log} is gone")
        return
    matches = st.matches
    lines = {p: [engine().parse_line(x) for x in hits.lines] for p, hits in matches.items()}
    lines, old = _written_since(lines, rec.process_started, tz_offset)
    if old:
        iv.problems.append(f"{old} matching line(s) in this launch's log carry a time before its server process "
                           f"started ({_hms(rec.process_started)}): replayed from an earlier run? "
                           "they are not counted")
    iv.ready = bool(lines.get(engine().ready_line))
    if not iv.running and not stopped:  # it ended on its own: say how, first, with its last words
        iv.exited = st.exit.to_json() if st.exit is not None else {}
        iv.tail = list(st.tail)[-30:]
        iv.problems.append(exited_line(iv.exited or None, ready=iv.ready, tail=iv.tail))
    if pb.verify.require_ready and not iv.ready and iv.exited is None:
        iv.problems.append("no ready line in this launch's log")
    dump = None
    for ln in reversed(lines.get(engine().dump_anchor, [])):
        dump = engine().parse_server_args_dump(ln.message)
        if dump is not None:
            break
    version = iv.version or ""
    res = engine().resolve_worker(version, rec.flags, rec.env) if engine().is_known(version) else None
    if dump is None and iv.exited is None:
        iv.problems.append(f"no {engine().dump_anchor} dump in this launch's log")
    if dump is not None and res is not None:
        wrong = _dump_mismatches(dump, res.resolved_args, rec.flags)
        if wrong:
            iv.problems.append("the logged server arguments are not this launch's (" + "; ".join(wrong[:4])
                               + "): the lines come from another process")
    if pb.versions.get(version) and deploy_now is not None and deploy_now.playbook not in (None, pb.name):
        iv.problems.append(f"the deploy on disk ({deploy_now.id}) is of playbook "
                           f"{deploy_now.playbook!r}, not {pb.name!r}")
    elif pb.versions.get(version) and deploy_now is None:
        iv.problems.append(f"no deploy of {pb.name!r} is on disk here: the files hold no patch fleetctl put "
                           "there, so no log line can prove one runs")
    args = dump if dump is not None else (dict(res.resolved_args) if res else {})
    iv.problems += never_fires(pb, {**(dict(res.resolved_args) if res else {}), **args})
    iv.args = {k: args.get(k) for k in dict.fromkeys([*REPORT_ARGS, *pb.covers.report_args])}
    if res is not None:
        iv.worker = {"class": res.worker_class, "file": res.worker_file,
                     "disable_overlap_schedule": res.disable_overlap_schedule, "reason": res.reason,
                     "spec_v2_env": res.spec_v2_env}
    exp = engine().expected_ranks(version, args) if engine().is_known(version) else [{}]
    once = {m for m in markers if not pb.marker_site(m).per_rank}  # logged once (e.g. on rank 0 only)
    for ranks in exp:
        iv.ranks.append(RankCheck(ranks, {m: bool(lines.get(m)) if m in once else
                                          any(ln.ranks == ranks for ln in lines.get(m, [])) for m in markers}))
    _report_and_forbidden(iv, pb, lines, matches)
    _missing_markers(iv, pb, rec, version, models, lines)
    if not markers:
        iv.explanation.append("no verify.markers: this proves the server started on the files on disk and "
                              "answered, not that the patched code ran; add a log line to your patch and list it "
                              "under verify.markers")
    if st.restart_needed:
        iv.problems.append(f"restart needed: {', '.join(st.changed_files)} changed on disk "
                           f"after the server started (hash at launch != hash now)")
    if deploy_now is not None and predates_deploy(rec, st.changed_files, deploy_now):
        iv.problems.append(f"log is from before the deploy: launched {_hms(rec.launched_at)}, before "
                           f"deploy {deploy_now.id} ({_hms(deploy_now.at)}) of the files on disk")


def collapse_ranks(lines: list[str]) -> list[str]:
    """Log lines as a person reads them: a message every rank logged (the same words, only the
    time and the rank prefix differ) is one line, the first, followed by the other ranks that logged
    it ("(also TP1, TP2, TP3)"). The order of first appearance is kept. (--json keeps every line.)"""
    firsts: dict[str, str] = {}
    others: dict[str, list[str]] = {}
    for raw in lines:
        ln = engine().parse_line(raw)
        key = ln.message if ln.ranks else raw
        if key not in firsts:
            firsts[key] = raw
            others[key] = []
        elif ln.ranks:
            others[key].append(rank_label(ln.ranks))
    return [firsts[k] + (f"  (also {', '.join(dict.fromkeys(others[k]))})" if others[k] else "") for k in firsts]


def never_fires(pb: Playbook, args: dict[str, Any]) -> list[str]:
    """The playbook's never_fires_when rules that hold for these server arguments."""
    out = []
    for rule in pb.verify.never_fires_when:
        a, b = args.get(rule.arg), args.get(rule.at_least)
        try:
            if a is None or b is None or isinstance(a, bool) or float(a) < float(b):
                continue
        except (TypeError, ValueError):
            continue
        out.append(f"{rule.arg}={a} >= {rule.at_least}={b}: the feature can never act"
                   + (f" ({rule.why})" if rule.why else ""))
    return out


def _written_since(lines: dict[str, list[Any]], started: float | None,
                   tz_offset: Any) -> tuple[dict[str, list[Any]], int]:
    """Drop lines whose timestamp is before the server process started (2 s of slack for the
    seconds-resolution clocks): a launch command that replays an old log (tail -f, journalctl)
    writes another process's lines into this launch's log. Returns (kept, how many dropped)."""
    if not isinstance(started, int | float) or not isinstance(tz_offset, int):
        return lines, 0
    kept: dict[str, list[Any]] = {}
    dropped = 0
    for pat, lns in lines.items():
        kept[pat] = []
        for ln in lns:
            t = _epoch(ln.timestamp, tz_offset)
            if t is not None and t < started - 2.0:
                dropped += 1
            else:
                kept[pat].append(ln)
    return kept, dropped


def _epoch(stamp: str | None, tz_offset: int) -> float | None:
    """A log timestamp ('YYYY-MM-DD HH:MM:SS[.mmm]', the host's local time) as epoch seconds."""
    if not stamp:
        return None
    try:
        return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) - tz_offset
    except ValueError:
        return None


def _dump_mismatches(dump: dict[str, Any], resolved: dict[str, Any], flags: dict[str, Any]) -> list[str]:
    """Fields the launch set by flag whose value in the logged ServerArgs differs."""
    out = []
    for name in flags:
        dest = name.lstrip("-").replace("-", "_")
        if dest not in dump or dest not in resolved:
            continue
        want, got = resolved[dest], dump[dest]
        if want is None or str(want).lower() == str(got).lower():
            continue
        try:
            if float(want) == float(got):
                continue
        except (TypeError, ValueError):
            pass
        out.append(f"{dest}={got!r} in the log, launched with {want!r}")
    return out


def _hms(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def _explain_loaded(iv: InstanceVerify, loaded: LoadedCheck | None, site: dict[str, Any]) -> None:
    """What the launch's python would load for the worker module (the probe): the code that runs,
    which is not always the source on disk (a cached hash-based pyc, an extension, sourceless)."""
    if loaded is None:
        return
    v = loaded.view
    problem = bytecode_problem(site["file"], v)
    if problem:
        iv.explanation.append(problem)
    if loaded.loaded and v.loader == "source" and v.pyc_used:
        marked = loaded.check is not None and loaded.check.marker
        src_dir = posixpath.dirname(v.file or "")
        pyc = (f"its {v.pyc[len(src_dir) + 1:]}" if src_dir and v.pyc and v.pyc.startswith(src_dir + "/")
               else v.pyc)  # next to the source: short, so a narrow terminal does not cut the path
        iv.explanation.append(f"the code import loads for {site['file']} (from {pyc}) "
                              f"{'DOES' if marked else 'does NOT'} carry {loaded.marker!r} in "
                              f"{site['class']}.{site['function']}")


def _explain(iv: InstanceVerify, rec_env: dict[str, str], check: WorkerCheck | None,
             site: dict[str, Any]) -> None:
    w = iv.worker
    if site["file"] != w.get("file") or site["class"] != w.get("class"):  # a marker outside the worker
        _explain_file(iv, check, site)
        return
    if not w.get("class"):
        iv.explanation.append(f"no speculative worker runs with this launch's flags: {w.get('reason', '')}")
        return
    iv.explanation.append(f"the server ran {w['class']} from {w['file']}: {w['reason']}")
    cause = engine().overlap_cause(iv.version or "", bool(w.get("disable_overlap_schedule")), rec_env)
    if cause:
        iv.explanation.append(cause)
    dos_log = iv.args.get("disable_overlap_schedule")
    if dos_log is not None and w.get("disable_overlap_schedule") is not None and dos_log != w["disable_overlap_schedule"]:
        iv.explanation.append(f"note: the log's dump says disable_overlap_schedule={dos_log}, fleetctl's "
                              f"model of this release says {w['disable_overlap_schedule']}")
    if check is None:
        return
    c = check.check
    if not check.exists:
        iv.explanation.append(f"{w['file']} does not exist on the host")
    elif c is not None and c.error:
        iv.explanation.append(f"{w['file']} on disk {c.error}")
    elif c is not None and c.marker:
        iv.explanation.append(f"{w['file']} on disk DOES carry {check.marker!r} in {w['class']}.{site['function']}"
                              + ("; the server started before that: restart needed"
                                 if any("restart needed" in p for p in iv.problems) else
                                 "; the log still lacks it: does the call sit under a condition this launch "
                                 "does not meet (a flag not given?)"))
    else:
        iv.explanation.append(f"{w['file']} on disk does NOT carry {check.marker!r} in {w['class']}."
                              f"{site['function']}: the patch is not in the file that runs")


def _explain_file(iv: InstanceVerify, check: WorkerCheck | None, site: dict[str, Any]) -> None:
    """Why a marker the playbook places in a named file's class.function is missing."""
    where = f"{site['class']}.{site['function']}"
    c = check.check if check is not None else None
    if check is None:
        return
    if not check.exists:
        iv.explanation.append(f"{site['file']} does not exist on the host")
    elif c is not None and c.error:
        iv.explanation.append(f"{site['file']} on disk {c.error}")
    elif c is not None and c.marker:
        iv.explanation.append(f"{site['file']} on disk DOES carry {check.marker!r} in {where}"
                              + ("; the server started before that: restart needed"
                                 if any("restart needed" in p for p in iv.problems) else ""))
    else:
        iv.explanation.append(f"{site['file']} on disk does NOT carry {check.marker!r} in {where}: "
                              "the patch is not deployed there")


def _site(pb: Playbook, marker: str, worker: dict[str, Any]) -> dict[str, Any] | None:
    """The agent check for where the playbook says `marker` is logged (None: nowhere to look)."""
    site = pb.marker_site(marker)
    if site.where == "worker":
        if not worker.get("class"):
            return None
        return {"file": worker["file"], "class": worker["class"], "marker": marker, "function": site.function}
    if site.where == "file":
        return {"file": site.file, "class": site.cls, "marker": marker, "function": site.function}
    return None


def _recreated(conn: Transport, got: ServerGrepAnswer) -> str | None:
    """For a container host: the line saying the container was re-created since the newest deploy
    that recorded it (the patch went with the old container); None otherwise."""
    if not conn.host.container:
        return None
    from fleetctl.containers.host import inspect
    from fleetctl.ops.container_advice import recreated, recreated_per_ledger

    now = inspect(conn)
    assert now is not None
    if got.container_deploy is None:  # (no record on the host: it may have died with the old container)
        return recreated_per_ledger(conn.host.name, now)
    return recreated(conn.host.name, now, got.container_deploy.id, got.container_deploy.container)


def verify_main_process(conn: Transport, pb: Playbook, plan: list[Instance]) -> list[InstanceVerify]:
    """A server that is its container's main process: the proof is read from the container's own log
    of its current start (containers/mainproc.py: bounded, untrusted, each line's runtime time at or
    after this start, so an older start's or a replayed line does not count)."""
    from fleetctl.containers.host import inspect
    from fleetctl.containers.mainproc import read_log, refusal, spec_main

    spec = spec_main(conn)
    assert spec is not None
    iv = InstanceVerify(conn.host.name, spec.name, plan[0].port if plan else 0,
                        log=spec.shown([*spec.command, "logs", spec.name]))
    why = refusal(spec)
    if why is not None:
        iv.problems.append(f"not verified: {why} (and fleetctl does not read a pod's log)")
        return [iv]
    got: ServerGrepAnswer = conn.agent(names.SERVER_GREP, {
        "state_dir": conn.host.state_dir, "instances": [], "patterns": [], "max_per_pattern": 1, "container": True})
    gone_with = _recreated(conn, got)
    info = inspect(conn, need_running=False)
    assert info is not None
    iv.running = info.running
    log = read_log(conn, spec, info)
    iv.since = log.since
    iv.launch_id = f"container start {info.started_at}"
    if not info.running:
        iv.problems.append(f"server not running: {spec.label} is stopped")
    if log.since is None:
        iv.problems.append(f"{spec.label} has no start time the runtime says: nothing in its log can be counted")
    if log.over_cap:
        from fleetctl.containers.mainproc import LOG_CAP

        iv.problems.append(f"{spec.label}'s log since its start is over {LOG_CAP >> 20} MiB: not read")
    if log.older or log.unstamped:
        iv.explanation.append(f"{log.older + log.unstamped} line(s) the runtime sent carry no time at or after this "
                              f"start of the container ({info.started_at}): replayed or from an earlier start, they "
                              "are not counted")
    kept, replayed = [], 0
    for x in log.lines:  # the line's own time (the host's local time) before this start: replayed
        t = _epoch(engine().parse_line(x).timestamp, got.tz_offset) if isinstance(got.tz_offset, int) else None
        if t is not None and log.since is not None and t < log.since - 2.0:
            replayed += 1
        else:
            kept.append(x)
    if replayed:
        iv.explanation.append(f"{replayed} line(s) written since this start of the container carry a time of their "
                              f"own before it ({info.started_at}): replayed from an earlier run? they are not counted")
    lines = {p: [engine().parse_line(x) for x in kept if p in x]
             for p in dict.fromkeys([*pb.verify.markers, *pb.verify.forbidden, engine().ready_line,
                                     engine().dump_anchor])}
    iv.ready = bool(lines.get(engine().ready_line))
    if not iv.ready:
        iv.problems.append("no ready line in the container's log since its start")
    dump = None
    for ln in reversed(lines.get(engine().dump_anchor, [])):
        dump = engine().parse_server_args_dump(ln.message)
        if dump is not None:
            break
    if dump is None:
        iv.problems.append(f"no {engine().dump_anchor} dump in the container's log since its start")
    args = dump or {}
    iv.args = {k: args.get(k) for k in dict.fromkeys([*REPORT_ARGS, *pb.covers.report_args])}
    iv.problems += never_fires(pb, args)
    now = got.deploy_now
    if now is None:
        iv.problems.append(f"no deploy of {pb.name!r} is on disk in {spec.label}: no log line can prove a patch runs")
    elif now.playbook not in (None, pb.name):
        iv.problems.append(f"the deploy on disk ({now.id}) is of playbook {now.playbook!r}, not {pb.name!r}")
    elif now.at is not None and log.since is not None and log.since < now.at:
        iv.problems.append(f"restart needed: {spec.label} started ({info.started_at}) before deploy {now.id} wrote "
                           f"its files; 'fleetctl deploy --restart' or '{spec.shown(spec.restart_argv() or [])}' "
                           f"on {conn.host.name}")
    markers = list(pb.verify.markers)
    once = {m for m in markers if not pb.marker_site(m).per_rank}
    ranks_seen = [ln.ranks for m in markers for ln in lines.get(m, [])]
    exp = [r for r in dict.fromkeys(tuple(sorted(r.items())) for r in ranks_seen)] or [()]
    for ranks in exp:  # (without the launch's flags: the ranks the log shows; none: one check)
        rd = dict(ranks)
        iv.ranks.append(RankCheck(rd, {m: bool(lines.get(m)) if m in once or not rd else
                                       any(ln.ranks == rd for ln in lines.get(m, [])) for m in markers}))
    for m in markers:
        if not lines.get(m):
            iv.problems.append(f"marker {m!r} missing from {spec.label}'s log since its start ({info.started_at})")
    for f in pb.verify.forbidden:
        if lines.get(f):
            iv.forbidden += [ln.raw for ln in lines[f][:MAX_SHOWN]]
            iv.problems.append(f"forbidden {f!r}: {len(lines[f])} line(s) in the container's log since its start")
    if gone_with:
        iv.problems.append(gone_with)
    iv.ok = not iv.problems
    return [iv]


def verify_host(conn: Transport, pb: Playbook, plan: list[Instance]) -> list[InstanceVerify]:
    h = conn.host
    if h.container and h.container.get("main_process"):
        return verify_main_process(conn, pb, plan)
    wanted = [i.name for i in plan]
    patterns = list(dict.fromkeys([*pb.verify.markers, *pb.verify.forbidden, *pb.verify.report, engine().ready_line,
                                   engine().dump_anchor]))
    got: ServerGrepAnswer = conn.agent(names.SERVER_GREP, {
        "state_dir": h.state_dir, "instances": wanted, "patterns": patterns, "max_per_pattern": 512,
        "container": bool(h.container)})
    gone_with = _recreated(conn, got)
    out = []
    records: dict[str, LaunchRecord] = {}
    seen: list[Any] = []

    def read_models() -> tuple[Any, Any]:
        """The target's and draft's config.json as the launch reads them on this host (asked once,
        only to explain a missing marker)."""
        if not seen:
            from fleetctl.model.facts import read_facts

            try:
                f = read_facts(conn, gpus=False, all_hashes=False, profile=pb.launch)
                seen.append((f.model, f.draft_model))
            except RemoteError:
                seen.append((None, None))
        return seen[0]

    for inst in plan:
        iv = InstanceVerify(h.name, inst.name, inst.port)
        st = got.instances.get(inst.name) or InstanceState(inst.name, running=False)
        _check_instance(iv, st, pb, got.deploy_now, got.tz_offset, models=read_models)
        if gone_with:
            iv.problems.append(gone_with)
        if st.record is not None:
            records[inst.name] = st.record
        if iv.running:  # alive is not enough: the server must answer on its port now
            port = (st.record.port if st.record else None) or inst.port
            try:
                code, _ = http_get(conn, int(port), "/health", timeout=15.0)
                if code != 200:
                    iv.problems.append(f"GET /health on port {port} answered {code or 'nothing'}")
            except (RemoteError, OSError, ValueError) as e:
                iv.problems.append(f"GET /health on port {port} failed: {e}")
        out.append(iv)
    # explanations need the file the missing marker is declared in, as it is on the host: one more
    # call, only on failure (a marker the playbook places `anywhere` has nothing to check on disk)
    need = []
    for iv in out:
        if iv.exited is not None or iv.instance not in records:
            continue
        missing = next((m for r in iv.ranks for m, ok in r.markers.items() if not ok), None)
        site = _site(pb, missing, iv.worker) if missing else None
        if site is not None:
            need.append((iv, records[iv.instance], site))
    checks: list[WorkerCheck] = []
    if need:
        pkg = need[0][1].package_dir
        checks = conn.agent(names.WORKER_CHECK, {"package_dir": pkg, "checks": [site for _, _, site in need]})
    loaded: list[LoadedCheck] = []
    if need and plan and plan[0].launch is not None:
        try:  # the code the launch's python would load now, bytecode included
            got_l: LocateAnswer = conn.agent(names.LOCATE, {"launch": plan[0].launch.to_agent(),
                                                           "engine": engine().agent_facts(),
                                                           "checks": [site for _, _, site in need]})
            if got_l.package_dir and posixpath.normpath(got_l.package_dir) == posixpath.normpath(
                    need[0][1].package_dir or "."):
                loaded = got_l.checks
        except RemoteError:
            loaded = []
    for k, (iv, rec, site) in enumerate(need):
        _explain(iv, rec.env, checks[k] if k < len(checks) else None, site)
        _explain_loaded(iv, loaded[k] if k < len(loaded) else None, site)
    for iv in out:
        iv.ok = not iv.problems
    return out


def verify_fleet(fleet: Fleet, pb: Playbook) -> list[HostVerify]:
    plans = instances_by_host(fleet, pb)
    outs = fleet.run(lambda c: verify_host(c, pb, plans[c.host.name]))
    res = []
    for o in outs:
        if o.ok:
            bad = [i for i in o.detail if not i.ok]
            hv = HostVerify(o.host, "failed" if bad else "ok",
                            f"{len(bad)} of {len(o.detail)} instance(s) failed" if bad
                            else f"{len(o.detail)} instance(s) verified", Verified(list(o.detail)))
        else:
            hv = o.carry(Verified())
        hv.elapsed = o.elapsed
        res.append(hv)
    return res


def main_process_health(conn: Transport) -> dict[str, Any]:
    """For `status`: whether a server that is its container's main process is healthy: the container
    runs, its log of this start holds the ready line, and (when that start's logged arguments name a
    port) GET /health answers 200 there. `problems` says what is not."""
    from fleetctl.containers.host import inspect
    from fleetctl.containers.mainproc import read_log, refusal, spec_main

    spec = spec_main(conn)
    assert spec is not None
    out: dict[str, Any] = {"container": spec.name, "running": False, "started_at": None, "ready": False,
                           "port": None, "health": None, "healthy": False, "problems": []}
    why = refusal(spec)
    if why is not None:
        out["problems"].append(f"main process not checked: {why}")
        return out
    info = inspect(conn, need_running=False)
    assert info is not None
    out["running"], out["started_at"] = info.running, info.started_at
    if not info.running:
        out["problems"].append(f"{spec.label} is stopped: its main process (the server) does not run")
        return out
    log = read_log(conn, spec, info)
    out["ready"] = any(engine().ready_line in ln for ln in log.lines)
    for ln in reversed([x for x in log.lines if engine().dump_anchor in x]):
        dump = engine().parse_server_args_dump(engine().parse_line(ln).message)
        if dump is not None and isinstance(dump.get("port"), int) and 0 < dump["port"] < 65536:
            out["port"] = dump["port"]
            break
    if not out["ready"]:
        out["problems"].append(f"{spec.label}'s main process logged no ready line since its start "
                               f"({info.started_at})")
    if out["port"] is not None:
        try:
            code, _ = http_get(conn, int(out["port"]), "/health", timeout=15.0)
        except (RemoteError, OSError, ValueError) as e:
            code = None
            out["problems"].append(f"{spec.label}'s server: GET /health on port {out['port']} failed: {e}")
        out["health"] = code
        if code is not None and code != 200:
            out["problems"].append(f"{spec.label}'s server: GET /health on port {out['port']} answered {code}")
    out["healthy"] = not out["problems"]
    return out
