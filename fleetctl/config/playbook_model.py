"""The playbook as loaded: plain dataclasses, no pydantic.

config/playbook.py validates a playbook file against these same classes (pydantic validates a
standard dataclass by its fields, `__pydantic_config__` and `__post_init__`) and builds a Playbook;
a command whose playbook was loaded before from the same inputs takes the kept copy
(config/playbook_cache.py) and never imports pydantic or PyYAML. So each class here is the one
definition of its part of the file: its fields, defaults and checks hold for both paths.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from fleetctl.engines import engine

MAX_STATE_FILE = 1 << 20  # a state file is configuration, not a payload
_FORBID = {"extra": "forbid"}  # (a pydantic ConfigDict is a plain dict: an unknown key is an error)


def check_relpath(rel: str) -> str:
    """A path relative to the package dir that cannot escape it (lexically)."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or rel.startswith("~") or ".." in p.parts or "\\" in rel:
        raise ValueError(f"path {rel!r} escapes the package dir: use a relative path with no '..'")
    if any(c in rel for c in "\0\n\r"):
        raise ValueError(f"path {rel!r} holds a control character")
    return str(p)


def _at_least(owner: object, name: str, low: float, *, above: bool = False, high: float | None = None) -> None:
    v = getattr(owner, name)
    if v is None:
        return
    if (v <= low if above else v < low) or (high is not None and v > high):
        bound = f"greater than {low:g}" if above else f"at least {low:g}"
        raise ValueError(f"{name} must be {bound}" + (f" and at most {high:g}" if high is not None else "")
                         + f" (got {v!r})")


MANAGERS = ("fleetctl", "supervisor", "systemd")


@dataclass
class InstanceLayout:
    """How the host's GPUs are split into server instances."""

    __pydantic_config__ = _FORBID

    gpus_per_instance: int | None = None  # None: one instance on all GPUs
    port_stride: int = 1

    def __post_init__(self) -> None:
        _at_least(self, "gpus_per_instance", 1)
        _at_least(self, "port_stride", 1)


def _launch_command() -> str:
    return engine().launch_command


@dataclass
class LaunchProfile:
    __pydantic_config__ = _FORBID

    command: str = field(default_factory=_launch_command)
    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str | int | bool] = field(default_factory=dict)
    port: int = 30000
    layout: InstanceLayout = field(default_factory=InstanceLayout)
    ready_timeout: float = 900.0
    stop_timeout: float = 30.0
    # who runs the servers: fleetctl itself (a detached process group), supervisord (a program
    # section fleetctl writes, started/stopped through supervisorctl) or systemd (a unit, systemctl)
    manager: str = "fleetctl"
    # the server's working directory (its sys.path[0] under -m): absolute, or ~/... (the launch env's
    # HOME); default (None): the launch env's HOME, else the SSH user's home
    cwd: str | None = None

    def __post_init__(self) -> None:
        if self.manager not in MANAGERS:
            raise ValueError(f"manager must be one of {', '.join(MANAGERS)} (got {self.manager!r})")
        if self.cwd is not None and not (self.cwd.startswith("/") or self.cwd == "~" or self.cwd.startswith("~/")):
            raise ValueError(f"launch.cwd {self.cwd!r} must be an absolute path or start with ~/")
        _at_least(self, "port", 1, high=65535)
        _at_least(self, "ready_timeout", 0, above=True)
        _at_least(self, "stop_timeout", 0, above=True)


@dataclass
class NeverFires:
    """The feature can never act when ServerArgs field `arg` >= field `at_least` (both as the server
    resolves them, defaults and SGLang's own adjustments included)."""

    __pydantic_config__ = _FORBID

    arg: str
    at_least: str
    why: str = ""


# Lines a crash usually prints. A server that prints one and then is ready and healthy (or, after
# ready, keeps running) survived it: launch and verify-logs report such lines, they do not fail it
# (real 0.5.12 logs a handled traceback at start-up when openai_harmony is absent). A server that
# dies fails anyway, by its exit. Any other `verify.forbidden` line fails the launch when seen.
CRASH_SIGNS = ("Traceback (most recent call last)", "CUDA out of memory", "Address already in use")


def _forbidden() -> list[str]:
    return list(CRASH_SIGNS)


@dataclass
class VerifySpec:
    __pydantic_config__ = _FORBID

    markers: list[str] = field(default_factory=list)  # log lines the patched code writes (where: covers.markers)
    # settings under which the patched code runs but the feature can never act: explain warns,
    # verify-logs fails (checked on the server arguments the log shows, else on fleetctl's model)
    never_fires_when: list[NeverFires] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=_forbidden)
    require_ready: bool = True
    # lines the patched code logs while it acts (e.g. each switch of a feature): verify-logs counts
    # them and shows the latest per instance; they never pass or fail a check
    report: list[str] = field(default_factory=list)


def _yaml_name(name: str) -> str:
    return "class" if name == "cls" else name  # (`class` is a Python keyword)


_MARKER_CONFIG = {**_FORBID, "alias_generator": _yaml_name}


@dataclass
class MarkerSite:
    """Where a verify marker is logged, so verify-logs can count it and explain its absence."""

    __pydantic_config__ = _MARKER_CONFIG

    text: str
    # worker: in the speculative worker class the launch runs (file and class resolved per launch);
    # file: in `class`.`function` of the package file `file`; anywhere: no place to check on disk
    where: Literal["worker", "file", "anywhere"] = "anywhere"
    file: str | None = None
    cls: str | None = None
    function: str = "__init__"
    per_rank: bool = True  # every scheduler rank logs it (False: at least once per launch log)

    def __post_init__(self) -> None:
        if self.file is not None:
            self.file = check_relpath(self.file)
        if self.where == "file" and not (self.file and self.cls):
            raise ValueError(f"marker {self.text!r}: where: file needs file: and class:")


@dataclass
class Covers:
    """What the playbook must cover on a host, declared by the playbook (never assumed by the core)."""

    __pydantic_config__ = _FORBID

    # the speculative worker the launch runs must be in a file this playbook patches (and not one of
    # its unsupported_workers); every worker file is hashed at launch (restart-needed detection).
    # None (not written): derived from the patch, checked when it changes any worker file;
    # false: never checked; true: checked even when the patch changes no worker file
    worker: bool | None = None
    # the same for every family of alternatives the launch chooses between (engine().family_names:
    # model, attention_backend, ...): true widens (check it although no member is patched), false
    # narrows (never check it); a family not named is derived from the patch
    families: dict[str, bool] = field(default_factory=dict)
    # package files the feature lives in: every version must patch them; hashed at launch
    files: list[str] = field(default_factory=list)
    markers: list[MarkerSite] = field(default_factory=list)
    # ServerArgs fields verify-logs reports besides the engine's own (from the logged dump)
    report_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.files = [check_relpath(x) for x in self.files]
        names = engine().family_names
        bad = sorted(set(self.families) - set(names))
        if bad:
            raise ValueError(f"covers.families: {', '.join(bad)} is not a family; families: {', '.join(names)}")
        if self.worker is not None and names[0] in self.families and self.families[names[0]] != self.worker:
            raise ValueError(f"covers.worker and covers.families.{names[0]} disagree: write one of them")

    def asked(self) -> dict[str, bool | None]:
        """Family -> True (check it), False (never), None (derived from the patch)."""
        out: dict[str, bool | None] = dict(self.families)
        if self.worker is not None:
            out[engine().family_names[0]] = self.worker
        return out

    def checks_worker(self, patches_a_worker: bool) -> bool:
        """Is the speculative worker family checked, given whether the patch changes a worker file?"""
        want = self.asked().get(engine().family_names[0])
        return patches_a_worker if want is None else want


@dataclass
class PatchFile:
    """A file to patch, with the diff text already read."""

    path: str
    patch_path: Path
    patch_text: bytes
    sha256: str


@dataclass
class ShippedFile:
    """A state file with its bytes already read."""

    name: str
    source: Path
    data: bytes
    mode: int = 0o644

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class Playbook:
    path: Path
    name: str
    description: str
    versions: dict[str, list[PatchFile]]
    launch: LaunchProfile
    verify: VerifySpec
    unsupported_workers: dict[str, dict[str, str]] = field(default_factory=dict)
    covers: Covers = field(default_factory=Covers)
    state_files: list[ShippedFile] = field(default_factory=list)
    launch_declared: bool = True  # the file has a `launch:` section (launch refuses one that has none)

    def marker_site(self, text: str) -> MarkerSite:
        """Where the playbook says `text` is logged (undeclared: anywhere, per rank)."""
        for m in self.covers.markers:
            if m.text == text:
                return m
        return MarkerSite(text=text)

    def supported(self) -> list[str]:
        from packaging.version import Version

        return sorted(self.versions, key=Version)

    def files_for(self, version: str) -> list[PatchFile] | None:
        return self.versions.get(version)
