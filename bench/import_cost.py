"""CPU each import adds, in the order given: one process, process_time around each import.

    .venv/bin/python bench/import_cost.py typer,rich.console,yaml,pydantic,pydantic.main,paramiko,fabric,fleetctl.config.playbook [RUNS]

Prints one row per module: the median over RUNS fresh processes (default 7), in ms.
"""

from __future__ import annotations

import importlib
import statistics
import subprocess
import sys
import time


def once(mods: list[str]) -> list[float]:
    out = []
    for m in mods:
        t = time.process_time()
        importlib.import_module(m)
        out.append((time.process_time() - t) * 1000)
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--once":
        print(" ".join(f"{x:.1f}" for x in once(sys.argv[2].split(","))))
        return 0
    mods = sys.argv[1].split(",")
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    rows = []
    for _ in range(runs):
        p = subprocess.run([sys.executable, __file__, "--once", ",".join(mods)], capture_output=True,
                           text=True, check=True)
        rows.append([float(x) for x in p.stdout.split()])
    for i, m in enumerate(mods):
        print(f"{m:40s} {statistics.median(r[i] for r in rows):6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
