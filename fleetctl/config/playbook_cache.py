"""The playbook each command last loaded, kept per playbook file: the next command on the same
inputs takes it instead of parsing and validating the file again (commands/context.py).

Loading a playbook costs a command pydantic, PyYAML and the models' schemas: ~0.1 s of one CPU on
every deploy, check and no-op alike, while the hosts' connections open on the same CPUs.

Loading a playbook (config/playbook.py load_playbook) is a function of: the file's bytes and real
path (patch and state file paths are taken from its directory), the real path and bytes of each
patch and state file it names, the engine's defaults (package, launch command), and the code that
does it. The copy kept here holds the validated playbook without those files' bytes; it is taken
only when the playbook's bytes hash as they did, each named path resolves to the same real file
again, and that file's bytes (read now, and used) hash as they did. So it is exactly what loading
the file would give; anything else (another byte, a moved symlink, an upgrade) loads the file as
always, with its errors, and keeps the new result.

Never kept: a playbook whose values do not survive JSON exactly (a YAML date as a flag value, say).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetctl.config import kept
from fleetctl.config.playbook_model import (
    MAX_STATE_FILE,
    Covers,
    InstanceLayout,
    LaunchProfile,
    MarkerSite,
    NeverFires,
    PatchFile,
    Playbook,
    ShippedFile,
    VerifySpec,
)
from fleetctl.engines import engine

VERSION = 2


def playbook_file(path: Path) -> Path:
    """The playbook file a command's PLAYBOOK argument names (a directory: its playbook.yaml)."""
    return path / "playbook.yaml" if path.is_dir() else path


@functools.cache
def code_id() -> str:
    """The code a loaded playbook depends on (config/kept.py code_id), with the engine's defaults."""
    e = engine()
    return kept.code_id(("kept.py", "playbook.py", "playbook_cache.py", "playbook_model.py", "yamlpos.py"),
                        e.package, e.launch_command)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _doc(pb: Playbook, raw: dict[Path, str]) -> dict[str, Any]:
    """`pb` as JSON data: each read file by its path as written (`raw`), real path and sha256."""
    return {"name": pb.name, "description": pb.description, "unsupported_workers": pb.unsupported_workers,
            "versions": {v: [{"path": f.path, "patch": raw[f.patch_path], "real": str(f.patch_path),
                              "sha256": f.sha256, "patch_sha256": _sha(f.patch_text)} for f in files]
                         for v, files in pb.versions.items()},
            "launch": dataclasses.asdict(pb.launch), "verify": dataclasses.asdict(pb.verify),
            "covers": dataclasses.asdict(pb.covers),
            "state_files": [{"name": s.name, "source": raw[s.source], "real": str(s.source), "mode": s.mode,
                             "sha256": s.sha256} for s in pb.state_files],
            "launch_declared": pb.launch_declared}


def _playbook(doc: dict[str, Any], path: Path, read: Callable[[str, str, str], bytes]) -> Playbook:
    """The Playbook `doc` holds, each named file's bytes from `read(written path, real path, sha256)`."""
    launch = dict(doc["launch"])
    launch["layout"] = InstanceLayout(**launch["layout"])
    verify = dict(doc["verify"])
    verify["never_fires_when"] = [NeverFires(**n) for n in verify["never_fires_when"]]
    covers = dict(doc["covers"])
    covers["markers"] = [MarkerSite(**m) for m in covers["markers"]]
    versions = {v: [PatchFile(path=f["path"], patch_path=Path(f["real"]), sha256=f["sha256"],
                              patch_text=read(f["patch"], f["real"], f["patch_sha256"])) for f in files]
                for v, files in doc["versions"].items()}
    shipped = [ShippedFile(name=s["name"], source=Path(s["real"]), mode=s["mode"],
                           data=read(s["source"], s["real"], s["sha256"])) for s in doc["state_files"]]
    return Playbook(path=path, name=doc["name"], description=doc["description"], versions=versions,
                    unsupported_workers={v: dict(w) for v, w in doc["unsupported_workers"].items()},
                    launch=LaunchProfile(**launch), verify=VerifySpec(**verify), covers=Covers(**covers),
                    state_files=shipped, launch_declared=doc["launch_declared"])


class _Changed(Exception):
    pass


def lookup(path: Path) -> Playbook | None:
    """The kept playbook of the PLAYBOOK argument `path` when every input it was loaded from is the
    same now (see the module's text); else None. Never raises."""
    try:
        file = playbook_file(path)
        real = file.resolve()
        doc = kept.read(kept.store("playbooks", file))
        if not (isinstance(doc, dict) and doc.get("v") == VERSION and doc.get("file") == str(real)
                and doc.get("code") == code_id() and doc.get("sha256") == kept.file_sha(file)):
            return None
        base = real.parent
        sources = {s["source"] for s in doc["playbook"]["state_files"]}  # (read at most MAX_STATE_FILE)

        def read(written: str, real_path: str, sha256: str) -> bytes:
            if str((base / written).resolve()) != real_path:
                raise _Changed
            data = kept.read_bytes(Path(real_path), MAX_STATE_FILE if written in sources else None)
            if data is None or _sha(data) != sha256:
                raise _Changed
            return data

        return _playbook(doc["playbook"], file, read)
    except Exception:  # (unreadable, malformed, another layout, a changed file: as if nothing were kept)
        return None


def save(pb: Playbook, sha256: str | None, raw: dict[Path, str]) -> None:
    """Keep `pb`, loaded from playbook bytes whose sha256 is `sha256`; `raw`: each file it read (real
    path) as the playbook names it. A copy that could not be used exactly is removed. Never raises."""
    try:
        file = pb.path
        f = kept.store("playbooks", file)
        doc = {"v": VERSION, "file": str(file.resolve()), "code": code_id(), "sha256": sha256,
               "playbook": _doc(pb, raw)}
        try:
            text = json.dumps(doc, allow_nan=False) if sha256 and doc["code"] else ""
        except (TypeError, ValueError):  # a value JSON cannot hold
            text = ""
        if text:
            data = {f.patch_path: f.patch_text for fs in pb.versions.values() for f in fs}
            data.update((s.source, s.data) for s in pb.state_files)
            if _playbook(json.loads(text)["playbook"], file, lambda _w, real, _s: data[Path(real)]) != pb:
                text = ""
        kept.write(f, text)
    except Exception:  # (a read-only state dir, a full disk: the next command just loads the file)
        pass


def load(path: Path) -> Playbook:
    """The playbook `path` names: the kept copy when every input is the same, else loaded (and
    validated, with its errors) by config/playbook.py and kept for the next command."""
    pb = lookup(path)
    if pb is not None:
        return pb
    from fleetctl.config.playbook import load_playbook_from

    file = playbook_file(path)
    sha = kept.file_sha(file)
    pb, raw = load_playbook_from(file)
    save(pb, sha, raw)
    return pb
