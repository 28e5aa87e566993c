"""The controller's own directories (a leaf: imports nothing of fleetctl).

State (the ledger, run logs, kept inventories and playbooks, seals): $FLEETCTL_STATE_DIR, else
$XDG_STATE_HOME/fleetctl, else ~/.local/state/fleetctl.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    env = os.environ.get("FLEETCTL_STATE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state") / "fleetctl"
