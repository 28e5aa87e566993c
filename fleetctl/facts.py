"""What a host is: read in one remote call by the agent, turned into typed data here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from fleetctl.config.playbook import LaunchProfile
from fleetctl.gpus import Gpu, combine
from fleetctl.transport.ssh import HostConnection

HASH_DIRS = ["srt/speculative"]
HASH_FILES = ["srt/server_args.py"]


@dataclass
class FileFact:
    path: str
    exists: bool
    sha256: str | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    mtime: float | None = None
    symlink: str | None = None
    escapes: bool = False
    error: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileFact:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})  # type: ignore[arg-type]


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
    sglang_found: bool
    sglang_version: str | None
    sglang_dir: str | None
    sglang_install: str | None
    torch: TorchCheck
    files: dict[str, FileFact]
    gpus: list[Gpu] | None
    gpu_note: str
    remote_elapsed: float
    extra: dict[str, Any] = field(default_factory=dict)
    # how the LAUNCH's python (not the agent's) imports sglang: see fleetctl/launchspec.py
    launch_python: str | None = None
    launch_python_version: str | None = None
    sglang_error: str | None = None
    sglang_notes: list[str] = field(default_factory=list)
    bytecode: dict[str, dict[str, Any]] = field(default_factory=dict)  # rel -> what import would load
    pycache_prefix: str | None = None

    def bytecode_problem(self, rel: str) -> str | None:
        """Why import of `rel` would not run the source file on disk (None: it would)."""
        return bytecode_problem(rel, self.bytecode.get(rel))

    def to_json(self) -> dict[str, Any]:
        return {
            "os": self.os,
            "python": {"executable": self.python, "version": self.python_version},
            "user": self.user,
            "sglang": {"found": self.sglang_found, "version": self.sglang_version,
                       "dir": self.sglang_dir, "install": self.sglang_install, "error": self.sglang_error,
                       "notes": self.sglang_notes},
            "launch_python": {"executable": self.launch_python, "version": self.launch_python_version,
                              "pycache_prefix": self.pycache_prefix},
            "bytecode": {p: b for p, b in self.bytecode.items() if bytecode_problem(p, b)},
            "torch": {"installed": self.torch.installed, "required": self.torch.required,
                      "satisfied": self.torch.satisfied, "note": self.torch.note},
            "files": {p: {"sha256": f.sha256, "exists": f.exists, "mode": f.mode, "size": f.size,
                          **({"symlink": f.symlink} if f.symlink else {}),
                          **({"escapes": True} if f.escapes else {}),
                          **({"error": f.error} if f.error else {})}
                      for p, f in self.files.items()},
            "gpus": [g.to_json() for g in self.gpus] if self.gpus is not None else None,
            "gpu_note": self.gpu_note,
        }


def bytecode_problem(rel: str, view: dict[str, Any] | None) -> str | None:
    """Why `import` would not run the source of `rel` as it is on disk, from the probe's view."""
    if not view:
        return None
    loader = view.get("loader")
    if loader == "extension":
        return f"{rel}: import loads the compiled extension {view.get('file')}, not this source"
    if loader == "sourceless":
        return f"{rel}: missing; import loads the sourceless bytecode {view.get('file')}"
    if view.get("stale"):
        return (f"{rel}: import runs {view.get('pyc')} ({view.get('pyc_kind')} pyc, not checked against the "
                f"source), compiled from other source than the file on disk")
    return None


def check_torch(installed: str | None, requires: list[str]) -> TorchCheck:
    reqs: list[Requirement] = []
    for r in requires:
        try:
            req = Requirement(r)
        except InvalidRequirement:
            continue
        if req.name.lower() != "torch":
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        reqs.append(req)
    shown = [str(r.specifier) or "any" for r in reqs]
    if installed is None:
        return TorchCheck(None, shown, False if reqs else None, "torch is not installed beside sglang")
    if not reqs:
        return TorchCheck(installed, shown, None, "sglang states no torch requirement")
    try:
        v = Version(installed)
    except InvalidVersion:
        return TorchCheck(installed, shown, None, f"cannot parse torch version {installed!r}")
    ok = all(r.specifier.contains(v, prereleases=True) for r in reqs)
    return TorchCheck(installed, shown, ok, "" if ok else f"torch {installed} does not satisfy {', '.join(shown)}")


def parse_facts(host: str, raw: dict[str, Any]) -> HostFacts:
    sg = raw.get("sglang", {})
    g = raw.get("gpus") or {}
    if g.get("available"):
        gpus: list[Gpu] | None = combine(g.get("gpus", ""), g.get("apps", ""))
        note = ""
    else:
        gpus, note = None, f"no GPU info ({g.get('reason', 'not asked')})"
    extra = {k: v for k, v in raw.items() if k not in {"os", "python", "sglang", "torch", "files", "gpus", "user",
                                                        "elapsed", "protocol"}}
    return HostFacts(
        host=host,
        os=raw.get("os", {}).get("pretty", "?"),
        python=raw.get("python", {}).get("executable", "?"),
        python_version=raw.get("python", {}).get("version", "?"),
        user=raw.get("user", "?"),
        sglang_found=bool(sg.get("found")),
        sglang_version=sg.get("version"),
        sglang_dir=sg.get("dir"),
        sglang_install=sg.get("install"),
        torch=check_torch(raw.get("torch"), sg.get("torch_requires", [])),
        files={p: FileFact.from_json(d) for p, d in raw.get("files", {}).items()},
        gpus=gpus,
        gpu_note=note,
        remote_elapsed=float(raw.get("elapsed", 0.0)),
        extra=extra,
        launch_python=(sg.get("launch") or {}).get("executable"),
        launch_python_version=(sg.get("launch") or {}).get("version"),
        sglang_error=sg.get("error"),
        sglang_notes=list(sg.get("notes") or []),
        bytecode=dict(sg.get("bytecode") or {}),
        pycache_prefix=(sg.get("launch") or {}).get("pycache_prefix"),
    )


def bytecode_files(extra_files: list[str] | None = None) -> list[str]:
    """Files whose bytecode import view is read: server_args, every EAGLE worker file any known
    release has, and the playbook's files."""
    from fleetctl.sglang import KNOWN_VERSIONS, worker_files

    rels = list(HASH_FILES)
    for v in KNOWN_VERSIONS:
        rels += [r for r in worker_files(v).values() if r not in rels]
    return rels + [r for r in (extra_files or []) if r not in rels and r.endswith(".py")]


def read_facts(conn: HostConnection, *, extra_files: list[str] | None = None, gpus: bool = True,
               with_: list[str] | None = None, payload: dict[str, Any] | None = None,
               all_hashes: bool = True, profile: LaunchProfile | None = None) -> HostFacts:
    """One agent round trip: everything fleetctl needs to know about the host.

    SGLang is located as the launch will import it: the playbook's launch `profile` (or the default
    launch without a playbook) + the inventory's launch_command and env (fleetctl/launchspec.py).
    all_hashes=False hashes only `extra_files` (what deploy plans need), not srt/speculative/**."""
    from fleetctl.instances import host_launch_spec

    p: dict[str, Any] = {
        "sglang_dir": conn.host.sglang_dir,
        "launch": host_launch_spec(conn.host, profile).to_agent(),
        # without a playbook the launch env is not fully known: a sglang_dir mismatch is a note
        "strict_sglang_dir": profile is not None,
        "bytecode_files": bytecode_files(extra_files),
        "hash_dirs": HASH_DIRS if all_hashes else [],
        "hash_files": (HASH_FILES + [f for f in (extra_files or []) if f not in HASH_FILES] if all_hashes
                       else list(extra_files or [])),
        "gpus": gpus,
        "with": with_ or [],
        "state_dir": conn.host.state_dir,
    }
    p.update(payload or {})
    raw = conn.agent("facts", p)
    return parse_facts(conn.host.name, raw)
