#!/usr/bin/env bash
# The main job on the embedded default: a local sandbox fleet (real sshd on 127.0.0.1, real
# SGLang package trees from the wheels, the labelled server SIMULATOR instead of GPUs).
#   deploy -> launch -> verify-logs (pass) -> the origin story's wrong-file mistake caught and
#   explained -> rollback -> verify-logs shows the marker gone after restart.
# Everything it starts is stopped at the end, also on failure, and its dir (~160 MB of SGLang trees,
# made under $TMPDIR, else /tmp) is removed: nothing is left behind unless KEEP=1.
# Options: HOSTS=N, KEEP=1 (leave the sandbox running), DIR=path (use and keep this dir).
#   bash scripts/demo.sh down DIR   stops a sandbox a KEEP=1 demo left, and removes DIR
set -uo pipefail
cd "$(dirname "$0")/.."
FLEETCTL=.venv/bin/fleetctl

teardown() { # teardown DIR REMOVE: stop everything the sandbox in DIR runs; REMOVE=1: then delete DIR
    local dir=$1 remove=$2
    if [ -f "$dir/sandbox.json" ] && ! $FLEETCTL sandbox down --dir "$dir"; then
        echo "demo: could not stop everything in $dir: kept for inspection" >&2
        return 1
    fi
    if [ "$remove" = 1 ] && [ -d "$dir" ]; then
        rm -rf -- "$dir" && echo "== removed $dir"
    fi
}

if [ "${1:-}" = down ]; then
    [ -n "${2:-}" ] || { echo "usage: bash scripts/demo.sh down DIR" >&2; exit 2; }
    [ -f "$2/sandbox.json" ] || { echo "demo: $2 holds no sandbox (no sandbox.json)" >&2; exit 2; }
    teardown "$2" 1
    exit $?
fi

bash scripts/setup.sh || exit $?
HOSTS=${HOSTS:-4}
OWN_DIR=0
if [ -z "${DIR:-}" ]; then
    DIR=$(mktemp -d "${TMPDIR:-/tmp}/fleetctl-demo.XXXXXX") || exit 1
    OWN_DIR=1
fi
export FLEETCTL_STATE_DIR="$DIR/controller-state"   # the demo's ledger, not your real one
INV="$DIR/inventory.yaml"
PAYLOAD=playbooks/dynamic-spec-disable
WRONG=playbooks/origin-wrong-file

cleanup() {
    if [ "${KEEP:-0}" = 1 ]; then
        echo "== KEEP=1: sandbox left running in $DIR; stop it and remove the dir with: bash scripts/demo.sh down $DIR"
    else
        echo "== tearing down the sandbox"
        teardown "$DIR" "$OWN_DIR" || true
    fi
}
trap cleanup EXIT

expect() { # expect CODE TITLE CMD...: run, and stop the demo if the exit code is not the expected one
    local want=$1 title=$2; shift 2
    printf '\n\033[1m== %s\033[0m\n$ %s\n' "$title" "$*"
    "$@"; local rc=$?
    if [ "$rc" != "$want" ]; then echo "demo: expected exit $want, got $rc" >&2; exit 1; fi
    echo "(exit $rc, as expected)"
}

expect 0 "a sandbox fleet of $HOSTS hosts (SGLang 0.5.9 and 0.5.14)" \
    $FLEETCTL sandbox up --hosts "$HOSTS" --dir "$DIR"
expect 0 "what the hosts are" $FLEETCTL facts -i "$INV"
expect 1 "the origin story's playbook (patches only eagle_worker_v2.py): which worker really runs?" \
    $FLEETCTL explain -i "$INV" "$WRONG"
expect 1 "...so deploy refuses it before changing anything" $FLEETCTL deploy -i "$INV" "$WRONG"
expect 0 "the real payload: which worker runs, and is it patched?" $FLEETCTL explain -i "$INV" "$PAYLOAD"
expect 0 "plan" $FLEETCTL deploy --check -i "$INV" "$PAYLOAD"
expect 0 "deploy" $FLEETCTL deploy -i "$INV" "$PAYLOAD"
expect 0 "deploy again: nothing to do" $FLEETCTL deploy -i "$INV" "$PAYLOAD"
expect 0 "launch the servers (the SIMULATOR on the sandbox: no GPU here)" $FLEETCTL launch -i "$INV" "$PAYLOAD"
expect 0 "verify-logs: the marker on every host and every rank" $FLEETCTL verify-logs -i "$INV" "$PAYLOAD"
expect 0 "rollback" $FLEETCTL rollback -i "$INV"
expect 0 "the origin story on the 0.5.9 hosts: patch only eagle_worker_v2.py anyway (--allow-uncovered)" \
    $FLEETCTL deploy --allow-uncovered --limit v0_5_9 -i "$INV" "$WRONG"
expect 1 "launch refuses it: the worker that will run is not the one patched" \
    $FLEETCTL launch --replace --limit v0_5_9 -i "$INV" "$WRONG"
expect 0 "restart on it anyway (--allow-uncovered)" $FLEETCTL launch --replace --allow-uncovered --limit v0_5_9 -i "$INV" "$WRONG"
expect 1 "verify-logs catches it and says why" $FLEETCTL verify-logs --limit v0_5_9 -i "$INV" "$WRONG"
expect 0 "rollback" $FLEETCTL rollback -i "$INV"
expect 0 "restart everything on the original code (its SGLang does not know the patch's flag)" \
    $FLEETCTL launch --replace --drop-unknown-flags -i "$INV" "$PAYLOAD"
expect 1 "verify-logs: the marker is gone everywhere" $FLEETCTL verify-logs -i "$INV" "$PAYLOAD"
expect 0 "stop the servers" $FLEETCTL stop -i "$INV" "$PAYLOAD"
expect 0 "status: every host back on its original files" $FLEETCTL status -i "$INV" "$PAYLOAD"
expect 0 "history" $FLEETCTL history
echo
echo "demo: done"
