"""Time the agent's nvidia-smi queries on a machine with a real GPU (the device machine; nothing else
of fleetctl runs there): the two queries one after the other (as a facts request ran them until
2026-12-04) against both at once (hostfacts.gpu_queries: spawn_piped + finish_bounded), alternating,
ROUNDS rounds. Prints one JSON document: every timing (ms) and whether both ways answered the same
GPUs (index, uuid, name, memory.total of every row; used memory and utilization may move).

    python3 bench/gpu_queries_timing.py [ROUNDS]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetctl.remote import core, hostfacts  # (stdlib-only agent modules)


def _rows(csv: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")][:4] for line in csv.strip().splitlines()]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    exe = core.which("nvidia-smi")
    if exe is None:
        raise SystemExit("nvidia-smi not found on PATH")
    seq_ms, together_ms, same = [], [], []
    for i in range(rounds):
        for way in (("seq", "together") if i % 2 == 0 else ("together", "seq")):
            t = time.perf_counter()
            if way == "seq":
                answers = [core.run_bounded([exe, *args], 20) for _, args in hostfacts.GPU_QUERIES]
                seq_ms.append(round((time.perf_counter() - t) * 1000, 1))
                assert all(rc == 0 for rc, _, _ in answers), answers
                seq_gpus = answers[0][1].decode()
            else:
                got = hostfacts.gpu_queries()
                together_ms.append(round((time.perf_counter() - t) * 1000, 1))
                assert got["available"], got
                together_gpus = got["gpus"]
        same.append(_rows(seq_gpus) == _rows(together_gpus))
    print(json.dumps({"exe": exe, "rounds": rounds, "one_after_the_other_ms": seq_ms, "at_once_ms": together_ms,
                      "same_gpus": same, "gpus_csv": together_gpus}, indent=1))


if __name__ == "__main__":
    main()
