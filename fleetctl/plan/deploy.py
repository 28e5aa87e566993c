"""facts + playbook -> Plan: pure data saying, per host and file, what deploy would do.

`deploy --check` renders this and stops; `deploy` renders it and hands it to ops/deploy.py.
Nothing here touches a host.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetctl.config.hosts import Host
from fleetctl.config.playbook_model import Playbook
from fleetctl.model import hoststate
from fleetctl.model.facts import HostFacts
from fleetctl.model.result import Decided
from fleetctl.protocol.answers import Manifest

FileState = Literal["pristine", "as-intended", "drifted", "missing", "unsafe", "no-record", "unwritable"]


@dataclass
class Intended:
    """The intended bytes of one file for one SGLang version (the same on every host of it)."""

    path: str
    sha_pristine: str
    data: bytes
    sha_intended: str
    offsets: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class FilePlan:
    path: str
    state: FileState
    action: Literal["patch", "none", "refuse", "force"]
    sha_now: str | None
    sha_pristine: str
    sha_intended: str
    note: str = ""
    # --port-onto-host: the release's patch merged onto the host's own bytes (what is written
    # instead of the release's intended bytes; sha_intended is its hash)
    ported: bytes | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "state": self.state, "action": self.action, "sha_now": self.sha_now,
                "sha_pristine": self.sha_pristine, "sha_intended": self.sha_intended, "note": self.note,
                **({"ported": True} if self.ported is not None else {})}


@dataclass
class Coverage:
    worker_class: str | None
    worker_file: str | None
    disable_overlap_schedule: bool | None
    covered: bool | None
    reason: str
    refused: str | None = None  # why deploy refuses this host on coverage grounds (None: fine)
    # why the answer is not certain (the model config could not be read on the host): a warning,
    # a refusal under --strict
    uncertain: str | None = None
    # one entry per family of alternatives checked (the patch changes a member, or `covers:` asks):
    # {"family", "title", "patched", "runs", "covered", "message"}; empty: nothing to check, no noise
    families: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"worker_class": self.worker_class, "worker_file": self.worker_file,
                "disable_overlap_schedule": self.disable_overlap_schedule, "covered": self.covered,
                "reason": self.reason, "refused": self.refused, "uncertain": self.uncertain,
                "families": self.families}


@dataclass
class HostPlan(Decided):
    """One host's deploy, decided from its facts: change, noop, refused, unreachable or failed, why in
    its message."""

    version: str | None = None
    package_dir: str | None = None
    files: list[FilePlan] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    coverage: Coverage | None = None
    drop_bytecode: list[str] = field(default_factory=list)  # files not replaced whose cached pyc is stale
    # a package tree other selected hosts reach too (fleetctl/plan/trees.py): deployed once, by its owner
    tree_owner: str | None = None  # the host whose transaction deploys this host's tree (None: this one)
    tree_members: list[str] = field(default_factory=list)  # every selected host on the tree (if several)
    records_dir: str | None = None  # the tree's records live beside it (its records dir), not in state_dir
    lane: tuple[Any, ...] = ()  # the machine and state dir its transaction locks (fleetctl/plan/trees.py lane_key)

    @property
    def to_patch(self) -> list[FilePlan]:
        return [f for f in self.files if f.action in ("patch", "force")]

    def fields(self) -> dict[str, Any]:
        """The plan's own fields in its row ("reason": the message, as rows said before it was one)."""
        return {"reason": self.message, "version": self.version,
                "package_dir": self.package_dir, "interrupted": self.interrupted,
                "files": [f.to_json() for f in self.files], "drop_bytecode": self.drop_bytecode,
                "coverage": self.coverage.to_json() if self.coverage else None,
                **({"shared_tree": {"owner": self.tree_owner or self.host, "hosts": self.tree_members,
                                    "records_dir": self.records_dir}}
                   if self.tree_members or self.records_dir else {})}


@dataclass
class Plan:
    playbook: str
    hosts: list[HostPlan]
    intended: dict[str, dict[str, Intended]]  # version -> path -> Intended
    # what apply_plan did per host, kept across calls (a rolling deploy's batches): a host on a tree
    # another host deployed in an earlier batch reports that transaction (fleetctl/plan/trees.py)
    applied: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"playbook": self.playbook, "hosts": [h.to_json() for h in self.hosts]}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def interrupted_deploys(facts: HostFacts) -> list[Manifest]:
    return hoststate.interrupted(facts)


def stale_lock(facts: HostFacts) -> str | None:
    """'op id by who' of a lock whose holder process is gone (the next agent call clears it)."""
    lock = facts.state.lock if facts.state else None
    if lock is None or not lock.stale:
        return None
    return lock.holder()


def effective_hashes(facts: HostFacts) -> dict[str, str | None]:
    """Current file hashes as they will be once interrupted deploys are repaired (restored)."""
    cur = {p: f.sha256 for p, f in facts.files.items()}
    for m in interrupted_deploys(facts):
        for f in m.files:
            if f.sha_now == f.sha_after and f.status in ("applied", "pending"):
                cur[f.path] = f.sha_before
    return cur


def between_releases(facts: HostFacts, version: str) -> tuple[str | None, list[str]]:
    """(what the tree is, when it is not release `version` as the wheel ships it: a git checkout at a
    commit after its tag, or files that differ from the release's; else None), and the files among
    those facts hashed that differ from the release's pristine bytes."""
    pristine, _ = hoststate.release_pristine(version)
    differ = sorted(rel for rel, ff in facts.files.items()
                    if pristine is not None and rel in pristine and ff.exists and ff.sha256 != pristine[rel])
    g = facts.git
    desc = None
    if g is not None and g.describe:
        head, _, rest = g.describe.rpartition("-g")
        tag, _, dist = head.rpartition("-")
        commit = (g.commit or rest)[:12]
        if tag and dist.isdigit() and int(dist) > 0:
            desc = f"a git checkout at {g.describe} (commit {commit}, {dist} commit(s) after {tag}), not release {version}"
        elif differ:
            desc = f"a git checkout at {g.describe} (commit {commit}) whose files are not release {version}'s"
    elif differ and facts.checkout:
        desc = f"a checkout at {facts.checkout} whose files are not release {version}'s"
    if desc and differ:
        shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
        desc += f" (nearest release {version}; {len(differ)} file(s) differ from it: {shown})"
    elif desc:
        desc += f" (nearest release {version})"
    return desc, differ


def _file_plan(rel: str, it: Intended, facts: HostFacts, s: str | None, force: bool) -> FilePlan:
    """One package file's state and action on the host (`s`: its effective hash there)."""
    ff = facts.files.get(rel)
    if ff is not None and (ff.escapes or ff.symlink):
        return FilePlan(rel, "unsafe", "refuse", s, it.sha_pristine, it.sha_intended,
                        f"is a symlink to {ff.symlink}" + (" outside the package dir" if ff.escapes else ""))
    if ff is None or not ff.exists or s is None:
        return FilePlan(rel, "missing", "refuse", None, it.sha_pristine, it.sha_intended, "not on the host")
    if s == it.sha_intended and not hoststate.explained(facts, rel, s):
        # patched, but no record of this host says so: a rollback could not undo it
        return FilePlan(rel, "no-record", "refuse", s, it.sha_pristine, it.sha_intended,
                        "deployed without a record (state dir deleted or moved, or state_dir changed?)")
    if s == it.sha_intended:
        return FilePlan(rel, "as-intended", "none", s, it.sha_pristine, it.sha_intended)
    if s == it.sha_pristine:
        return FilePlan(rel, "pristine", "patch", s, it.sha_pristine, it.sha_intended)
    return FilePlan(rel, "drifted", "force" if force else "refuse", s, it.sha_pristine, it.sha_intended,
                    "someone edited it" + ("" if hoststate.explained(facts, rel, s) else " (no deploy record)")
                    + ("; --force replaces it (backup kept)" if force else ""))


def _refusal(host: Host, facts: HostFacts, playbook: Playbook, refusals: list[FilePlan], tree: str | None,
             v: str) -> str:
    """Why a host with refused files is refused, with the fix: one line, from its first refused file."""
    f = refusals[0]
    if f.state == "drifted" and tree:
        drifted = [x.path for x in refusals if x.state == "drifted"]
        return (f"{host.name}: {', '.join(drifted)} is not {v}'s: the host is {tree}, so {v}'s patch set "
                f"does not apply to its bytes. Port it onto the host's own bytes: rerun with --port-onto-host "
                f"(a three-way merge as 'fleetctl patch port' does, the host's files as the base; add --check "
                f"--diff to see the result first; the deploy is recorded against the tree's own hashes, so "
                f"rollback restores them exactly), or --force to write {v}'s patched bytes over them")
    if f.state == "unsafe" and facts.link_tree is not None:
        lt = facts.link_tree
        return (f"{host.name}: {f.path}: the launch imports {lt.tree}, a strict editable install's link tree "
                f"(its files are links into the checkout {lt.checkout}), and fleetctl never writes through a "
                f"link. Keep the checkout: set 'sglang_dir: {lt.checkout}' for this host in the inventory "
                f"(fleetctl then patches the checkout's files, which the links lead to), or reinstall it "
                f"with '{facts.launch_python or host.python} -m pip install -e {lt.project} --config-settings "
                f"editable_mode=compat' (the launch then imports the checkout itself)")
    hint = {"drifted": "inspect with --diff, then --force to replace it (a backup is kept)",
            "missing": "is this the right SGLang install?",
            "unsafe": "fleetctl never writes through a symlink; replace it with a regular file",
            "no-record": f"'fleetctl rollback --from-pristine -p {playbook.path}' restores the release's "
                         "pristine bytes (verified, with backups), then deploy again",
            "unwritable": "the files cannot be replaced there (remount it read-write, or build a new image)"
                          if "read-only file system" in f.note else
                          "deploy as a user who can write the package (its owner), or point 'python:' "
                          "at an SGLang install this user owns"}[f.state]
    return f"{host.name}: {f.path} is {f.state} ({f.note}); {hint}"


def plan_host(host: Host, facts: HostFacts, playbook: Playbook, intended: dict[str, Intended] | None,
              *, force: bool, coverage: Coverage | None = None, allow_uncovered: bool = False) -> HostPlan:
    if not facts.package_found:
        return HostPlan(host.name, "failed", f"{host.name}: " + (
            facts.package_error or f"sglang is not importable by the launch's python {facts.launch_python or facts.python}"),
                        coverage=coverage)
    v = facts.package_version
    hp = HostPlan(host.name, "noop", version=v, package_dir=facts.package_dir, coverage=coverage)
    if v is None or intended is None:
        hp.status = "refused"
        from fleetctl.engines import engine

        why = engine().playbook_refusal(playbook, v) if v else None
        hp.message = f"{host.name}: " + (why or f"SGLang {v or '(unknown version)'} has no patch set in "
                                        f"{playbook.path.name}; supported: {', '.join(playbook.supported())}")
        return hp
    if facts.state is not None and facts.state.unwritable:
        hp.status = "refused"
        hp.message = (f"{host.name}: state_dir {facts.state.state_dir}: {facts.state.unwritable} (the host lock, "
                     "backups and deploy records go there); set 'state_dir:' for this host in the inventory to a "
                     "directory this user can write")
        return hp
    hp.interrupted = [m.id for m in interrupted_deploys(facts)]
    now = effective_hashes(facts)
    refusals = []
    for rel, it in intended.items():
        ff = facts.files.get(rel)
        s = now.get(rel)
        fp = _file_plan(rel, it, facts, s, force)
        if fp.action in ("patch", "force") and ff is not None and ff.unwritable:
            fp = FilePlan(rel, "unwritable", "refuse", s, it.sha_pristine, it.sha_intended, ff.unwritable)
        hp.files.append(fp)
        if fp.action == "refuse":
            refusals.append(fp)
    tree, differ = between_releases(facts, v) if facts.checkout or facts.git else (None, [])
    if refusals:
        hp.status = "refused"
        hp.message = _refusal(host, facts, playbook, refusals, tree, v)
        return hp
    if coverage is not None and coverage.refused and not allow_uncovered:
        hp.status = "refused"
        hp.message = f"{host.name}: {coverage.refused}"
        return hp
    stale = stale_lock(facts)
    hp.status = "change" if hp.to_patch or hp.interrupted or stale else "noop"
    own = {fp.path for fp in hp.files}
    siblings = [rel for rel in differ if rel not in own]
    if tree and any(fp.action == "force" for fp in hp.files) and siblings:
        hp.message = (f"warning: --force builds a mixed tree: {v}'s patched files among {len(siblings)} sibling(s) that "
                     f"are not {v}'s ({', '.join(siblings[:6])}{' ...' if len(siblings) > 6 else ''}); the host is {tree}")
    elif tree and hp.files and all(fp.state in ("pristine", "as-intended") for fp in hp.files):
        hp.message = (f"the host is {tree}; the files the playbook patches are byte-equal to {v}'s, so {v}'s patch "
                     "set applies")
    if hp.interrupted:
        hp.message = f"interrupted deploy {', '.join(hp.interrupted)} will be repaired first"
    elif stale:
        hp.message = f"a stale lock ({stale}) will be cleared"
    return hp
