#!/usr/bin/env bash
# Set up a fresh machine for fleetctl: a virtualenv with fleetctl and its test tools, and
# OpenSSH's sshd (the sandbox fleet runs real sshd on loopback). Idempotent; run as root for apt.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import fleetctl, pytest, ruff" >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.fleetctl-installed ]; then
    echo "setup: installing fleetctl and test tools into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
    touch .venv/.fleetctl-installed
fi
# fleetctl's own bytecode, written once: an editable install never compiles the package, and where
# PYTHONDONTWRITEBYTECODE is set no command writes it either, so each command would compile its
# modules from source again (a 1-host no-op deploy: 0.22 s of CPU with them, 0.29 s without).
# Up-to-date files are skipped; a later edit is recompiled in memory by Python as usual.
.venv/bin/python -m compileall -q -j 0 fleetctl >/dev/null || echo "setup: compileall failed (fleetctl still runs, from source)" >&2

if [ ! -x /usr/sbin/sshd ]; then
    echo "setup: installing openssh-server (the sandbox fleet runs real sshd on 127.0.0.1)"
    if [ "$(id -u)" != 0 ]; then
        echo "setup: /usr/sbin/sshd is missing and this is not root: install openssh-server, then rerun" >&2
        exit 2
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null
fi
mkdir -p /run/sshd 2>/dev/null || true

# sudo: become's tests run the real one (tests/test_become.py); systemd-journal-remote: the systemd
# manager's tests write a real journal file with it and read it back with journalctl
# (tests/test_systemd.py). Each is skipped where it is missing.
need=""
{ command -v sudo && command -v visudo; } >/dev/null 2>&1 || need="$need sudo"
[ -x /lib/systemd/systemd-journal-remote ] || need="$need systemd-journal-remote"
if [ -n "$need" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing$need (tests run the real ones)"
        export DEBIAN_FRONTEND=noninteractive
        # shellcheck disable=SC2086
        { apt-get install -y -qq --no-install-recommends $need >/dev/null 2>&1; } \
            || { apt-get update -qq && apt-get install -y -qq --no-install-recommends $need >/dev/null; } \
            || echo "setup: could not install$need: their tests will be skipped" >&2
    else
        echo "setup: missing$need (install as root): their tests will be skipped" >&2
    fi
fi

# Real container runtimes for the container tests (tests/test_containers.py starts its own dockerd on
# a private socket, and podman on storage of its own, and stops them; they are skipped where none can
# run). Debian's docker.io and podman; a failure here only skips those tests. FLEETCTL_NO_DOCKER=1
# leaves them out.
if [ "${FLEETCTL_NO_DOCKER:-0}" != 1 ] && [ "$(id -u)" = 0 ] \
   && { ! command -v dockerd >/dev/null 2>&1 || ! command -v podman >/dev/null 2>&1; }; then
    echo "setup: installing docker.io and podman (local container runtimes for the container tests)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends docker.io podman >/dev/null; } \
        || echo "setup: docker.io/podman did not install: the container tests will be skipped" >&2
fi

# The cached CPU SGLang venv of `explain --probe`'s tests and `sandbox up --cpu-sglang` (torch CPU
# build + the packages SGLang's argument processing imports, pinned in fleetctl/sandbox/cpu_venv.lock,
# + a labelled GPU stand-in; ~1.2 GB, ~2.5 min once): the tests build it on first use;
# FLEETCTL_PROBE_VENV=1 builds it here instead.
if [ "${FLEETCTL_PROBE_VENV:-0}" = 1 ]; then
    echo "setup: building the CPU SGLang venv for explain --probe (cached in ~/.cache/fleetctl)"
    .venv/bin/python -m fleetctl.sandbox.cpu_venv
fi
