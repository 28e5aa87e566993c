#!/bin/bash
# Runs ON THE GPU MACHINE, from the repository root: fleetctl's own ops (local transport, no sshd)
# against the real SGLang 0.5.12 install: deploy -> launch -> verify-logs -> requests -> stop -> rollback.
#   FL_TIMEOUT=150 bash gpu/device_fl.sh      carry=["gpu/carry"] without carry/cache
#   (carry/ with cache/ is over the 64 MiB limit; build the fl parts with FL=1 build_carry.sh 012)
# Needs carry/site012.tar.xz, carry/fleetctl/ (fleetctl + the playbook), carry/flwheels/ (paramiko and
# its deps), carry/flcache/wheels/sglang-0.5.12-*.whl (fleetctl's pristine-bytes cache; no registry there).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-real-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=/tmp/w; mkdir -p $W/cache
export TRITON_CACHE_DIR=$W/cache/triton TVM_FFI_CACHE_DIR=$W/cache/tvm-ffi
T0=$(date +%s)
tar xJf "$HERE/carry/site012.tar.xz" -C $W || exit 3
for c in "$HERE"/carry/cache/cache_*.tgz; do [ -f "$c" ] && tar xzf "$c" -C $W/cache; done
python3 "$HERE/make_models.py" --out $W/models || exit 4
(PYTHONPATH=$W/site:$HERE/carry/extra:$HERE/shims:$HERE/probe timeout 150 python3 "$HERE/prewarm_jit.py" > $W/prewarm.log 2>&1 &)  # JIT kernels, beside the setup
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fldeps "$HERE"/carry/flwheels/*.whl || exit 5
cp -r "$HERE/carry/flcache" $W/flcache
echo "== setup $(( $(date +%s) - T0 ))s"
FLEETCTL_CACHE_DIR=$W/flcache PYTHONPATH=/tmp/fldeps:$W/site:$HERE/carry/extra \
  timeout ${FL_TIMEOUT:-230} python3 "$HERE/fl_e2e.py" --fleetctl "$HERE/carry/fleetctl" --site $W/site --models $W/models \
  --work $W/fl --pythonpath-extra "$HERE/carry/extra:$HERE/shims:$HERE/probe:/tmp/fldeps"
echo "== fl_e2e rc=$? at $(( $(date +%s) - T0 ))s"
find $W/fl/state -name '*.log' -size -3M 2>/dev/null | head -3 | while read f; do cp "$f" "$OUT/"; done
ls -la "$OUT"; ls -R $W/fl/state 2>/dev/null | head -30
