#!/bin/bash
# Runs ON THE GPU MACHINE (device `run`), from the repository root:
#   bash gpu/device_run.sh 012 [PLAN]    PLAN: 012 (default), 012k, 012f, 012g, 014g, 014q (see drive.py)
# Needs gpu/carry/site<VER>.tar.xz (see build_carry.sh), carried with
# carry=["gpu/carry"]. Unpacks SGLang + trimmed sgl_kernel + deps into /tmp/w/site,
# builds the tiny models, makes a patched copy of the SGLang tree (playbook diffs, sha256
# checked), compiles the JIT kernels, then drive.py runs the server phases. Everything useful
# lands in $OUT (log, results.json, srv_logs.tgz, cache_tvm-ffi.tgz, cache_triton.tgz). Copy the
# two cache tarballs into carry/cache/ for the next call: restored here, they save the JIT builds.
set -u
VER=${1:-012}
PLAN=${2:-$VER}
HERE=$(cd "$(dirname "$0")" && pwd)
T0=$(date +%s)
BUDGET=${GPU_REAL_BUDGET:-535}   # seconds from start until drive.py must be done
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-real-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
# single GPU; keep NVLink multicast off anyway, as the workplace asks
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 SGLANG_DISABLE_REQUEST_LOGGING=1
W=/tmp/w
export TRITON_CACHE_DIR=$W/cache/triton TVM_FFI_CACHE_DIR=$W/cache/tvm-ffi
mkdir -p $W $TRITON_CACHE_DIR $TVM_FFI_CACHE_DIR

echo "== env $(date -u +%FT%TZ) ver=$VER plan=$PLAN"
uname -a; nproc; free -g | head -2; df -h /tmp | tail -1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
command -v python3 nvcc gcc g++ c++ ninja patch xz
nvcc --version 2>&1 | tail -2; c++ --version 2>&1 | head -1
python3 -V
python3 -m pip list 2>/dev/null | tr -s " " | paste -sd" " | fold -w 4000
ldconfig -p | grep -E "libnuma.so|libcuda.so.1" | head -3
echo "carry:"; ls -la "$HERE/carry"

echo "== unpack"
t=$(date +%s); tar xJf "$HERE/carry/site$VER.tar.xz" -C $W || { echo "UNPACK FAILED"; exit 3; }
echo "unpacked in $(( $(date +%s) - t ))s: $(du -sh $W/site | cut -f1)"
if ! ldconfig -p | grep -q "libnuma.so.1 "; then
  echo "libnuma.so.1 not in ldconfig: using the carried one"
  export LD_LIBRARY_PATH=$HERE/carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
python3 - <<'EOF'
import typing_extensions, importlib.metadata as md
print("device typing_extensions", md.version("typing_extensions"))
EOF

if [ -d "$HERE/carry/cache" ]; then   # kernel caches brought back from an earlier call (same paths)
  for c in "$HERE"/carry/cache/cache_*.tgz; do [ -f "$c" ] && tar xzf "$c" -C $W/cache && echo "restored $(basename $c)"; done
fi

echo "== models"
python3 "$HERE/make_models.py" --out $W/models || exit 4
case $PLAN in *w|*v|*vl|*wt|*wm|*wx|*wd|*wl|*wl2|*wc|*p)   # the 8b shape (~14 GB of shared zero layers, written once)
  if [ -f $W/models8b/.done ]; then echo "8b models kept from the call before (warm machine)"; else
  rm -rf $W/models8b; t=$(date +%s); python3 "$HERE/make_models.py" --shape 8b --out $W/models8b || exit 4
  touch $W/models8b/.done; echo "8b models in $(( $(date +%s) - t ))s: $(du -shL $W/models8b/target-bigram | cut -f1)"; fi;;
esac

echo "== patch (playbook dynamic-spec-disable, release $VER)"
python3 "$HERE/apply_patch.py" --ver "$VER" --site $W/site --dest $W/patched --patches "$HERE/carry/patches" || echo "PATCH STEP FAILED"
# an experiment's own edit of the patched copy (plan 014x), never of the playbook's diffs
[ -n "${GPU_REAL_POSTPATCH:-}" ] && { echo "== post-patch: $GPU_REAL_POSTPATCH"; (cd $W/patched && eval "$GPU_REAL_POSTPATCH") || echo "POST-PATCH FAILED"; }

export PYTHONPATH=$W/site:$HERE/carry/extra:$HERE/shims:$HERE/probe
# quick load checks and the JIT prewarm run in the background while the first server starts
(python3 - <<'EOF2'
import time, importlib, traceback
t0 = time.time()
import torch
try:
    print("[check] torch", torch.__version__, torch.version.cuda, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0), flush=True)
except Exception as e:
    print("[check] torch cuda:", repr(e), flush=True)
for name in ["sgl_kernel", "sgl_kernel.elementwise", "flashinfer", "sglang.srt.speculative.eagle_worker", "sglang.srt.managers.scheduler", "sglang.srt.entrypoints.http_server", "transformers", "tokenizers", "tvm_ffi", "zmq", "pydantic", "fastapi"]:
    t = time.time()
    try:
        m = importlib.import_module(name)
        print(f"[check] import {name} OK {time.time()-t:.1f}s {getattr(m, '__version__', '')} {getattr(m, '__file__', '')}", flush=True)
    except Exception as e:
        print(f"[check] import {name} FAILED {type(e).__name__}: {str(e)[:3000]}", flush=True)
        traceback.print_exc(limit=4)
print(f"[check] done in {time.time()-t0:.1f}s", flush=True)
EOF2
) &
BG1=$!
(timeout 200 python3 "$HERE/prewarm_jit.py" || echo "[prewarm] exit $?") &
BG2=$!

echo "== phases ($(( $(date +%s) - T0 ))s used)"
python3 "$HERE/drive.py" --plan "$PLAN" --work $W --out "$OUT" --deadline $(( T0 + BUDGET )) ${GPU_REAL_ONLY:+--only $GPU_REAL_ONLY} ${GPU_REAL_EXTRA:+--extra-flags "$GPU_REAL_EXTRA"}
wait $BG1 $BG2 2>/dev/null
echo "== end: $(( $(date +%s) - T0 ))s; caches: $(du -sh $W/cache/* 2>/dev/null | tr '\n' ' ')"
# at most 8 files come back: the server logs are one tarball (drive.py keeps them in $W/logs), and bring the kernel
# caches (same paths next time) back when they are small
(cd $W/logs 2>/dev/null && tar czf "$OUT/srv_logs.tgz" srv_*.log)
for c in tvm-ffi triton; do
  tar czf "$OUT/cache_$c.tgz" -C $W/cache "$c" 2>/dev/null
  [ "$(stat -c %s "$OUT/cache_$c.tgz" 2>/dev/null || echo 0)" -gt 15000000 ] && rm -f "$OUT/cache_$c.tgz"
done
ls -la "$OUT"
