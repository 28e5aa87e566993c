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
SITE=014
. "$HERE/fl_device.sh"
left() { echo $(( ${GPU_CHECK_BUDGET:-350} - ($(date +%s) - T0) )); }
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
