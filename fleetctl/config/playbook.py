"""The playbook: what to change on each SGLang version, how to launch, what the logs must show.

    name: dynamic-spec-disable
    package: sglang
    versions:
      "0.5.9":
        files:
          - path: srt/speculative/eagle_worker.py     # relative to the package dir
            patch: patches/0.5.9/eagle_worker.py.diff  # relative to the playbook file
            sha256: <sha256 of the pristine file the patch applies to>
    launch: {...}   # see LaunchProfile
    verify: {...}   # see VerifySpec

A host whose SGLang version has no entry under `versions:` is refused.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetctl.config.yamlpos import load_yaml, validate
from fleetctl.engine import engine
from fleetctl.errors import InputError

SHA256_RE = r"^[0-9a-f]{64}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def check_relpath(rel: str) -> str:
    """A path relative to the package dir that cannot escape it (lexically)."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or rel.startswith("~") or ".." in p.parts or "\\" in rel:
        raise ValueError(f"path {rel!r} escapes the package dir: use a relative path with no '..'")
    if any(c in rel for c in "\0\n\r"):
        raise ValueError(f"path {rel!r} holds a control character")
    return str(p)


class FileSpec(Strict):
    path: str
    patch: str
    sha256: Annotated[str, Field(pattern=SHA256_RE)]

    _check = field_validator("path")(classmethod(lambda cls, v: check_relpath(v)))


class VersionSpec(Strict):
    files: list[FileSpec]
    # Worker classes this version's patch set cannot serve, with the reason. `explain` and
    # `deploy` refuse a host that would run one of them (e.g. a path where the feature cannot work).
    unsupported_workers: dict[str, str] = {}

    @field_validator("files")
    @classmethod
    def _unique(cls, v: list[FileSpec]) -> list[FileSpec]:
        seen = set()
        for f in v:
            if f.path in seen:
                raise ValueError(f"file {f.path} is listed twice")
            seen.add(f.path)
        if not v:
            raise ValueError("a version needs at least one file")
        return v


class InstanceLayout(Strict):
    """How the host's GPUs are split into server instances."""

    gpus_per_instance: Annotated[int, Field(ge=1)] | None = None  # None: one instance on all GPUs
    port_stride: Annotated[int, Field(ge=1)] = 1


class LaunchProfile(Strict):
    command: str = engine().launch_command
    flags: dict[str, Any] = {}
    env: dict[str, str | int | bool] = {}
    port: Annotated[int, Field(ge=1, le=65535)] = 30000
    layout: InstanceLayout = InstanceLayout()
    ready_timeout: Annotated[float, Field(gt=0)] = 900.0
    stop_timeout: Annotated[float, Field(gt=0)] = 30.0


class NeverFires(Strict):
    """The feature can never act when ServerArgs field `arg` >= field `at_least` (both as the server
    resolves them, defaults and SGLang's own adjustments included)."""
    arg: str
    at_least: str
    why: str = ""


class VerifySpec(Strict):
    markers: list[str] = ["Dynamic speculation disable enabled"]
    # settings under which the patched code runs but the feature can never act: explain warns,
    # verify-logs fails (checked on the server arguments the log shows, else on fleetctl's model)
    never_fires_when: list[NeverFires] = []
    forbidden: list[str] = [
        "Traceback (most recent call last)",
        "CUDA out of memory",
        "Address already in use",
    ]
    require_ready: bool = True


class PlaybookFile(Strict):
    name: str
    description: str = ""
    package: str = engine().package
    versions: dict[str, VersionSpec]
    launch: LaunchProfile = LaunchProfile()
    verify: VerifySpec = VerifySpec()

    @field_validator("package")
    @classmethod
    def _pkg(cls, v: str) -> str:
        if v != engine().package:
            raise ValueError(f"only package {engine().package!r} is supported")
        return v

    @field_validator("versions")
    @classmethod
    def _vers(cls, v: dict[str, VersionSpec]) -> dict[str, VersionSpec]:
        for k in v:
            if not re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", k):
                raise ValueError(f"version {k!r} is not an exact release (like 0.5.9 or 0.5.5.post3)")
        if not v:
            raise ValueError("the playbook names no SGLang version")
        return v


class PatchFile(BaseModel):
    """A file to patch, with the diff text already read."""

    path: str
    patch_path: Path
    patch_text: bytes
    sha256: str


class Playbook(BaseModel):
    path: Path
    name: str
    description: str
    versions: dict[str, list[PatchFile]]
    unsupported_workers: dict[str, dict[str, str]] = {}
    launch: LaunchProfile
    verify: VerifySpec

    def supported(self) -> list[str]:
        from packaging.version import Version

        return sorted(self.versions, key=Version)

    def files_for(self, version: str) -> list[PatchFile] | None:
        return self.versions.get(version)


def load_playbook(path: Path | str) -> Playbook:
    path = Path(path)
    if path.is_dir():
        path = path / "playbook.yaml"
    doc = load_yaml(path, "playbook")
    raw = validate(doc, PlaybookFile, "playbook")
    base = path.resolve().parent
    versions: dict[str, list[PatchFile]] = {}
    for ver, spec in raw.versions.items():
        out = []
        for i, f in enumerate(spec.files):
            pp = (base / f.patch).resolve()
            try:
                text = pp.read_bytes()
            except OSError as e:
                line = doc.line_of(("versions", ver, "files", i, "patch"))
                raise InputError(
                    f"{path}:{line}: versions.{ver}.files[{i}].patch: cannot read {f.patch}: {e.strerror}",
                    hint="fix the patch path (relative to the playbook file)",
                ) from None
            out.append(PatchFile(path=f.path, patch_path=pp, patch_text=text, sha256=f.sha256))
        versions[ver] = out
    return Playbook(path=path, name=raw.name, description=raw.description, versions=versions,
                    unsupported_workers={v: dict(s.unsupported_workers) for v, s in raw.versions.items()},
                    launch=raw.launch, verify=raw.verify)
