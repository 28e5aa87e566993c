"""What a host is: read in one remote call by the agent, turned into typed data here."""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.config.playbook_model import LaunchProfile
from fleetctl.engines import engine
from fleetctl.protocol import InvalidAnswer, names
from fleetctl.protocol.answers import (
    DiscoverFacts,
    EnvChange,
    FactsAnswer,
    FileFact,
    GitInfo,
    ImportView,
    LinkTree,
    Manifest,
    ModuleOrigin,
    ServersFacts,
    Shadow,
    StateFacts,
)
from fleetctl.protocol.gpus import Gpu, combine
from fleetctl.protocol.schema import shown

if TYPE_CHECKING:  # the transport (paramiko, fabric) is imported on first connect
    from fleetctl.config.hosts import Host
    from fleetctl.containers.inspect import ContainerInfo
    from fleetctl.engines.base import ModelConfig
    from fleetctl.transport.base import Transport

__all__ = ["FileFact", "HostFacts", "TorchCheck", "check_torch", "facts_request", "parse_facts", "read_facts"]

HASH_DIRS = list(engine().hash_dirs)
HASH_FILES = list(engine().hash_files)


@dataclass
class TorchCheck:
    installed: str | None
    required: list[str]
    satisfied: bool | None  # None: nothing to check against
    note: str = ""


@dataclass
class HostFacts:
    host: str
    os: str
    python: str
    python_version: str
    user: str
    package_found: bool
    package_version: str | None
    package_dir: str | None
    package_install: str | None
    torch: TorchCheck
    files: dict[str, FileFact]
    gpus: list[Gpu] | None
    gpu_note: str
    remote_elapsed: float
    state: StateFacts | None = None  # asked with with_=["state"]: lock and deploy manifests
    servers: ServersFacts | None = None  # asked with with_=["servers"]
    discover: DiscoverFacts | None = None  # asked with with_=["discover"]: server processes from /proc
    registered_flags: dict[str, bool] | None = None  # asked with payload check_flags
    # how the LAUNCH's python (not the agent's) imports the engine's package: see fleetctl/model/launchspec.py
    launch_python: str | None = None
    launch_python_version: str | None = None
    package_error: str | None = None
    package_notes: list[str] = field(default_factory=list)
    # the inventory's package dir is not what the launch imports (why); `facts` fails such a host
    package_dir_mismatch: str | None = None
    bytecode: dict[str, ImportView] = field(default_factory=dict)  # rel -> what import would load
    pycache_prefix: str | None = None
    # the launch's target model config.json as read on the host (None: the launch names no model)
    model: ModelConfig | None = None
    # the host's container, as its runtime describes it (fleetctl/containers); None: not in one
    container: ContainerInfo | None = None
    # the launch's speculative draft model config.json as read on the host (None: it names no draft path)
    draft_model: ModelConfig | None = None
    # files the launch's flags name, as read on the host: path -> bytes, or why not (None: not asked)
    launch_files: dict[str, bytes | str] | None = None
    # a deploy's facts (payload `settle`): nothing a deploy would look at changed while they were read
    # (remote/seal.py), and, where a seal was asked and could be made, the seal of this reading
    settled: bool = False
    seal: Any = None
    # per-module locate (probe.locate_module): files the launch would NOT import from package_dir by
    # CPython's path finder (another file, a start-up hook's loader, preloaded), the namespace portions
    # of the top-level package, the finders that served the files, and what the interpreter's start
    # (sitecustomize, usercustomize, .pth lines, a python: shim) set in the environment
    modules: dict[str, ModuleOrigin] = field(default_factory=dict)
    namespace: list[str] | None = None
    finders: list[str] = field(default_factory=list)
    env_changes: dict[str, EnvChange] = field(default_factory=dict)
    link_tree: LinkTree | None = None
    via_link_tree: str | None = None
    checkout: str | None = None
    launch_cwd: str | None = None
    shadow: Shadow | None = None
    git: GitInfo | None = None  # the checkout's HEAD (commit, git describe)

    def startup_env(self) -> dict[str, str | None]:
        """What the interpreter's start set (a value) or unset (None): applied on top of the env
        fleetctl passes, it is the environment the server process runs with."""
        return {k: c.value for k, c in self.env_changes.items()}

    def judged_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` (what the launch passes) as the server process will have it after its interpreter's
        start-up hooks ran."""
        out = dict(env)
        for k, v in self.startup_env().items():
            if v is None:
                out.pop(k, None)
            elif v != "***":
                out[k] = v
        return out

    def hook_notes(self, names: list[str] | None = None) -> list[str]:
        """'NAME=value set by FILE:LINE' for each variable the start changed (only `names` if given)."""
        out = []
        for k, c in sorted(self.env_changes.items()):
            if names is not None and k not in names:
                continue
            by = c.by or "the interpreter's start-up (site)"
            out.append(f"{k}={c.value} set by {by}" if c.value is not None else f"{k} unset by {by}")
        return out

    def module_problem(self, rel: str) -> str | None:
        """Why import of package file `rel` would not run `package_dir/rel` (None: it would)."""
        m = self.modules.get(rel)
        if m is None:
            return None
        if m.error:
            return f"{rel}: the launch's python finds no module {m.module} ({m.error})"
        if m.preloaded:
            return (f"{rel}: {m.module} is imported while the launch's python starts (a start-up hook), "
                    f"from {m.file or 'no file'}")
        if not m.standard:
            by = f"{m.finder} ({m.finder_file})" if m.finder_file else (m.finder or "a start-up hook")
            return (f"{rel}: {m.module} is served by the meta-path finder {by} with loader {m.loader}, not from "
                    f"the file on disk: fleetctl cannot vouch for the code it runs")
        if self.package_dir and m.file and m.file != f"{self.package_dir}/{rel}" and not self.via_link_tree:
            return f"{rel}: the launch imports {m.module} from {m.file}, not from {self.package_dir}/{rel}"
        return None

    def deploys(self) -> list[Manifest]:
        return self.state.deploys if self.state else []

    def interrupted(self) -> list[Manifest]:
        """Deploys cut off half-way (their files may be mixed)."""
        return [m for m in self.deploys() if m.state in names.OPEN_STATES and not m.foreign and not m.gone]

    def bytecode_problem(self, rel: str) -> str | None:
        """Why import of `rel` would not run the source file on disk (None: it would)."""
        return bytecode_problem(rel, self.bytecode.get(rel))

    def bytecode_loader(self, rel: str) -> str | None:
        """What import of `rel` loads (source, sourceless, extension, none); None: not asked."""
        view = self.bytecode.get(rel)
        return view.loader if view else None

    def to_json(self) -> dict[str, Any]:
        return {
            "os": self.os,
            "python": {"executable": self.python, "version": self.python_version},
            "user": self.user,
            "sglang": {"found": self.package_found, "version": self.package_version,
                       "dir": self.package_dir, "install": self.package_install, "error": self.package_error,
                       "notes": self.package_notes},
            "launch_python": {"executable": self.launch_python, "version": self.launch_python_version,
                              "pycache_prefix": self.pycache_prefix},
            "bytecode": {p: b.to_json() for p, b in self.bytecode.items() if bytecode_problem(p, b)},
            "locate": {"namespace": self.namespace, "finders": self.finders,
                       "modules": {p: m.to_json() for p, m in self.modules.items()},
                       "link_tree": ({"tree": self.link_tree.tree, "checkout": self.link_tree.checkout,
                                      "project": self.link_tree.project} if self.link_tree else None),
                       "via_link_tree": self.via_link_tree, "checkout": self.checkout, "cwd": self.launch_cwd,
                       "git": ({"commit": self.git.commit, "describe": self.git.describe} if self.git else None),
                       "shadow": ({"by": self.shadow.by, "regular": self.shadow.regular,
                                   "installed": self.shadow.installed} if self.shadow else None),
                       "startup_env": {k: {"value": c.value, "by": c.by} for k, c in self.env_changes.items()}},
            "torch": {"installed": self.torch.installed, "required": self.torch.required,
                      "satisfied": self.torch.satisfied, "note": self.torch.note},
            "files": {p: {"sha256": f.sha256, "exists": f.exists, "mode": f.mode, "size": f.size,
                          **({"symlink": f.symlink} if f.symlink else {}),
                          **({"escapes": True} if f.escapes else {}),
                          **({"unwritable": f.unwritable} if f.unwritable else {}),
                          **({"error": f.error} if f.error else {})}
                      for p, f in self.files.items()},
            "gpus": [g.to_json() for g in self.gpus] if self.gpus is not None else None,
            "gpu_note": self.gpu_note,
            "model_config": ({"architecture": self.model.arch, "path": self.model.path, "error": self.model.error}
                             if self.model else None),
            "draft_model_config": ({"architecture": self.draft_model.arch, "path": self.draft_model.path,
                                    "error": self.draft_model.error} if self.draft_model else None),
            "container": self.container.to_json() if self.container else None,
        }


def locate_notes(f: HostFacts) -> list[str]:
    """What explain says about where the launch's code comes from: a namespace portion or a package
    in the launch's working directory (sys.path[0]) and what it shadows, the finder that serves the
    files, a strict editable install."""
    out: list[str] = []
    name = engine().agent_facts()["package"]
    sh = f.shadow
    cwd = f.launch_cwd or "the launch's working directory"
    if sh is not None:
        if sh.regular and sh.installed and sh.installed != f.package_dir:
            out.append(f"warning: the launch's working directory {cwd} holds {sh.by}, which shadows the installed "
                       f"{name} at {sh.installed} (sys.path[0] comes first): the launch imports {f.package_dir}; "
                       "set launch.cwd in the playbook to a directory without it")
        elif not sh.regular:
            served = f" (by {', '.join(x for x in f.finders if 'PathFinder' not in x)})" if any(
                "PathFinder" not in x for x in f.finders) else ""
            out.append(f"warning: the launch's working directory {cwd} holds {sh.by}, a directory without "
                       f"__init__.py: `import {name}` takes it as a namespace package (sys.path[0]), so "
                       f"{name}/__init__.py never runs; its modules still come from {f.package_dir}{served}. "
                       "Set launch.cwd in the playbook to a directory without it to import the package whole")
    elif f.namespace:
        out.append(f"{name} is a namespace package for the launch (portions: {', '.join(f.namespace)}); "
                   f"its modules come from {f.package_dir}")
    if f.via_link_tree:
        out.append(f"the launch imports {f.via_link_tree} (a strict editable install's link tree); fleetctl "
                   f"patches the checkout {f.package_dir} its links lead to")
    return out


def bytecode_problem(rel: str, view: ImportView | None) -> str | None:
    """Why `import` would not run the source of `rel` as it is on disk, from the probe's view."""
    if view is None:
        return None
    if view.loader == "extension":
        return f"{rel}: import loads the compiled extension {view.file}, not this source"
    if view.loader == "sourceless":
        return f"{rel}: missing; import loads the sourceless bytecode {view.file}"
    if view.stale:
        return (f"{rel}: import runs {view.pyc} ({view.pyc_kind} pyc, not checked against the "
                f"source), compiled from other source than the file on disk")
    return None


def check_torch(installed: str | None, requires: list[str]) -> TorchCheck:
    """Whether the installed torch satisfies sglang's requirement (the hosts of a fleet mostly share
    both: each pair is parsed once per command)."""
    got = _check_torch(installed, tuple(requires))
    return TorchCheck(got.installed, list(got.required), got.satisfied, got.note)  # (each host its own)


_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def _plain_requirement(line: str) -> tuple[str, str] | None:
    """(name, specifier text) of a requirement line that is a name and a specifier and nothing else
    (`torch==2.9.1`, what sglang's wheels state); None for anything else (a marker, extras, a URL,
    parentheses), which packaging.requirements parses."""
    s = line.strip()
    n = 0
    while n < len(s) and s[n] in _NAME_CHARS:
        n += 1
    name, rest = s[:n], s[n:]
    if not name or not (name[0].isalnum() and name[-1].isalnum()) or any(c in rest for c in ";@[]()"):
        return None
    return name, rest


@functools.lru_cache(maxsize=64)
def _check_torch(installed: str | None, requires: tuple[str, ...]) -> TorchCheck:
    # packaging.requirements (and the markers, tags, subprocess and sysconfig it imports: ~40 ms of
    # CPU per command) only for a line that is more than a name and a specifier; packaging.specifiers
    # (~10 ms) reads those. tests/test_agent_local.py holds the two to the same answers.
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    specs: list[SpecifierSet] = []
    for r in requires:
        plain = _plain_requirement(r)
        if plain is not None:
            if plain[0].lower() != "torch":
                continue
            try:
                specs.append(SpecifierSet(plain[1]))
            except InvalidSpecifier:
                continue
            continue
        from packaging.requirements import InvalidRequirement, Requirement

        try:
            req = Requirement(r)
        except InvalidRequirement:
            continue
        if req.name.lower() != "torch":
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        specs.append(req.specifier)
    shown = [str(s) or "any" for s in specs]
    if installed is None:
        return TorchCheck(None, shown, False if specs else None, "torch is not installed beside sglang")
    if not specs:
        return TorchCheck(installed, shown, None, "sglang states no torch requirement")
    try:
        v = Version(installed)
    except InvalidVersion:
        return TorchCheck(installed, shown, None, f"cannot parse torch version {installed!r}")
    ok = all(s.contains(v, prereleases=True) for s in specs)
    return TorchCheck(installed, shown, ok, "" if ok else f"torch {installed} does not satisfy {', '.join(shown)}")


def parse_facts(host: str, raw: FactsAnswer) -> HostFacts:
    g = raw.gpus
    if g is not None and g.available:
        try:
            gpus: list[Gpu] | None = combine(g.gpus, g.apps)
        except (csv.Error, ValueError, OverflowError) as e:
            raise InvalidAnswer(host, names.FACTS, "gpus", f"not nvidia-smi CSV: {shown(str(e))}") from None
        note = ""
    else:
        gpus, note = None, f"no GPU info ({g.reason if g else 'not asked'})"
    sg = raw.package
    return HostFacts(
        host=host,
        os=raw.os.pretty,
        python=raw.python.executable,
        python_version=raw.python.version,
        user=raw.user,
        package_found=sg.found,
        package_version=sg.version,
        package_dir=sg.dir,
        package_install=sg.install,
        torch=check_torch(raw.torch, sg.torch_requires),
        files=raw.files,
        gpus=gpus,
        gpu_note=note,
        remote_elapsed=raw.elapsed,
        state=raw.state,
        servers=raw.servers,
        discover=raw.discover,
        registered_flags=raw.registered_flags,
        launch_python=sg.launch.executable if sg.launch else None,
        launch_python_version=sg.launch.version if sg.launch else None,
        package_error=sg.error,
        package_notes=list(sg.notes),
        package_dir_mismatch=sg.dir_mismatch,
        bytecode=dict(sg.bytecode),
        pycache_prefix=sg.launch.pycache_prefix if sg.launch else None,
        model=engine().model_from_answer(raw.model),
        draft_model=engine().model_from_answer(getattr(raw, "draft_model", None)),
        launch_files=_launch_files(raw.launch_files),
        settled=raw.settled,
        seal=raw.seal,
        modules=dict(sg.modules),
        namespace=list(sg.namespace) if sg.namespace is not None else None,
        finders=[str(f[0]) for f in sg.finders if f and f[0]],
        env_changes=dict(sg.env_changes),
        link_tree=sg.link_tree,
        shadow=sg.shadow,
        git=sg.git,
        via_link_tree=sg.via_link_tree,
        checkout=sg.checkout,
        launch_cwd=sg.launch.cwd if sg.launch else None,
    )


MAX_LAUNCH_FILE = 1 << 20


def _launch_files(answer: Any) -> dict[str, bytes | str] | None:
    """What the agent read of the files the launch names (untrusted: bounded, decoded, or a short why)."""
    import base64
    import binascii

    if answer is None:
        return None
    out: dict[str, bytes | str] = {}
    for path, info in list(answer.items())[:8]:
        if info.data is not None:
            try:
                data = base64.b64decode(info.data[: 2 * MAX_LAUNCH_FILE], validate=True)
            except (binascii.Error, ValueError):
                out[path] = "the host sent it malformed"
                continue
            out[path] = data[:MAX_LAUNCH_FILE]
        else:
            out[path] = (info.error or "not read")[:300]
    return out


def bytecode_files(extra_files: list[str] | None = None) -> list[str]:
    """Files whose bytecode import view is read: server_args, every EAGLE worker file any known
    release has, and the playbook's files."""
    eng = engine()
    rels = list(HASH_FILES)
    for v in eng.known_versions():
        rels += [r for r in eng.worker_files(v).values() if r not in rels]
    return rels + [r for r in (extra_files or []) if r not in rels and r.endswith(".py")]


def read_facts(conn: Transport, *, extra_files: list[str] | None = None, gpus: bool = True,
               with_: list[str] | None = None, payload: dict[str, Any] | None = None,
               all_hashes: bool = True, profile: LaunchProfile | None = None,
               request: dict[str, Any] | None = None) -> HostFacts:
    """One agent round trip: everything fleetctl needs to know about the host.

    SGLang is located as the launch will import it: the playbook's launch `profile` (or the default
    launch without a playbook) + the inventory's launch_command and env (fleetctl/model/launchspec.py).
    all_hashes=False hashes only `extra_files` (what deploy plans need), not srt/speculative/**.
    request: the facts_request already built from these arguments (the caller needed it too)."""
    p = dict(request) if request is not None else facts_request(
        conn.host, extra_files=extra_files, gpus=gpus, with_=with_, all_hashes=all_hashes, profile=profile)
    p.update(payload or {})
    box = inspect_container(conn)  # (first: a stopped container is said so, not as a failed exec)
    raw: FactsAnswer = conn.agent(names.FACTS, p)
    facts = parse_facts(conn.host.name, raw)
    facts.container = box
    return facts


def inspect_container(conn: Transport) -> ContainerInfo | None:
    """The host's container as its runtime describes it (None: the host names none)."""
    if not conn.host.container:
        return None
    from fleetctl.containers.host import inspect

    return inspect(conn)


def facts_request(host: Host, *, extra_files: list[str] | None = None, gpus: bool = True,
                  with_: list[str] | None = None, all_hashes: bool = True,
                  profile: LaunchProfile | None = None) -> dict[str, Any]:
    """The `facts` request read_facts sends to `host` (pure: also what a seal is keyed by)."""
    from fleetctl.model.instances import host_launch_spec

    prof = profile if profile is not None else LaunchProfile()
    return {
        "engine": engine().agent_facts(),
        "package_dir": host.sglang_dir,
        "launch": host_launch_spec(host, profile).to_agent(),
        # without a playbook the launch env is not fully known: a package dir mismatch is a note
        "strict_package_dir": profile is not None,
        "bytecode_files": bytecode_files(extra_files),
        "hash_dirs": HASH_DIRS if all_hashes else [],
        "hash_files": (HASH_FILES + [f for f in (extra_files or []) if f not in HASH_FILES] if all_hashes
                       else list(extra_files or [])),
        "gpus": gpus,
        "with": with_ or [],
        "state_dir": host.state_dir,
        # the inventory entry asking: its own servers only (two entries may name one machine and state dir)
        "entry": host.name,
        # the target model's config.json, read under the launch's environment (model-specific routing)
        "model": _launch_model(host, prof),
        "draft_model": _launch_model(host, prof, draft=True),
        # files the launch's flags name that start-up reads (an adaptive config), read on the host
        "launch_files": _named_files(host, prof),
    }


def _named_files(host: Any, profile: LaunchProfile) -> list[str]:
    from fleetctl.errors import InputError
    from fleetctl.model.instances import plan_instances

    try:
        return engine().launch_files(plan_instances(host, profile)[0].flags)
    except InputError:
        return []


def _launch_model(host: Any, profile: LaunchProfile, *, draft: bool = False) -> dict[str, str] | None:
    """{"path", "revision"} of the model the host's launch names (None: none, or a launch layout that
    does not plan: the command using it reports that)."""
    from fleetctl.errors import InputError
    from fleetctl.model.instances import command_argv, plan_instances

    try:
        return engine().launch_model(plan_instances(host, profile)[0].flags, command_argv(host, profile), draft=draft)
    except InputError:
        return None
