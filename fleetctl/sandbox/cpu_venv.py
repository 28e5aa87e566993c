"""A cached CPU virtualenv in which the real SGLang release trees import far enough for
`explain --probe`: SGLang's argument processing (ServerArgs, __post_init__, check_server_args) and
its worker selection. For sandbox hosts that opt in (`sandbox up --cpu-sglang`) and the tests.

What it holds: exactly the packages of the lock file next to this module (cpu_venv.lock: exact
versions, installed with `--no-deps`, so nothing is resolved at build time and no package can pull
another torch): torch 2.13.0, CPU build (this machine's local wheel), the packages SGLang's
server_args and speculative modules import, and the labelled GPU
STAND-IN (fleetctl/sandbox/gpu_standin: placeholder modules for GPU-only packages such as
sgl_kernel, flashinfer and triton, which do not install or import without CUDA). No SGLang: each
sandbox host's own site-packages holds its release tree, added after this venv's site-packages.

Built once per cache dir and lock file (the dir name carries the lock's hash, so a venv built by an
older lock is never used), under a file lock, into a temporary directory renamed into place when
complete: `ensure_cpu_venv()` returns its python. `.built` records the build time, the size and the
lock's hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fleetctl.engines.wheel_cache import cache_dir, locked
from fleetctl.errors import FleetctlError

LOCK = Path(__file__).resolve().parent / "cpu_venv.lock"
STANDIN_DIR = Path(__file__).resolve().parent / "gpu_standin"
STANDIN_MODULE = "fleetctl_gpu_standin"
BUILD_TIMEOUT = 1800.0


def lock_hash(lock: Path = LOCK) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def requirements(lock: Path = LOCK) -> list[str]:
    """The lock's pins (`name==version` lines; comments and blank lines skipped)."""
    out = []
    for n, raw in enumerate(lock.read_text().splitlines(), 1):
        ln = raw.split("#", 1)[0].strip()
        if not ln:
            continue
        if "==" not in ln or ln.startswith("-"):
            raise FleetctlError(f"{lock}:{n}: {ln!r} is not an exact pin (name==version)",
                                hint="the CPU venv's lock holds exact versions only", reference="sandbox-failed")
        out.append(ln)
    return out


def _key(lock: Path = LOCK) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(list(sys.version_info[:2])).encode())
    h.update(lock_hash(lock).encode())
    h.update((STANDIN_DIR / f"{STANDIN_MODULE}.py").read_bytes())
    return h.hexdigest()[:12]


def venv_dir(lock: Path = LOCK) -> Path:
    return cache_dir() / f"cpu-sglang-venv-{_key(lock)}"


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise FleetctlError(f"{venv}: no site-packages dir", reference="sandbox-failed")
    return found[0]


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if proc.returncode != 0:
        tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if not ln.startswith("WARNING: Location")]
        raise FleetctlError(f"cannot build the CPU SGLang venv: {what} failed: {(tail or ['?'])[-1]}",
                            hint="check the package registry is reachable; torch==2.13.0 must be installable",
                            reference="sandbox-failed")


def install_standin(site: Path, extra_pth: str = "") -> None:
    """Copy the GPU stand-in into a site-packages dir and have site.py import it at start-up."""
    shutil.copyfile(STANDIN_DIR / f"{STANDIN_MODULE}.py", site / f"{STANDIN_MODULE}.py")
    (site / f"{STANDIN_MODULE}.pth").write_text(f"import {STANDIN_MODULE}\n" + extra_pth)


def ensure_cpu_venv(extra_pth: str = "", lock: Path = LOCK) -> Path:
    """The CPU venv's python, building the venv on first use (minutes; then cached)."""
    final = venv_dir(lock)
    py = final / "bin" / "python"
    if (final / ".built").exists():
        return py
    with locked(final.with_name(final.name + ".lock")):
        if (final / ".built").exists():
            return py
        started = time.monotonic()
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            reqs = requirements(lock)
            _run([sys.executable, "-m", "venv", str(tmp)], "venv")
            _run([str(tmp / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  "--no-deps", "-r", str(lock)], "pip install")
            install_standin(site_packages(tmp), extra_pth)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file() and not f.is_symlink())
        (final / ".built").write_text(json.dumps({"seconds": round(time.monotonic() - started, 1),
                                                  "bytes": size, "lock_sha256": lock_hash(lock),
                                                  "requirements": reqs}) + "\n")
    return py


if __name__ == "__main__":  # scripts/setup.sh with FLEETCTL_PROBE_VENV=1: build it ahead of the tests
    print(ensure_cpu_venv())
