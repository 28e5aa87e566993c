"""One command over 1,000 sandbox hosts (issue 11, defect 9): facts, deploy, rollback.

A sandbox host is a real sshd with its own full SGLang tree; 1,000 of those would be 1,000 sshds and
~2 million copied files. Here a few real sshds serve 1,000 *inventory hosts*: each inventory host has
its own python wrapper, its own site-packages (a hard-linked copy of a real host's tree: fleetctl
replaces files by rename, so a deploy on one never touches another's bytes) and its own state dir,
and its own SSH connection (1,000 connections, so the controller holds >1,024 descriptors). The
controller starts with a soft open-files limit of 1024, as on a default Linux login, so raising it
is exercised too.

    FLEETCTL_SCALE_HOSTS=1000 FLEETCTL_SCALE_SSHDS=8 pytest -m slow tests/test_scale.py -s
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
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ledger_dir")]

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = ROOT / "playbooks" / "dynamic-spec-disable" / "playbook.yaml"
SA = "srt/server_args.py"

PROBE = """\
import resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, soft), hard))  # a default login's limit
from fleetctl.cli import main
t0 = time.monotonic()
code = main(sys.argv[1:])
hwm = int(open("/proc/self/status").read().split("VmHWM:", 1)[1].split()[0])  # this image's peak (not ru_maxrss:
# Linux keeps the forked test process's peak there too)
sys.stderr.write("SCALE wall=%.1f maxrss_kb=%d nofile=%d\\n" % (time.monotonic() - t0, hwm,
                 resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
sys.exit(code)
"""


def _cli(args: list[str], ledger: Path, bound: float) -> tuple[int, dict[str, Any], dict[str, float]]:
    p = subprocess.run([sys.executable, "-c", PROBE, *args, "--json"], capture_output=True, text=True,
                       timeout=bound, env={**os.environ, "FLEETCTL_STATE_DIR": str(ledger)})
    line = next((ln for ln in p.stderr.splitlines() if ln.startswith("SCALE ")), None)
    assert line, p.stderr[-3000:]
    stats = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {p.returncode}): {p.stdout[-2000:]} {p.stderr[-2000:]}") from None
    return p.returncode, doc, stats


def _mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_facts_deploy_rollback_over_1000_hosts(tmp_path_factory: pytest.TempPathFactory,
                                               request: pytest.FixtureRequest, tmp_path: Path,
                                               ledger_dir: Path) -> None:
    from conftest import _down, _new_dir, require_sshd

    require_sshd()
    from fleetctl.sandbox import lifecycle

    n = int(os.environ.get("FLEETCTL_SCALE_HOSTS", "1000"))
    sshds = int(os.environ.get("FLEETCTL_SCALE_SSHDS", "8"))
    # every host keeps its connection and agent for the whole command: on this one machine that is
    # ~15 MB per host (two sshd session processes and the agent's python), measured at N=200
    need_mb = 2048 + 16 * n
    avail_mb = _mem_available_mb()
    if avail_mb < need_mb:
        pytest.skip(f"{n} hosts need about {need_mb} MB of free memory here; {avail_mb} MB available")
    d = _new_dir(tmp_path_factory, "scale")
    request.addfinalizer(lambda: _down(d))
    t0 = time.monotonic()
    sb = lifecycle.up(d, hosts=sshds, versions=["0.5.9"], gpus=1)
    base_doc = yaml.safe_load(sb.inventory_path.read_text())
    bases = list(sb.hosts.values())
    cp = shutil.which("cp")
    assert cp, "GNU cp is needed for hard-linked trees"
    hosts: dict[str, Any] = {}
    vdirs: list[Path] = []
    width = len(str(n))
    for i in range(n):
        b = bases[i % len(bases)]
        name = f"v{i + 1:0{width}d}"
        v = d / "virtual" / name
        (v / "bin").mkdir(parents=True)
        (v / "state").mkdir()
        subprocess.run([cp, "-al", str(b.site_packages), str(v / "site-packages")], check=True)
        lifecycle.install_host_python(v, sb.host_python or sb.controller_python,
                                      [v / "site-packages", d / lifecycle.HOSTLIB])
        entry = dict(base_doc["hosts"][b.name])
        entry.update(python=str(v / "bin" / "python"), state_dir=str(v / "state"))
        hosts[name] = entry
        vdirs.append(v)
    doc = {"ssh_config": str(d / base_doc["ssh_config"]),
           "defaults": {**base_doc["defaults"], "identity_file": str(d / "client_key"),
                        "known_hosts": str(d / "known_hosts"), "connect_timeout": 120,
                        "command_timeout": 600},
           "hosts": hosts}
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    built = time.monotonic() - t0
    pristine = _sha(vdirs[0] / "site-packages" / "sglang" / SA)

    report: dict[str, Any] = {"hosts": n, "sshds": sshds, "build_s": round(built, 1)}
    bound = 3600.0
    code, out, st = _cli(["facts", "-i", str(inv)], ledger_dir, bound)
    report["facts"] = st
    assert code == 0, [h for h in out.get("hosts", []) if h.get("status") != "ok"][:5]

    code, out, st = _cli(["deploy", "-i", str(inv), str(PLAYBOOK)], ledger_dir, bound)
    report["deploy"] = st
    assert code == 0, [r for r in out.get("hosts", []) if r["status"] != "changed"][:5]
    assert [r["status"] for r in out["hosts"]] == ["changed"] * n
    after = {_sha(v / "site-packages" / "sglang" / SA) for v in vdirs}
    assert len(after) == 1 and pristine not in after  # every host holds the one intended file

    code, out, st = _cli(["rollback", "-i", str(inv)], ledger_dir, bound)
    report["rollback"] = st
    assert code == 0, [r for r in out.get("hosts", []) if r["status"] != "changed"][:5]
    assert [r["status"] for r in out["hosts"]] == ["changed"] * n
    assert {_sha(v / "site-packages" / "sglang" / SA) for v in vdirs} == {pristine}
    if 256 + 4 * n > 1024:
        for op in ("facts", "deploy", "rollback"):
            assert report[op]["nofile"] > 1024  # the soft limit was raised for this many connections
    print("SCALE REPORT", json.dumps(report))
    out_file = os.environ.get("FLEETCTL_SCALE_REPORT")
    if out_file:
        Path(out_file).write_text(json.dumps(report, indent=2) + "\n")
