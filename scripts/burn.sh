#!/usr/bin/env bash
# Issue 30 item 8's check that no test depends on timing: the whole default suite RUNS times in a row
# (default 3) on a fresh clone of this checkout's HEAD, beside BURNERS CPU-burning processes (default
# 6), each pass's junit and log under OUT (default /tmp/fleetctl-burn). Not part of CI (hours on 2
# cores). The burners are this script's own children, ended by PID when it exits.
set -u
RUNS=${RUNS:-3}; BURNERS=${BURNERS:-6}; OUT=${OUT:-/tmp/fleetctl-burn}
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"; C="$OUT/clone"
rm -rf "$C"; git clone -q "$SRC" "$C" || exit 3
cd "$C"
git log --oneline -1 | tee "$OUT/commit"
bash scripts/setup.sh > "$OUT/setup.log" 2>&1 || { echo "setup failed: $OUT/setup.log"; exit 4; }
pids=()
for _ in $(seq "$BURNERS"); do python3 -c "while True: pass" & pids+=($!); done
cleanup() { kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; }
trap cleanup EXIT
for r in $(seq "$RUNS"); do
  t0=$(date +%s)
  .venv/bin/python -m pytest -q -m "not slow" -p no:cacheprovider --basetemp "$OUT/pt$r" \
    --junitxml="$OUT/run$r.xml" > "$OUT/run$r.log" 2>&1
  rc=$?
  echo "pass $r: exit $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/run$r.log")" | tee -a "$OUT/summary"
  rm -rf "$OUT/pt$r"
done
