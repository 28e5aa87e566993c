"""Draw bench results: wall seconds vs N, one line per tool (deploy solid, no-op dashed).

    python bench/plot.py results.json results.png      (needs matplotlib: bench/.venvs/plot)
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LABELS = {"fleetctl": "fleetctl", "lean": "lean paramiko", "pyinfra": "pyinfra",
          "ansible": "ansible-core (tuned)", "ansible-default": "ansible-core (defaults)"}
COLORS = {"fleetctl": "tab:green", "lean": "tab:gray", "pyinfra": "tab:blue", "ansible": "tab:red",
          "ansible-default": "tab:orange"}


def main(src: str, dst: str) -> int:
    doc = json.load(open(src))
    sizes = sorted(doc["sizes"], key=int)
    tools = list(dict.fromkeys(t for n in sizes for t in doc["sizes"][n]["tools"]))
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    for tool in tools:
        for op, style in (("deploy", "-"), ("noop", "--")):
            xs, ys = [], []
            for n in sizes:
                d = doc["sizes"][n]["tools"].get(tool, {}).get(op)
                if d:
                    xs.append(int(n))
                    ys.append(d["median"]["wall"])
            if xs:
                ax.plot(xs, ys, style, marker="o", color=COLORS.get(tool), label=f"{LABELS.get(tool, tool)} {op}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([int(n) for n in sizes], [str(n) for n in sizes])
    ax.set_xlabel("hosts (N)")
    ax.set_ylabel("wall seconds (median)")
    m = doc.get("meta", {})
    ax.set_title(f"Patch deploy on a sandbox fleet ({m.get('cpus', '?')} CPUs shared by controller and hosts)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(dst)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
