"""The inventory each fleet command last resolved, kept per inventory file: the next command on the
same inputs takes it instead of parsing and validating the file again (commands/context.py).

What a command does before its first handshake is mostly loading the inventory: the YAML parser,
pydantic and the inventory's models, ~0.1 s of one CPU on a 64-host file while every host waits
(and libyaml holds the GIL while it composes, so a parse that overlaps the handshakes stalls them).

Resolving an inventory (config/inventory.py load_inventory) is a function of: the file's bytes, its
real path (relative paths are taken from its directory), its ssh_config's bytes (host aliases), the
resolution of each path value (`~` is HOME; symlinks), and the code that does it (fleetctl's config
modules, pydantic, PyYAML). The copy kept here is taken only when every one of those is what it was
made from: the bytes hashed again, each path value resolved again, the code identified by its files.
So it is exactly what validating the file would give, without the parse; anything else (another
byte, a moved symlink, an upgrade) loads the file as always and keeps the new result.

Never kept: an inventory with a secret env value (a copy of the secret outside the inventory), or one
whose values do not survive JSON exactly (a YAML date as a flag value, say). The copies live in the
state dir (0700, files 0600), like the seals and the ledger.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from fleetctl.config import kept
from fleetctl.config.hosts import Host, Inventory, resolve_path

VERSION = 1
file_sha = kept.file_sha
_SCALARS: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,),
                                         "None": (type(None),)}
_CONTAINERS: dict[str, type] = {"dict": dict, "frozenset": list, "tuple": list}  # as JSON holds them


def _allowed(annotation: str) -> tuple[type, ...]:
    """What a kept copy's JSON may hold for a Host field annotated `annotation` ("int | None", ...)."""
    out: list[type] = []
    for part in annotation.split("|"):
        base = part.strip().split("[", 1)[0]
        out += [_CONTAINERS[base]] if base in _CONTAINERS else list(_SCALARS[base])
    return tuple(out)


_TYPES = {f.name: _allowed(str(f.type)) for f in dataclasses.fields(Host)}  # each Host field: its JSON types


def _store(path: Path) -> Path:
    return kept.store("inventories", path)


@functools.cache
def code_id() -> str:
    """The code a resolution depends on (config/kept.py code_id)."""
    return kept.code_id(("hosts.py", "inventory.py", "inventory_cache.py", "kept.py", "yamlpos.py"))


def _host_doc(h: Host) -> dict[str, Any]:
    d = dict(h.__dict__)
    d["secret_env_keys"] = sorted(h.secret_env_keys)
    d["gpus"], d["groups"] = list(h.gpus), list(h.groups)
    return d


def _host(d: dict[str, Any]) -> Host:
    if set(d) != set(_TYPES) or not all(isinstance(d[k], t) for k, t in _TYPES.items()):
        raise ValueError("not a kept host")
    d = dict(d)
    d["secret_env_keys"] = frozenset(d["secret_env_keys"])
    d["gpus"], d["groups"] = tuple(d["gpus"]), tuple(d["groups"])
    return Host(**d)


def _inventory(doc: dict[str, Any], path: Path) -> Inventory:
    return Inventory(path=path, ssh_config=Path(doc["ssh_config"]) if doc["ssh_config"] is not None else None,
                     hosts=[_host(h) for h in doc["hosts"]], identity_where=dict(doc["identity_where"]),
                     paths=dict(doc["paths"]))


def lookup(path: Path) -> Inventory | None:
    """The kept resolution of the inventory file `path` when every input it was made from is the
    same now (see the module's text); else None. Never raises."""
    try:
        real = path.resolve()
        doc = kept.read(_store(path))
        if not (isinstance(doc, dict) and doc.get("v") == VERSION and doc.get("file") == str(real)
                and doc.get("code") == code_id() and doc.get("sha256") == file_sha(path)):
            return None
        inv = _inventory(doc["inventory"], path)
        if doc.get("ssh_config_sha256") != file_sha(inv.ssh_config):
            return None
        base = real.parent
        if any(resolve_path(base, raw) != done for raw, done in inv.paths.items()):
            return None
        return inv
    except Exception:  # (unreadable, malformed, another layout: as if nothing were kept)
        return None


def save(inv: Inventory, sha256: str | None) -> None:
    """Keep `inv`, resolved from inventory bytes whose sha256 is `sha256`; a copy that could not be
    used exactly (secret values, values JSON changes) is removed instead. Never raises."""
    try:
        f = _store(inv.path)
        ssh = file_sha(inv.ssh_config)
        doc = {"v": VERSION, "file": str(inv.path.resolve()), "code": code_id(), "sha256": sha256,
               "ssh_config_sha256": ssh,
               "inventory": {"ssh_config": str(inv.ssh_config) if inv.ssh_config is not None else None,
                             "hosts": [_host_doc(h) for h in inv.hosts], "identity_where": inv.identity_where,
                             "paths": inv.paths}}
        try:
            text = json.dumps(doc, allow_nan=False) if ssh is not None and sha256 and doc["code"] else ""
        except (TypeError, ValueError):  # a value JSON cannot hold
            text = ""
        if text and (any(h.secret_env_keys for h in inv.hosts)
                     or _inventory(json.loads(text)["inventory"], inv.path) != inv):
            text = ""
        kept.write(f, text)
    except Exception:  # (a read-only state dir, a full disk: the next command just loads the file)
        pass
