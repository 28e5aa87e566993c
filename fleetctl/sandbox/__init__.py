"""The sandbox: a local fleet of real OpenSSH hosts on loopback, for trying and testing fleetctl.

    from fleetctl.sandbox import up, down, status
    sb = up("/tmp/sb", hosts=8)          # -> Sandbox (.inventory_path, .hosts, .stop_host(), ...)
    down("/tmp/sb")

See `fleetctl.sandbox.lifecycle` for the layout and for what is a stand-in (torch, nvidia-smi, the
SGLang server). Names are imported lazily so that `python -m fleetctl.sandbox.<module>` on a
sandbox host stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.sandbox.lifecycle import (
        DownReport,
        HostStatus,
        Sandbox,
        SandboxHost,
        down,
        load,
        set_gpu_state,
        status,
        up,
    )

__all__ = ["DownReport", "HostStatus", "Sandbox", "SandboxHost", "down", "load", "set_gpu_state", "status", "up"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fleetctl.sandbox import lifecycle

        return getattr(lifecycle, name)
    raise AttributeError(f"module 'fleetctl.sandbox' has no attribute {name!r}")
