"""Run SGLang servers one after another on the GPU machine and measure them (standard library only).

Each phase starts `python3 -m sglang.launch_server` on 127.0.0.1 with its own flags, env and
PYTHONPATH (pristine or patched SGLang tree), waits for "The server is fired up and ready to roll!",
sends a few greedy /generate requests, runs a small concurrency benchmark, stops the server (its
own process group, by pid), and reads its log: the worker class (probe line), the server_args
fields that decide it, the dynamic-spec-disable marker, and the periodic decode lines
(#running-req, accept len, gen throughput). Everything goes to OUT/results.json after every
phase, and the server logs (WORK/logs/srv_<phase>.log) are re-tarred into OUT/srv_logs.tgz after
every phase (at most 8 files come back from the GPU machine), so a run cut short still reports.

Plans: 012 (constant-token target + perfect draft, random target + random draft), 012k (bigram
target + draft-kvmean: switch test, threshold boundary, throughput), 012f (flapping load, CUDA
graphs off for comparison, threshold 16). Phases with switch=True run switch_test first (fresh,
never-written KV slots), then greedy samples, then each bench level twice (warm-up, measured).

  python3 drive.py --plan 012k --work /tmp/w --out $OUT --deadline EPOCH
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
READY = "The server is fired up and ready to roll"

SPEC = [
    "--speculative-algorithm", "EAGLE3",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]
COMMON = [
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--host", "127.0.0.1",
    "--mem-fraction-static", "0.5",
    "--max-total-tokens", "131072",
    "--max-running-requests", "80",
    "--cuda-graph-max-bs", "64",
    "--decode-log-interval", "10",
    "--log-level", "info",
    # 0.5.12 turns on an experimental piecewise CUDA graph for prefill by default, which
    # torch.compiles the model for ~50 token counts at start-up; decode (what EAGLE and the
    # payload change) is unaffected. Off, to keep each start short enough for one device call.
    "--disable-piecewise-cuda-graph",
]


def plan_for(version):
    """Phases in order. tree: 'pristine' or 'patched'. need_s: skip the phase if less is left."""
    v1 = {"SGLANG_ENABLE_SPEC_V2": "0"}
    bench_std = [(1, 4, 256), (32, 64, 256)]
    if version in ("012", "011"):
        # t*: constant-token target + perfect draft (accept len = num_draft_tokens when speculating,
        # so on/off is visible); r*: random target + random draft (context-dependent greedy text,
        # for the same-output checks). switch: the long-request-plus-burst schedule of switch_test.
        b4 = [(1, 4, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)]
        return [
            dict(name="b_v1_spec", tree="pristine", env=v1, target="target", draft="draft-perfect", bench=b4,
                 switch=True, ready_max=300, need_s=100),
            dict(name="c_v1_dsd4", tree="patched", env=v1, target="target", draft="draft-perfect", threshold=4,
                 bench=b4, switch=True, ready_max=200, need_s=90),
            dict(name="e_nospec", tree="pristine", env=v1, target="target", draft=None, bench=b4, switch=True,
                 ready_max=150, need_s=60),
            dict(name="r_v1_spec", tree="pristine", env=v1, target="target-random", draft="draft-random",
                 bench=[], switch=True, ready_max=150, need_s=60),
            dict(name="r_v1_dsd4", tree="patched", env=v1, target="target-random", draft="draft-random",
                 threshold=4, bench=[], switch=True, ready_max=150, need_s=60),
            dict(name="r_nospec", tree="pristine", env=v1, target="target-random", draft=None, bench=[],
                 switch=True, ready_max=120, need_s=45),
            dict(name="d_v2_dsd4_refused", tree="patched", env={}, target="target", draft="draft-perfect",
                 threshold=4, expect_fail=True, bench=[], ready_max=90, need_s=30),
        ]
    if version == "012k":
        # kv: bigram target + draft-kvmean (accept len ~2 while speculating with a complete draft KV;
        # 1 once >~4% of a request's draft KV entries were never written). g: bigram target alone.
        bk = [(1, 4, 256), (4, 8, 256), (5, 10, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)]
        return [
            dict(name="k_v1_spec", tree="pristine", env=v1, target="target-bigram", draft="draft-kvmean",
                 bench=bk, switch=True, ready_max=240, need_s=100),
            dict(name="k_v1_dsd4", tree="patched", env=v1, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bk, switch=True, ready_max=200, need_s=100),
            dict(name="g_nospec", tree="pristine", env=v1, target="target-bigram", draft=None, bench=bk,
                 switch=True, ready_max=150, need_s=70),
            dict(name="d_v2_dsd4_refused", tree="patched", env={}, target="target", draft="draft-perfect",
                 threshold=4, expect_fail=True, bench=[], ready_max=60, need_s=45),
            dict(name="c_v1_dsd4", tree="patched", env=v1, target="target", draft="draft-perfect", threshold=4,
                 bench=[(1, 4, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)], switch=False, ready_max=150,
                 need_s=100),
            dict(name="b_v1_spec", tree="pristine", env=v1, target="target", draft="draft-perfect",
                 bench=[(1, 4, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)], switch=False, ready_max=150,
                 need_s=90),
        ]
    if version in ("012g", "012g2"):
        # issue 35: the payload's skipped steps at CUDA-graph speed. Patched first (if it fails, the
        # stock rows still come back), then stock spec-on, stock spec-off (overlap scheduler on, the
        # default), stock spec-off without the overlap scheduler (what the v1 worker runs under).
        bk = [(1, 4, 256), (4, 8, 256), (5, 10, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)]
        ph = [
            dict(name="k_v1_dsd4", tree="patched", env=v1, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bk, switch=True, ready_max=200, need_s=100, nofb=True),
            dict(name="k_v1_spec", tree="pristine", env=v1, target="target-bigram", draft="draft-kvmean",
                 bench=bk, switch=True, ready_max=200, need_s=90, nofb=True),
            dict(name="g_nospec", tree="pristine", env=v1, target="target-bigram", draft=None, bench=bk,
                 switch=True, ready_max=150, need_s=70, nofb=True),
        ]
        # a draft that pays (constant target + draft-perfect: accept 4 while speculating); texts are
        # trivially equal here, the point is throughput on both sides of the threshold
        bt = [(1, 4, 256), (4, 8, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)]
        ph += [
            dict(name="t_v1_dsd4", tree="patched", env=v1, target="target", draft="draft-perfect", threshold=4,
                 bench=bt, ready_max=150, need_s=75, nofb=True),
            dict(name="t_v1_spec", tree="pristine", env=v1, target="target", draft="draft-perfect",
                 bench=bt, ready_max=150, need_s=70, nofb=True),
            dict(name="t_nospec", tree="pristine", env=v1, target="target", draft=None,
                 bench=bt, ready_max=150, need_s=60, nofb=True),
            dict(name="g_nospec_noov", tree="pristine", env=v1, target="target-bigram", draft=None,
                 bench=bk[2:], extra=["--disable-overlap-schedule"], ready_max=150, need_s=60, nofb=True),
        ]
        if version == "012g2":  # default launch (no SGLANG_ENABLE_SPEC_V2): EAGLEWorkerV2
            ph = [dict(p, name=p["name"].replace("v1", "v2"), env={}) for p in ph]
        return ph
    if version == "014t":
        # the least that says something in ~100 s: the payload on 0.5.14's default launch, then spec-off
        bt = [(64, 128, 256), (5, 10, 256), (4, 8, 256), (32, 64, 256)]
        return [
            dict(name="k_v2_dsd4", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bt, ready_max=200, need_s=30, nofb=True),
            dict(name="g_nospec", tree="pristine", env={}, target="target-bigram", draft=None, bench=bt,
                 ready_max=150, need_s=30, nofb=True),
        ]
    if version == "014q":
        # short: what one device call with little time left can hold (payload first, then spec-off, spec-on)
        bq = [(1, 4, 256), (4, 8, 256), (5, 10, 256), (32, 64, 256), (64, 128, 256)]
        return [
            dict(name="k_v2_dsd4", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bq, switch=True, ready_max=200, need_s=60, nofb=True),
            dict(name="g_nospec", tree="pristine", env={}, target="target-bigram", draft=None, bench=bq,
                 switch=True, ready_max=150, need_s=50, nofb=True),
            dict(name="k_v2_spec", tree="pristine", env={}, target="target-bigram", draft="draft-kvmean",
                 bench=bq, switch=True, ready_max=150, need_s=50, nofb=True),
        ]
    if version == "014x":
        # where a skipped step's time goes on 0.5.14: the payload with SGLang's own experimental
        # SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 (no draft extend on steps=0; the payload refuses it,
        # GPU_REAL_POSTPATCH lifts the refusal in the device's patched copy), then the payload as shipped
        bx = [(5, 10, 256), (32, 64, 256), (64, 128, 256)]
        return [
            dict(name="k_v2_dsd4_noext", tree="patched", env={"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"},
                 target="target-bigram", draft="draft-kvmean", threshold=4, bench=bx, ready_max=200, need_s=60,
                 nofb=True),
            dict(name="k_v2_dsd4", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bx, switch=True, ready_max=150, need_s=60, nofb=True),
        ]
    if version == "014g":
        # 0.5.14's default launch (EAGLEWorkerV2, overlap scheduler): the payload's steps=0 runtime state
        bk = [(1, 4, 256), (4, 8, 256), (5, 10, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)]
        bt = [(1, 4, 256), (4, 8, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)]
        return [
            dict(name="k_v2_dsd4", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bk, switch=True, ready_max=240, need_s=100, nofb=True),
            dict(name="k_v2_spec", tree="pristine", env={}, target="target-bigram", draft="draft-kvmean",
                 bench=bk, switch=True, ready_max=200, need_s=90, nofb=True),
            dict(name="g_nospec", tree="pristine", env={}, target="target-bigram", draft=None, bench=bk,
                 switch=True, ready_max=150, need_s=70, nofb=True),
            dict(name="t_v2_dsd4", tree="patched", env={}, target="target", draft="draft-perfect", threshold=4,
                 bench=bt, ready_max=150, need_s=75, nofb=True),
            dict(name="t_v2_spec", tree="pristine", env={}, target="target", draft="draft-perfect",
                 bench=bt, ready_max=150, need_s=70, nofb=True),
            dict(name="t_nospec", tree="pristine", env={}, target="target", draft=None,
                 bench=bt, ready_max=150, need_s=60, nofb=True),
        ]
    if version in ("014w", "012w", "012v", "014wt", "012wt", "014wm"):
        # the 8b shape (make_models.py --shape 8b, in WORK/models8b): the same bigram target and
        # draft-kvmean at Llama-3-8B's width and depth, so that a decode step is GPU-bound as with
        # real models; *wt: the draft that pays (constant target + draft-perfect, accept 4);
        # 012w/012wt: 0.5.12's v1 worker (SGLANG_ENABLE_SPEC_V2=0 for every server); 012v: 0.5.12's
        # default EAGLEWorkerV2 (no SGLANG_ENABLE_SPEC_V2 anywhere), the payload's own skipped step there
        env = {"SGLANG_ENABLE_SPEC_V2": "0"} if version in ("012w", "012wt") else {}
        wk = "v1" if env else "v2"
        m = dict(models="models8b", nofb=True)
        if version.endswith(("wt", "wm")):
            bt = [(1, 4, 256), (4, 8, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)]
            if version.endswith("wm"):  # the least that shows a mixed load: low and high phases
                bt = [(1, 4, 256), (4, 8, 256), (64, 128, 256)]
            return [
                dict(name=f"t8_{wk}_dsd4", tree="patched", env=env, target="target", draft="draft-perfect",
                     threshold=4, bench=bt, ready_max=240, need_s=90, **m),
                dict(name=f"t8_{wk}_spec", tree="pristine", env=env, target="target", draft="draft-perfect",
                     bench=bt, ready_max=200, need_s=60, **m),
                dict(name="t8_nospec", tree="pristine", env={}, target="target", draft=None, bench=bt,
                     ready_max=150, need_s=55, **m),
            ]
        bw = [(1, 4, 256), (4, 8, 256), (5, 10, 256), (16, 32, 256), (64, 128, 256)]
        return [
            dict(name=f"k8_{wk}_dsd4", tree="patched", env=env, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bw, switch=True, ready_max=240, need_s=120, **m),
            dict(name="g8_nospec", tree="pristine", env={}, target="target-bigram", draft=None, bench=bw,
                 ready_max=150, need_s=80, **m),
            dict(name=f"k8_{wk}_spec", tree="pristine", env=env, target="target-bigram", draft="draft-kvmean",
                 bench=bw, ready_max=200, need_s=90, **m),
        ]
    if version == "014wx":
        # the 8b shape: the DECODE-graph skip's outputs and acceptance after re-enable (switch test,
        # samples against stock spec-off's), and the ceiling of a deferred draft extend: the payload
        # with SGLang's SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 (no draft extend on skipped steps;
        # needs GPU_REAL_POSTPATCH="python3 $PWD/gpu/lift_skip_refusal.py"; draft KV left with holes)
        m = dict(models="models8b", nofb=True)
        bw = [(1, 4, 256), (4, 8, 256), (5, 10, 256), (16, 32, 256), (64, 128, 256)]
        bx = [(5, 10, 256), (16, 32, 256), (64, 128, 256)]
        return [
            dict(name="k8_v2_dsd4", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bw, switch=True, ready_max=240, need_s=120, **m),
            dict(name="g8_nospec", tree="pristine", env={}, target="target-bigram", draft=None, bench=bw,
                 ready_max=150, need_s=80, **m),
            dict(name="k8_v2_dsd4_noext", tree="patched", env={"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"},
                 target="target-bigram", draft="draft-kvmean", threshold=4, bench=bx, ready_max=200, need_s=70, **m),
            dict(name="k8_v2_spec", tree="pristine", env={}, target="target-bigram", draft="draft-kvmean",
                 bench=bw[:2], ready_max=200, need_s=60, **m),
        ]
    if version == "014wd":
        # the 8b shape: the deferred draft extend (skipped steps keep the token and target hidden
        # state of each position; one batched draft extend every 16 skipped steps and before drafting
        # resumes): switch test (acceptance after re-enable), samples against stock spec-off's, flap,
        # and the bench on both sides of the threshold
        m = dict(models="models8b", nofb=True)
        bw = [(1, 4, 256), (4, 8, 256), (5, 10, 256), (16, 32, 256), (64, 128, 256)]
        return [
            dict(name="k8_v2_dsd4", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bw, switch=True, ready_max=240, need_s=120, **m),
            dict(name="g8_nospec", tree="pristine", env={}, target="target-bigram", draft=None, bench=bw,
                 ready_max=150, need_s=80, **m),
            dict(name="k8_v2_dsd4_flap", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=[], flap=True, ready_max=200, need_s=70, **m),
        ]
    if version == "012vl":
        # 0.5.12's default EAGLEWorkerV2 (as 012v) with passes 2x as long above the threshold (4xC
        # requests): payload, stock spec-off, then stock spec-on below the threshold only (C = 1, 4)
        m = dict(models="models8b", nofb=True)
        lo = [(1, 4, 256), (4, 16, 256)]
        bl = [(5, 20, 256), (16, 64, 256), (64, 256, 256)]
        return [
            dict(name="k8_v2_dsd4", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=lo + bl, ready_max=240, need_s=110, **m),
            dict(name="g8_nospec", tree="pristine", env={}, target="target-bigram", draft=None, bench=bl,
                 ready_max=150, need_s=70, **m),
            dict(name="k8_v2_spec", tree="pristine", env={}, target="target-bigram", draft="draft-kvmean",
                 bench=lo, ready_max=200, need_s=60, **m),
        ]
    if version == "012vwt":
        # 0.5.12's default EAGLEWorkerV2 (no SGLANG_ENABLE_SPEC_V2 for any server, as 012v) with the
        # draft that pays (constant target + draft-perfect, accept 4): payload (threshold 4), stock
        # spec-off, stock spec-on at C = 1, 4, 64 (014wm's shape) and one mixed load each (a low part,
        # then a high one); then a flap test on a second payload server (bigram target + draft-kvmean,
        # 12 bursts under one long request) and, as its reference, stock spec-off's long request alone.
        # (named *wt, not 012vt: device_run.sh builds the 8b models for plans ending in wt, not vt)
        m = dict(models="models8b", nofb=True)
        bt = [(1, 4, 256), (4, 8, 256), (64, 128, 256)]
        mixed = [(4, 32, 256), (64, 256, 256)]
        return [
            dict(name="t8_v2_dsd4", tree="patched", env={}, target="target", draft="draft-perfect", threshold=4,
                 bench=bt, mixed=mixed, ready_max=240, need_s=90, **m),
            dict(name="t8_nospec", tree="pristine", env={}, target="target", draft=None, bench=bt, mixed=mixed,
                 ready_max=150, need_s=70, **m),
            dict(name="t8_v2_spec", tree="pristine", env={}, target="target", draft="draft-perfect", bench=bt,
                 mixed=mixed, ready_max=200, need_s=70, **m),
            dict(name="k8_v2_dsd4_flap", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=[], flap=True, flap_cycles=12, ready_max=200, need_s=75, **m),
            dict(name="g8_nospec_ref", tree="pristine", env={}, target="target-bigram", draft=None, bench=[],
                 flap=True, flap_cycles=0, ready_max=150, need_s=55, **m),
        ]
    if version in ("014wl", "014wl2"):
        # the deferred draft extend's throughput above the threshold with passes 2x as long (4xC requests);
        # wl2: payload, spec-off, payload, spec-off (alternating, for the spread between two starts)
        m = dict(models="models8b", nofb=True)
        bl = [(5, 20, 256), (16, 64, 256), (64, 256, 256)]
        ph = [
            dict(name="k8_v2_dsd4", tree="patched", env={}, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=bl, ready_max=240, need_s=100, **m),
            dict(name="g8_nospec", tree="pristine", env={}, target="target-bigram", draft=None, bench=bl,
                 ready_max=150, need_s=70, **m),
        ]
        if version == "014wl2":
            ph += [dict(p, name=p["name"] + "_2") for p in ph]
        return ph
    if version in ("014wc", "012vwc"):
        # a draft that pays (constant target + draft-perfect, accept 4 while speculating) on the 8b
        # shape up to 256 running requests: where stock spec-off overtakes stock spec-on (if it does),
        # then the payload with its threshold at that crossover ("auto": the largest C where stock
        # spec-on was at least as fast), and one mixed load on every server (a low phase, then a high).
        # 012vwc: the same on 0.5.12's default EAGLEWorkerV2 (env {} everywhere, no SGLANG_ENABLE_SPEC_V2;
        # named *wc so that device_run.sh builds the 8b models for it)
        m = dict(models="models8b", nofb=True, extra=["--max-running-requests", "256", "--cuda-graph-max-bs", "256"])
        bc = [(4, 8, 256), (64, 64, 256), (128, 128, 256), (192, 192, 256), (256, 256, 256)]
        mixed = [(4, 32, 256), (256, 512, 256)]
        return [
            dict(name="t8_v2_spec", tree="pristine", env={}, target="target", draft="draft-perfect", bench=bc,
                 mixed=mixed, ready_max=240, need_s=100, **m),
            dict(name="t8_nospec", tree="pristine", env={}, target="target", draft=None, bench=bc, mixed=mixed,
                 ready_max=200, need_s=80, **m),
            dict(name="t8_v2_dsdauto", tree="patched", env={}, target="target", draft="draft-perfect",
                 threshold="auto", bench=bc, mixed=mixed, ready_max=240, need_s=100, **m),
        ]
    if version in ("014p", "012p"):
        # where a step's time goes on the 8b shape at 64 running requests: SGLang's torch profiler
        # over 20 steps of the payload (skipping), stock spec-off and stock spec-on
        env = {"SGLANG_ENABLE_SPEC_V2": "0"} if version.startswith("012") else {}
        wk = "v1" if version.startswith("012") else "v2"
        m = dict(models="models8b", nofb=True, profile=(64, 128, 256), bench=[])
        return [
            dict(name=f"k8_{wk}_dsd4_prof", tree="patched", env=env, target="target-bigram", draft="draft-kvmean",
                 threshold=4, ready_max=240, need_s=90, **m),
            dict(name="g8_nospec_prof", tree="pristine", env={}, target="target-bigram", draft=None,
                 ready_max=150, need_s=70, **m),
            dict(name=f"k8_{wk}_spec_prof", tree="pristine", env=env, target="target-bigram", draft="draft-kvmean",
                 ready_max=200, need_s=70, **m),
        ]
    if version == "012f":
        # flap: many on/off switches under one long request; nograph: where the skipped step's
        # time goes (stock spec-on and spec-off with CUDA graphs off, against the payload's skip).
        b4 = [(1, 4, 256), (8, 16, 256), (32, 64, 256), (64, 128, 256)]
        ng = ["--disable-cuda-graph"]
        return [
            dict(name="k_v1_dsd4_flap", tree="patched", env=v1, target="target-bigram", draft="draft-kvmean",
                 threshold=4, bench=[(8, 16, 256), (32, 64, 256)], flap=True, ready_max=200, need_s=100),
            dict(name="g_nospec_nograph", tree="pristine", env=v1, target="target-bigram", draft=None, bench=b4,
                 extra=ng, ready_max=150, need_s=60),
            dict(name="k_v1_spec_nograph", tree="pristine", env=v1, target="target-bigram", draft="draft-kvmean",
                 bench=b4, extra=ng, ready_max=150, need_s=70),
            dict(name="k_v1_dsd16", tree="patched", env=v1, target="target-bigram", draft="draft-kvmean",
                 threshold=16, bench=[(16, 32, 256), (17, 34, 256), (32, 64, 256)], ready_max=150, need_s=80),
        ]
    if version == "014":
        return [
            dict(name="a_v2_spec", tree="pristine", env={}, draft="draft-perfect", bench=bench_std,
                 ready_max=330, need_s=120),
            dict(name="c_v2_dsd4", tree="patched", env={}, draft="draft-perfect", threshold=4,
                 bench=bench_std, ready_max=200, need_s=70),
            dict(name="e_nospec", tree="patched", env={}, draft=None, bench=bench_std,
                 ready_max=150, need_s=50),
            dict(name="g_v2_nooverlap_dsd4", tree="patched", env={}, draft="draft-perfect", threshold=4,
                 extra=["--disable-overlap-schedule"], bench=bench_std, ready_max=150, need_s=60),
        ]
    raise SystemExit(f"no plan for {version}")


def http(method, url, payload=None, timeout=120):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    try:
        return json.loads(body)
    except Exception:
        return body.decode(errors="replace")


def gpu_apps():
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
        return [l.strip() for l in out.splitlines() if l.strip()]
    except Exception as e:
        return [f"nvidia-smi failed: {e}"]


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


DECODE_RE = re.compile(r"Decode batch[^\n]*?#running-req: (\d+)[^\n]*")


def parse_log(text):
    info = {}
    lines = text.splitlines()
    info["probe"] = [l for l in lines if "[gpu-real probe]" in l][:8]
    info["marker"] = [l for l in lines if "Dynamic speculation disable enabled" in l][:8]
    info["dsd_lines"] = [l[-300:] for l in lines if "Dynamic speculation disable:" in l][:40]
    info["dsd_lines_n"] = sum(1 for l in lines if "Dynamic speculation disable:" in l)
    info["spec_v_lines"] = [l[-220:] for l in lines if re.search(r"Spec v[12] ", l) or "SPEC_V2" in l][:6]
    info["adaptive_lines"] = [l[-220:] for l in lines if "adaptive runtime state" in l][:20]
    info["errors"] = [l[-400:] for l in lines if re.search(r"Traceback|Error|error:|Exception", l)][:30]
    m = re.search(r"server_args=ServerArgs\((.*)", text)
    sa = {}
    if m:
        s = m.group(1)
        for key in ("disable_overlap_schedule", "speculative_algorithm", "speculative_disable_batch_threshold",
                    "attention_backend", "speculative_draft_attention_backend", "sampling_backend",
                    "max_running_requests", "cuda_graph_max_bs", "disable_cuda_graph", "speculative_num_steps",
                    "speculative_eagle_topk", "speculative_num_draft_tokens", "enable_overlap_schedule"):
            mm = re.search(r"\b" + key + r"=([^,)]+)", s)
            if mm:
                sa[key] = mm.group(1)
    else:
        m2 = re.search(r"server_args=(\{.*)", text)
        if m2:
            for key in ("disable_overlap_schedule", "speculative_disable_batch_threshold", "attention_backend"):
                mm = re.search(r"'" + key + r"': ([^,}]+)", m2.group(1))
                if mm:
                    sa[key] = mm.group(1)
    info["server_args"] = sa
    dec = []
    for l in lines:
        if "Decode batch" not in l:
            continue
        d = {}
        for k, rx in (("run", r"#running-req: (\d+)"), ("accept_len", r"accept len: ([\d.]+)"),
                      ("gen_tps", r"gen throughput \(token/s\): ([\d.]+)"), ("cuda_graph", r"cuda graph: (\w+)")):
            mm = re.search(rx, l)
            if mm:
                d[k] = mm.group(1)
        dec.append(d)
    info["decode_lines_n"] = len(dec)
    buckets = {}
    for d in dec:
        if "run" not in d:
            continue
        r = int(d["run"])
        b = "1" if r == 1 else ("2-4" if r <= 4 else ("5-16" if r <= 16 else "17+"))
        e = buckets.setdefault(b, {"n": 0, "accept_len": [], "gen_tps": [], "cuda_graph": set()})
        e["n"] += 1
        if "accept_len" in d:
            e["accept_len"].append(float(d["accept_len"]))
        if "gen_tps" in d:
            e["gen_tps"].append(float(d["gen_tps"]))
        if "cuda_graph" in d:
            e["cuda_graph"].add(d["cuda_graph"])
    for b, e in buckets.items():
        al, gt = e.pop("accept_len"), e.pop("gen_tps")
        e["accept_len_mean"] = round(sum(al) / len(al), 3) if al else None
        e["accept_len_min_max"] = [min(al), max(al)] if al else None
        e["gen_tps_max"] = max(gt) if gt else None
        e["cuda_graph"] = sorted(e["cuda_graph"])
    info["decode_by_running_req"] = buckets
    info["decode_samples"] = [l[-260:] for l in lines if "Decode batch" in l][-6:]
    return info


class Server:
    def __init__(self, name, argv, env, log_path):
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_path
        self.proc = None

    def start(self):
        self.logf = open(self.log_path, "w")
        self.t0 = time.time()
        self.proc = subprocess.Popen(self.argv, stdout=self.logf, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True, cwd="/tmp")

    def wait_ready(self, port, deadline):
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return "exited"
            if READY in read(self.log_path):
                try:
                    http("GET", f"http://127.0.0.1:{port}/get_model_info", timeout=10)
                    return "ready"
                except Exception:
                    pass
            time.sleep(1)
        return "timeout"

    def stop(self):
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)  # SGLang's launch_server often ignores SIGTERM for >20 s
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        else:  # the server exited by itself: its children may still be in its group
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.logf.close()
        for _ in range(30):  # wait for the GPU memory to be released
            if not [a for a in gpu_apps() if not a.startswith("nvidia-smi failed")]:
                break
            time.sleep(1)
        return self.proc.returncode


PROMPT_WORDS = "the quick brown fox jumps over the lazy dog and the draft model proposes tokens".split()


def prompt(i, n_words=24):
    return f"request {i}: " + " ".join(PROMPT_WORDS[(i + j) % len(PROMPT_WORDS)] for j in range(n_words))


def generate(port, i, max_new, timeout=300):
    t = time.time()
    r = http("POST", f"http://127.0.0.1:{port}/generate",
             {"text": prompt(i), "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}},
             timeout=timeout)
    return r, time.time() - t


def bench(port, conc, n, max_new, deadline):
    t0 = time.time()
    errs = []

    def one(i):
        if time.time() > deadline:
            return None
        try:
            return generate(port, 1000 + i, max_new)
        except Exception as e:
            errs.append(repr(e)[:300])
            return None

    with ThreadPoolExecutor(conc) as ex:
        res = [r for r in ex.map(one, range(n)) if r is not None]
    wall = time.time() - t0
    toks = sum(r["meta_info"].get("completion_tokens", 0) for r, _ in res)
    verify = sum(r["meta_info"].get("spec_verify_ct", 0) or 0 for r, _ in res)
    lats = sorted(l for _, l in res)
    return {
        "concurrency": conc, "requests": n, "completed": len(res), "max_new_tokens": max_new,
        "wall_s": round(wall, 3), "output_tokens": toks, "tok_per_s": round(toks / wall, 1) if wall else None,
        "accept_len_from_meta": round(toks / verify, 3) if verify else None,
        "spec_verify_ct": verify,
        "latency_s_p50": round(lats[len(lats) // 2], 3) if lats else None,
        "latency_s_max": round(lats[-1], 3) if lats else None,
        "errors": errs[:5],
        "distinct_texts": len({r["text"] for r, _ in res}),
    }


def mixed_load(port, parts, deadline):
    """One load in parts run back to back (e.g. a low-concurrency phase, then a high one), after one
    short warm-up pass per part: total output tokens over total wall, and each part's own numbers."""
    for conc, n, _ in parts:
        bench(port, conc, max(conc, n // 4), 64, deadline)
    rows = [bench(port, conc, n, max_new, deadline) for conc, n, max_new in parts]
    wall = sum(r["wall_s"] for r in rows)
    toks = sum(r["output_tokens"] for r in rows)
    return {"parts": rows, "wall_s": round(wall, 3), "output_tokens": toks,
            "tok_per_s": round(toks / wall, 1) if wall else None}


def auto_threshold(results):
    """The crossover of the stock servers measured before in this plan: the largest concurrency at
    which stock spec-on was at least as fast as stock spec-off (their bench rows), else 1."""
    rates = {}
    for rec in results["phases"]:
        if rec.get("tree") != "pristine":
            continue
        side = "on" if rec.get("draft") else "off"
        for b in rec.get("bench", []):
            if b.get("tok_per_s"):
                rates.setdefault(b["concurrency"], {})[side] = b["tok_per_s"]
    wins = [c for c, r in rates.items() if "on" in r and "off" in r and r["on"] >= r["off"]]
    t = max(wins) if wins else 1
    print(f"[drive] auto threshold {t} from {json.dumps(rates, sort_keys=True)}", flush=True)
    return t


def batched_samples(port, n, max_new):
    def one(i):
        try:
            r, lat = generate(port, i, max_new)
            mi = r.get("meta_info", {})
            return {"i": i, "text": r.get("text", ""), "completion_tokens": mi.get("completion_tokens"),
                    "spec_verify_ct": mi.get("spec_verify_ct")}
        except Exception as e:
            return {"i": i, "error": repr(e)[:300]}

    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


def switch_test(port, deadline):
    """One long request L alone (speculating), a burst of 32 more (running batch 33: above the
    threshold), L finishing alone, then L2 alone: the decode lines in between show accept len
    before disable, while disabled and after re-enable. L's text is compared across phases."""
    out = {"texts": {}}
    t0 = time.time()
    res = {}

    def long_req(key, i, max_new):
        try:
            r, lat = generate(port, i, max_new, timeout=max(30, deadline - time.time()))
            mi = r.get("meta_info", {})
            res[key] = {"completion_tokens": mi.get("completion_tokens"), "spec_verify_ct": mi.get("spec_verify_ct"),
                        "latency_s": round(lat, 3), "t_end": round(time.time() - t0, 3)}
            out["texts"][key] = r.get("text", "")
        except Exception as e:
            res[key] = {"error": repr(e)[:300]}

    import threading
    th = threading.Thread(target=long_req, args=("L", 500, 3000))
    th.start()
    time.sleep(1.0)
    out["burst_start_s"] = round(time.time() - t0, 3)
    b = batched_samples(port, 32, 200)
    out["burst_end_s"] = round(time.time() - t0, 3)
    out["burst_completed"] = sum(1 for x in b if "error" not in x)
    out["burst_errors"] = [x["error"] for x in b if "error" in x][:3]
    out["texts"]["burst"] = [x.get("text", "") for x in b]
    th.join(timeout=max(1, deadline - time.time()))
    long_req("L2", 501, 1000)
    out["L"], out["L2"] = res.get("L"), res.get("L2")
    for k in ("L", "L2"):
        v = res.get(k) or {}
        if v.get("spec_verify_ct"):
            v["tokens_per_verify"] = round(v["completion_tokens"] / v["spec_verify_ct"], 3)
    out["wall_s"] = round(time.time() - t0, 3)
    return out


def flap_test(port, deadline, cycles=8):
    """One long request L (the switch test's prompt 500, 3000 tokens) while bursts of 8 short
    requests come and go: the running batch crosses the threshold 2*cycles times under L.
    cycles=0: L alone (a stock server's reference text for L)."""
    import threading
    out = {"texts": {}, "bursts": []}
    res = {}
    t0 = time.time()

    def long_req():
        try:
            r, lat = generate(port, 500, 3000, timeout=max(30, deadline - time.time()))
            mi = r.get("meta_info", {})
            res["L"] = {"completion_tokens": mi.get("completion_tokens"), "spec_verify_ct": mi.get("spec_verify_ct"),
                        "latency_s": round(lat, 3)}
            out["texts"]["L"] = r.get("text", "")
        except Exception as e:
            res["L"] = {"error": repr(e)[:300]}

    th = threading.Thread(target=long_req)
    th.start()
    time.sleep(0.5)
    for c in range(cycles):
        if not th.is_alive() or time.time() > deadline:
            break
        tb = time.time()
        b = batched_samples(port, 8, 60)
        out["bursts"].append({"start_s": round(tb - t0, 3), "wall_s": round(time.time() - tb, 3),
                              "completed": sum(1 for x in b if "error" not in x)})
        time.sleep(0.25)
    th.join(timeout=max(1, deadline - time.time()))
    out["L"] = res.get("L")
    out["wall_s"] = round(time.time() - t0, 3)
    return out


def timeline(text):
    """Decode lines in order, run-length grouped by whether #running-req is above 4."""
    segs = []
    for l in text.splitlines():
        if "Decode batch" not in l:
            continue
        m = re.search(r"#running-req: (\d+)", l)
        a = re.search(r"accept len: ([\d.]+)", l)
        g = re.search(r"gen throughput \(token/s\): ([\d.]+)", l)
        if not m:
            continue
        run = int(m.group(1))
        key = "run<=4" if run <= 4 else "run>4"
        if not segs or segs[-1]["key"] != key:
            segs.append({"key": key, "n": 0, "runs": [], "accept": [], "gen_tps": []})
        sg = segs[-1]
        sg["n"] += 1
        sg["runs"].append(run)
        if a:
            sg["accept"].append(float(a.group(1)))
        if g:
            sg["gen_tps"].append(float(g.group(1)))
    for sg in segs:
        r, a, g = sg.pop("runs"), sg.pop("accept"), sg.pop("gen_tps")
        sg["run_min_max"] = [min(r), max(r)]
        sg["accept_mean"] = round(sum(a) / len(a), 3) if a else None
        sg["accept_all"] = a[:40]
        sg["gen_tps_mean"] = round(sum(g) / len(g), 1) if g else None
    return segs


def profile_under_load(port, level, args, name):
    """A steady load at `level` (concurrency, requests, max_new), and SGLang's own torch profiler
    over 20 scheduler steps in the middle of it; the trace is summarised here (prof_summary.py)."""
    import glob
    import threading
    sys.path.insert(0, HERE)
    from prof_summary import load, summarise
    conc, n, max_new = level
    pdir = os.path.join(args.work, "prof", name)
    os.makedirs(pdir, exist_ok=True)
    bench(port, conc, conc, 32, args.deadline - 15)  # warm
    res = {}
    t = threading.Thread(target=lambda: res.update(bench=bench(port, conc, n, max_new, args.deadline - 15)))
    t.start()
    time.sleep(1.5)  # the load is running at full concurrency by now (device harness, not a test)
    try:
        res["start_profile"] = str(http("POST", f"http://127.0.0.1:{port}/start_profile",
                                        {"output_dir": pdir, "num_steps": 20, "activities": ["CPU", "GPU"]},
                                        timeout=60))[:300]
    except Exception as e:
        res["start_profile_error"] = repr(e)[:300]
    t.join()
    time.sleep(3)
    files = sorted(glob.glob(os.path.join(pdir, "**", "*.json*"), recursive=True))
    res["files"] = [os.path.basename(f) for f in files]
    for f in files[:2]:
        try:
            res.setdefault("summaries", []).append(summarise(load(f)))
        except Exception as e:
            res.setdefault("summaries", []).append({"error": repr(e)[:300]})
    print(f"[drive] {name}: profile {json.dumps(res)[:6000]}", flush=True)
    return res


def run_phase(ph, args, port, results):
    name = ph["name"]
    rec = {"name": name, "tree": ph["tree"], "env": ph["env"], "threshold": ph.get("threshold"), "target": ph.get("target"),
           "draft": ph.get("draft"), "expect_fail": ph.get("expect_fail", False)}
    results["phases"].append(rec)
    left = args.deadline - time.time()
    if left < ph["need_s"]:
        rec["status"] = f"skipped: {left:.0f}s left < {ph['need_s']}s needed"
        print(f"[drive] {name}: {rec['status']}", flush=True)
        return
    work = args.work
    pp = [os.path.join(work, "patched")] if ph["tree"] == "patched" else []
    pp += [os.path.join(work, "site"), os.path.join(HERE, "carry", "extra"), os.path.join(HERE, "shims"),
           os.path.join(HERE, "probe")]
    env = dict(os.environ)
    env.pop("SGLANG_ENABLE_SPEC_V2", None)
    env.update(ph["env"])
    env["PYTHONPATH"] = ":".join(pp)
    env["GPU_REAL_PROBE"] = "1"
    if args.act_fallback:
        env["GPU_REAL_ACT_FALLBACK"] = "1"
        rec["act_fallback"] = True
    models = os.path.join(work, ph.get("models", "models"))
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", os.path.join(models, ph.get("target", "target")),
            "--port", str(port)] + COMMON
    if ph.get("draft"):
        argv += SPEC + ["--speculative-draft-model-path", os.path.join(models, ph["draft"])]
    if ph.get("threshold") == "auto":
        ph = dict(ph, threshold=auto_threshold(results))
        rec["threshold"] = ph["threshold"]
    if ph.get("threshold"):
        argv += ["--speculative-disable-batch-threshold", str(ph["threshold"])]
    argv += ph.get("extra", []) + args.extra_flags
    rec["argv"] = " ".join(argv[1:])
    log_path = os.path.join(args.logs, f"srv_{name}.log")
    srv = Server(name, argv, env, log_path)
    print(f"[drive] {name}: start ({left:.0f}s left) {rec['argv']}", flush=True)
    srv.start()
    state = srv.wait_ready(port, min(args.deadline - 25, time.time() + ph["ready_max"]))
    rec["start_state"] = state
    rec["start_s"] = round(time.time() - srv.t0, 1)
    print(f"[drive] {name}: {state} after {rec['start_s']}s", flush=True)
    try:
        if state == "ready":
            if ph.get("switch") and args.deadline - time.time() > 40:
                off0 = os.path.getsize(log_path)
                rec["switch"] = switch_test(port, args.deadline - 20)
                rec["switch"]["log_timeline"] = timeline(read(log_path)[off0:])
                print(f"[drive] {name}: switch {json.dumps({k: v for k, v in rec['switch'].items() if k not in ('texts',)})[:3000]}", flush=True)
            if ph.get("flap") and args.deadline - time.time() > 40:
                off0 = os.path.getsize(log_path)
                rec["flap"] = flap_test(port, args.deadline - 20, ph.get("flap_cycles", 8))
                rec["flap"]["log_timeline"] = timeline(read(log_path)[off0:])
                print(f"[drive] {name}: flap {json.dumps({k: v for k, v in rec['flap'].items() if k not in ('texts',)})[:3000]}", flush=True)
            samples = []
            for i in range(8):  # sequential, greedy
                try:
                    r, lat = generate(port, i, 64)
                    mi = r.get("meta_info", {})
                    samples.append({"i": i, "text": r.get("text", ""), "completion_tokens": mi.get("completion_tokens"),
                                    "spec_verify_ct": mi.get("spec_verify_ct"), "latency_s": round(lat, 3)})
                except Exception as e:
                    samples.append({"i": i, "error": repr(e)[:300]})
            rec["samples"] = samples
            rec["samples_batched"] = batched_samples(port, 32, 64)  # 32 at once: above the threshold
            if ph.get("profile"):
                rec["profile"] = profile_under_load(port, ph["profile"], args, name)
            rec["bench"] = []
            for conc, n, max_new in ph.get("bench", []):
                if args.deadline - time.time() < 20:
                    rec["bench"].append({"concurrency": conc, "skipped": "time"})
                    continue
                warm = bench(port, conc, max(conc, n // 2), 64, args.deadline - 15)  # first-use JIT, graphs
                b = bench(port, conc, n, max_new, args.deadline - 15)
                b["warmup_tok_per_s"] = warm.get("tok_per_s")
                print(f"[drive] {name}: bench {json.dumps(b)}", flush=True)
                rec["bench"].append(b)
            if ph.get("mixed") and args.deadline - time.time() > 30:
                rec["mixed"] = mixed_load(port, ph["mixed"], args.deadline - 15)
                print(f"[drive] {name}: mixed {json.dumps(rec['mixed'])}", flush=True)
            try:
                si = http("GET", f"http://127.0.0.1:{port}/get_server_info", timeout=20)
                st = (si.get("internal_states") or [{}])[0] if isinstance(si, dict) else {}
                rec["server_info_avg_spec_accept_length"] = st.get("avg_spec_accept_length")
            except Exception as e:
                rec["server_info_error"] = repr(e)[:200]
    finally:
        rec["exit_code"] = srv.stop()
        rec["total_s"] = round(time.time() - srv.t0, 1)
    text = read(log_path)
    rec["log"] = parse_log(text)
    if state != "ready":
        rec["log_tail"] = text.splitlines()[-80:]
    print(f"[drive] {name}: done in {rec['total_s']}s, exit {rec['exit_code']}; probe={rec['log']['probe'][:1]} "
          f"marker={rec['log']['marker'][:1]} server_args={rec['log']['server_args']}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, required=True)
    ap.add_argument("--only", default="", help="comma-separated phase names")
    ap.add_argument("--extra-flags", default="", help="appended to every launch")
    args = ap.parse_args()
    args.extra_flags = args.extra_flags.split() if args.extra_flags else []
    args.logs = os.path.join(args.work, "logs")
    os.makedirs(args.logs, exist_ok=True)
    args.act_fallback = False
    results = {"plan": args.plan, "started": time.time(), "phases": []}
    plan = plan_for(args.plan)
    if args.only:
        keep = set(args.only.split(","))
        plan = [p for p in plan if p["name"] in keep]
    port = 30000
    fallback_used = False
    act_fallback_used = False
    queue = list(plan)
    while queue:
        ph = queue.pop(0)
        try:
            run_phase(ph, args, port, results)
        except Exception as e:
            results["phases"][-1]["driver_error"] = repr(e)[:500]
            print(f"[drive] {ph['name']}: driver error {e!r}", flush=True)
        port += 1
        rec = results["phases"][-1]
        # one fallback: a start that dies in CUDA graph capture is retried (and every later
        # phase run) with --disable-cuda-graph, so that the rest of the plan still teaches us
        errs = " ".join(rec.get("log", {}).get("errors", []) + rec.get("log_tail", [])[-30:])
        if (not fallback_used and not ph.get("expect_fail") and not ph.get("nofb") and rec.get("start_state") in ("exited", "timeout")
                and re.search(r"[Cc][Uu][Dd][Aa] ?[Gg]raph|cuda_graph|capture", errs)
                and not re.search(r"Ninja build failed|ModuleNotFoundError|ImportError|No such file", errs)):
            fallback_used = True
            args.extra_flags.append("--disable-cuda-graph")
            results["fallback"] = f"--disable-cuda-graph after {ph['name']} failed"
            print(f"[drive] {ph['name']}: CUDA-graph failure; retrying with --disable-cuda-graph", flush=True)
            queue.insert(0, dict(ph, name=ph["name"] + "_nograph"))
        elif (not act_fallback_used and not ph.get("expect_fail") and rec.get("start_state") in ("exited", "timeout")
              and re.search(r"jit_activation|activation\.cuh", read(os.path.join(args.logs, f"srv_{ph['name']}.log")))):
            act_fallback_used = True
            args.act_fallback = True
            results["act_fallback"] = f"sgl_kernel.silu_and_mul instead of the JIT one after {ph['name']} failed"
            print(f"[drive] {ph['name']}: JIT activation kernel failed; retrying with the prebuilt one", flush=True)
            queue.insert(0, dict(ph, name=ph["name"] + "_actfb"))
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
        subprocess.run(f"cd {args.logs} && tar czf {args.out}/srv_logs.tgz srv_*.log", shell=True)
    results["finished"] = time.time()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
