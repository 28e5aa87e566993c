"""What a host is: read in one remote call by the agent, turned into typed data here."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from fleetctl.gpus import Gpu, combine
from fleetctl.protocol import InvalidAnswer, names
from fleetctl.protocol.answers import DiscoverFacts, FactsAnswer, FileFact, Manifest, ServersFacts, StateFacts
from fleetctl.protocol.schema import shown

if TYPE_CHECKING:  # the transport (paramiko, fabric) is imported on first connect
    from fleetctl.transport.ssh import HostConnection

__all__ = ["FileFact", "HostFacts", "TorchCheck", "check_torch", "parse_facts", "read_facts"]

HASH_DIRS = ["srt/speculative"]
HASH_FILES = ["srt/server_args.py"]


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
    state: StateFacts | None = None  # asked with with_=["state"]: lock and deploy manifests
    servers: ServersFacts | None = None  # asked with with_=["servers"]
    discover: DiscoverFacts | None = None  # asked with with_=["discover"]: server processes from /proc
    registered_flags: dict[str, bool] | None = None  # asked with payload check_flags

    def deploys(self) -> list[Manifest]:
        return self.state.deploys if self.state else []

    def interrupted(self) -> list[Manifest]:
        """Deploys cut off half-way (their files may be mixed)."""
        return [m for m in self.deploys() if m.state in names.OPEN_STATES and not m.foreign and not m.gone]

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
    sg = raw.sglang
    return HostFacts(
        host=host,
        os=raw.os.pretty,
        python=raw.python.executable,
        python_version=raw.python.version,
        user=raw.user,
        sglang_found=sg.found,
        sglang_version=sg.version,
        sglang_dir=sg.dir,
        sglang_install=sg.install,
        torch=check_torch(raw.torch, sg.torch_requires),
        files=raw.files,
        gpus=gpus,
        gpu_note=note,
        remote_elapsed=raw.elapsed,
        state=raw.state,
        servers=raw.servers,
        discover=raw.discover,
        registered_flags=raw.registered_flags,
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
    raw: FactsAnswer = conn.agent(names.FACTS, p)
    return parse_facts(conn.host.name, raw)
