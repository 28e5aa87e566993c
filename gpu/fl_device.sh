# Sourced ON THE GPU MACHINE by gpu_check.sh and fl_cli.sh (after they set HERE, ROOT, OUT and
# SITE=012|014): a clean /tmp/w, the carried SGLang site unpacked, fleetctl's own dependencies
# installed beside it, fleetctl's wheel cache, the JIT prewarm started, and $W/inventory.yaml naming
# the device itself through `connection: local` (the image has no sshd), with the launch flags the
# image needs. INV_ENV / INV_FLAGS: extra YAML lines for the host's env: / flags: (6-space indent).
exec > >(tee -a "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=/tmp/w; rm -rf $W /tmp/fldeps; mkdir -p $W/cache   # a warm machine keeps /tmp from the last call
export TRITON_CACHE_DIR=$W/cache/triton TVM_FFI_CACHE_DIR=$W/cache/tvm-ffi
export FLEETCTL_STATE_DIR=$W/controller FLEETCTL_CACHE_DIR=$W/flcache COLUMNS=160
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
tar xJf "$HERE/carry/site$SITE.tar.xz" -C $W || exit 3
for c in "$HERE"/carry/cache/cache_*.tgz; do [ -f "$c" ] && tar xzf "$c" -C $W/cache; done
# fleetctl's own deps (the image's typer is too old for it; paramiko & co.); cffi comes from the site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fldeps ${FLWHEELS:-$HERE/carry/flwheels}/*.whl || exit 5
cp -r "${FLCACHE:-$HERE/carry/flcache}" $W/flcache   # the pristine sglang wheel deploy checks the installed files against
SP=$W/site:$HERE/carry/extra:$HERE/shims:$HERE/probe:/tmp/fldeps
(PYTHONPATH=$SP timeout 150 python3 "$HERE/prewarm_jit.py" > $W/prewarm.log 2>&1 &)  # JIT kernels, beside
PY=$(command -v python3)
FL() { PYTHONPATH=$ROOT:/tmp/fldeps:$W/site:$HERE/carry/extra python3 -m fleetctl "$@"; }
cat > $W/inventory.yaml <<INV
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
${INV_ENV:-}
    # what this image needs (docs/gpu-verified.md): no FA3 .so, no xgrammar, no piecewise graphs
    flags:
${INV_FLAGS:-}
      --attention-backend: triton
      --sampling-backend: pytorch
      --grammar-backend: none
      --disable-piecewise-cuda-graph: true
      --mem-fraction-static: 0.5
      --max-total-tokens: 131072
      --max-running-requests: 80
      --cuda-graph-max-bs: 64
      --decode-log-interval: 10
INV
