"""What the config caches share (config/inventory_cache.py, config/playbook_cache.py): where a kept
copy lives, how its inputs are hashed, how its code is identified, and how it is read and written.

A kept copy is a JSON document in the state dir (0700, files 0600), written whole (a temporary file
renamed over it), read only when it is at most MAX_BYTES; any problem reading or writing it is as if
nothing were kept: the command then loads its file as always.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

MAX_BYTES = 16 << 20  # a kept copy larger than this is not read
# the validation code every kept copy depends on besides its own modules: found without importing it
LIBRARIES = (("pydantic", "version.py"), ("pydantic_core", "__init__.py"), ("yaml", "__init__.py"))


def store(kind: str, path: Path) -> Path:
    """The kept copy of the file `path` (by its real path) among the copies of `kind`."""
    from fleetctl.config.paths import state_dir

    return state_dir() / kind / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32] + ".json")


def read_bytes(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes of the regular file `path` (at most `limit` of them), or None if it cannot be read
    or is not a regular file: a FIFO or a device is read by the file's loader alone, once, and is
    not even opened here (a FIFO's writer would see a reader)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb", opener=lambda p, fl: os.open(p, fl | os.O_NONBLOCK)) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = f.read(limit + 1 if limit is not None else -1)
        return data if limit is None or len(data) <= limit else None
    except OSError:
        return None


def file_sha(path: Path | None) -> str | None:
    """sha256 of the file's bytes ("" for no file, None if it cannot be read or is not a regular file)."""
    if path is None:
        return ""
    data = read_bytes(path)
    return hashlib.sha256(data).hexdigest() if data is not None else None


def code_id(here: Iterable[str], *values: str) -> str:
    """The code a kept copy depends on: fleetctl's version, its config modules named in `here`, the
    files of pydantic, pydantic_core and PyYAML that say their versions, and `values` (defaults
    that come from elsewhere). "" when a library cannot be found (then nothing is kept)."""
    from fleetctl import __version__

    h = hashlib.sha256(__version__.encode())
    base = Path(__file__).resolve().parent
    files = [base / f for f in here]
    for pkg, name in LIBRARIES:
        spec = find_spec(pkg)
        if spec is None or not spec.origin:
            return ""
        files.append(Path(spec.origin).parent / name)
    for f in files:
        h.update(str(f).encode() + b"\0" + f.read_bytes() + b"\0")
    for v in values:
        h.update(v.encode() + b"\0")
    return h.hexdigest()


def read(f: Path) -> Any:
    """The JSON document kept in `f` (raises on any problem: the caller treats that as nothing kept)."""
    if f.stat().st_size > MAX_BYTES:
        raise ValueError("too large")
    return json.loads(f.read_bytes())


def write(f: Path, text: str) -> None:
    """Keep `text` in `f`, whole or not at all; "" removes the kept copy."""
    if not text:
        f.unlink(missing_ok=True)
        return
    f.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, f)
