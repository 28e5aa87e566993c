#!/bin/bash
# Runs ON THE GPU MACHINE (device `run`), from the repository root: fleetctl's own CLI, as a user runs
# it, against the device's real SGLang 0.5.12 install (the carried site), through the inventory's
# `connection: local` (the image has no sshd): facts (real nvidia-smi), explain and explain --probe,
# deploy, launch, a burst over the threshold, verify-logs (PASS + switch lines), stop; then the origin
# story: playbooks/origin-wrong-file (given a 0.5.12 entry here, in a copy) refused before launch,
# launched with --allow-uncovered, verify-logs FAIL naming the worker that ran; rollback, restart to
# stock (launch --drop-unknown-flags), stop, rollback. Issue 35 item 3. Wall time kept under ~9 min.
#
#   CPU machine: bash gpu/build_carry.sh 012 && FL_ONLY=1 bash gpu/build_carry.sh 012
#                (then move carry/flcache to carry/flcache012 if gpu_check.sh's 0.5.14 flcache is kept)
#   device call: command "bash gpu/fl_cli.sh", carry ["gpu/carry/site012.tar.xz", "gpu/carry/extra",
#                "gpu/carry/flwheels", "gpu/carry/flcache012", "gpu/carry/cache"]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=${OUT:-/tmp/fl-cli-out}; mkdir -p "$OUT"
SITE=012 FLCACHE=${FLCACHE:-$HERE/carry/flcache012}
INV_ENV='      # 0.5.12 runs EAGLEWorkerV2 by default; the payload is in EAGLEWorker on this release
      SGLANG_ENABLE_SPEC_V2: "0"'
INV_FLAGS='      --model-path: /tmp/w/models/target-bigram
      --speculative-draft-model-path: /tmp/w/models/draft-kvmean
      --speculative-disable-batch-threshold: 4'
. "$HERE/fl_device.sh"
at() { echo "== $1 rc=$2 at $(( $(date +%s) - T0 ))s"; }
PYTHONPATH=$SP python3 "$HERE/make_models.py" --out $W/models > $W/models.log 2>&1 || { cat $W/models.log; exit 4; }
# the origin story on this release: a copy of playbooks/origin-wrong-file with a 0.5.12 entry that
# patches server_args.py and eagle_worker_v2.py only (the payload's own diffs), while EAGLEWorker runs
OWF=$W/origin-wrong-file; mkdir -p $OWF
PYTHONPATH=/tmp/fldeps python3 - "$ROOT" "$OWF" <<'PYEOF'
import re, sys, yaml
root, dst = sys.argv[1:]
src = yaml.safe_load(open(f"{root}/playbooks/origin-wrong-file/playbook.yaml"))
dyn = yaml.safe_load(open(f"{root}/playbooks/dynamic-spec-disable/playbook.yaml"))
files = [dict(f, patch=f"{root}/playbooks/dynamic-spec-disable/{f['patch']}")
         for f in dyn["versions"]["0.5.12"]["files"] if not f["path"].endswith("eagle_worker.py")]
src["versions"] = {"0.5.12": {"files": files}}
yaml.safe_dump(src, open(f"{dst}/playbook.yaml", "w"), sort_keys=False)
print("origin-wrong-file copy for 0.5.12:", [f["path"] for f in files])
PYEOF
PB=$ROOT/playbooks/dynamic-spec-disable; I="-i $W/inventory.yaml"
burst() {  # 16 concurrent greedy requests (over the threshold of 4), then 1 alone
  PYTHONPATH=/tmp/fldeps python3 - <<'PYEOF'
import json, urllib.request
from concurrent.futures import ThreadPoolExecutor
def gen(i):
    body = json.dumps({"text": f"{i} hello", "sampling_params": {"max_new_tokens": 200, "temperature": 0}}).encode()
    req = urllib.request.Request("http://127.0.0.1:30000/generate", data=body, headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["meta_info"]
with ThreadPoolExecutor(16) as ex:
    metas = list(ex.map(gen, range(16)))
print("burst:", len(metas), "done; then 1 alone:", gen(99).get("completion_tokens"))
PYEOF
}
echo "== setup $(( $(date +%s) - T0 ))s"
FL facts $I; at facts $?
FL explain $PB $I; at "explain (before deploy)" $?
FL explain $PB $I --probe; at "explain --probe (before deploy)" $?
FL deploy $PB $I; at deploy $?
FL explain $PB $I --probe; at "explain --probe (deployed)" $?
FL launch $PB $I --timeout 240; at launch $?
burst; at burst $?
FL verify-logs $PB $I; at "verify-logs (payload)" $?
FL stop $I; at stop $?
FL rollback $I; at "rollback (payload)" $?
FL explain $OWF $I; at "explain origin-wrong-file (expect refused, 1)" $?
FL deploy $OWF $I; at "deploy origin-wrong-file (expect refused, 1)" $?
FL deploy $OWF $I --allow-uncovered; at "deploy origin-wrong-file --allow-uncovered" $?
FL launch $OWF $I --allow-uncovered --timeout 200; at "launch origin-wrong-file --allow-uncovered" $?
FL verify-logs $OWF $I; at "verify-logs origin-wrong-file (expect FAIL, 1)" $?
FL stop $I; at stop $?
FL rollback $I; at "rollback (origin-wrong-file)" $?
FL launch $PB $I --drop-unknown-flags --timeout 200; at "launch stock (--drop-unknown-flags)" $?
FL status $I; at status $?
FL stop $I; at stop $?
FL history $I 2>/dev/null | tail -20
echo "== end $(( $(date +%s) - T0 ))s"
nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
(cd $W/state 2>/dev/null && find . -name '*.log' -size -4M | head -4 | tar czf "$OUT/server_logs.tgz" -T - 2>/dev/null)
ls -la "$OUT"
