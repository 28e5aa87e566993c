"""Run ON the host (`fleetctl gpu-check`), next to a throwaway SGLang server on 127.0.0.1: greedy
samples and a tokens/s measurement through the server's own HTTP API (`POST /generate`).
(stdlib only, Python >= 3.8 grammar; no `from __future__`; shipped as a string, run as `-c`.)

One JSON request on stdin:

    {"port": P, "prompts": 8, "sample_tokens": 48, "batched": C,
     "loads": [[concurrency, requests, max_new_tokens], ...], "warmup_tokens": 32, "timeout": s}

and one JSON answer on stdout:

    {"samples": [{"sha256", "head", "tokens"}], "batched": [...same...],
     "loads": [{"concurrency", "requests", "completed", "tokens", "seconds", "tok_per_s",
                "accept_len", "errors"}], "errors": [...]}

Greedy (temperature 0) with ignore_eos, so every request produces exactly max_new_tokens. The
texts themselves stay on the host: only their sha256 and first characters come back.
"""

import hashlib
import json
import sys
import threading
import time
import urllib.request

WORDS = "the quick brown fox jumps over the lazy dog while a draft model proposes tokens".split()
MAX_ERRORS = 5


def prompt(i):
    return "request %d: %s" % (i, " ".join(WORDS[(i + j) % len(WORDS)] for j in range(20)))


def generate(port, i, max_new, timeout):
    body = json.dumps({"text": prompt(i), "sampling_params": {"temperature": 0, "max_new_tokens": max_new,
                                                               "ignore_eos": True}}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/generate" % port, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        doc = json.loads(r.read(1 << 22).decode("utf-8", "replace"))
    meta = doc.get("meta_info") or {}
    return str(doc.get("text", "")), int(meta.get("completion_tokens") or 0), int(meta.get("spec_verify_ct") or 0)


def fan_out(fn, n, conc):
    """fn(i) for i in range(n), at most `conc` at once; results in order (an exception is kept)."""
    out = [None] * n
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                return
            try:
                out[i] = fn(i)
            except Exception as e:
                out[i] = e

    ts = [threading.Thread(target=worker) for _ in range(max(1, min(conc, n)))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def shown(text, tokens):
    return {"sha256": hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(),
            "head": text[:60], "tokens": tokens}


def samples(port, idx, max_new, conc, timeout, errors):
    res = fan_out(lambda k: generate(port, idx[k], max_new, timeout), len(idx), conc)
    out = []
    for r in res:
        if isinstance(r, Exception):
            if len(errors) < MAX_ERRORS:
                errors.append(("%s: %s" % (type(r).__name__, r))[:300])
            out.append(None)
        else:
            out.append(shown(r[0], r[1]))
    return out


def load(port, conc, n, max_new, timeout):
    t0 = time.time()
    res = fan_out(lambda i: generate(port, 1000 + i, max_new, timeout), n, conc)
    wall = time.time() - t0
    ok = [r for r in res if not isinstance(r, Exception)]
    errs = [("%s: %s" % (type(r).__name__, r))[:300] for r in res if isinstance(r, Exception)][:MAX_ERRORS]
    toks = sum(r[1] for r in ok)
    verify = sum(r[2] for r in ok)
    return {"concurrency": conc, "requests": n, "completed": len(ok), "tokens": toks,
            "seconds": round(wall, 3), "tok_per_s": round(toks / wall, 1) if wall > 0 else None,
            "accept_len": round(toks / verify, 3) if verify else None, "errors": errs}


def main():
    req = json.loads(sys.stdin.read() or "{}")
    port = int(req["port"])
    timeout = float(req.get("timeout", 120))
    errors = []
    n = int(req.get("prompts", 8))
    out = {"samples": samples(port, list(range(n)), int(req.get("sample_tokens", 48)), 1, timeout, errors)}
    conc = int(req.get("batched", 0))
    # the same prompts, all at once (a running batch above the threshold when conc is)
    out["batched"] = samples(port, [i % n for i in range(conc)], int(req.get("sample_tokens", 48)), conc,
                             timeout, errors) if conc else []
    out["loads"] = []
    for conc, nreq, max_new in req.get("loads") or []:
        load(port, int(conc), int(conc), int(req.get("warmup_tokens", 32)), timeout)  # first use: graphs, JIT
        out["loads"].append(load(port, int(conc), int(nreq), int(max_new), timeout))
    out["errors"] = errors
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
