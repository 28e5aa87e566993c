"""What test sessions share on this machine, so that two at once (two pytest runs, or the workers of
one `pytest -n 2`) keep out of each other's way.

- Directories a session makes outside pytest's temp dir are named for the process that makes them,
  so the session's end-of-run check (tests/conftest.py) finds its own and never another's.
- Machine-wide things a test changes (system accounts, a file in /etc/sudoers.d) are held under
  `machine_lock(name)`: an exclusive flock, waited for, released when the test is done.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# tests/test_non_root.py's (and become's, containers') world-readable sandbox dirs under /tmp
# (pytest's tmp dirs are 0700)
NON_ROOT_PREFIX = f"fleetctl-nr-{os.getpid()}-"


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock `name` (a file under /tmp) until the block ends."""
    with open(Path("/tmp") / f"fleetctl-test-{name}.lock", "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
