"""Summarise a torch-profiler chrome trace written by SGLang's /start_profile (standard library only).

  python3 prof_summary.py TRACE.json[.gz]  ->  JSON on stdout: the window's wall time, GPU busy time
  (union of kernel intervals), GPU idle, the kernels that took the most time, and the CUDA runtime
  calls that block the host (synchronize, blocking copies) with their counts and total time."""
import gzip
import json
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def union(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarise(trace):
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    kern = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rt = [e for e in ev if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver"]
    out = {"events": len(ev), "kernels": len(kern)}
    if not kern:
        return out
    t0 = min(e["ts"] for e in kern)
    t1 = max(e["ts"] + e["dur"] for e in kern)
    busy = union([(e["ts"], e["ts"] + e["dur"]) for e in kern])
    out.update(window_ms=round((t1 - t0) / 1000, 2), gpu_busy_ms=round(busy / 1000, 2),
               gpu_idle_ms=round((t1 - t0 - busy) / 1000, 2))
    by = {}
    for e in kern:
        n = e["name"][:90]
        c, d = by.get(n, (0, 0.0))
        by[n] = (c + 1, d + e["dur"])
    out["top_kernels"] = [[n, c, round(d / 1000, 3)] for n, (c, d) in
                          sorted(by.items(), key=lambda kv: -kv[1][1])[:25]]
    blocking = {}
    for e in rt:
        n = e["name"]
        if "ynchronize" in n or n in ("cudaMemcpy", "cuMemcpyDtoH_v2", "cudaMemcpyDtoH") or "StreamWait" in n:
            c, d = blocking.get(n, (0, 0.0))
            blocking[n] = (c + 1, d + e["dur"])
    out["blocking_runtime"] = {n: [c, round(d / 1000, 3)] for n, (c, d) in blocking.items()}
    launches = sum(1 for e in rt if "aunch" in e["name"])
    graphs = sum(1 for e in rt if "GraphLaunch" in e["name"])
    out.update(kernel_launch_calls=launches, graph_launches=graphs)
    return out


if __name__ == "__main__":
    print(json.dumps(summarise(load(sys.argv[1])), indent=1))
