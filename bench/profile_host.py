"""Per-host profile: where fleetctl's time per host goes, next to what the lean push does per host.

    python bench/profile_host.py SANDBOX_DIR [--reps 20] [--hosts 16]

Host side: each piece is run REPS times on this machine the way a sandbox host runs it (the
host's own `python` wrapper, a bare session environment, cwd = the session's HOME) and its CPU
(user + sys of the child processes, from rusage) is divided by REPS. Controller side: SSH
HOSTS connections (round the sandbox's hosts), one after another, CPU of this process per
connection (paramiko alone, as the lean push connects; then fleetctl's HostConnection). Medians
are not needed: every number is an average of REPS runs; run it on a quiet machine, or twice.
Prints a markdown table (ms of CPU per host per command).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def host_side(sb_dir: Path, reps: int) -> list[tuple[str, float]]:
    """Each piece's host CPU. fleetctl's agent sessions are recorded from real commands (the argv and
    stdin the host's python got) and replayed, so the numbers follow whatever the bootstrap and the
    protocol are in this checkout; a replay meets the host as the recorded session did (the agent's
    cache, the host's files, its seal)."""
    from fleetctl.config.inventory import load_inventory
    from fleetctl.config.playbook import load_playbook

    inv = load_inventory(sb_dir / "inventory.yaml")
    h = inv.hosts[0]
    home = sb_dir / "hosts" / h.name / "home"
    home.mkdir(exist_ok=True)
    pb = load_playbook(REPO / "playbooks" / "dynamic-spec-disable")
    # a bare session: what sshd and a login with no rc files give (plus the sandbox's markers)
    env = {"HOME": str(home), "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash",
           "FLEETCTL_SANDBOX_DIR": str(sb_dir), "FLEETCTL_SANDBOX_HOST": h.name, **h.env}
    extra = sorted({f.path for fs in pb.versions.values() for f in fs})

    def cost(argv: list[str], data: bytes = b"") -> float:
        subprocess.run(argv, input=data, capture_output=True, env=env, cwd=home)  # warm the caches
        c0 = child_cpu()
        for _ in range(reps):
            p = subprocess.run(argv, input=data, capture_output=True, env=env, cwd=home)
            if p.returncode != 0:
                raise SystemExit(f"{argv[:2]}: exit {p.returncode}: {p.stderr[-300:]!r}")
        return (child_cpu() - c0) / reps * 1000

    rows = [
        ("bash -c true (the login shell of a bare host)", cost(["bash", "-c", "true"])),
        ("bash -c 'sha256sum 3 files' (lean push: one exec)",
         cost(["bash", "-c", "sha256sum " + " ".join(str(Path(h.sglang_dir or "") / r) for r in extra[:3])
               if h.sglang_dir else "sha256sum /etc/hostname"])),
        ("host python -c pass (interpreter start, site)", cost([h.python, "-c", "pass"])),
    ]
    pb_dir = str(REPO / "playbooks" / "dynamic-spec-disable")
    for what, command in (("agent session of `facts` (agent start, facts)", ["facts"]),
                          ("agent session of a no-op `deploy` (after a deploy)", ["deploy", pb_dir])):
        argv, data = recorded(sb_dir, h, command)
        rows.append((what, cost([h.python, *argv], data)))
    return rows


def recorded(sb_dir: Path, host: Any, command: list[str]) -> tuple[list[str], bytes]:
    """The argv and stdin the host's python gets in a real `fleetctl COMMAND` on this host (after a
    deploy, so the agent's cache is warm and a deploy is a no-op), recorded by a wrapper in place of
    the host's python; restored after. The last session of the command is the one kept."""
    py = Path(host.python)
    real = py.with_name("python.profiled")
    rec = sb_dir / "profile-recorded"
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(sb_dir / "profile-ledger"), "NO_COLOR": "1",
           "PYTHONPATH": str(REPO)}
    base = [sys.executable, "-m", "fleetctl"]
    tail = ["-i", str(sb_dir / "inventory.yaml"), "--limit", host.name, "--json"]
    subprocess.run([*base, "deploy", str(REPO / "playbooks" / "dynamic-spec-disable"), *tail],
                   capture_output=True, env=env, cwd=REPO, check=True)
    py.rename(real)
    try:
        py.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {rec}.argv\ntee {rec}.stdin | {real} "$@"\n')
        py.chmod(0o755)
        subprocess.run([*base, *command, *tail], capture_output=True, env=env, cwd=REPO, check=True)
    finally:
        real.replace(py)
    args = (rec.with_suffix(".argv")).read_bytes().split(b"\0")[:-1]
    return [a.decode() for a in args], rec.with_suffix(".stdin").read_bytes()


def controller_side(sb_dir: Path, n: int) -> list[tuple[str, float]]:
    import paramiko

    from fleetctl.config.inventory import load_inventory
    from fleetctl.transport.ssh import HostConnection

    inv = load_inventory(sb_dir / "inventory.yaml")
    hosts = [inv.hosts[i % len(inv.hosts)] for i in range(n)]  # n connections, round the sandbox's hosts
    rows = []
    t0 = time.process_time()
    for h in hosts:
        c = paramiko.SSHClient()
        c.load_host_keys(str(sb_dir / "known_hosts"))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect("127.0.0.1", port=h.port, username=h.user, key_filename=str(sb_dir / "client_key"),
                  look_for_keys=False, allow_agent=False, timeout=60)
        c.exec_command("true")[1].channel.recv_exit_status()
        c.close()
    rows.append(("controller: paramiko connect + auth + one exec (lean)", (time.process_time() - t0) / n * 1000))
    t0 = time.process_time()
    for h in hosts:
        conn = HostConnection(h, inv)
        conn.connect()
        conn.agent("ping")
        conn.close()
    rows.append(("controller: fleetctl connect + agent start + one request",
                 (time.process_time() - t0) / n * 1000))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sandbox_dir", type=Path)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--hosts", type=int, default=16, help="controller-side connections to time")
    args = ap.parse_args()
    rows = host_side(args.sandbox_dir.resolve(), args.reps) + controller_side(args.sandbox_dir.resolve(), args.hosts)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}\n")
    print("| per host, per command | CPU ms |\n|---|---:|")
    for what, ms in rows:
        print(f"| {what} | {ms:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
