"""The intended bytes of a playbook's files for one SGLang version, computed once on the
controller from the real pristine file (wheel cache) and the playbook's exact patch."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path

from fleetctl.config.playbook_model import Playbook
from fleetctl.engines import wheels
from fleetctl.errors import InputError
from fleetctl.plan.deploy import Intended, sha


@lru_cache(maxsize=256)
def _apply(version: str, rel: str, patch_text: bytes, expect_sha: str, where: str) -> Intended:
    pristine = wheels.pristine_bytes(version, rel)
    got = sha(pristine)
    if got != expect_sha:
        raise InputError(
            f"{where}: sha256 {expect_sha[:12]}… for {rel} does not match the real sglang {version} file ({got[:12]}…)",
            hint="the patch set was made for other bytes; regenerate it with 'fleetctl patch new'",
        )
    key = _cache_key(version, rel, patch_text, got)
    hit = _cached(key)
    if hit is not None:
        return Intended(rel, got, hit[0], sha(hit[0]), hit[1])
    from fleetctl.patching.engine import apply_patch

    res = apply_patch(pristine, patch_text, name=f"{rel} (sglang {version})")
    try:
        compile(res.output, rel, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise InputError(f"{where}: patched {rel} for sglang {version} does not compile: line {e.lineno}: {e.msg}",
                         hint="fix the patch") from None
    _store(key, res.output, list(res.offsets))
    return Intended(rel, got, res.output, sha(res.output), list(res.offsets))


# The intended bytes, once patched and compiled, are kept in the cache dir keyed by everything they
# depend on (pristine bytes, patch, our patch engine, this Python's grammar): a re-deploy does not
# patch and compile them again on the critical path between facts and apply.

# The patch engine's source, read (not imported: a cache hit needs no patching code) from the file
# Python would import it from.
_ENGINE_SRC = Path(__file__).resolve().parent.parent / "patching" / "engine.py"


def _cache_key(version: str, rel: str, patch_text: bytes, pristine_sha: str) -> str:
    h = hashlib.sha256()
    for part in (version.encode(), rel.encode(), pristine_sha.encode(), patch_text,
                 _ENGINE_SRC.read_bytes(), f"{sys.version_info[0]}.{sys.version_info[1]}".encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:40]


def _cache_path(key: str) -> Path:
    return wheels.cache_dir() / "intended" / key


def _cached(key: str) -> tuple[bytes, list[tuple[int, int]]] | None:
    p = _cache_path(key)
    try:
        meta = json.loads(p.with_suffix(".json").read_text())
        data = p.with_suffix(".bytes").read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("sha256") != sha(data):  # torn or tampered: redo it
        return None
    return data, [tuple(o) for o in meta.get("offsets", [])]


def _store(key: str, data: bytes, offsets: list[tuple[int, int]]) -> None:
    p = _cache_path(key)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        for suffix, blob in ((".bytes", data), (".json", json.dumps({"sha256": sha(data), "offsets": offsets}).encode())):
            tmp = p.with_suffix(f"{suffix}.{os.getpid()}.tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, p.with_suffix(suffix))
    except OSError:
        pass  # a cache that cannot be written is only slower


def intended_data(playbook: Playbook, version: str) -> dict[str, bytes]:
    """rel -> the bytes deploy would write for `version` ({} when the playbook has no patch set, or
    a patch does not apply: patch check and deploy say why)."""
    from fleetctl.errors import FleetctlError

    try:
        it = intended_for(playbook, version)
    except FleetctlError:
        return {}
    return {rel: i.data for rel, i in (it or {}).items()}


def intended_for(playbook: Playbook, version: str) -> dict[str, Intended] | None:
    files = playbook.files_for(version)
    if files is None:
        return None
    return {f.path: _apply(version, f.path, f.patch_text, f.sha256, str(f.patch_path)) for f in files}
