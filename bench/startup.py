"""CPU (user+sys) of fleetctl's start-up, per command line: median and least of N runs (issues
16.10 and 17).

    .venv/bin/python bench/startup.py [N] [--inventory SANDBOX/inventory.yaml] [--short]

A measurement, never a test: the machine's load moves the numbers. "up to the first connect" is
measured with an inventory that does not exist (the command stops, exit 2, right where it would
load the inventory and connect). With --inventory (a 1-host sandbox: `fleetctl sandbox up -d DIR
-n 1 --bare-shell`) also `deploy --check --json` and a no-op `deploy --json` on it (the playbook
is deployed once first, so every timed deploy is a no-op); --short: only --version and those. FLEETCTL_TREE=DIR times another
checkout's fleetctl package (compile it first: `python -m compileall -q DIR/fleetctl`). The
results go into bench/README.md by hand.
"""

from __future__ import annotations

import os
import resource
import statistics
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


def cpu(argv: list[str], check: bool = False) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([*FLEETCTL, *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "FLEETCTL_STATE_DIR": os.environ.get("FLEETCTL_STATE_DIR", "/tmp/fleetctl-bench-state")},
                   check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if check and p.returncode != 0:
        raise SystemExit(f"fleetctl {' '.join(argv)}: exit {p.returncode}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    args = sys.argv[1:]
    inventory = None
    if "--inventory" in args:
        i = args.index("--inventory")
        inventory = str(Path(args[i + 1]).resolve())
        del args[i:i + 2]
    lines = list(LINES)
    if "--short" in args:  # --version and the sandbox lines only
        args.remove("--short")
        lines = [["--version"]]
    n = int(args[0]) if args else 5
    sandbox_lines: list[list[str]] = []
    if inventory:
        cpu(["deploy", PB, "-i", inventory], check=True)  # deployed: the timed deploys are no-ops
        sandbox_lines = [["deploy", PB, "-i", inventory, "--check", "--json"], ["deploy", PB, "-i", inventory, "--json"]]
        lines += sandbox_lines
    xs = [cpu_of([sys.executable, "-c", "pass"]) for _ in range(n)]
    print(f"{'CPU s, ' + str(n) + ' runs':<58} {'median':>7} {'least':>7}")
    print(f"{'python -c pass (the floor)':<58} {statistics.median(xs):7.3f} {min(xs):7.3f}")
    for argv in lines:
        xs = [cpu(argv, check=argv in sandbox_lines) for _ in range(n)]
        shown = " ".join(a if a != inventory else "INV" for a in argv)
        print(f"{'fleetctl ' + shown:<58} {statistics.median(xs):7.3f} {min(xs):7.3f}")


def cpu_of(cmd: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


if __name__ == "__main__":
    main()
