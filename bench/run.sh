#!/usr/bin/env bash
# The bench: fleetctl vs ansible-core, pyinfra and a lean paramiko push on one sandbox fleet.
#
#   bash bench/run.sh [--sizes 8,32,64,128,256] [--runs 3] [--smoke] [--tools ...] [--out DIR] [other bench.py options]
#
# Makes one virtualenv per tool under bench/.venvs/ (gitignored) with pip, then runs bench/bench.py
# with fleetctl's own Python ($FLEETCTL_PYTHON, else .venv/bin/python made by scripts/setup.sh),
# then draws results.png with matplotlib (its own venv). --smoke: N=2, one run, fleetctl + lean
# only, results to a temp dir unless --out is given.
set -euo pipefail
cd "$(dirname "$0")/.."
VENVS=bench/.venvs
HOST_PY=${BENCH_VENV_PYTHON:-python3}

smoke=0; out=""; tools=""; pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --out) out="$2"; pass+=("$1" "$2"); shift ;;
    --tools) tools="$2"; pass+=("$1" "$2"); shift ;;
    *) pass+=("$1") ;;
  esac
  shift
done
if [ "$smoke" = 1 ]; then
  [ -n "$tools" ] || { tools="fleetctl,lean"; pass+=(--tools "$tools"); }
  [ -n "$out" ] || { out=$(mktemp -d /tmp/fleetctl-bench-smoke-XXXX); pass+=(--out "$out"); }
  pass=(--sizes 2 --runs 1 --fresh "${pass[@]}")
fi
[ -n "$tools" ] || tools="fleetctl,lean,pyinfra,ansible,ansible-default"
[ -n "$out" ] || out=bench/results

if [ -z "${FLEETCTL_PYTHON:-}" ]; then
  [ -x .venv/bin/python ] || bash scripts/setup.sh
  FLEETCTL_PYTHON=.venv/bin/python
fi

venv() {  # venv NAME PACKAGE...: make bench/.venvs/NAME and pip-install the packages once
  local name=$1; shift
  local d=$VENVS/$name
  if [ ! -f "$d/.installed" ] || [ "$(cat "$d/.installed")" != "$*" ]; then
    echo "[bench] installing $* into $d" >&2
    rm -rf "$d"
    "$HOST_PY" -m venv "$d"
    if ! "$d/bin/pip" install -q --disable-pip-version-check "$@" > "$d/pip.log" 2>&1; then
      grep -v '^WARNING: Location' "$d/pip.log" >&2; echo "[bench] pip install $* failed" >&2; exit 1
    fi
    echo "$*" > "$d/.installed"
  fi
}
LEAN_PY=${BENCH_LEAN_PYTHON:-}  # set it to skip the lean venv (e.g. fleetctl's own Python has paramiko)
if [ -z "$LEAN_PY" ]; then
  case ",$tools," in *,lean,*) venv lean "paramiko>=3.4" ;; esac
  LEAN_PY=$VENVS/lean/bin/python
fi
case ",$tools," in *,pyinfra,*) venv pyinfra "pyinfra>=3,<4" ;; esac
case ",$tools," in *,ansible*) venv ansible "ansible-core>=2.17" ;; esac

"$FLEETCTL_PYTHON" bench/bench.py --lean-python "$LEAN_PY" "${pass[@]}"

if [ "$smoke" = 0 ] || [ -n "${BENCH_PLOT:-}" ]; then
  venv plot "matplotlib>=3.8"
  "$VENVS/plot/bin/python" bench/plot.py "$out/results.json" "$out/results.png"
fi
echo "[bench] results in $out" >&2
