#!/usr/bin/env bash
# The test command: set up (venv, sshd), lint, then the test suite on real sshd sandbox fleets.
# Extra arguments go to pytest (e.g. -k deploy, -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check fleetctl tests
# Four pytest-xdist workers, a test file each at a time: on 2 cores two workers kept the CPUs 67-77 %
# busy (the rest waiting on sshd, the hosts' agents and timeouts), four 87 % (docs/reliability.md);
# FLEETCTL_TEST_WORKERS=0 runs it in one process.
exec .venv/bin/python -m pytest -q -m "not slow" -n "${FLEETCTL_TEST_WORKERS:-4}" --dist loadfile "$@"
