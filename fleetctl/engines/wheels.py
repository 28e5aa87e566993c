"""The real wheels of the engine fleetctl drives (SGLang), cached, and their extracted package trees:
fleetctl/engines/wheel_cache.py's `WheelCache` for `engine().package`. Used by `fleetctl patch
check/new`, by the sandbox fleet (pristine trees), by plans (pristine bytes) and by the tests that
hold our SGLang knowledge to the real sources.
"""

from __future__ import annotations

from fleetctl.engines import engine
from fleetctl.engines.wheel_cache import WheelCache, cache_dir, locked, sha256_bytes

_ENGINE = engine()
CACHE = WheelCache(_ENGINE.package, _ENGINE.display_name, _ENGINE.known_versions())
PACKAGE = CACHE.package
ensure_wheel = CACHE.ensure_wheel
extracted = CACHE.extracted
package_dir = CACHE.package_dir
pristine_bytes = CACHE.pristine_bytes
pristine_hashes = CACHE.pristine_hashes
verified_pristine = CACHE.verified_pristine

__all__ = ["CACHE", "PACKAGE", "WheelCache", "cache_dir", "ensure_wheel", "extracted", "locked", "package_dir",
           "pristine_bytes", "pristine_hashes", "sha256_bytes", "verified_pristine"]
