"""CPU (user+sys) of fleetctl's start-up, per command line: the least of N runs (issue 16.10).

    .venv/bin/python bench/startup.py [N]

A measurement, never a test: the machine's load moves the numbers. "up to the first connect" is
measured with an inventory that does not exist (the command stops, exit 2, right where it would
load the inventory and connect). The results go into bench/README.md by hand.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLEETCTL = [sys.executable, "-m", "fleetctl"]
if os.environ.get("FLEETCTL_TREE"):  # FLEETCTL_TREE=DIR: the fleetctl package of another checkout
    FLEETCTL = [sys.executable, "-c", "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in "
                f"repr(f)]; sys.path.insert(0, {os.environ['FLEETCTL_TREE']!r}); from fleetctl.cli import main; "
                "sys.exit(main())"]
NO_INV = "/nonexistent/inventory.yaml"
PB = "playbooks/dynamic-spec-disable"

LINES = [
    ["--version"], ["--help"],
    *[[c, "--help"] for c in ("deploy", "rollback", "status", "history", "explain", "launch", "verify-logs", "stop",
                              "servers", "facts", "patch", "sandbox")],
    ["patch", "check", "--help"], ["sandbox", "up", "--help"],
    ["history", "--last", "1"],
    ["status", "-i", NO_INV], ["stop", "-i", NO_INV, "--limit", "h03"], ["facts", "-i", NO_INV],
    ["deploy", PB, "-i", NO_INV, "--restart", "--serial", "2"],
]


def cpu(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([*FLEETCTL, *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "FLEETCTL_STATE_DIR": os.environ.get("FLEETCTL_STATE_DIR", "/tmp/fleetctl-bench-state")},
                   check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    base = min(cpu_of([sys.executable, "-c", "pass"]) for _ in range(n))
    print(f"{'python -c pass (the floor)':<58} {base:.3f}")
    for argv in LINES:
        print(f"{'fleetctl ' + ' '.join(argv):<58} {min(cpu(argv) for _ in range(n)):.3f}")


def cpu_of(cmd: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


if __name__ == "__main__":
    main()
