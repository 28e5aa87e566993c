"""verify-logs: prove from each server's CURRENT launch log, per host, instance and rank, that the
patched code runs; when it does not, say why (worker routing, file on disk, restart, timing).

The grep runs on the host (agent `server_grep`): only matching lines come back, bounded. Every
SGLang fact (ranks, line format, dump, worker routing) comes from `fleetctl.sglang`.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field
from typing import Any

from fleetctl.config.playbook import Playbook
from fleetctl.facts import bytecode_problem
from fleetctl.fleet import Fleet
from fleetctl.instances import Instance
from fleetctl.ops.launch import http_get, plan_fleet, predates_deploy
from fleetctl.sglang import (
    DUMP_ANCHOR,
    READY_LINE,
    expected_ranks,
    is_known,
    parse_line,
    parse_server_args_dump,
    resolve_worker,
)
from fleetctl.sglang import releases as sg_releases
from fleetctl.transport.ssh import HostConnection, RemoteError

REPORT_ARGS = ("speculative_algorithm", "disable_overlap_schedule", "speculative_eagle_topk",
               "speculative_disable_batch_threshold")
MAX_SHOWN = 5


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

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "instance": self.instance, "port": self.port, "ok": self.ok,
                "running": self.running, "launch_id": self.launch_id, "since": self.since,
                "version": self.version, "log": self.log, "ready": self.ready, "args": self.args,
                "ranks": [r.to_json() for r in self.ranks], "forbidden": self.forbidden,
                "problems": self.problems, "explanation": self.explanation, "worker": self.worker}


@dataclass
class HostVerify:
    host: str
    status: str  # ok | failed | unreachable
    message: str = ""
    instances: list[InstanceVerify] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok" and all(i.ok for i in self.instances)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "ok": self.ok, "message": self.message,
                "elapsed": round(self.elapsed, 3), "instances": [i.to_json() for i in self.instances]}


def _check_instance(iv: InstanceVerify, st: dict[str, Any], pb: Playbook, deploy_now: dict[str, Any] | None) -> None:
    """Fill iv from the agent's state + matches for one instance (no host access)."""
    rec = st.get("record")
    markers = list(pb.verify.markers)
    if rec is None:
        iv.problems.append("server not running: never launched by fleetctl here (no launch record)")
        return
    iv.running = bool(st.get("running"))
    iv.launch_id, iv.log, iv.version = rec.get("launch_id"), rec.get("log"), rec.get("version")
    iv.since = rec.get("process_started") or rec.get("launched_at")
    if not iv.running:
        how = f" ({rec.get('state')})" if rec.get("state") not in (None, "started") else ""
        if st.get("wrapper_only"):
            how = (f" (its server process {rec.get('server_pid') or '?'} is gone; only its launch wrapper, pid "
                   f"{rec.get('pid')}, still runs)")
        iv.problems.append(f"server not running: launch {iv.launch_id}{how}")
    if not st.get("log_exists"):
        iv.problems.append(f"the launch's log {iv.log} is gone")
        return
    matches = st.get("matches") or {}
    lines = {p: [parse_line(x) for x in (matches.get(p) or {}).get("lines", [])] for p in matches}
    iv.ready = bool(lines.get(READY_LINE))
    if pb.verify.require_ready and not iv.ready:
        iv.problems.append("no ready line in this launch's log")
    dump = None
    for ln in reversed(lines.get(DUMP_ANCHOR, [])):
        dump = parse_server_args_dump(ln.message)
        if dump is not None:
            break
    version = iv.version or ""
    res = resolve_worker(version, rec.get("flags") or {}, rec.get("env") or {}) if is_known(version) else None
    if dump is None:
        iv.problems.append(f"no {DUMP_ANCHOR} dump in this launch's log")
    args = dump if dump is not None else (dict(res.resolved_args) if res else {})
    iv.args = {k: args.get(k) for k in REPORT_ARGS}
    if res is not None:
        iv.worker = {"class": res.worker_class, "file": res.worker_file,
                     "disable_overlap_schedule": res.disable_overlap_schedule, "reason": res.reason,
                     "spec_v2_env": res.spec_v2_env}
    exp = expected_ranks(version, args) if is_known(version) else [{}]
    for ranks in exp:
        iv.ranks.append(RankCheck(ranks, {m: any(ln.ranks == ranks for ln in lines.get(m, [])) for m in markers}))
    for f in pb.verify.forbidden:
        got = matches.get(f) or {}
        if got.get("count"):
            iv.forbidden += got["lines"][:MAX_SHOWN]
            iv.problems.append(f"forbidden {f!r}: {got['count']} line(s) in this launch's log")
    missing = [(r, m) for r in iv.ranks for m, ok in r.markers.items() if not ok]
    if missing:
        by_marker: dict[str, list[str]] = {}
        for r, m in missing:
            by_marker.setdefault(m, []).append(rank_label(r.ranks))
        for m, where in by_marker.items():
            n_ok = len(iv.ranks) - len(where)
            iv.problems.append(f"marker {m!r} missing on {', '.join(where)}"
                               + (f" (present on the other {n_ok} rank(s))" if n_ok else ""))
    if st.get("restart_needed"):
        iv.problems.append(f"restart needed: {', '.join(st.get('changed_files') or [])} changed on disk "
                           f"after the server started (hash at launch != hash now)")
    if predates_deploy(rec, st.get("changed_files") or [], deploy_now):
        iv.problems.append(f"log is from before the deploy: launched {_hms(rec.get('launched_at'))}, before "
                           f"deploy {(deploy_now or {}).get('id')} ({_hms((deploy_now or {}).get('at'))}) of the "
                           f"files on disk")


def _hms(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def _explain_loaded(iv: InstanceVerify, loaded: dict[str, Any] | None) -> None:
    """What the launch's python would load for the worker module (the probe): the code that runs,
    which is not always the source on disk (a cached hash-based pyc, an extension, sourceless)."""
    if not loaded:
        return
    w, v = iv.worker, loaded.get("view") or {}
    problem = bytecode_problem(w["file"], v)
    if problem:
        iv.explanation.append(problem)
    c = loaded.get("check") or {}
    if loaded.get("loaded") and v.get("loader") == "source" and v.get("pyc_used"):
        iv.explanation.append(f"the code import loads for {w['file']} (from {v.get('pyc')}) "
                              f"{'DOES' if c.get('marker') else 'does NOT'} carry {loaded.get('marker')!r} in "
                              f"{w['class']}.__init__")


def _explain(iv: InstanceVerify, rec_env: dict[str, str], check: dict[str, Any] | None) -> None:
    w = iv.worker
    if not w.get("class"):
        iv.explanation.append(f"no speculative worker runs with this launch's flags: {w.get('reason', '')}")
        return
    iv.explanation.append(f"the server ran {w['class']} from {w['file']}: {w['reason']}")
    env_name = sg_releases.SPEC_V2_ENV
    rel = sg_releases.RELEASES.get(iv.version or "")
    env_default_off = rel is not None and rel.rules.spec_v2_default is False
    if w.get("disable_overlap_schedule") and env_default_off and env_name not in rec_env:
        iv.explanation.append(f"disable_overlap_schedule=True because {env_name} was not in the launch env")
    dos_log = iv.args.get("disable_overlap_schedule")
    if dos_log is not None and w.get("disable_overlap_schedule") is not None and dos_log != w["disable_overlap_schedule"]:
        iv.explanation.append(f"note: the log's dump says disable_overlap_schedule={dos_log}, fleetctl's "
                              f"model of this release says {w['disable_overlap_schedule']}")
    if check is None:
        return
    c = check.get("check") or {}
    if not check.get("exists"):
        iv.explanation.append(f"{w['file']} does not exist on the host")
    elif c.get("error"):
        iv.explanation.append(f"{w['file']} on disk {c['error']}")
    elif c.get("marker"):
        iv.explanation.append(f"{w['file']} on disk DOES carry {check['marker']!r} in {w['class']}.__init__"
                              + ("; the server started before that: restart needed"
                                 if any("restart needed" in p for p in iv.problems) else
                                 "; the log still lacks it (was the feature's flag given?)"))
    else:
        iv.explanation.append(f"{w['file']} on disk does NOT carry {check['marker']!r} in {w['class']}.__init__: "
                              "the patch is not in the file that runs")


def verify_host(conn: HostConnection, pb: Playbook, plan: list[Instance]) -> list[InstanceVerify]:
    h = conn.host
    names = [i.name for i in plan]
    patterns = list(dict.fromkeys([*pb.verify.markers, *pb.verify.forbidden, READY_LINE, DUMP_ANCHOR]))
    got = conn.agent("server_grep", {"state_dir": h.state_dir, "instances": names, "patterns": patterns,
                                     "max_per_pattern": 512})
    deploy_now = got.get("deploy_now")
    out = []
    for inst in plan:
        iv = InstanceVerify(h.name, inst.name, inst.port)
        st = got["instances"].get(inst.name) or {}
        _check_instance(iv, st, pb, deploy_now)
        if iv.running:  # alive is not enough: the server must answer on its port now
            port = (st.get("record") or {}).get("port") or inst.port
            try:
                code, _ = http_get(conn, int(port), "/health", timeout=15.0)
                if code != 200:
                    iv.problems.append(f"GET /health on port {port} answered {code or 'nothing'}")
            except (RemoteError, OSError, ValueError) as e:
                iv.problems.append(f"GET /health on port {port} failed: {e}")
        out.append(iv)
    # explanations need the worker file as it is on the host: one more call, only on failure
    need = [(iv, got["instances"][iv.instance]["record"]) for iv in out
            if any(not r.ok for r in iv.ranks) and iv.worker.get("class")]
    checks: list[Any] = []
    if need:
        pkg = need[0][1].get("package_dir")
        checks = conn.agent("worker_check", {"package_dir": pkg, "checks": [
            {"file": iv.worker["file"], "class": iv.worker["class"], "marker": m}
            for iv, _ in need for m in [next(m for r in iv.ranks for m, ok in r.markers.items() if not ok)]]})
    loaded: list[Any] = []
    if need and plan and plan[0].launch is not None:
        try:  # the code the launch's python would load now, bytecode included
            got_l = conn.agent("locate", {"launch": plan[0].launch.to_agent(), "checks": [
                {"file": iv.worker["file"], "class": iv.worker["class"], "marker": m}
                for iv, _ in need for m in [next(m for r in iv.ranks for m, ok in r.markers.items() if not ok)]]})
            if got_l.get("sglang_dir") and posixpath.normpath(got_l["sglang_dir"]) == posixpath.normpath(
                    need[0][1].get("package_dir") or "."):
                loaded = got_l.get("checks") or []
        except RemoteError:
            loaded = []
    for k, (iv, rec) in enumerate(need):
        _explain(iv, rec.get("env") or {}, checks[k] if k < len(checks) else None)
        _explain_loaded(iv, loaded[k] if k < len(loaded) else None)
    for iv in out:
        iv.ok = not iv.problems
    return out


def verify_fleet(fleet: Fleet, pb: Playbook) -> list[HostVerify]:
    plans = plan_fleet(fleet, pb)
    outs = fleet.run(lambda c: verify_host(c, pb, plans[c.host.name]))
    res = []
    for o in outs:
        if o.ok:
            hv = HostVerify(o.host, "ok", instances=o.data)
            bad = [i for i in o.data if not i.ok]
            hv.message = (f"{len(bad)} of {len(o.data)} instance(s) failed" if bad
                          else f"{len(o.data)} instance(s) verified")
            if bad:
                hv.status = "failed"
        else:
            hv = HostVerify(o.host, o.status, o.message)
        hv.elapsed = o.elapsed
        res.append(hv)
    return res
