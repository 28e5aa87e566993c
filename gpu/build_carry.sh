#!/bin/bash
# Build gpu/carry/ on the CPU machine: everything a device call needs that the GPU
# machine lacks, as ONE xz tarball per SGLang release (the 64 MiB limit is on bytes carried).
#   bash gpu/build_carry.sh 012      (or 014)
# Wheels are downloaded (pip download, no deps) into $WHEELS (default /tmp/gpuwh, outside the
# repo); the tarball lands in gpu/carry/site<VER>.tar.xz, plus carry/patches/<release>/
# (the playbook's diffs, PINS.json, pre-patched copies) and carry/lib/libnuma.so.1.
set -eu
VER=${1:-012}
HERE=$(cd "$(dirname "$0")" && pwd)
WHEELS=${WHEELS:-/tmp/gpuwh}
MAIN=${MAIN:-$(cd "$HERE/.." && pwd)}   # the checkout whose playbook is carried
STAGE=${STAGE:-/tmp/gpu-real-stage-$VER}
PY=${PY:-/root/.pyenv/versions/3.12.1/bin/python3.12}   # a Python 3.12 with pip (the pyenv shim python3.12 is not on PATH here): the wheels are cp312 / abi3 for the device

# Runtime deps that the device image lacks (found by importing the server's modules with the
# device's package set; see README). Versions pinned to what was tested.
COMMON_DEPS="fastapi==0.128.0 starlette==0.50.0 uvicorn==0.54.0 pydantic==2.12.5 pydantic-core==2.41.5
annotated-types==0.8.0 typing-inspection==0.4.5 orjson==3.13.0 pyzmq==27.3.0 msgspec==0.23.0
setproctitle==1.3.8 partial-json-parser==0.2.1.1.post7 interegular==0.3.3 pybase64==1.5.1
python-multipart==0.0.34 openai==2.6.1 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1 dill==0.4.1
compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 soundfile==0.13.1
cffi==2.1.1 pycparser==3.12 apache-tvm-ffi==0.1.9"
case $VER in
  012) REL=0.5.12; SGL="sglang==0.5.12"; KER="sglang-kernel==0.4.2.post2"; FI="flashinfer_python==0.6.11.post1"
       TF="transformers==5.6.0 tokenizers==0.22.2" ;;
  014) REL=0.5.14; SGL="sglang==0.5.14"; KER="sglang-kernel==0.4.4"; FI="flashinfer_python==0.6.12"
       TF="transformers==5.8.1 tokenizers==0.22.2" ;;
  *) echo "unknown VER $VER"; exit 2 ;;
esac

mkdir -p "$WHEELS/$VER"
dl() {
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 -d "${DEST:-$WHEELS/$VER}" "$@"
}
if [ -n "${FL_ONLY:-}" ]; then   # only what gpu_check.sh / fl_cli.sh need besides the site (kept as built)
  FL=1
else
[ -n "${SKIP_DL:-}" ] || dl $SGL $KER $FI $TF $COMMON_DEPS

rm -rf "$STAGE"; mkdir -p "$STAGE/site"
# everything but the kernel wheel goes in as pip would put it (--target, no deps)
ls "$WHEELS/$VER"/*.whl | grep -v sglang_kernel | xargs $PY -m pip install -q --no-index --no-deps \
  --no-compile --target "$STAGE/site"
# the kernel wheel: only what an H200 (sm90) needs. Left out: flash_ops.abi3.so (FlashAttention-3,
# 1-1.8 GB unpacked; we run --attention-backend triton), sm100/ (Blackwell), the mscclpp
# libraries and headers (custom all-reduce over several GPUs).
(cd "$STAGE/site" && unzip -q -o "$WHEELS/$VER"/sglang_kernel-*.whl -x 'sgl_kernel/flash_ops*' \
   'sgl_kernel/sm100/*' 'lib/*' 'include/*' 'lib64/*' '_mscclpp*' 'share/*')
cd "$STAGE/site"
# left out as not imported on the server path (checked by an import sweep): openai_harmony
# (gpt-oss only), SGLang's diffusion package and kernel tests/benchmarks, console scripts.
# flashinfer/data (JIT sources and headers, 75 MB raw, ~4.6 MB xz) stays: flashinfer.norm is
# JIT-built from it (sgl_kernel's rmsnorm calls it); build_fi_aot.sh prebuilds that module.
rm -rf bin openai_harmony openai_harmony-*.dist-info sglang/multimodal_gen \
  sglang/jit_kernel/tests sglang/jit_kernel/benchmark tools build_backend.py build_utils.py
find . -name __pycache__ -type d -prune -exec rm -rf {} +
if [ -n "${FI_AOT:-}" ] && $PY -c "import torch" 2>/dev/null; then   # needs torch here (import flashinfer); off by default
  PY=$PY bash "$HERE/build_fi_aot.sh" "$STAGE/site"
else
  echo "no flashinfer AOT build: probe/sitecustomize.py turns flashinfer.norm off in sgl_kernel (GPU_REAL_NO_FI_NORM=1), so no JIT build is needed"
fi
find . -name __pycache__ -type d -prune -exec rm -rf {} +
cd "$STAGE"
mkdir -p "$HERE/carry"
t=$(date +%s); du -sh site; tar cf - site | xz -${XZ_LEVEL:-9} -T0 > "$HERE/carry/site$VER.tar.xz"; echo "xz in $(( $(date +%s) - t ))s"

# the payload patch: the playbook's diffs + pins (pristine sha256 from the playbook, result
# sha256 from applying here) + pre-patched copies as a fallback where GNU patch is missing
P="$HERE/carry/patches/$REL"; rm -rf "$P"; mkdir -p "$P/patched"
cp "$MAIN/playbooks/dynamic-spec-disable/patches/$REL/"*.diff "$P/"
rm -rf "$STAGE/ptree"; mkdir -p "$STAGE/ptree"; cp -a "$STAGE/site/sglang" "$STAGE/ptree/"
$PY - "$REL" "$MAIN/playbooks/dynamic-spec-disable/playbook.yaml" "$P" "$STAGE/ptree/sglang" <<'EOF'
import hashlib, json, os, re, shutil, subprocess, sys
rel, playbook, pdir, tree = sys.argv[1:]
text = open(playbook).read()
block = text.split(f'  "{rel}":', 1)[1].split("\n  \"", 1)[0]
pins = {}
for path, diff, pristine in re.findall(r"- path: (\S+)\n\s+patch: (\S+)\n\s+sha256: (\w+)", block):
    target = os.path.join(tree, path)
    got = hashlib.sha256(open(target, "rb").read()).hexdigest()
    assert got == pristine, (path, got, pristine)
    subprocess.run(["patch", "-p1", "-i", os.path.join(pdir, os.path.basename(diff))], cwd=tree, check=True,
                   capture_output=True)
    patched = hashlib.sha256(open(target, "rb").read()).hexdigest()
    shutil.copyfile(target, os.path.join(pdir, "patched", path.replace("/", "__")))
    pins[path] = {"diff": os.path.basename(diff), "pristine_sha256": pristine, "patched_sha256": patched}
json.dump(pins, open(os.path.join(pdir, "PINS.json"), "w"), indent=1)
print(json.dumps(pins, indent=1))
EOF
fi  # (FL_ONLY)
mkdir -p "$HERE/carry/lib"; cp -L /usr/lib/x86_64-linux-gnu/libnuma.so.1 "$HERE/carry/lib/"   # (the GPU image has it: spare)
# carry/extra is put on the server's PYTHONPATH after site/: a typing_extensions new enough for
# pydantic 2.12 (the GPU image's is 4.16.0 already: spare, harmless)
mkdir -p "$WHEELS/extra" "$HERE/carry/extra"
$PY -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS/extra" typing_extensions==4.16.0
$PY -m pip install -q --no-deps --no-index --no-compile --target "$HERE/carry/extra" "$WHEELS/extra"/typing_extensions-4.16.0-*.whl
# FL=1: what gpu_check.sh / fl_cli.sh (fleetctl's own CLI on the device, gpu/fl_device.sh) need besides
# the site: paramiko and its deps, fleetctl's own deps (the image's typer is too old for fleetctl),
# openai-harmony (so that 0.5.12 logs no handled ModuleNotFoundError traceback at start), and the
# sglang wheel in fleetctl's cache (pristine bytes; no registry on the GPU machine). fleetctl itself
# is the repo's own tree (the device call copies the working tree). Mind the 64 MiB carry limit
# (site ~37 MB + flwheels ~15 MB + flcache ~8-12 MB + the tree ~4 MB): calls 3-4 dropped cache/,
# and for 0.5.14 pydantic and openai-harmony too (docs/gpu-verified.md).
if [ -n "${FL:-}" ]; then
  rm -rf "$HERE/carry/fleetctl" "$HERE/carry/flwheels" "$HERE/carry/flcache"
  mkdir -p "$HERE/carry/flwheels" "$HERE/carry/flcache/wheels"
  # (a folder of their own: everything in $WHEELS/$VER is installed into the site)
  mkdir -p "$WHEELS/fl"
  DEST="$WHEELS/fl" dl paramiko==5.1.0 cryptography==50.0.2 bcrypt==5.0.0 pynacl==1.6.2 invoke==3.0.3 openai-harmony==0.0.4 \
    fabric==3.2.2 decorator==5.2.1 deprecated==1.2.18 wrapt==1.17.2 \
    typer==0.29.2 annotated-doc==0.0.7 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 \
    shellingham==1.5.4 pydantic==2.14.4 pydantic-core==2.50.5 pyyaml==6.0.4 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0
  cp "$WHEELS/fl"/*.whl "$HERE/carry/flwheels/"
  [ -f "$WHEELS/$VER"/sglang-$REL-*.whl ] || DEST="$WHEELS/$VER" dl $SGL
  cp "$WHEELS/$VER"/sglang-$REL-*.whl "$HERE/carry/flcache/wheels/"

fi
ls -la "$HERE/carry" "$HERE/carry/patches/$REL"; du -sh "$HERE/carry"
