"""launch and stop: pre-checks per instance, detached start by the agent, bounded readiness wait
on THIS launch's log, and status of what fleetctl launched. Results are data; the CLI renders."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetctl.config.hosts import Host
from fleetctl.config.playbook_model import CRASH_SIGNS, Playbook
from fleetctl.engines import engine
from fleetctl.model import statefiles
from fleetctl.model.facts import HostFacts, read_facts
from fleetctl.model.instances import Instance, plan_instances
from fleetctl.model.launchspec import INHERIT_FROM_HOST
from fleetctl.model.result import Decided, HostResult, Status
from fleetctl.ops.deploy import new_op_id, who
from fleetctl.ops.exits import exited_line
from fleetctl.ops.managers import manager_request
from fleetctl.ops.runner import Fleet
from fleetctl.plan.patched_worker import coverage
from fleetctl.plan.trees import lane, lane_key
from fleetctl.protocol import names
from fleetctl.protocol.answers import (
    DeployOnDisk,
    InstanceState,
    LaunchRecord,
    ServersFacts,
    ServerStopAnswer,
    ServerWaitAnswer,
    StopResult,
)
from fleetctl.protocol.schema import to_json
from fleetctl.transport import events
from fleetctl.transport.base import RemoteError, Transport

TAIL = 30

InstanceStatus = Literal["ready", "refused", "failed", "timeout", "skipped", "interrupted"]


@dataclass
class InstanceLaunch:
    host: str
    instance: str
    port: int
    gpus: list[int]
    status: InstanceStatus
    message: str = ""
    launch_id: str | None = None
    pid: int | None = None
    seconds: float | None = None  # launch -> ready (or -> failure)
    log: str | None = None
    worker: dict[str, Any] = field(default_factory=dict)
    health: int | None = None
    tail: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "instance": self.instance, "port": self.port, "gpus": self.gpus,
                "status": self.status, "message": self.message, "launch_id": self.launch_id, "pid": self.pid,
                "seconds": self.seconds, "log": self.log, "worker": self.worker, "health": self.health,
                "tail": self.tail, "notes": self.notes}


@dataclass
class Launched:
    """A host's launch (HostLaunch's detail): its SGLang version, each instance, seconds per step."""

    version: str | None = None
    instances: list[InstanceLaunch] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step on this host

    def mark(self, phase: str, t0: float) -> float:
        now = time.monotonic()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - t0, 3)
        return now

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "phases": self.phases, "instances": [i.to_json() for i in self.instances]}


HostLaunch = HostResult[Launched]


def instances_by_host(fleet: Fleet, pb: Playbook) -> dict[str, list[Instance]]:
    """Every host's instances (InputError on a bad profile/inventory, before any connection)."""
    return {h.name: plan_instances(h, pb.launch) for h in fleet.hosts}


def _public_flags(inst: Instance) -> dict[str, Any]:
    secrets = [inst.env[k] for k in inst.secret_keys]
    out = {}
    for k, v in inst.flags.items():
        s = str(v)
        out[k] = "***" if any(x and x in s for x in secrets) else v
    return out


def _running(facts: HostFacts) -> list[InstanceState]:
    """Instances whose server runs, or whose launch still has a live process (a wrapper)."""
    return [s for s in (facts.servers.instances if facts.servers else []) if s.running or s.launch_alive]


def _conflicts(running: list[InstanceState], insts: list[Instance]) -> list[InstanceState]:
    wanted = {i.name for i in insts}
    ports = {i.port for i in insts}
    gpus = {g for i in insts for g in i.gpus}
    out = []
    for s in running:
        rec = s.record
        if s.instance in wanted or (rec is not None and (rec.port in ports or gpus & set(rec.gpus))):
            out.append(s)
    return out


def _gpu_problems(facts: HostFacts, inst: Instance) -> list[str]:
    if not inst.gpus:
        return []
    if facts.gpus is None:
        return [f"cannot check GPUs {list(inst.gpus)}: {facts.gpu_note}"]
    by_index = {g.index: g for g in facts.gpus}
    out = []
    for i in inst.gpus:
        g = by_index.get(i)
        if g is None:
            out.append(f"GPU {i} not found by nvidia-smi on the host (it lists {sorted(by_index)})")
        elif g.busy():
            procs = ", ".join(f"pid {p.pid} {p.name} {p.used_mib} MiB" for p in g.processes)
            out.append(f"GPU {i} is in use: {procs or ''}{'; ' if procs else ''}"
                       f"{g.memory_used_mib} MiB of memory used")
    return out


def http_get(conn: Transport, port: int, path: str, timeout: float = 10.0) -> tuple[int | None, bytes]:
    """GET http://127.0.0.1:port/path as seen from the host, through the SSH connection."""
    chan = conn.open_tcp(port, timeout=timeout)
    try:
        chan.settimeout(timeout)
        chan.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        buf = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = chan.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            buf += chunk
    finally:
        chan.close()
    head, _, body = buf.partition(b"\r\n\r\n")
    try:
        code = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        code = None
    return code, body


def hash_set(pb: Playbook | None, version: str) -> list[str]:
    """Files whose bytes at launch are recorded: the playbook's files, the files it declares it
    covers, and every speculative worker file when it declares it covers the running worker."""
    rels = [f.path for f in (pb.files_for(version) or [])] if pb else []
    extra = list(pb.covers.files) if pb else []
    if pb is not None and pb.covers.worker:
        extra += list(engine().worker_files(version).values())
    for rel in extra:
        if rel not in rels:
            rels.append(rel)
    return rels


def stop_instances(conn: Transport, instances: list[str] | None, timeout: float) -> ServerStopAnswer:
    res: ServerStopAnswer = conn.agent(
        names.SERVER_STOP, {"state_dir": conn.host.state_dir, "instances": instances, "timeout": timeout,
                             "entry": conn.host.name},
        timeout=timeout + 30 + 10 * len(instances or [1]))
    return res


@dataclass
class InstanceStart:
    """What the launch will start for one instance: data, shown by `launch --check` (public argv and
    env: secret values are ***)."""

    instance: str
    port: int
    gpus: list[int]
    argv: list[str]
    env: dict[str, str]
    cwd: str
    worker: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # why it will not start (the host is refused)
    notes: list[str] = field(default_factory=list)  # said before the launch (flags left out)
    warnings: list[str] = field(default_factory=list)  # said when it starts (coverage)

    def to_json(self) -> dict[str, Any]:
        return {"instance": self.instance, "port": self.port, "gpus": self.gpus, "argv": self.argv,
                "env": self.env, "cwd": self.cwd, "worker": self.worker, "problems": self.problems,
                "notes": [*self.notes, *self.warnings]}


@dataclass
class LaunchPlan(Decided):
    """One host's launch, decided from its facts (pure data; `plan_launch` makes it, `apply_launch`
    carries it out, `launch --check` shows it): start, refused, failed or unreachable."""

    status: Status = "start"
    version: str | None = None
    stop: list[str] = field(default_factory=list)  # fleetctl instances stopped first (--replace)
    recheck: bool = False  # ports and GPUs are checked again once those are stopped
    hash_files: list[str] = field(default_factory=list)  # files whose bytes at launch are recorded
    instances: list[InstanceStart] = field(default_factory=list)
    # for the apply step, not shown: the instances (secret values included) and the facts read
    run: list[Instance] = field(default_factory=list, repr=False)
    facts: HostFacts | None = field(default=None, repr=False)

    def fields(self) -> dict[str, Any]:
        """The plan's own fields in its row."""
        return {"version": self.version, "stop": self.stop, "recheck": self.recheck, "hash_files": self.hash_files,
                "instances": [i.to_json() for i in self.instances]}


def _starts(insts: list[Instance]) -> list[InstanceStart]:
    return [InstanceStart(i.name, i.port, list(i.gpus), list(i.public_argv),
                          i.launch.public_effective_env if i.launch else i.public_env,
                          (i.launch.cwd if i.launch and i.launch.cwd else None)
                          or i.effective_env.get("HOME") or "~ (the home of the user the agent runs as)") for i in insts]


def _plan_refused(lp: LaunchPlan, msg: str, status: Status = "refused") -> LaunchPlan:
    lp.status, lp.message = status, msg
    return lp


def _plan_problems(lp: LaunchPlan, problems: dict[str, list[str]]) -> LaunchPlan | None:
    """Refuse the whole host if any instance has a problem (nothing is started half-way)."""
    if not any(problems.values()):
        return None
    first = next((n, p) for n, p in problems.items() if p)
    for st in lp.instances:
        st.problems = list(problems.get(st.instance, []))
    return _plan_refused(lp, f"nothing started on this host: {first[0]}: {first[1][0]}")


def resource_problems(facts: HostFacts, insts: list[Instance]) -> dict[str, list[str]]:
    """Per instance: its port in use, its GPUs missing or busy (from the facts)."""
    free = facts.servers.ports if facts.servers else {}
    problems: dict[str, list[str]] = {i.name: [] for i in insts}
    for inst in insts:
        if free.get(str(inst.port)) is False:
            problems[inst.name].append(f"port {inst.port} is in use on the host")
        problems[inst.name] += _gpu_problems(facts, inst)
    return problems


def _instance_problems(host: Host, pb: Playbook, inst: Instance, st: InstanceStart, facts: HostFacts, v: str,
                       named: dict[str, bytes | str] | None, hooks: list[str], allow_uncovered: bool) -> list[str]:
    """Why one instance of the launch must not start (its model, what the release would refuse, the
    playbook's patched argument checks, coverage); its worker and warnings go on `st` (its start)."""
    problems: list[str] = []
    if engine().launch_model({}, inst.argv) is None:  # (was: started with no model, failing later)
        no_model = (f"the launch names no target model: set launch.flags.{engine().model_flag} in {pb.path} "
                    "(or in the inventory's launch_command)")
        if "-m" in inst.argv:  # the server's module run directly: it gets no model from elsewhere
            problems.append(no_model)
        else:  # a script of the user's own (a wrapper) may name it itself
            st.warnings.append(f"warning: {no_model}, unless {host.launch_command or pb.launch.command!r} does")
    env = facts.judged_env(inst.effective_env)  # after the interpreter's start-up hooks
    r = engine().resolve_worker(v, inst.flags, env, files=named)
    if r.startup_error:
        problems.append(f"SGLang {v} would refuse to start: {r.startup_error}")
    problems += engine().log_visibility_problems(r.resolved_args, env)
    if r.startup_error:
        return problems  # refused: which worker would run does not matter
    # a check the playbook's patch adds to the argument file refuses this launch (explain says the same)
    from fleetctl.plan.intended import intended_data

    bad_value = engine().patched_refusal(v, intended_data(pb, v), r.resolved_args) if pb.files_for(v) else None
    if bad_value:
        problems.append(f"the playbook's patched {engine().args_file} refuses this launch: {bad_value}")
        return problems
    cov = (coverage(v, inst.flags, env, pb, model=facts.model, draft=facts.draft_model)
           if pb.files_for(v) is not None else None)
    if cov is not None and cov.refused and hooks:
        cov.refused = f"{cov.refused} ({'; '.join(hooks)})"
    for pf in pb.files_for(v) or []:
        why = facts.module_problem(pf.path)
        if why and cov is not None and not cov.refused:
            cov.refused = why
    if cov is not None and cov.refused and not allow_uncovered:
        # the origin mistake: the worker that will run is not the one patched
        problems.append(f"{cov.refused} (--allow-uncovered to launch it anyway)")
    st.worker = {"class": r.worker_class, "file": r.worker_file,
                 "disable_overlap_schedule": r.disable_overlap_schedule, "reason": r.reason}
    st.warnings += [f"warning: {w}" for w in engine().playbook_warnings(pb, dict(inst.flags))]
    if cov is None:
        st.warnings.append(f"warning: {engine().playbook_refusal(pb, v) or f'the playbook has no patch set for SGLang {v}'}")
    elif cov.refused:
        st.warnings.append(f"warning: {cov.refused}")
    return problems


def plan_launch(host: Host, pb: Playbook, insts: list[Instance], facts: HostFacts, *, replace: bool = False,
                drop_unknown_flags: bool = False, allow_uncovered: bool = False) -> LaunchPlan:
    """Decide one host's launch from its facts: pure (no I/O). Refused (nothing will start) on an
    unknown release, an interrupted deploy, an unregistered flag, a startup error, an uncovered
    worker, a running fleetctl server in the way (without --replace), a busy port or GPU."""
    v = facts.package_version
    lp = LaunchPlan(host.name, version=v, instances=_starts(insts), run=insts, facts=facts)
    if not facts.package_found or not v:
        return _plan_refused(lp, facts.package_error or "SGLang not found by the launch's python", "failed")
    if not engine().is_known(v):
        return _plan_refused(lp, f"SGLang {v} is not a release fleetctl knows; it will not guess how it starts")
    if facts.interrupted():
        m = facts.interrupted()[0]
        return _plan_refused(lp, f"deploy {m.id} was interrupted ({m.state}): the files are mixed; "
                                 "run 'fleetctl rollback' or 'fleetctl deploy' to repair before launching")
    # a flag neither this release knows nor the installed server_args.py registers: argparse would
    # refuse it (typically the playbook's own flag on a host where its patch is not deployed)
    registered = facts.registered_flags or {}
    unregistered = sorted({f for inst in insts for f in engine().resolve_worker(v, inst.flags, inst.effective_env).unknown_flags
                           if registered.get(f) is False})
    if unregistered and drop_unknown_flags:
        profile = dataclasses.replace(pb.launch, flags={k: x for k, x in pb.launch.flags.items()
                                                        if k not in unregistered})
        h = dataclasses.replace(host, flags={k: x for k, x in host.flags.items() if k not in unregistered})
        insts = plan_instances(h, profile)
        lp.run, lp.instances = insts, _starts(insts)
        for st in lp.instances:
            st.notes.append(f"left out {', '.join(unregistered)}: not a flag of SGLang {v} as installed here")
    elif unregistered:
        return _plan_refused(lp, f"{', '.join(unregistered)} is not a flag of SGLang {v} as installed on {host.name} "
                                 f"(its {engine().args_file} does not register it): deploy the playbook first, or pass "
                                 f"--drop-unknown-flags to launch the installed code without it")
    # {file:<name>} in a flag: the playbook's state file as deployed on this host (fleetctl/model/statefiles.py)
    if pb.state_files:
        absent = statefiles.not_deployed(pb, facts)
        if absent:
            return _plan_refused(lp, f"{', '.join(absent)} is not on {host.name} as the playbook ships it (never "
                                     "deployed, rolled back or changed since): run 'fleetctl deploy' first")
        notes = [st.notes for st in lp.instances]
        insts = statefiles.expand_instances(insts, pb, facts.state.state_dir if facts.state else None)
        lp.run, lp.instances = insts, _starts(insts)
        for st, nt in zip(lp.instances, notes, strict=True):
            st.notes = nt
    problems: dict[str, list[str]] = {i.name: [] for i in insts}
    # the files the flags name, as start-up reads them (an adaptive config): judged as the release's loader would
    named: dict[str, bytes | str] | None = dict(facts.launch_files) if facts.launch_files is not None else None
    if pb.state_files and facts.state:
        named = dict(named or {})
        named.update((statefiles.expand("{file:" + f.name + "}", pb, facts.state.state_dir), f.data)
                     for f in pb.state_files)
    hooks = facts.hook_notes([k for k in facts.env_changes if k.startswith(engine().routing_env_prefixes)])
    for inst, st in zip(insts, lp.instances, strict=True):
        problems[inst.name] += _instance_problems(host, pb, inst, st, facts, v, named, hooks, allow_uncovered)
    conflicts = _conflicts(_running(facts), insts)
    if conflicts and not replace:
        for s in conflicts:
            rec = s.record or LaunchRecord(s.instance)
            msg = (f"a fleetctl server is already running here: {s.instance} pid {rec.pid} "
                   f"(launch {rec.launch_id}); stop it or pass --replace")
            for inst in insts:
                if inst.name == s.instance or inst.port == rec.port or set(inst.gpus) & set(rec.gpus):
                    problems[inst.name].append(msg)
    if _plan_problems(lp, problems):
        return lp
    lp.hash_files = hash_set(pb, v)
    if conflicts:  # ports and GPUs are checked once the old servers are stopped
        lp.stop, lp.recheck = [s.instance for s in conflicts], True
        return lp
    _plan_problems(lp, resource_problems(facts, insts))
    return lp


def read_launch_facts(conn: Transport, pb: Playbook, insts: list[Instance]) -> HostFacts:
    return read_facts(conn, gpus=True, with_=[names.WITH_STATE, names.WITH_SERVERS], profile=pb.launch,
                      payload={"server_ports": [i.port for i in insts],
                               "check_flags": sorted({f for i in insts for f in i.flags})})


def check_host(conn: Transport, pb: Playbook, insts: list[Instance], *, replace: bool,
               drop_unknown_flags: bool = False, allow_uncovered: bool = False) -> LaunchPlan:
    """`launch --check` on one host: its facts and its launch plan, nothing started or stopped."""
    if conn.host.container and conn.host.container.get("main_process"):
        return _main_process_plan(conn)
    return plan_launch(conn.host, pb, insts, read_launch_facts(conn, pb, insts), replace=replace,
                       drop_unknown_flags=drop_unknown_flags, allow_uncovered=allow_uncovered)


def _main_process_plan(conn: Transport) -> LaunchPlan:
    """`launch --check` for a server that is its container's main process: the container restart a
    launch would run (the container inspected, so a missing or stopped one says so), or the refusal."""
    from fleetctl.containers.host import inspect
    from fleetctl.containers.mainproc import refusal, spec_main

    spec = spec_main(conn)
    assert spec is not None
    why = refusal(spec)
    if why is not None:
        return LaunchPlan(conn.host.name, "refused", f"{conn.host.name}: {why}")
    inspect(conn, need_running=False)
    argv = spec.restart_argv() or []
    return LaunchPlan(conn.host.name, "start", f"would restart {spec.label} (its main process is the server): "
                      f"'{spec.shown(argv)}' on {conn.host.name}, then wait for its ready line")


def launch_host(conn: Transport, pb: Playbook, insts: list[Instance], *, launch_id: str, replace: bool,
                timeout: float, drop_unknown_flags: bool = False, allow_uncovered: bool = False,
                wait_lock: float = 0.0, interrupt: threading.Event | None = None) -> HostLaunch:
    """Facts -> plan_launch (pure) -> apply_launch: the launch on one host."""
    t = time.monotonic()
    facts = read_launch_facts(conn, pb, insts)
    lp = plan_launch(conn.host, pb, insts, facts, replace=replace, drop_unknown_flags=drop_unknown_flags,
                     allow_uncovered=allow_uncovered)
    return apply_launch(conn, lp, pb, launch_id=launch_id, timeout=timeout, started=t, wait_lock=wait_lock,
                        interrupt=interrupt)


def _result(lp: LaunchPlan) -> HostLaunch:
    res = HostLaunch(lp.host, "ok", detail=Launched(lp.version))
    res.detail.instances = [InstanceLaunch(lp.host, st.instance, st.port, list(st.gpus), "skipped", notes=list(st.notes))
                     for st in lp.instances]
    if lp.status != "start":
        res.status, res.message = lp.status, lp.message
        for st, it in zip(lp.instances, res.detail.instances, strict=True):
            it.status = "refused"
            if any(x.problems for x in lp.instances):
                it.message = ("; ".join(st.problems) if st.problems else
                              "not started: another instance on this host was refused")
            else:
                it.message = lp.message
    return res


def apply_launch(conn: Transport, lp: LaunchPlan, pb: Playbook, *, launch_id: str, timeout: float,
                 started: float | None = None, wait_lock: float = 0.0,
                 interrupt: threading.Event | None = None) -> HostLaunch:
    """Carry out a launch plan: stop what it replaces (then check ports and GPUs again), start every
    instance, wait for all of them in one bounded agent call, GET /health, stop the ones that failed."""
    h = conn.host
    res = _result(lp)
    res.detail.mark("facts", started if started is not None else time.monotonic())
    if lp.status != "start":
        return res
    assert lp.facts is not None and lp.version is not None
    facts, v, insts, items = lp.facts, lp.version, lp.run, res.detail.instances
    if lp.stop:
        t = time.monotonic()
        stopped = stop_instances(conn, lp.stop, pb.launch.stop_timeout)
        t = res.detail.mark("stop old", t)
        for sr in stopped:
            for it in items:
                it.notes.append(f"replaced {sr.instance} (pid {sr.pid}): {sr.action}"
                                f"{' by ' + sr.how if sr.how else ''}")
        bad = [sr for sr in stopped if sr.action == "still running"]
        if bad:
            return _refuse(res, f"could not stop {bad[0].instance} (pid {bad[0].pid})", "failed")
        # re-check ports and GPUs now that the old server is gone (no file hashing this time)
        facts = read_facts(conn, gpus=True, with_=[names.WITH_SERVERS], profile=pb.launch,
                           payload={"server_ports": [i.port for i in insts], "hash_dirs": [], "hash_files": []})
        res.detail.mark("re-check", t)
        problems = resource_problems(facts, insts)
        if any(problems.values()):
            return _refuse_items(res, insts, problems)

    # start every instance, then wait for all of them in one bounded agent call
    started_ok: list[str] = []
    t = time.monotonic()
    for inst, st, it in zip(insts, lp.instances, items, strict=True):
        it.worker = dict(st.worker)
        it.notes += st.warnings
        request = {
            "state_dir": h.state_dir, "instance": inst.name, "launch_id": launch_id, "argv": inst.argv, "by": who(),
            "public_argv": inst.public_argv, "env": inst.env,
            # recorded as the launch's env: what its python sees (verify-logs routes the worker with it)
            "public_env": facts.judged_env(inst.launch.public_effective_env if inst.launch else inst.public_env),
            "inherit_env": list(INHERIT_FROM_HOST), "package_dir": facts.package_dir, "hash_files": lp.hash_files,
            "cwd": inst.launch.cwd if inst.launch else None,
            "extra": {"version": v, "port": inst.port, "gpus": list(inst.gpus), "flags": _public_flags(inst),
                      "playbook": pb.name, "by": who(), "host": h.name, "worker": it.worker,
                      "ready_timeout": timeout,
                      # how the agent tells the server process from its wrappers (liveness)
                      "server_match": {"executable": facts.launch_python,
                                       "target": inst.launch.target if inst.launch else None}},
            "manager": manager_request(h, pb.launch.manager, pb.launch.stop_timeout),
        }
        if wait_lock:
            request["wait_lock"] = wait_lock
        try:
            with lane(lane_key(h, lp.facts)):  # (another entry for this machine and state dir: one at a time)
                rec: LaunchRecord = conn.agent(names.SERVER_START, request,
                                               timeout=h.command_timeout + wait_lock if wait_lock else None)
        except RemoteError as e:
            it.status, it.message = "failed", e.message
            continue
        it.launch_id, it.pid, it.log = launch_id, rec.pid, rec.log
        started_ok.append(inst.name)
    t = res.detail.mark("start", t)
    if started_ok:
        _wait_ready(conn, res, pb, insts, started_ok, launch_id=launch_id, timeout=timeout, t=t, interrupt=interrupt)
    bad = [it for it in items if it.status != "ready"]
    if bad:
        res.status = "failed"
        res.message = f"{len(bad)} of {len(items)} instance(s) not ready: {bad[0].instance}: {bad[0].message}"
    else:
        res.message = f"{len(items)} instance(s) ready"
    return res


WAIT_SLICE = 1.0  # seconds of one ready-wait request: a Ctrl-C is seen within it


def _wait_ready(conn: Transport, res: HostLaunch, pb: Playbook, insts: list[Instance], started: list[str], *,
                launch_id: str, timeout: float, t: float, interrupt: threading.Event | None = None) -> None:
    """Wait for the started instances (one bounded agent call), GET /health of the ready ones, and
    stop those that failed (a wrapper that outlived its server too)."""
    h, items = conn.host, res.detail.instances
    request = {
        "state_dir": h.state_dir, "launch_ids": dict.fromkeys(started, launch_id),
        "ready_line": engine().ready_line, "forbidden": [f for f in pb.verify.forbidden if f not in CRASH_SIGNS],
        "survivable": [f for f in pb.verify.forbidden if f in CRASH_SIGNS], "tail": TAIL,
        "stamp_re": engine().log_stamp_re, "stamp_fmt": engine().log_stamp_fmt,
    }
    events.emit("launch-waiting", h.name)
    # waited for in slices, so that a Ctrl-C (the fleet's interrupt) stops the wait at once instead of
    # after the model has loaded; the servers are left starting, and said so (below)
    waited: ServerWaitAnswer = {}
    pending = list(started)
    deadline = time.monotonic() + timeout
    cut = False
    while pending:
        left = max(0.0, deadline - time.monotonic())
        last = interrupt is None or left <= WAIT_SLICE
        part = left if last else WAIT_SLICE
        got: ServerWaitAnswer = conn.agent(names.SERVER_WAIT, {**request, "instances": pending, "timeout": part},
                                           timeout=part + 60)
        for n in pending:
            w = got.get(n)
            if w is not None and (w.status != "timeout" or last):
                if w.status == "timeout":
                    w.why = f"not ready after {timeout:g}s"
                waited[n] = w
        pending = [n for n in pending if n not in waited]
        if pending and interrupt is not None and interrupt.is_set():
            cut = True
            break
    t = res.detail.mark("wait ready", t)
    if cut:
        for inst, it in zip(insts, items, strict=True):
            if inst.name in pending:
                it.status = "interrupted"
                it.message = (f"interrupted (Ctrl-C) while it was starting: left running (pid {it.pid}, still "
                              f"loading); 'fleetctl stop --limit {h.name} --instance {inst.name}' stops it, "
                              f"'fleetctl status' shows it once ready")
    to_stop = []
    for inst, it in zip(insts, items, strict=True):
        w = waited.get(inst.name)
        if w is None:
            continue
        it.seconds = w.seconds
        it.tail = w.tail
        if w.status == "ready":
            it.status, it.message = "ready", "ready line seen in this launch's log"
            try:
                code, _ = http_get(conn, inst.port, "/health", timeout=min(30.0, max(5.0, timeout)))
            except (RemoteError, OSError) as e:
                code = None
                it.notes.append(f"GET /health failed: {e}")
            it.health = code
            t = res.detail.mark("GET /health", t)
            if code != 200:
                it.status = "failed"
                it.message = f"ready line seen, but GET /health answered {code}"
                to_stop.append(inst.name)
            elif w.logged:  # judged by liveness, readiness and its exit: it survived what it logged
                it.notes.append(f"the server logged {len(w.logged)} error line(s) during start-up and is ready "
                                f"and healthy (reported, not a failure): {w.logged[0]}")
        else:
            it.status = "timeout" if w.status == "timeout" else "failed"
            it.message = w.why or w.status
            if w.line:
                it.message += f": {w.line}"
            if not w.running and w.status in ("exited", "forbidden"):
                it.message = exited_line(w.exit.to_json() if w.exit else None, ready=False, tail=it.tail)
                if w.wrapper_only:
                    it.message += " (its launch wrapper still ran)"
            if w.running or w.wrapper_only:  # a wrapper that outlived its server is stopped too
                to_stop.append(inst.name)
    if to_stop:
        for sr in stop_instances(conn, to_stop, pb.launch.stop_timeout):
            for it in items:
                if it.instance == sr.instance:
                    it.notes.append(f"stopped the failed server ({sr.action}"
                                    f"{', ' + sr.how if sr.how else ''})")


def _refuse(res: HostLaunch, msg: str, status: Status = "refused") -> HostLaunch:
    res.status = status
    res.message = msg
    for it in res.detail.instances:
        it.status, it.message = "refused", msg
    return res


def _refuse_items(res: HostLaunch, insts: list[Instance], problems: dict[str, list[str]]) -> HostLaunch:
    res.status = "refused"
    first = next((n, p) for n, p in problems.items() if p)
    res.message = f"nothing started on this host: {first[0]}: {first[1][0]}"
    for inst, it in zip(insts, res.detail.instances, strict=True):
        p = problems[inst.name]
        it.status = "refused"
        it.message = "; ".join(p) if p else "not started: another instance on this host was refused"
    return res


def check_fleet(fleet: Fleet, pb: Playbook, *, replace: bool = False, drop_unknown_flags: bool = False,
                allow_uncovered: bool = False) -> list[LaunchPlan]:
    """`launch --check`: every host's launch plan, from its facts; nothing is started or stopped."""
    insts_by_host = instances_by_host(fleet, pb)
    outs = fleet.run(lambda c: check_host(c, pb, insts_by_host[c.host.name], replace=replace,
                                          drop_unknown_flags=drop_unknown_flags, allow_uncovered=allow_uncovered))
    res = []
    for o in outs:
        if o.ok:
            res.append(o.detail)
        else:
            lp = LaunchPlan(o.host, "unreachable" if o.status == "unreachable" else "failed", o.message,
                            instances=_starts(insts_by_host[o.host]), reference=o.reference)
            res.append(lp)
    return res


def launch_fleet(fleet: Fleet, pb: Playbook, *, replace: bool = False, timeout: float | None = None,
                 launch_id: str | None = None, hosts: list[Host] | None = None,
                 drop_unknown_flags: bool = False, allow_uncovered: bool = False) -> tuple[str, list[HostLaunch]]:
    """Launch the profile's instances on every host (or on `hosts`, e.g. those a deploy changed)."""
    targets = list(fleet.hosts if hosts is None else hosts)
    insts_by_host = {h.name: plan_instances(h, pb.launch) for h in targets}
    lid = launch_id or new_op_id("l")
    t = float(timeout if timeout is not None else pb.launch.ready_timeout)
    outs = fleet.run(lambda c: launch_host(c, pb, insts_by_host[c.host.name], launch_id=lid, replace=replace, timeout=t,
                                           drop_unknown_flags=drop_unknown_flags, allow_uncovered=allow_uncovered,
                                           wait_lock=fleet.wait_lock, interrupt=fleet.interrupt)
                     if not (c.host.container and c.host.container.get("main_process"))
                     else restart_main_process(c, insts_by_host[c.host.name], t),
                     targets)
    results = []
    for o, h in zip(outs, targets, strict=True):
        if o.ok:
            r: HostLaunch = o.detail
        else:
            r = o.carry(Launched(instances=[InstanceLaunch(h.name, i.name, i.port, list(i.gpus), "failed", o.message)
                                               for i in insts_by_host[h.name]]))
        r.elapsed = o.elapsed
        results.append(r)
    return lid, results


def restart_main_process(conn: Transport, insts: list[Instance], timeout: float) -> HostLaunch:
    """A host whose server is its container's main process: (re)start the server by restarting the
    container through its runtime (containers/mainproc.py), then wait for its ready line in the
    container's log of this start. A pod's is refused with the reason."""
    from fleetctl.containers.inspect import ContainerError
    from fleetctl.containers.mainproc import restart, spec_main

    spec = spec_main(conn)
    assert spec is not None
    h = conn.host.name
    port = insts[0].port if insts else 0
    row = InstanceLaunch(h, spec.name, port, [], "ready", log=f"{spec.shown([*spec.command, 'logs', spec.name])}")
    t0 = time.monotonic()
    try:
        _, took = restart(conn, spec, engine().ready_line, timeout)
    except ContainerError as e:
        row.status = "refused" if "a pod's container" in str(e) else "failed"
        row.message = str(e)
        row.seconds = round(time.monotonic() - t0, 3)
        return HostLaunch(h, "refused" if row.status == "refused" else "failed", row.message, Launched(instances=[row]))
    row.seconds = round(took, 3)
    row.message = f"restarted {spec.label} (its main process is the server); ready in {took:.1f}s"
    return HostLaunch(h, "ok", row.message, Launched(instances=[row]))


@dataclass
class Stopped:
    """What stop did to each instance on a host (HostStop's detail)."""

    instances: list[StopResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"instances": to_json(self.instances)}


HostStop = HostResult[Stopped]


def stop_fleet(fleet: Fleet, *, names: list[str] | None = None, timeout: float = 30.0) -> list[HostStop]:
    outs = fleet.run(lambda c: stop_instances(c, names, timeout))
    res = []
    for o in outs:
        if not o.ok:
            res.append(o.carry(Stopped()))
            continue
        stopped: ServerStopAnswer = o.detail
        bad = [s for s in stopped if s.action == "still running"]
        n = sum(1 for s in stopped if s.action == "stopped")
        res.append(HostStop(o.host, "failed" if bad else "ok",
                            f"could not stop {bad[0].instance}" if bad else f"{n} stopped", Stopped(list(stopped))))
    return res


# ----------------------------------------------------------------------------- status


def predates_deploy(rec: LaunchRecord, changed_files: list[str], deploy_now: DeployOnDisk | None) -> bool:
    """The server started before the deploy whose files are on disk, and runs other bytes than it put there
    (a later deploy of byte-identical files does not count)."""
    if deploy_now is None or not deploy_now.at or not rec.launched_at:
        return False
    if (rec.deploy.id if rec.deploy else None) == deploy_now.id or rec.launched_at >= deploy_now.at:
        return False
    return bool(set(changed_files) & set(deploy_now.files))


def server_status_facts(host: Host | str, facts: HostFacts | ServersFacts | None) -> list[dict[str, Any]]:
    """Rows for `fleetctl status`: one per server fleetctl launched on the host.

    `facts` is the host's HostFacts read with `read_facts(conn, with_=["servers"], ...)` (or its
    `servers`). Each row: instance, running, since (process start, epoch), pid, port,
    gpus, launch_id, flags, deploy id of the files at launch, deploy id on disk now, restart_needed
    (files on disk changed since the process started: hash at launch != hash now), changed_files, log.
    """
    name = host if isinstance(host, str) else host.name
    srv = facts.servers if isinstance(facts, HostFacts) else facts
    if not srv:
        return []
    dep_now = srv.deploy_now
    rows = []
    for s in srv.instances:
        rec = s.record or LaunchRecord(s.instance)
        problems = []
        if s.wrapper_only:
            problems.append(f"server process {rec.server_pid or '?'} is gone; its launch wrapper (pid "
                            f"{rec.pid}) still runs: 'fleetctl stop --limit {name} --instance {s.instance}' stops it")
        if s.restart_needed:
            problems.append(f"restart needed: {', '.join(s.changed_files)} changed on disk after "
                            f"the server started")
        dep_launch = rec.deploy.id if rec.deploy else None
        if s.running and predates_deploy(rec, s.changed_files, dep_now):
            problems.append(f"launched before deploy {dep_now.id if dep_now else None} of the files on disk")
        rows.append({
            "host": name, "instance": s.instance, "running": s.running,
            "since": rec.process_started or rec.launched_at, "pid": rec.pid,
            "port": rec.port, "gpus": rec.gpus if s.record else None, "launch_id": rec.launch_id,
            "version": rec.version, "flags": rec.flags,
            "worker": rec.worker.class_,
            "deploy_at_launch": dep_launch, "deploy_now": dep_now.id if dep_now else None,
            "restart_needed": s.restart_needed, "changed_files": s.changed_files,
            "state": rec.state, "stopped_at": rec.stopped_at, "log": rec.log,
            "manager": rec.manager or "fleetctl", "program": rec.program,
            "problems": problems,
        })
    return rows


@dataclass
class Listed:
    """The servers fleetctl launched on a host, as `servers` lists them (HostListed's detail)."""

    servers: list[dict[str, Any]] = field(default_factory=list)  # server_status_facts' rows

    def to_json(self) -> dict[str, Any]:
        return {"servers": self.servers}


HostListed = HostResult[Listed]


def status_fleet(fleet: Fleet) -> list[HostListed]:
    """Per host, for a `servers` listing: its servers, or why it did not answer."""
    outs = fleet.run(lambda c: read_facts(c, gpus=False, with_=[names.WITH_SERVERS]))
    return [o.carry(Listed(server_status_facts(o.host, o.detail) if o.ok else [])) for o in outs]
