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
    covers: {...}   # see Covers: what the playbook must cover and where its markers are logged
    state_files:    # see StateFile: non-package files shipped under the host's state dir
      - name: adaptive.json                        # -> {state_dir}/files/<playbook name>/adaptive.json
        source: files/adaptive.json                # relative to the playbook file

A host whose SGLang version has no entry under `versions:` is refused. The core knows nothing of
any one playbook: which worker or file a playbook must patch, which markers it logs where (file,
class, function; per rank or once) and which server arguments verify-logs reports are declared
here, by the playbook.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetctl.config.playbook_model import (  # (the classes a loaded playbook is made of)
    MAX_STATE_FILE,
    Covers,
    LaunchProfile,
    PatchFile,
    Playbook,
    ShippedFile,
    VerifySpec,
    check_relpath,
)
from fleetctl.config.yamlpos import load_yaml, validate
from fleetctl.engines import engine
from fleetctl.errors import InputError

SHA256_RE = r"^[0-9a-f]{64}$"


_SHIPS_FILES: ContextVar[bool] = ContextVar("_SHIPS_FILES", default=False)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileSpec(Strict):
    path: str
    patch: str
    sha256: Annotated[str, Field(pattern=SHA256_RE)]

    _check = field_validator("path")(classmethod(lambda cls, v: check_relpath(v)))


class VersionSpec(Strict):
    files: list[FileSpec] = []  # may be empty only when the playbook ships state_files (flags + a file)
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
        if not v and not _SHIPS_FILES.get():
            raise ValueError("a version needs at least one file")
        return v


class StateFile(Strict):
    """A non-package file deployed to {state_dir}/files/<playbook name>/<name> in the same transaction
    as the package files (and rolled back with them). Launch flags refer to it as {file:<name>}."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")]
    source: str  # relative to the playbook file
    mode: Annotated[int, Field(ge=0, le=0o777)] = 0o644


class PlaybookFile(Strict):
    name: str
    description: str = ""
    package: str = engine().package
    versions: dict[str, VersionSpec]
    launch: LaunchProfile = Field(default_factory=LaunchProfile)
    verify: VerifySpec = Field(default_factory=VerifySpec)
    covers: Covers = Field(default_factory=Covers)
    state_files: list[StateFile] = []

    @model_validator(mode="before")
    @classmethod
    def _ships(cls, data: Any) -> Any:
        # a version may list no package file only in a playbook that ships state files
        _SHIPS_FILES.set(isinstance(data, dict) and bool(data.get("state_files")))
        return data

    @model_validator(mode="after")
    def _whole(self) -> PlaybookFile:
        names = [f.name for f in self.state_files]
        if len(set(names)) != len(names):
            raise ValueError("state_files: a name is listed twice")
        if self.state_files and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", self.name):
            raise ValueError(f"name {self.name!r}: a playbook with state_files needs a name of letters, "
                             "digits and _ . - (it is a directory on the host)")
        for flag, value in self.launch.flags.items():
            for ref in re.findall(r"\{file:([^{}]*)\}", value if isinstance(value, str) else ""):
                if ref not in names:
                    raise ValueError(f"launch.flags.{flag}: {{file:{ref}}} names no entry of state_files")
        for m in self.covers.markers:
            if m.text not in self.verify.markers:
                raise ValueError(f"covers.markers: {m.text!r} is not one of verify.markers")
        for ver, spec in self.versions.items():
            missing = sorted(set(self.covers.files) - {f.path for f in spec.files})
            if missing:
                raise ValueError(f"versions.{ver}: covers.files names {', '.join(missing)}, "
                                 "which this version does not patch")
        return self

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


def load_playbook(path: Path | str) -> Playbook:
    """The playbook file `path` (a directory: its playbook.yaml), validated, with the files it names
    read; any problem is one InputError line naming file:line."""
    path = Path(path)
    return load_playbook_from(path / "playbook.yaml" if path.is_dir() else path)[0]


def load_playbook_from(path: Path) -> tuple[Playbook, dict[Path, str]]:
    """load_playbook of the playbook file `path`, and each file it read: its real path -> the path
    as the playbook names it (config/playbook_cache.py keeps both)."""
    doc = load_yaml(path, "playbook")
    raw = validate(doc, PlaybookFile, "playbook")
    base = path.resolve().parent
    versions: dict[str, list[PatchFile]] = {}
    raw_paths: dict[Path, str] = {}
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
                    reference="playbook-invalid") from None
            out.append(PatchFile(path=f.path, patch_path=pp, patch_text=text, sha256=f.sha256))
            raw_paths[pp] = f.patch
        versions[ver] = out
    shipped = []
    for i, sf in enumerate(raw.state_files):
        src = (base / sf.source).resolve()
        try:
            data = src.read_bytes()
        except OSError as e:
            line = doc.line_of(("state_files", i, "source"))
            raise InputError(f"{path}:{line}: state_files[{i}].source: cannot read {sf.source}: {e.strerror}",
                             hint="fix the source path (relative to the playbook file)",
                             reference="playbook-invalid") from None
        if len(data) > MAX_STATE_FILE:
            raise InputError(f"{path}: state_files[{i}]: {sf.source} is {len(data)} bytes (at most {MAX_STATE_FILE})",
                             hint="ship a smaller file", reference="playbook-invalid")
        shipped.append(ShippedFile(name=sf.name, source=src, data=data, mode=sf.mode))
        raw_paths[src] = sf.source
    pb = Playbook(path=path, name=raw.name, description=raw.description, versions=versions,
                  unsupported_workers={v: dict(s.unsupported_workers) for v, s in raw.versions.items()},
                  launch=raw.launch, verify=raw.verify, covers=raw.covers, state_files=shipped,
                  launch_declared=isinstance(doc.data, dict) and doc.data.get("launch") is not None)
    return pb, raw_paths
