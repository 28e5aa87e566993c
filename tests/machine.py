"""What test sessions share on this machine, so that two at once (two pytest runs, or the workers of
one `pytest -n 2`) keep out of each other's way.

- Directories a session makes outside pytest's temp dir are named for the process that makes them,
  so the session's end-of-run check (tests/conftest.py) finds its own and never another's.
- Machine-wide things a test changes (system accounts, a file in /etc/sudoers.d) are held under
  `machine_lock(name)`: an exclusive flock, waited for, released when the test is done.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path

from fleetctl.engines.wheel_cache import locked

# tests/test_non_root.py's (and become's, containers') world-readable sandbox dirs under /tmp
# (pytest's tmp dirs are 0700)
NON_ROOT_PREFIX = f"fleetctl-nr-{os.getpid()}-"


def machine_lock(name: str) -> AbstractContextManager[None]:
    """Hold the machine-wide lock `name` (a file under /tmp) until the block ends: fleetctl's own
    flock helper (the one its wheel cache is built under)."""
    return locked(Path("/tmp") / f"fleetctl-test-{name}.lock")
