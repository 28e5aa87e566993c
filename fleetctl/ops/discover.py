"""Every SGLang server on the selected hosts, whoever started it, and which of them run code older
than the files on disk (so deploy, rollback and status can say "restart these").

Two sources, one pass (the agent's facts with the "servers" and "discover" hooks):
- servers fleetctl launched: its launch records; stale when a worker file's hash at launch differs
  from its hash now (exact);
- every process on the host whose command line starts a server (/proc): stale when a file of the
  package this host's python imports changed (inode change time) after the process started.
  That assumes the process imports that package (it is the one the launch would import); its own
  PYTHONPATH, if it sets one, is shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.config.hosts import Host
from fleetctl.config.playbook_model import Playbook
from fleetctl.engines import engine
from fleetctl.errors import FleetctlError
from fleetctl.model.facts import HASH_FILES, HostFacts, facts_request, parse_facts, read_facts
from fleetctl.model.result import HostResult, Status
from fleetctl.ops.runner import Fleet
from fleetctl.protocol import names
from fleetctl.protocol.answers import InstanceState
from fleetctl.transport.base import Transport


@dataclass
class ServerProcess:
    host: str
    pid: int
    started: float | None
    argv: list[str]
    ports: list[int]
    log: str | None
    cwd: str | None
    env: dict[str, str] | None  # the routing-relevant variables; None: not readable
    instance: str | None  # the fleetctl instance whose record this is, if any
    version: str | None
    package_dir: str | None
    changed_files: list[str] = field(default_factory=list)
    worker: dict[str, Any] = field(default_factory=dict)
    launch_id: str | None = None  # fleetctl's own: the launch (its ledger id) that started it

    @property
    def stale(self) -> bool:
        return bool(self.changed_files)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started": self.started, "argv": self.argv,
                "ports": self.ports, "log": self.log, "cwd": self.cwd, "env": self.env,
                "launched_by": f"fleetctl ({self.instance})" if self.instance else "not fleetctl",
                "instance": self.instance, "version": self.version, "package_dir": self.package_dir,
                "stale": self.stale, "changed_files": self.changed_files, "worker": self.worker}


@dataclass
class Servers:
    """A host's server processes (HostServers' detail)."""

    processes: list[ServerProcess] = field(default_factory=list)
    truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"truncated": self.truncated, "servers": [p.to_json() for p in self.processes]}


HostServers = HostResult[Servers]


def no_servers(host: str, status: Status, message: str) -> HostServers:
    """A host whose servers were not read."""
    return HostServers(host, status, message, Servers())


def files_to_check(playbook: Playbook | None = None, extra: list[str] | None = None) -> list[str]:
    """The package files whose change means a running server runs old code: every worker file
    fleetctl knows, server_args.py, what the playbook patches, and `extra`."""
    rels = {rel for v in engine().known_versions() for rel in engine().worker_files(v).values()} | set(HASH_FILES) | set(extra or [])
    if playbook is not None:
        rels |= {f.path for files in playbook.versions.values() for f in files}
    return sorted(rels)


def _explain(version: str | None, flags: dict[str, Any], env: dict[str, str] | None) -> dict[str, Any]:
    if not version or not engine().is_known(version):
        return {"class": None, "reason": f"SGLang {version or '?'}: not in fleetctl's table"}
    r = engine().resolve_worker(version, flags, env or {})
    if r.startup_error:
        return {"class": None, "reason": f"this command line would not start: {r.startup_error}"}
    note = "" if env is not None else " (its environment is not readable: routing assumes none)"
    return {"class": r.worker_class, "file": r.worker_file, "reason": r.reason + note}


def discover_request(launch_command: str | None, playbook: Playbook | None = None,
                     files: list[str] | None = None) -> dict[str, Any]:
    """What to add to a facts call's payload (with the "servers" and "discover" hooks) to learn a
    host's servers."""
    return {"discover": engine().match_rules(launch_command), "discover_env": list(engine().routing_env_prefixes),
            "discover_files": files_to_check(playbook, files)}


def servers_from_facts(host: str, f: HostFacts, request: dict[str, Any]) -> HostServers:
    """The host's servers from facts read with the "servers" and "discover" hooks."""
    res = Servers()
    recs: dict[int, InstanceState] = {}
    for s in (f.servers.instances if f.servers else []):
        if s.running and s.record is not None and isinstance(s.record.pid, int):
            recs[s.record.pid] = s
    found = f.discover
    res.truncated = bool(found and found.truncated)
    for p in (found.processes if found else []):
        flags = engine().server_flags(p.argv, request["discover"]["modules"])
        sp = ServerProcess(host, p.pid, p.started, list(p.argv), list(p.ports or []), p.stdout or p.stderr, p.cwd,
                           p.env, p.instance, f.package_version, p.package_dir, list(p.changed_files))
        rec_state = recs.get(sp.pid)
        if rec_state is not None:  # fleetctl's own: its hash record is exact
            sp.changed_files = list(rec_state.changed_files)
            sp.launch_id = rec_state.record.launch_id if rec_state.record else None
        sp.worker = _explain(f.package_version, flags, p.env)
        res.processes.append(sp)
    seen = {sp.pid for sp in res.processes}
    for pid, s in recs.items():  # launched by fleetctl through a command line the rules do not match
        if pid in seen or s.record is None:
            continue
        rec = s.record
        sp = ServerProcess(host, pid, rec.process_started, list(rec.argv),
                           [rec.port] if isinstance(rec.port, int) else [], rec.log, rec.cwd, dict(rec.env),
                           s.instance, rec.version, rec.package_dir, list(s.changed_files), launch_id=rec.launch_id)
        sp.worker = {"class": rec.worker.class_, "reason": "from its launch record"}
        res.processes.append(sp)
    return HostServers(host, "ok", detail=res)


DISCOVER_WITH = [names.WITH_SERVERS, names.WITH_DISCOVER]


def discover_facts(host: Host, playbook: Playbook | None = None, files: list[str] | None = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole facts request that learns `host`'s servers, and its discover part (for
    servers_from_facts): sent alone (discover_fleet) or as a deploy's `then_facts`."""
    req = discover_request(host.launch_command, playbook, files)
    return {**facts_request(host, gpus=False, all_hashes=False, with_=DISCOVER_WITH), **req}, req


def servers_after(host: str, answer: Any, req: dict[str, Any]) -> HostServers:
    """A host's servers from the `then_facts` of a deploy or rollback answer (discover_facts)."""
    if answer.then_facts is None:
        return no_servers(host, "failed", f"{host}: {answer.then_facts_error or 'servers not read'}")
    try:
        return servers_from_facts(host, parse_facts(host, answer.then_facts), req)
    except FleetctlError as e:
        return no_servers(host, "failed", str(e))


def discover_fleet(fleet: Fleet, playbook: Playbook | None = None, hosts: list[Host] | None = None,
                   files: list[str] | None = None) -> list[HostServers]:
    def one(conn: Transport) -> HostServers:
        full, req = discover_facts(conn.host, playbook, files)
        return servers_from_facts(conn.host.name, read_facts(conn, request=full), req)

    outs = fleet.run(one, hosts)
    return [o.detail if o.ok else o.carry(Servers()) for o in outs]


@dataclass
class RestartReminder:
    servers: int
    hosts: int
    launched: list[tuple[str, str]]  # (host, instance) of fleetctl's stale servers
    by_hand: list[tuple[str, int]]  # (host, pid) of stale servers fleetctl did not start
    unchecked: list[tuple[str, str]] = field(default_factory=list)  # (host, why) where servers could not be read
    launch_ids: list[str] = field(default_factory=list)  # the launches that started the fleetctl servers
    launch_of: dict[str, list[str]] = field(default_factory=dict)  # host -> those of its stale servers
    # host -> the command that restarts its container, where the server is the container's main process
    containers: dict[str, str] = field(default_factory=dict)

    def line(self, inventory: str, playbook: str | None, ledger: dict[str, str] | None = None) -> str:
        """The reminder; `playbook`: the one to restart with (the command's own), else each host's from
        `ledger` (launch id -> the playbook it used: ops.record.launch_playbooks)."""
        from fleetctl.model.suggest import quote

        cut = ""
        inv = quote(inventory)
        if self.unchecked:
            h, why = self.unchecked[0]
            cut = (f"; servers on {len(self.unchecked)} host(s) could not be checked ({h}: {why}): "
                   f"run 'fleetctl servers --discover -i {inv}'")
        if not self.servers:
            return "no running server runs code older than the files on disk" + cut
        one = self.servers == 1
        s = (f"{self.servers} server{'' if one else 's'} on {self.hosts} host{'s' if self.hosts != 1 else ''} "
             f"still run{'s' if one else ''} the old code (files changed on disk after {'it' if one else 'they'} "
             "started)")
        how = []
        if self.launched:
            hosts = sorted({h for h, _ in self.launched})
            # the playbook each host's servers were launched with: one command per playbook
            by_pb: dict[str | None, list[str]] = {}
            for h in hosts:
                pbs = [playbook] if playbook else list(dict.fromkeys(
                    (ledger or {}).get(i) for i in self.launch_of.get(h, [None])))
                for pb in pbs or [None]:
                    by_pb.setdefault(pb, []).append(h)
            cmds = [f"'fleetctl launch --replace --drop-unknown-flags -i {inv} {quote(pb)} --limit {','.join(hs)}'"
                    for pb, hs in by_pb.items() if pb]
            # --drop-unknown-flags: after a rollback the release on disk does not know the payload's own
            # flags (the launch would refuse them); after a deploy it drops nothing
            if cmds:
                how.append(f"restart {'it' if one else 'them'}: {' and '.join(cmds)}")
            if by_pb.get(None):
                unknown = by_pb[None]
                how.append(f"{'the others' if cmds else 'restart it' if one else 'restart them'} with fleetctl launch --replace "
                           f"and the playbook {'it was' if one else 'they were'} launched with (not in this "
                           "controller's ledger), "
                           f"--limit {','.join(unknown)}")
        boxed = sorted({h for h, _ in self.by_hand if h in self.containers})
        for h in boxed:  # (restarting keeps the container's files; re-creating it would not)
            how.append(f"{h}: the server is its container's main process: restart the container "
                       f"('{self.containers[h]}' on {h})")
        by_hand = [(h, p) for h, p in self.by_hand if h not in self.containers]
        if by_hand:
            pids = ", ".join(f"{h} pid {p}" for h, p in by_hand[:8])
            more = f" and {len(by_hand) - 8} more" if len(by_hand) > 8 else ""
            how.append(f"restart by hand (not started by fleetctl): {pids}{more}")
        return s + ": " + "; ".join(how) + cut

    def to_json(self) -> dict[str, Any]:
        return {"servers": self.servers, "hosts": self.hosts,
                "launched": [{"host": h, "instance": i} for h, i in self.launched],
                "by_hand": [{"host": h, "pid": p} for h, p in self.by_hand],
                "unchecked": [{"host": h, "why": w} for h, w in self.unchecked]}


def restart_reminder(found: list[HostServers], hosts: list[Host] | None = None) -> RestartReminder:
    """Which servers run code older than the files on disk now, and how to restart them (`hosts`:
    the inventory's, for the container hosts whose server is the container's main process)."""
    stale = [p for h in found for p in h.detail.processes if p.stale]
    return RestartReminder(len(stale), len({p.host for p in stale}),
                           [(p.host, p.instance) for p in stale if p.instance],
                           [(p.host, p.pid) for p in stale if not p.instance],
                           [(h.host, h.message) for h in found if h.status != "ok"],
                           list(dict.fromkeys(p.launch_id for p in stale if p.instance and p.launch_id)),
                           containers=main_process_restarts(hosts or []), launch_of=_launches_by_host(stale))


def _launches_by_host(stale: list[Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in stale:
        if p.instance and p.launch_id and p.launch_id not in out.setdefault(p.host, []):
            out[p.host].append(p.launch_id)
    return out


def main_process_restarts(hosts: list[Host]) -> dict[str, str]:
    """host -> the command that restarts its container, for hosts marked `container.main_process`."""
    from fleetctl.config.containers import ContainerSpec

    out = {}
    for h in hosts:
        spec = ContainerSpec.of(h.container)
        argv = spec.restart_argv() if spec is not None and spec.main_process else None
        if spec is not None and argv:  # (a pod's container has none that keeps its files: deploy warns)
            out[h.name] = spec.shown(argv)
    return out
