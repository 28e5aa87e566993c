#!/usr/bin/env bash
# The test command: set up (venv, sshd), lint, then the test suite on real sshd sandbox fleets.
# Extra arguments go to pytest (e.g. -k deploy, -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check fleetctl tests
exec .venv/bin/python -m pytest -q -m "not slow" "$@"
