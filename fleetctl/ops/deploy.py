"""Deploy: gather facts -> build_plan (pure) -> (render, by the caller) -> apply_plan per host, whose
result is re-hashed against the intended bytes (a host is "changed" only if it holds exactly them)."""

from __future__ import annotations

import dataclasses
import getpass
import secrets
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetctl.config.hosts import Host
from fleetctl.config.playbook_model import Playbook
from fleetctl.engines import engine
from fleetctl.errors import InputError
from fleetctl.model import statefiles
from fleetctl.model.facts import HostFacts, facts_request, inspect_container, parse_facts, read_facts
from fleetctl.model.instances import host_launch_spec
from fleetctl.model.result import HostResult
from fleetctl.ops import seal
from fleetctl.ops.runner import Fleet, HostOutcome
from fleetctl.ops.seal import Checked
from fleetctl.plan.deploy import Coverage, HostPlan, Intended, Plan, plan_host, sha
from fleetctl.plan.intended import intended_for
from fleetctl.protocol import names
from fleetctl.protocol.answers import DeployAnswer
from fleetctl.transport.base import Transport


def new_op_id(prefix: str = "d") -> str:
    return f"{prefix}{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


@dataclass
class Gathered:
    facts: dict[str, HostFacts]
    outcomes: dict[str, HostOutcome]
    # hosts whose inventory says `probe: true`: their own SGLang's answers (fleetctl/ops/probe.py)
    probes: dict[str, HostOutcome] = field(default_factory=dict)
    # per host: what its seal check found (fleetctl/ops/seal.py); empty when seals were not asked
    seals: dict[str, Checked] = field(default_factory=dict)


def gather(fleet: Fleet, playbook: Playbook | None, *, all_hashes: bool = False, probe: bool = False,
           use_seals: bool = False, make_seals: bool = False) -> Gathered:
    """probe: also ask the own SGLang of each host that opts in (`probe: true`) and that the
    playbook has a patch set for (deploy's coverage check; facts for the pure plan).
    use_seals: a host whose stored seal still holds is answered from it, without its Python
    (fleetctl/ops/seal.py); make_seals: the agent keeps what a seal needs, so the deploy can make one."""
    extra = sorted({f.path for files in (playbook.versions.values() if playbook else []) for f in files})
    profile = playbook.launch if playbook else None
    checks: dict[str, Checked] = {}
    kw: dict[str, Any] = {"extra_files": extra, "with_": [names.WITH_STATE], "gpus": False,
                          "all_hashes": all_hashes, "profile": profile}

    def one(c: Transport) -> HostFacts:
        if (use_seals or make_seals) and playbook is not None and not c.host.probe:
            req = facts_request(c.host, **kw)
            ck = checks[c.host.name] = seal.check(c, seal.seal_key(c.host, req), req, use=use_seals)
            ck.make = ck.make and make_seals
            if ck.facts is not None:
                facts = parse_facts(c.host.name, ck.facts)
                facts.container = inspect_container(c)
                return facts
            # settle: the answer says whether it may stand for the host as it is now (read_only_noop)
            settle = {"settle": True} if make_seals else {}
            if ck.make:  # the agent keeps what the deploy's seal needs (remote/seal.py)
                return read_facts(c, **kw, payload={"seal": {"drop": sorted(seal.drop_names(c.host))}, **settle},
                                  request=req)
            return read_facts(c, **kw, payload=settle, request=req)
        return read_facts(c, **kw)

    outs = fleet.run(one)
    g = Gathered({o.host: o.detail for o in outs if o.ok}, {o.host: o for o in outs}, seals=checks)
    if probe and playbook is not None:
        from fleetctl.ops.probe import ask_hosts

        ask = [h for h in fleet.hosts if h.probe and h.name in g.facts
               and playbook.files_for(g.facts[h.name].package_version or "") is not None]
        g.probes = ask_hosts(fleet, playbook, ask)
    return g


def coverage_for(host: Host, facts: HostFacts, playbook: Playbook, *, strict: bool = False) -> Coverage | None:
    """Which worker file the launch will run, and whether the playbook patches it (asked of the engine).
    strict: an answer that is not certain (model config not readable on the host) is refused."""
    from fleetctl.plan.patched_worker import host_coverage

    return host_coverage(host, facts, playbook, strict=strict)


def _patch_input_error(playbook: Playbook, version: str, e: InputError) -> InputError:
    """A playbook patch that does not parse or fit its pristine file is bad input (exit 2), named by
    its patch file (the engine names only the target file)."""
    files = playbook.files_for(version) or []
    f = next((f for f in files if str(f.patch_path) in e.message), None)
    if f is not None:  # already names the patch file
        return e if isinstance(e, InputError) and e.exit_code == 2 else InputError(e.message, hint=e.hint)
    f = next((f for f in files if e.message.startswith(f"{f.path} ")), None)
    where = f"{f.patch_path}" if f is not None else str(playbook.path)
    return InputError(f"{where}: {e.message}",
                      hint=e.hint or f"the patch must apply exactly to the pristine sglang {version} file; "
                                     "regenerate it with 'fleetctl patch new'")


def build_plan(fleet: Fleet, playbook: Playbook, gathered: Gathered, *, force: bool = False,
               allow_uncovered: bool = False, strict: bool = False) -> Plan:
    intended: dict[str, dict[str, Intended]] = {}
    hosts: list[HostPlan] = []
    for h in fleet.hosts:
        o = gathered.outcomes[h.name]
        if not o.ok:
            hosts.append(HostPlan(h.name, "unreachable" if o.status == "unreachable" else "failed", o.message,
                                  reference=o.reference))
            continue
        f = gathered.facts[h.name]
        v = f.package_version
        if v is not None and v not in intended:
            try:
                it = intended_for(playbook, v)
            except InputError as e:
                raise _patch_input_error(playbook, v, e) from None
            if it is not None:
                intended[v] = it
        cov = coverage_for(h, f, playbook, strict=strict) if v in intended else None
        hp = plan_host(h, f, playbook, intended.get(v) if v else None, force=force, coverage=cov,
                       allow_uncovered=allow_uncovered)
        _plan_probe(hp, gathered.probes.get(h.name))
        _plan_stale_bytecode(hp, f)
        _plan_state_files(hp, f, playbook)
        _plan_container(hp, h, f, playbook)
        if hp.status in ("change", "noop") and playbook.state_files:  # a steps=0 slot no batch reaches
            from fleetctl.plan.patched_worker import instances

            idle = dict.fromkeys(w for i in instances(h, playbook) for w in engine().playbook_warnings(playbook, dict(i.flags)))
            hp.message = "; ".join(x for x in (hp.message, *(f"warning: {w}" for w in idle)) if x)
        hosts.append(hp)
    _plan_shared_trees(hosts, gathered, playbook, list(fleet.hosts))
    return Plan(str(playbook.path), hosts, intended)


def port_onto_hosts(fleet: Fleet, plan: Plan, playbook: Playbook, gathered: Gathered, *,
                    allow_uncovered: bool = False) -> None:
    """--port-onto-host: on each host refused only because files the playbook patches are not the
    release's (a between-release checkout, a tree that moved on), merge the release's patch onto the
    host's own bytes (three-way, as `patch port` does: base = the release's pristine file, ours = its
    patched file, theirs = the host's), compile it, and plan writing that. The deploy's record keeps
    the host's own bytes as the backup and their hash as the file's before-hash, so rollback restores
    the tree exactly. A conflict refuses the host, naming the lines."""
    import base64

    from fleetctl.engines import wheels
    from fleetctl.patching.merge import merge3
    from fleetctl.protocol.answers import ReadFilesAnswer

    hosts = {h.name: h for h in fleet.hosts}
    for hp in plan.hosts:
        if hp.status != "refused" or hp.version not in plan.intended:
            continue
        facts = gathered.facts.get(hp.host)
        drifted = [fp for fp in hp.files if fp.state == "drifted"]
        others = [fp for fp in hp.files if fp.action == "refuse" and fp.state != "drifted"]
        if not drifted or others or facts is None:
            continue
        got: ReadFilesAnswer = fleet.connection(hosts[hp.host]).agent(
            names.READ_FILES, {"package_dir": hp.package_dir, "paths": [fp.path for fp in drifted]})
        it = plan.intended[hp.version or ""]
        problems = []
        for fp in drifted:
            raw = got.get(fp.path)
            theirs = base64.b64decode(raw) if raw is not None else None
            if theirs is None or sha(theirs) != fp.sha_now:
                problems.append(f"{fp.path} could not be read as planned")
                continue
            base = wheels.pristine_bytes(hp.version or "", fp.path)
            res = merge3(base, it[fp.path].data, theirs, ours_label=f"{playbook.name} {hp.version}",
                         theirs_label=f"{hp.host}")
            if not res.clean:
                lines = ", ".join(str(c.base_start) for c in res.conflicts[:5])
                problems.append(f"{fp.path}: the {hp.version} patch does not merge onto the host's bytes "
                                f"({len(res.conflicts)} conflict(s), at line(s) {lines}); write a patch for this tree "
                                "('fleetctl patch new' from the host's file)")
                continue
            try:
                compile(res.output, fp.path, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as e:
                problems.append(f"{fp.path}: the merge onto the host's bytes does not compile: {e}")
                continue
            fp.sha_pristine = fp.sha_now or fp.sha_pristine  # recorded against the tree's own hashes
            fp.sha_intended = sha(res.output)
            if res.output == theirs:  # ported before: the host holds the merge already
                fp.action, fp.state, fp.note = "none", "as-intended", "ported onto the host's bytes already"
                continue
            fp.ported = res.output
            fp.action = "patch"
            fp.note = (f"ported: {playbook.name}'s {hp.version} patch merged onto the host's own bytes "
                       "(three-way, the host's file as the base)")
        if problems:
            hp.message = f"{hp.host}: --port-onto-host: " + "; ".join(problems) + "; nothing was changed"
            for fp in drifted:
                fp.ported, fp.action = None, "refuse"
            continue
        if hp.coverage is not None and hp.coverage.refused and not allow_uncovered:
            hp.message = f"{hp.host}: {hp.coverage.refused}"
            continue
        ported = [fp.path for fp in drifted if fp.ported is not None]
        hp.status = "change" if ported or hp.interrupted else "noop"
        hp.message = (f"{len(ported)} file(s) ported onto the host's own bytes ({', '.join(ported)})" if ported
                     else "the host's files hold the port already")


def _plan_shared_trees(hosts: list[HostPlan], gathered: Gathered, playbook: Playbook,
                       fleet_hosts: list[Host]) -> None:
    """Hosts that reach one package tree (fleetctl/plan/trees.py): the first (the owner) deploys it, once;
    the others take the owner's plan and report its transaction as theirs."""
    from fleetctl.plan.trees import group_trees, lane_key

    groups = group_trees([h.name for h in fleet_hosts], gathered.facts)
    by_name = {hp.host: hp for hp in hosts}
    inv = {h.name: h for h in fleet_hosts}
    for hp in hosts:
        if hp.host in inv:
            hp.lane = lane_key(inv[hp.host], gathered.facts.get(hp.host))
    for name, g in groups.items():
        hp = by_name[name]
        if len(g.members) > 1:
            hp.tree_members = list(g.members)
        hp.records_dir = g.records_dir
        if name == g.owner:
            if g.records_dir and playbook.state_files and hp.status in ("change", "noop"):
                hp.status = "refused"
                hp.message = (f"{name}: its package tree {g.tree.real} is shared ({', '.join(g.members)}) and "
                             f"playbook {playbook.name!r} ships state files, which each host keeps in its own "
                             "state_dir: deploy it to a tree per host, or without state files")
            continue
        owner = by_name[g.owner]
        hp.tree_owner = g.owner
        hp.status, hp.files, hp.interrupted = owner.status, owner.files, owner.interrupted
        hp.drop_bytecode, hp.version, hp.package_dir = owner.drop_bytecode, owner.version, owner.package_dir
        said = f"shares its package tree {g.tree.real} with {g.owner}: deployed once, by {g.owner}'s transaction"
        hp.message = f"{said}; {owner.message}" if owner.message else said


def _plan_probe(hp: HostPlan, probed: HostOutcome | None) -> None:
    """A host whose own SGLang disagrees with the table, or could not be asked, is refused (the
    line `explain --probe` prints)."""
    if probed is None or hp.status not in ("change", "noop"):
        return
    from fleetctl.ops.probe import refusal

    why = refusal(probed)
    if why:
        hp.status, hp.message = "refused", why
    elif hp.coverage is not None:  # the answers show with "(worker that will run)"
        said = "; ".join(f"probe {p['instance']}: {p['line']}" for p in probed.detail)
        hp.coverage = dataclasses.replace(hp.coverage, reason=f"{hp.coverage.reason}; {said}")


def _plan_container(hp: HostPlan, host: Host, facts: HostFacts, playbook: Playbook) -> None:
    """A host whose SGLang is in a container: a read-only root is refused (the patch belongs in the
    image: `fleetctl patch dockerfile` prints how); a state dir on the container's own filesystem
    is warned about (its records and backups die with the container)."""
    from fleetctl.ops.container_advice import read_only_refusal, state_dir_warning

    if facts.container is None:
        return
    if facts.container.read_only and hp.status in ("change", "refused"):  # (the root cause of 'unwritable')
        hp.status, hp.message = "refused", read_only_refusal(hp.host, facts, playbook)
        return
    from fleetctl.config.containers import ContainerSpec
    from fleetctl.ops.container_advice import main_process_warning

    if hp.status not in ("change", "noop"):
        return
    for warn in (state_dir_warning(facts), main_process_warning(ContainerSpec.of(host.container))):
        if warn:
            hp.message = "; ".join(x for x in (hp.message, f"warning: {warn}") if x)


def _plan_state_files(hp: HostPlan, facts: HostFacts, playbook: Playbook) -> None:
    """The playbook's state files no deploy record shows as intended here: the deploy writes them
    (in the same transaction as the package files), even on a host whose package files are as intended."""
    if hp.status not in ("change", "noop") or not playbook.state_files:
        return
    pending = statefiles.not_deployed(playbook, facts)
    if pending:
        hp.status = "change"
        hp.message = "; ".join(x for x in (hp.message, f"{', '.join(pending)} will be written") if x)


def _stale(facts: HostFacts, rel: str) -> bool:
    view = facts.bytecode.get(rel)
    return view is not None and view.stale


def _plan_stale_bytecode(hp: HostPlan, facts: HostFacts) -> None:
    """A playbook file that is not replaced but whose cached pyc import would run instead of it
    (compiled from other bytes): the deploy removes that bytecode too, even on a host that is
    otherwise as intended."""
    if hp.status not in ("change", "noop"):
        return
    replaced = {fp.path for fp in hp.to_patch}
    stale = [fp.path for fp in hp.files if fp.path not in replaced and _stale(facts, fp.path)]
    if not stale:
        return
    hp.drop_bytecode = stale
    for fp in hp.files:
        if fp.path in stale:
            fp.note = (fp.note + "; " if fp.note else "") + "stale cached bytecode: removed"
    if hp.status == "noop":
        hp.status = "change"
        hp.message = f"stale cached bytecode of {', '.join(stale)} (import would not run the file on disk)"


@dataclass
class Applied:
    """What a deploy did on a host (HostApply's detail)."""

    deploy_id: str | None = None
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sealed: bool = False  # re-checked from its seal (fleetctl/ops/seal.py): no agent, no Python started
    servers: Any = None  # HostServers read right after a change (the restart reminder), if asked
    container: dict[str, Any] | None = None  # the container it patched (recorded in the ledger too)

    def to_json(self) -> dict[str, Any]:
        return {"deploy_id": self.deploy_id, "files": self.files, "notes": self.notes, "sealed": self.sealed}


HostApply = HostResult[Applied]


def lock_bound(conn: Transport, wait_lock: float) -> float | None:
    """The bound of a request that may wait for the host lock: the host's command_timeout plus the
    wait (--wait-lock); None (the usual bound) without one."""
    return conn.host.command_timeout + wait_lock if wait_lock else None


def _deploy_payload(conn: Transport, hp: HostPlan, plan: Plan, playbook: Playbook, op_id: str, *, validate: bool,
                    break_lock: set[str] | frozenset[str], wait_lock: float | None
                    ) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    """The agent's deploy request for one host of the plan: (payload, the package files it sends, the
    container it patches or None)."""
    it = plan.intended[hp.version or ""]
    files = []
    for fp in hp.to_patch:
        files.append({"path": fp.path, "sha_before": fp.sha_now, "sha_after": fp.sha_intended,
                      # raw bytes: marshal carries them (--port-onto-host: the merge onto the host's bytes)
                      "content": fp.ported if fp.ported is not None else it[fp.path].data})
    payload: dict[str, Any] = {
        "state_dir": hp.records_dir or conn.host.state_dir, "deploy_id": op_id, "package_dir": hp.package_dir,
        "version": hp.version, "playbook": playbook.name, "by": who(), "host": conn.host.name,
        "files": files, "validate": validate, "validated_by": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "verify_paths": [f.path for f in hp.files], "drop_bytecode": hp.drop_bytecode,
        # the launch's python, env and cwd: the agent asks it for its pycache prefix (bytecode)
        "launch": host_launch_spec(conn.host, playbook.launch).to_agent(),
        # the files the plan leaves alone must still hold what it saw, checked under the lock
        "expect": {f.path: f.sha_now for f in hp.files if f.action == "none"},
        # the playbook's non-package files, in the same transaction (fleetctl/model/statefiles.py)
        "state_files": statefiles.payload(playbook),
    }
    if hp.records_dir:  # a shared tree: its lock, manifest and backups beside it (fleetctl/plan/trees.py)
        payload["shared_tree"] = True
    if conn.host.name in break_lock:
        payload["break_lock"] = True
    if wait_lock:
        payload["wait_lock"] = wait_lock
    box = inspect_container(conn)
    if box is not None:  # the container it patches, recorded (status/verify-logs: re-created since?)
        payload["container"] = box.record()
    return payload, files, box


def _not_as_intended(hp: HostPlan, playbook: Playbook, final: dict[str, str]) -> list[str]:
    """The check after a deploy: each playbook file (package and state files) whose hash on the host
    is not the intended one, one phrase each."""
    bad = [f"{fp.path} hashes {(final.get(fp.path) or 'missing')[:12]}, expected {fp.sha_intended[:12]}"
           for fp in hp.files if final.get(fp.path) != fp.sha_intended]
    bad += [f"{statefiles.shown(playbook, sf.name)} hashes {(final.get(statefiles.shown(playbook, sf.name)) or 'missing')[:12]}"
            f", expected {sf.sha256[:12]}" for sf in playbook.state_files
            if final.get(statefiles.shown(playbook, sf.name)) != sf.sha256]
    return bad


def read_only_noop(hp: HostPlan, facts: HostFacts | None, playbook: Playbook) -> bool:
    """Whether a host planned as a no-op is answered from its facts alone, with no second request
    and no host lock: the facts say nothing a deploy looks at changed while they were read
    (`settled`, remote/seal.py: the state dir, lock, manifests, package dir, the planned files, their
    dirs and bytecode, every ctime older than the reading), no lock was there (held, stale or another
    machine's), no record is open or no longer on disk (a deploy under the lock would repair or close
    it), and nothing else would be written (no stale bytecode, no state files: their bytes are read
    only under the lock, no shared tree). The reading is then a snapshot of the host in which every
    planned file held its intended bytes, with no transaction running: what a deploy under the lock
    would have found, had it taken the lock at that moment. Anything else takes the lock and
    re-checks under it."""
    if hp.status != "noop" or hp.to_patch or hp.drop_bytecode or hp.interrupted or playbook.state_files:
        return False
    if hp.tree_members or hp.records_dir or hp.tree_owner or facts is None or not facts.settled:
        return False
    st = facts.state
    if st is None or st.lock is not None or st.tree_lock is not None or st.unwritable:
        return False
    return not any(m.gone or m.state in names.OPEN_STATES for m in st.deploys if not m.foreign)


def apply_plan(fleet: Fleet, plan: Plan, playbook: Playbook, op_id: str, *, validate: bool = True,
               hosts: list[str] | None = None, break_lock: set[str] | frozenset[str] = frozenset(),
               seals: dict[str, Checked] | None = None, facts: dict[str, HostFacts] | None = None,
               then_facts: Callable[[Host], tuple[dict[str, Any], dict[str, Any]]] | None = None
               ) -> dict[str, HostApply]:
    """Apply the plan to every host whose plan says 'change' or 'noop' (a no-op host is still visited:
    its files are re-checked under the host lock, so 'unchanged' is never a guess from facts read
    before a concurrent rollback). A no-op host answered from its seal (gather's `seals`) was
    re-checked by the seal check itself, moments ago: its files' bytes and everything the facts
    depended on, with no Python started. A no-op host whose `facts` (gather's) are a settled reading
    with no lock and nothing to repair (read_only_noop) is answered from that one request, and sealed
    from it. Returns per-host results; a host the agent visits with
    `seals` makes a new seal (fleetctl/ops/seal.py). then_facts(host) -> (facts request, discover part)
    (ops/discover.py discover_facts): a host planned to change also answers which of its servers
    now run older code, in the same request (HostApply.servers)."""
    results: dict[str, HostApply] = {}
    todo: dict[str, HostPlan] = {}
    for hp in plan.hosts:
        if hosts is not None and hp.host not in hosts:
            continue
        if hp.status in ("change", "noop"):
            todo[hp.host] = hp
        else:
            results[hp.host] = HostApply(hp.host, "unreachable" if hp.status == "unreachable" else
                                         ("refused" if hp.status == "refused" else "failed"), hp.message, Applied())

    riders = {n: hp for n, hp in todo.items() if hp.tree_owner is not None}
    for n in riders:
        del todo[n]

    def one(conn: Transport) -> HostApply:
        hp = todo[conn.host.name]
        ck = (seals or {}).get(conn.host.name)
        if ck is not None and ck.seal is not None and hp.status == "noop" and not hp.to_patch \
                and not hp.drop_bytecode:
            return HostApply(conn.host.name, "unchanged",
                             f"already as intended (sealed by {ck.seal.get('op_id')}: {len(ck.seal['paths'])} paths "
                             f"and {len(ck.seal['files'])} file hashes re-checked unchanged, no Python started)",
                             Applied(sealed=True))
        read = (facts or {}).get(conn.host.name)
        if read is not None and read_only_noop(hp, read, playbook):
            if ck is not None and ck.make and read.seal is not None and not read.seal.why:
                seal.save(conn.host, ck.key, read.seal, op_id)  # (what a locked no-op would have sealed)
            return HostApply(conn.host.name, "unchanged",
                             "already as intended (one reading, no lock: nothing a deploy looks at changed "
                             "while it was read)", Applied())
        payload, files, box = _deploy_payload(conn, hp, plan, playbook, op_id, validate=validate,
                                              break_lock=break_lock, wait_lock=fleet.wait_lock)
        sealing = ck is not None and ck.make
        if sealing and ck is not None:
            if ck.facts is not None and ck.request is not None:  # planned from a seal: the agent reads them now
                conn.agent(names.FACTS, {**ck.request, "seal": True})
            payload["seal"] = {"drop": sorted(seal.drop_names(conn.host))}
        disc = None
        if then_facts is not None and hp.status == "change":
            payload["then_facts"], disc = then_facts(conn.host)
        from fleetctl.plan.trees import lane, lane_key

        with lane(hp.lane or lane_key(conn.host, None)):  # (another entry for this machine and state dir: one at a time)
            res: DeployAnswer = conn.agent(names.DEPLOY, payload, timeout=lock_bound(conn, fleet.wait_lock))
        shipped = [f.path for f in res.files if f.path.startswith("{state_dir}/")]
        r = HostApply(conn.host.name, "changed" if res.deploy_id else "unchanged",
                      f"{len(files)} file(s) patched" + (f", {len(shipped)} state file(s) written" if shipped else "")
                      if res.deploy_id else
                      ("; ".join(res.notes) or "already as intended (checked under the host lock)"),
                      Applied(res.deploy_id, [f["path"] for f in files] + shipped, list(res.notes)))
        bad = _not_as_intended(hp, playbook, res.final)  # every playbook file must now hold the intended bytes
        if bad:
            r.status = "failed"
            r.message = "verification failed after deploy: " + "; ".join(bad)
        if box is not None and res.deploy_id:
            r.detail.container = box.record()
        if disc is not None and res.deploy_id:
            from fleetctl.ops.discover import servers_after

            r.detail.servers = servers_after(conn.host.name, res, disc)
        if sealing and ck is not None:
            if bad or res.seal is None:
                seal.forget(conn.host)
            elif res.seal.why:
                seal.save_unsealable(conn.host, ck.key, res.seal.why)
            else:
                seal.save(conn.host, ck.key, res.seal, op_id)
        return r

    targets = [h for h in fleet.hosts if h.name in todo]
    for o in fleet.run(one, targets):
        if o.ok:
            r = o.detail
        else:
            r = o.carry(Applied())
        r.elapsed = o.elapsed
        results[o.host] = r
    plan.applied.update(results)
    for n, hp in riders.items():
        results[n] = plan.applied[n] = _rider_result(n, hp, plan.applied.get(hp.tree_owner or ""))
    return results


def _rider_result(name: str, hp: HostPlan, owner: HostApply | None) -> HostApply:
    """A host whose tree another host's transaction deployed: that transaction, as what it is."""
    if owner is None:
        return HostApply(name, "failed", f"its package tree is deployed by {hp.tree_owner}'s transaction, which "
                                         f"was not run; deploy {hp.tree_owner} too", Applied())
    said = f"the tree it shares with {owner.host}" + (f" (records in {hp.records_dir})" if hp.records_dir else "")
    if owner.status in ("changed", "unchanged"):
        what = (f"deployed once, by {owner.host}'s transaction {owner.detail.deploy_id}: {owner.message}"
                if owner.status == "changed" else f"{owner.host} found it as intended: {owner.message}")
        return HostApply(name, owner.status, f"{said}: {what}",
                         Applied(owner.detail.deploy_id, list(owner.detail.files), list(owner.detail.notes),
                                 sealed=owner.detail.sealed))
    return HostApply(name, "failed" if owner.status != "refused" else "refused",
                     f"{said}: {owner.host}'s transaction {owner.status}: {owner.message}", Applied())
