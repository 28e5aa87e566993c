"""gpu-check: on each host's own GPU and its own engine install (the one facts locate for the
playbook's launch), a tiny model fleetctl makes there and three throwaway servers, one after
another on a free port: speculation on, speculation off, the deployed patch's dynamic mode. It
proves the playbook's marker in the dynamic server's log, compares greedy outputs across the three,
measures tokens/s at a concurrency at and above the playbook's threshold, and removes everything it
made (servers stopped by pid, the work dir), also on failure and Ctrl-C.

facts + a preflight (what the launch's torch sees) -> `plan_check` (pure) -> `apply_check`.
`--check` renders the plan and runs nothing. Engine knowledge comes from `engine().gpu_check()`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetctl.config.playbook_model import CRASH_SIGNS, Playbook
from fleetctl.engines import engine
from fleetctl.model.facts import HostFacts, read_facts
from fleetctl.model.instances import Instance, command_argv, flag_argv, plan_instances
from fleetctl.model.launchspec import INHERIT_FROM_HOST
from fleetctl.model.result import Decided, HostResult, Status
from fleetctl.ops.deploy import new_op_id, who
from fleetctl.ops.runner import Fleet
from fleetctl.protocol import names
from fleetctl.transport import events
from fleetctl.transport.base import RemoteError, Transport

PhaseStatus = Literal["ok", "failed", "skipped", "interrupted"]

WAIT_SLICE = 1.0  # seconds of one ready-wait request: a Ctrl-C is seen within it
PLACEHOLDER = "<work dir>"  # the plan's model paths and port before the work dir exists
SAMPLE_PROMPTS = 8
SAMPLE_TOKENS = 48
LOAD_TOKENS = 256
MAX_CONCURRENCY = 256


@dataclass
class PhasePlan:
    """One throwaway server: shown (public argv and env) and carried out."""

    name: str
    about: str
    argv: list[str]
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "about": self.about, "argv": self.argv, "env": self.env, "notes": self.notes}


@dataclass
class CheckPlan(Decided):
    """One host's check, decided from its facts and preflight (pure data): run, refused, failed or
    unreachable."""

    status: Status = "run"
    version: str | None = None
    gpu: dict[str, Any] | None = None
    torch: dict[str, Any] | None = None
    threshold: dict[str, Any] | None = None
    concurrency: list[int] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)
    phases: list[PhasePlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # for the apply step, not shown
    inst: Instance | None = field(default=None, repr=False)
    facts: HostFacts | None = field(default=None, repr=False)
    patch_flags: set[str] = field(default_factory=set, repr=False)

    def fields(self) -> dict[str, Any]:
        """The plan's own fields in its row."""
        return {"version": self.version, "gpu": self.gpu, "torch": self.torch, "threshold": self.threshold,
                "concurrency": self.concurrency, "markers": self.markers,
                "phases": [p.to_json() for p in self.phases], "notes": self.notes}


@dataclass
class PhaseResult:
    name: str
    status: PhaseStatus = "skipped"
    message: str = ""
    ready_s: float | None = None
    pid: int | None = None
    marker: list[str] = field(default_factory=list)  # the playbook's marker lines found in its log
    switches: list[str] = field(default_factory=list)  # the playbook's report lines (e.g. each switch)
    loads: list[dict[str, Any]] = field(default_factory=list)  # per concurrency: tokens/s, accept length
    samples: list[str | None] = field(default_factory=list)  # sha256 of each greedy text (None: failed)
    heads: list[str] = field(default_factory=list)  # the first characters of a few texts
    tail: list[str] = field(default_factory=list)

    def tok_s(self, conc: int) -> float | None:
        return next((ld.get("tok_per_s") for ld in self.loads if ld.get("concurrency") == conc), None)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "message": self.message, "ready_s": self.ready_s,
                "pid": self.pid, "marker": self.marker, "switches": self.switches, "loads": self.loads,
                "samples": self.samples, "heads": self.heads, "tail": self.tail}


@dataclass
class Checked:
    """What a gpu-check found on a host (HostCheck's detail; its status: passed, failed, refused,
    unreachable, interrupted)."""

    version: str | None = None
    gpu: dict[str, Any] | None = None
    threshold: dict[str, Any] | None = None
    concurrency: list[int] = field(default_factory=list)
    phases: list[PhaseResult] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    cleanup: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "gpu": self.gpu, "threshold": self.threshold,
                "concurrency": self.concurrency, "phases": [p.to_json() for p in self.phases],
                "outputs": self.outputs, "cleanup": self.cleanup, "notes": self.notes}


HostCheck = HostResult[Checked]


# ------------------------------------------------------------------------------------------ plan


def concurrencies(threshold: int) -> list[int]:
    """At the threshold (speculating: a batch of N or fewer speculates) and above it (skipped)."""
    low = max(1, min(threshold, MAX_CONCURRENCY - 1))
    return [low, min(MAX_CONCURRENCY, max(low + 1, 2 * low))]


def _phases(inst: Instance, host_cmd: list[str], patch_flags: set[str], models: dict[str, str], port: int | str,
            gpu: int | None) -> list[tuple[PhasePlan, list[str], dict[str, str]]]:
    """(shown, argv, env) per phase; argv/env carry secret values, the shown ones do not."""
    kit = engine().gpu_check()
    secrets = {inst.env[k] for k in inst.secret_keys if inst.env.get(k)}
    out = []
    for ph in kit.phases(dict(inst.flags), dict(inst.env), patch_flags, models, port, gpu):
        argv = host_cmd + flag_argv(ph.flags)
        shown_argv = [_mask(a, secrets) for a in argv]
        shown_env = {k: ("***" if k in inst.secret_keys else v) for k, v in ph.env.items()}
        out.append((PhasePlan(ph.name, kit.PHASE_HELP.get(ph.name, ""), shown_argv, shown_env, list(ph.notes)),
                    argv, ph.env))
    return out


def _mask(a: str, secrets: set[str]) -> str:
    for s in secrets:
        a = a.replace(s, "***")
    return a


def _refused(cp: CheckPlan, msg: str, status: Status = "refused") -> CheckPlan:
    cp.status, cp.message = status, msg
    return cp


def plan_check(host_name: str, pb: Playbook, inst: Instance, host_cmd: list[str], facts: HostFacts,
               pre: dict[str, Any] | None, pre_error: str | None) -> CheckPlan:
    """Decide one host's check from its facts and the preflight's answer: pure (no I/O)."""
    v = facts.package_version
    cp = CheckPlan(host_name, version=v, inst=inst, facts=facts, markers=list(pb.verify.markers))
    py = facts.launch_python or "the launch's python"
    if not facts.package_found or not v:
        return _refused(cp, facts.package_error or f"{engine().display_name} not found by the launch's python", "failed")
    if not engine().is_known(v):
        return _refused(cp, f"{engine().display_name} {v} is not a release fleetctl knows; it will not guess how "
                            "it starts")
    if facts.interrupted():
        m = facts.interrupted()[0]
        return _refused(cp, f"deploy {m.id} was interrupted ({m.state}): the files are mixed; run 'fleetctl "
                            "rollback' or 'fleetctl deploy' to repair first")
    # the GPU: nvidia-smi's facts, one that nothing uses
    if not facts.gpus:
        why = facts.gpu_note or "nvidia-smi lists no GPU"
        return _refused(cp, f"{host_name} has no GPU ({why}): gpu-check runs a tiny model on one of the "
                            "host's GPUs; run it on a GPU host (--limit)")
    free = [g for g in facts.gpus if not g.busy()]
    if inst.gpus:
        free = [g for g in free if g.index in inst.gpus] or free
    if not free:
        used = "; ".join(f"GPU {g.index}: {g.memory_used_mib} MiB used" for g in facts.gpus)
        return _refused(cp, f"every GPU of {host_name} is in use ({used}): gpu-check needs one free GPU; stop "
                            "the server there ('fleetctl stop') or pick another host")
    g = free[0]
    cp.gpu = {"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib}
    # the launch's torch (the engine runs on it)
    if pre is None:
        return _refused(cp, f"cannot ask {py} about torch: {pre_error}", "failed")
    cp.torch = {k: pre.get(k) for k in ("torch", "cuda", "devices", "device_name", "torch_error")}
    if not pre.get("torch"):
        return _refused(cp, f"torch does not import with {py} on {host_name} ({pre.get('torch_error')}): install "
                            f"the torch build {engine().display_name} {v} requires into that environment")
    if not pre.get("cuda"):
        return _refused(cp, f"torch {pre.get('torch')} with {py} on {host_name} sees no GPU "
                            f"(torch.cuda.is_available() is False{'; ' + pre['torch_error'] if pre.get('torch_error') else ''}): "
                            "install a CUDA build of torch, or check CUDA_VISIBLE_DEVICES and the driver")
    # the patch's own flags: the ones the stock release does not know; the installed code must register them
    flags = dict(inst.flags)
    patch_flags = set(engine().resolve_worker(v, flags, inst.effective_env).unknown_flags)
    cp.patch_flags = patch_flags
    registered = facts.registered_flags or {}
    missing = sorted(f for f in patch_flags if registered.get(f) is False)
    if missing:
        return _refused(cp, f"{', '.join(missing)} is not a flag of {engine().display_name} {v} as installed on "
                            f"{host_name}: the playbook is not deployed there; run 'fleetctl deploy' first")
    kit = engine().gpu_check()
    th = kit.threshold(flags, patch_flags, [w.arg for w in pb.verify.never_fires_when])
    if th is None:
        return _refused(cp, f"cannot tell the playbook's threshold from its launch flags ({pb.path}): give the "
                            "patch's threshold flag an integer value in launch.flags", "refused")
    cp.threshold = {"flag": th[0], "value": th[1]}
    cp.concurrency = concurrencies(th[1])
    if not cp.markers:
        cp.notes.append("the playbook names no verify.markers: no marker is looked for")
    models = {"target": f"{PLACEHOLDER}/models/target", "draft": f"{PLACEHOLDER}/models/draft"}
    cp.phases = [p for p, _, _ in _phases(inst, host_cmd, patch_flags, models, "<free port>", g.index)]
    return cp


def preflight(conn: Transport, inst: Instance) -> tuple[dict[str, Any] | None, str | None]:
    """What the launch's python says of torch (the model script, asked to make nothing)."""
    assert inst.launch is not None
    try:
        res = conn.agent(names.GPUCHECK_SCRIPT, {"script": engine().gpu_check().model_script(),
                                                 "launch": inst.launch.to_agent(), "dir": None,
                                                 "request": {"make": False}, "timeout": 120},
                         timeout=180)
    except RemoteError as e:
        return None, e.message
    if not res.ok:
        return None, res.error
    return res.answer, None


def check_host_plan(conn: Transport, pb: Playbook) -> CheckPlan:
    inst = plan_instances(conn.host, pb.launch)[0]
    facts = read_facts(conn, gpus=True, with_=[names.WITH_STATE], profile=pb.launch,
                       payload={"check_flags": sorted(inst.flags)})
    pre, err = (None, "not asked")
    if facts.package_found and facts.gpus:
        pre, err = preflight(conn, inst)
    return plan_check(conn.host.name, pb, inst, command_argv(conn.host, pb.launch), facts, pre, err)


# ------------------------------------------------------------------------------------------ apply


class _Interrupted(Exception):
    pass


def apply_check(conn: Transport, cp: CheckPlan, pb: Playbook, *, timeout: float,
                interrupt: threading.Event | None = None) -> HostCheck:
    """Carry out a plan: work dir, models, the three servers one after another, cleanup (always)."""
    res = HostResult(cp.host, "refused" if cp.status == "refused" else "failed", cp.message,
                     Checked(cp.version, cp.gpu, cp.threshold, list(cp.concurrency)))
    if cp.status != "run":
        return res
    assert cp.inst is not None and cp.facts is not None and cp.gpu is not None and cp.threshold is not None
    h = conn.host
    kit = engine().gpu_check()
    res.detail.phases = [PhaseResult(p.name) for p in cp.phases]
    prep = conn.agent(names.GPUCHECK_PREPARE, {"by": who(), "port_offsets": list(kit.PORT_OFFSETS)}, timeout=120)
    d = prep.dir
    if prep.swept:
        res.detail.notes.append(f"removed what earlier interrupted checks left: {', '.join(prep.swept)}")
    events.emit("gpucheck-prepared", h.name, d)
    try:
        assert cp.inst.launch is not None
        made = conn.agent(names.GPUCHECK_SCRIPT, {"script": kit.model_script(), "launch": cp.inst.launch.to_agent(),
                                                  "dir": d, "request": {"make": True, "dir": f"{d}/models"},
                                                  "timeout": 300}, timeout=360)
        if not made.ok or not isinstance(made.answer.get("target"), str) or not isinstance(made.answer.get("draft"), str):
            res.message = f"could not make the tiny model on {h.name}: {made.error or 'the script answered no model'}"
            return res
        models = {"target": made.answer["target"], "draft": made.answer["draft"]}
        runs = _phases(cp.inst, command_argv(h, pb.launch), cp.patch_flags, models, prep.port, cp.gpu["index"])
        lid = new_op_id("g")
        for (shown, argv, env), pr in zip(runs, res.detail.phases, strict=True):
            if interrupt is not None and interrupt.is_set():
                raise _Interrupted
            _run_phase(conn, pb, cp, d, lid, shown, argv, env, pr, prep.port, timeout, interrupt)
            if pr.status == "interrupted":
                raise _Interrupted
        _verdict(res, cp)
    except _Interrupted:
        res.status, res.message = "interrupted", "interrupted (Ctrl-C): the servers were stopped and the work dir removed"
    except RemoteError as e:
        res.status, res.message = "failed", e.message
    finally:
        res.detail.cleanup = _cleanup(conn, d, pb.launch.stop_timeout)
        if not res.detail.cleanup.get("removed"):
            res.status = "failed" if res.status == "passed" else res.status
            res.message += f"; left on the host: {d} ({res.detail.cleanup.get('error') or 'not removed'})"
    return res


def _run_phase(conn: Transport, pb: Playbook, cp: CheckPlan, d: str, lid: str, shown: PhasePlan, argv: list[str],
               env: dict[str, str], pr: PhaseResult, port: int, timeout: float,
               interrupt: threading.Event | None) -> None:
    h = conn.host
    sd = f"{d}/state"
    name = f"gpucheck-{shown.name}"
    facts = cp.facts
    assert facts is not None and cp.inst is not None and cp.inst.launch is not None
    events.emit("gpucheck-phase", h.name, shown.name)
    req = {"state_dir": sd, "instance": name, "launch_id": lid, "argv": argv, "by": who(), "public_argv": shown.argv,
           "env": env, "public_env": shown.env, "inherit_env": list(INHERIT_FROM_HOST),
           "package_dir": facts.package_dir, "hash_files": [], "cwd": cp.inst.launch.cwd,
           "extra": {"version": cp.version, "port": port, "gpus": [cp.gpu["index"]] if cp.gpu else [],
                     "playbook": pb.name, "by": who(), "host": h.name, "gpu_check": shown.name,
                     "server_match": {"executable": facts.launch_python, "target": cp.inst.launch.target}}}
    t0 = time.monotonic()
    try:
        rec = conn.agent(names.SERVER_START, req)
    except RemoteError as e:
        pr.status, pr.message = "failed", f"not started: {e.message}"
        return
    pr.pid = rec.pid
    try:
        _serve_phase(conn, pb, cp, d, lid, name, pr, port, timeout, t0, interrupt)
    finally:  # this server is stopped before the next one starts (cleanup stops it too, whatever happens)
        stopped = conn.agent(names.SERVER_STOP, {"state_dir": sd, "instances": [name],
                                                 "timeout": pb.launch.stop_timeout},
                             timeout=pb.launch.stop_timeout + 40)
        bad = [s for s in stopped if s.action == "still running"]
        if bad and pr.status == "ok":
            pr.status, pr.message = "failed", f"could not stop it (pid {bad[0].pid})"


def _serve_phase(conn: Transport, pb: Playbook, cp: CheckPlan, d: str, lid: str, name: str, pr: PhaseResult,
                 port: int, timeout: float, t0: float, interrupt: threading.Event | None) -> None:
    sd = f"{d}/state"
    assert cp.inst is not None and cp.inst.launch is not None
    wait = {"state_dir": sd, "launch_ids": {name: lid}, "ready_line": engine().ready_line,
            "forbidden": [f for f in pb.verify.forbidden if f not in CRASH_SIGNS],
            "survivable": [f for f in pb.verify.forbidden if f in CRASH_SIGNS], "tail": 30,
            "stamp_re": engine().log_stamp_re, "stamp_fmt": engine().log_stamp_fmt}
    deadline = time.monotonic() + timeout
    w = None
    while True:
        left = max(0.0, deadline - time.monotonic())
        part = left if interrupt is None else min(WAIT_SLICE, left)
        got = conn.agent(names.SERVER_WAIT, {**wait, "instances": [name], "timeout": part}, timeout=part + 60)
        w = got.get(name)
        if w is not None and (w.status != "timeout" or left <= part):
            break
        if interrupt is not None and interrupt.is_set():
            pr.status, pr.message = "interrupted", "interrupted while it was starting"
            return
    if w is None or w.status != "ready":
        pr.status = "failed"
        pr.message = f"not ready: {(w.why if w else None) or (w.status if w else 'no answer')}"
        pr.tail = list(w.tail) if w else []
        return
    pr.ready_s = round(time.monotonic() - t0, 1)
    pats = list(pb.verify.markers) + list(pb.verify.report)
    grep = conn.agent(names.SERVER_GREP, {"state_dir": sd, "instances": [name], "patterns": pats,
                                          "max_per_pattern": 20})
    st = grep.instances.get(name)
    hits = st.matches if st else {}
    pr.marker = [ln[:300] for m in pb.verify.markers for ln in (hits[m].lines if m in hits else [])][:8]
    if interrupt is not None and interrupt.is_set():
        pr.status, pr.message = "interrupted", "interrupted before its requests"
        return
    loads = [[c, 2 * c, LOAD_TOKENS] for c in cp.concurrency]
    bench = conn.agent(names.GPUCHECK_SCRIPT, {
        "script": engine().gpu_check().bench_script(), "launch": cp.inst.launch.to_agent(), "dir": d,
        "request": {"port": port, "prompts": SAMPLE_PROMPTS, "sample_tokens": SAMPLE_TOKENS,
                    "batched": cp.concurrency[-1], "loads": loads, "timeout": 120},
        "timeout": 540}, timeout=600)
    grep = conn.agent(names.SERVER_GREP, {"state_dir": sd, "instances": [name], "patterns": pats,
                                          "max_per_pattern": 20})
    st = grep.instances.get(name)
    hits = st.matches if st else {}
    pr.marker = [ln[:300] for m in pb.verify.markers for ln in (hits[m].lines if m in hits else [])][:8]
    pr.switches = [ln[:300] for m in pb.verify.report for ln in (hits[m].lines if m in hits else [])][:8]
    if not bench.ok:
        pr.status, pr.message = "failed", f"requests failed: {bench.error}"
        return
    _read_bench(pr, bench.answer)


def _read_bench(pr: PhaseResult, ans: dict[str, Any]) -> None:
    """The bench script's answer, untrusted: only the expected shapes are kept, bounded."""
    def sha(x: Any) -> str | None:
        s = x.get("sha256") if isinstance(x, dict) else None
        return s if isinstance(s, str) and len(s) == 64 and all(c in "0123456789abcdef" for c in s) else None

    seq = ans.get("samples") if isinstance(ans.get("samples"), list) else []
    bat = ans.get("batched") if isinstance(ans.get("batched"), list) else []
    pr.samples = [sha(x) for x in (seq + bat)[:512]]
    pr.heads = [str(x.get("head", ""))[:60] for x in seq[:3] if isinstance(x, dict)]
    for ld in (ans.get("loads") if isinstance(ans.get("loads"), list) else [])[:8]:
        if not isinstance(ld, dict):
            continue
        keep = {k: ld.get(k) for k in ("concurrency", "requests", "completed", "tokens", "seconds", "tok_per_s",
                                       "accept_len") if isinstance(ld.get(k), (int, float)) and not isinstance(ld.get(k), bool)}
        keep["errors"] = [str(e)[:300] for e in (ld.get("errors") or [])[:3]] if isinstance(ld.get("errors"), list) else []
        pr.loads.append(keep)
    errs = [str(e)[:300] for e in (ans.get("errors") or [])[:3]] if isinstance(ans.get("errors"), list) else []
    bad = errs + [e for ld in pr.loads for e in ld["errors"]]
    if bad or None in pr.samples:
        pr.status, pr.message = "failed", f"requests failed: {bad[0] if bad else 'a greedy sample got no text'}"
    else:
        pr.status, pr.message = "ok", f"{len(pr.samples)} greedy texts, {len(pr.loads)} loads"


def _verdict(res: HostCheck, cp: CheckPlan) -> None:
    ran = {p.name: p for p in res.detail.phases}
    bad = [p for p in res.detail.phases if p.status != "ok"]
    texts = [p.samples for p in res.detail.phases if p.status == "ok"]
    differ = [i for i in range(min((len(t) for t in texts), default=0)) if len({t[i] for t in texts}) > 1]
    n = min((len(t) for t in texts), default=0)
    res.detail.outputs = {"compared": n if len(texts) > 1 else 0, "differ": len(differ), "phases": len(texts),
                          "identical": (not differ) if len(texts) > 1 else None}
    dyn = ran.get("dynamic")
    problems = []
    if bad:
        problems.append(f"{bad[0].name}: {bad[0].message}")
    if dyn is not None and dyn.status == "ok" and cp.markers and not dyn.marker:
        problems.append(f"the playbook's marker ({cp.markers[0]!r}) is not in the dynamic server's log: the "
                        "patched code did not run (is the playbook deployed? 'fleetctl verify-logs' after a "
                        "launch says why)")
    if differ:
        problems.append(f"greedy outputs differ between the servers for {len(differ)} of {n} requests")
    if problems:
        res.status, res.message = "failed", "; ".join(problems)
        return
    res.status = "passed"
    res.message = (f"marker found, greedy outputs identical across {len(texts)} servers ({n} requests); "
                   + ", ".join(_speed_line(res.detail, c) for c in res.detail.concurrency))


def _speed_line(res: Checked, conc: int) -> str:
    ph = {p.name: p.tok_s(conc) for p in res.phases}
    dyn = ph.get("dynamic")
    best = max((v for k, v in ph.items() if k != "dynamic" and v), default=None)
    ratio = f"{dyn / best:.2f}x the faster stock server" if dyn and best else "no ratio"
    return f"C={conc}: dynamic {dyn:.0f} tok/s ({ratio})" if dyn else f"C={conc}: dynamic ? tok/s"


def _cleanup(conn: Transport, d: str, stop_timeout: float) -> dict[str, Any]:
    try:
        c = conn.agent(names.GPUCHECK_CLEANUP, {"dir": d, "timeout": stop_timeout}, timeout=stop_timeout * 4 + 60)
    except RemoteError as e:
        return {"dir": d, "removed": False, "stopped": [], "error": e.message}
    return {"dir": c.dir, "removed": c.removed,
            "stopped": [{"instance": s.instance, "action": s.action, "pid": s.pid, "how": s.how} for s in c.stopped]}


# ------------------------------------------------------------------------------------------ fleet


def _host_fn(pb: Playbook, *, run: bool, timeout: float, interrupt: threading.Event | None) -> Any:
    def fn(conn: Transport) -> Any:
        cp = check_host_plan(conn, pb)
        if not run:
            return cp
        t = time.monotonic()
        r = apply_check(conn, cp, pb, timeout=timeout, interrupt=interrupt)
        r.elapsed = time.monotonic() - t
        return r
    return fn


def plan_fleet(fleet: Fleet, pb: Playbook) -> list[CheckPlan]:
    """`gpu-check --check`: every host's plan from its facts and preflight; nothing is made or started."""
    outs = fleet.run(_host_fn(pb, run=False, timeout=0.0, interrupt=None))
    return [o.detail if o.ok else CheckPlan(o.host, "unreachable" if o.status == "unreachable" else "failed", o.message,
                                                reference=o.reference)
            for o in outs]


def check_fleet(fleet: Fleet, pb: Playbook, *, timeout: float | None = None) -> list[HostCheck]:
    t = float(timeout if timeout is not None else pb.launch.ready_timeout)
    outs = fleet.run(_host_fn(pb, run=True, timeout=t, interrupt=fleet.interrupt))
    out = []
    for o in outs:
        if o.ok:
            out.append(o.detail)
        else:
            st: Status = "unreachable" if o.status == "unreachable" else (
                "interrupted" if o.status == "not-started" else "failed")
            r = o.carry(Checked())
            r.status = st
            out.append(r)
    return out
