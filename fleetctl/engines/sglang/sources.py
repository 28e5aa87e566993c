"""SGLang's release wheels as this engine's own modules read them (the family tables, the
server_args replay): a `WheelCache` of its own, so nothing here goes through the engine factory
(fleetctl/engines/wheels.py, for code outside the engine, binds the same cache dirs)."""

from __future__ import annotations

from fleetctl.engines.sglang import releases as R
from fleetctl.engines.wheel_cache import WheelCache

WHEELS = WheelCache(R.PACKAGE, R.DISPLAY_NAME, R.KNOWN_VERSIONS)
