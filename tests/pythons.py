"""The Pythons this machine has, for tests that run the agent (or a host) under each: read from
their install paths, so collecting the tests starts no interpreter (a pyenv shim is a shell script
that takes ~0.1 s a run; collection asked each of them, twice, on every pytest start)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
from pathlib import Path

_VERSION = re.compile(r"(?:/versions/|/python)(3\.\d+)(?:[./]|$)")


def version(python: str) -> tuple[int, int]:
    """(major, minor) of one of pythons(), from its path (this interpreter's: its own)."""
    if python == sys.executable:
        return sys.version_info[0], sys.version_info[1]
    m = _VERSION.search(python)
    if m is None:
        raise ValueError(f"{python}: no version in its path")
    major, minor = m.group(1).split(".")
    return int(major), int(minor)


@functools.cache
def pythons() -> list[str]:
    """This interpreter and one other CPython >= 3.8 per version found: pyenv's installs
    (~/.pyenv/versions/3.X.Y/bin/python3), then python3.X on PATH that is not a pyenv shim."""
    found = {version(sys.executable): sys.executable}
    candidates = [*sorted(str(p) for p in Path("~/.pyenv/versions").expanduser().glob("3.*/bin/python3")),
                  *(shutil.which(f"python3.{m}") for m in range(8, 15))]
    for exe in candidates:
        if not exe or "/shims/" in os.path.realpath(exe) or not os.access(exe, os.X_OK):
            continue
        try:
            v = version(exe)
        except ValueError:
            continue
        if v >= (3, 8):
            found.setdefault(v, exe)
    return sorted(found.values())
