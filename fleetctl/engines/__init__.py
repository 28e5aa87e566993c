"""The inference engine behind one small interface: everything engine-specific goes through here.

Core modules (config, facts, plan, ops, commands) name no engine path, env name, flag or log line:
they ask `engine()` (tests/test_engine_boundary.py enforces it); its type is `Engine`
(engines/base.py). The one implementation today is SGLang, in fleetctl/engines/sglang/; a second
engine is a second package implementing `Engine`, returned here.

The host agent (fleetctl/remote/, stdlib only) holds no engine knowledge either: the controller
passes the facts it needs in each request (`Engine.agent_facts()`: package name, the file that
registers server flags, the inventory key naming the package dir).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.engines.base import Engine

_ENGINE: Engine | None = None


def engine() -> Engine:
    """The engine fleetctl drives (SGLang). Imported on first use: start-up stays light."""
    global _ENGINE
    if _ENGINE is None:
        from fleetctl.engines.sglang.engine import SGLANG

        _ENGINE = SGLANG
    return _ENGINE
