"""What a host is: read in one remote call by the agent, turned into typed data here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

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

    def to_json(self) -> dict[str, Any]:
        return {
            "os": self.os,
            "python": {"executable": self.python, "version": self.python_version},
            "user": self.user,
            "sglang": {"found": self.sglang_found, "version": self.sglang_version,
                       "dir": self.sglang_dir, "install": self.sglang_install},
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
    )


def read_facts(conn: HostConnection, *, extra_files: list[str] | None = None, gpus: bool = True,
               with_: list[str] | None = None, payload: dict[str, Any] | None = None,
               all_hashes: bool = True) -> HostFacts:
    """One agent round trip: everything fleetctl needs to know about the host.

    all_hashes=False hashes only `extra_files` (what deploy plans need), not srt/speculative/**."""
    p: dict[str, Any] = {
        "sglang_dir": conn.host.sglang_dir,
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
