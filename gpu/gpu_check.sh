#!/bin/bash
# Runs ON THE GPU MACHINE (device `run`), from the repository root: `fleetctl gpu-check` as a user runs it,
# through the inventory's `connection: local` (the image has no sshd), against the device's own SGLang
# 0.5.14 install (the carried site, unpacked as device_run.sh does): deploy the playbook, gpu-check
# --check, gpu-check (the table; its JSON rows in the run log), rollback. Everything fleetctl made is
# removed by fleetctl; this script's own files are under /tmp/w. Wall time: kept under 6 minutes.
#
#   CPU machine: FL_ONLY=1 bash gpu/build_carry.sh 014   (after a full `bash gpu/build_carry.sh 014`)
#   device call: command "bash gpu/gpu_check.sh", carry ["gpu/carry/site014.tar.xz", "gpu/carry/extra",
#                "gpu/carry/flwheels", "gpu/carry/flcache", "gpu/carry/cache"]   (~64 MB; cache/ optional)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=${OUT:-/tmp/gpu-check-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=/tmp/w; rm -rf $W /tmp/fldeps; mkdir -p $W/cache   # a warm machine keeps /tmp from the last call
export TRITON_CACHE_DIR=$W/cache/triton TVM_FFI_CACHE_DIR=$W/cache/tvm-ffi
export FLEETCTL_STATE_DIR=$W/controller FLEETCTL_CACHE_DIR=$W/flcache COLUMNS=160
T0=$(date +%s)
left() { echo $(( ${GPU_CHECK_BUDGET:-350} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
tar xJf "$HERE/carry/site014.tar.xz" -C $W || exit 3
for c in "$HERE"/carry/cache/cache_*.tgz; do [ -f "$c" ] && tar xzf "$c" -C $W/cache; done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fldeps ${FLWHEELS:-$HERE/carry/flwheels}/*.whl || exit 5
cp -r "$HERE/carry/flcache" $W/flcache   # the pristine sglang wheel deploy checks the installed files against
SP=$W/site:$HERE/carry/extra:$HERE/shims:$HERE/probe:/tmp/fldeps
(PYTHONPATH=$SP timeout 150 python3 "$HERE/prewarm_jit.py" > $W/prewarm.log 2>&1 &)  # JIT kernels, beside
PY=$(command -v python3)
cat > $W/inventory.yaml <<EOF
# the device itself, through the local transport (no sshd on the image)
hosts:
  gpu0:
    address: 127.0.0.1
    connection: local
    python: $PY
    state_dir: $W/state
    gpus: 1
    env:
      PYTHONPATH: "$SP"
      HF_HUB_OFFLINE: "1"
      TRANSFORMERS_OFFLINE: "1"
      TRITON_CACHE_DIR: "$TRITON_CACHE_DIR"
      TVM_FFI_CACHE_DIR: "$TVM_FFI_CACHE_DIR"
      GPU_REAL_NO_FI_NORM: "1"
      NCCL_NVLS_ENABLE: "0"
      TORCH_SYMM_MEM_DISABLE_MULTICAST: "1"
      NVSHMEM_DISABLE_NVLS: "1"
    # what this image needs (docs/gpu-verified.md): no FA3 .so, no xgrammar, no piecewise graphs
    flags:
      --attention-backend: triton
      --sampling-backend: pytorch
      --grammar-backend: none
      --disable-piecewise-cuda-graph: true
      --mem-fraction-static: 0.5
      --max-total-tokens: 131072
      --max-running-requests: 80
      --cuda-graph-max-bs: 64
      --decode-log-interval: 10
EOF
FL() { PYTHONPATH=$ROOT:/tmp/fldeps:$W/site:$HERE/carry/extra python3 -m fleetctl "$@"; }
PB=$ROOT/playbooks/dynamic-spec-disable
echo "== setup $(( $(date +%s) - T0 ))s"
FL facts -i $W/inventory.yaml; echo "== facts rc=$? at $(( $(date +%s) - T0 ))s"
FL deploy "$PB" -i $W/inventory.yaml; echo "== deploy rc=$? at $(( $(date +%s) - T0 ))s"
FL gpu-check "$PB" -i $W/inventory.yaml --check; echo "== gpu-check --check rc=$? at $(( $(date +%s) - T0 ))s"
# one run: the table here, the JSON rows in the run log ($OUT/gpu_check.jsonl); bounded by what is left
# (SIGINT first: fleetctl's Ctrl-C path stops the throwaway servers and removes its work dir)
B=$(left); [ "$B" -gt 60 ] || B=60
PYTHONPATH=$ROOT:/tmp/fldeps:$W/site:$HERE/carry/extra timeout -s INT -k 40 $B \
  python3 -m fleetctl gpu-check "$PB" -i $W/inventory.yaml --timeout 180 --log-file $OUT/gpu_check.jsonl
echo "== gpu-check rc=$? at $(( $(date +%s) - T0 ))s"
FL rollback -i $W/inventory.yaml; echo "== rollback rc=$? at $(( $(date +%s) - T0 ))s"
ls -d /tmp/fleetctl-gpucheck-* 2>/dev/null && echo "LEFT BEHIND (above)" || echo "no gpu-check work dir left in /tmp"
nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
ls -la "$OUT"
