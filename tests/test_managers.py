"""Servers under a service manager (issue 32.3): launch.manager supervisor, for real.

supervisord (the PyPI package `supervisor`, a test dependency) is started by the test in the
sandbox host's dir, listening on a unix socket there (no network), including program sections from
a conf.d of its own. fleetctl writes the program section, starts and stops it through
supervisorctl; launch's readiness wait, verify-logs' provenance checks, status, servers, stop and
a rolling restart read the same launch record as for fleetctl's own launches.

The hosts are in-process (`fake_sandbox`, tests/fakehost.py): supervisord, supervisorctl, the launcher
and the servers are real processes; what is checked is the manager's part of launch/stop, not SSH."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.jsoncli import cli

pytestmark = pytest.mark.usefixtures("ledger_dir")

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = REPO / "playbooks" / "dynamic-spec-disable"
BIN = Path(sys.executable).parent


def playbook_with(tmp_path: Path, launch: dict[str, Any], base: Path = PAYLOAD) -> Path:
    doc = yaml.safe_load((base / "playbook.yaml").read_text())
    for files in doc["versions"].values():
        for f in files["files"]:
            f["patch"] = str((base / f["patch"]).resolve())
    doc["launch"] = {**doc.get("launch", {}), **launch}
    p = tmp_path / "pb" / "playbook.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(doc))
    return p


class Supervisord:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf_dir = root / "conf.d"
        self.conf = root / "supervisord.conf"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ctl(self) -> list[str]:
        return [str(BIN / "supervisorctl"), "-c", str(self.conf)]

    def start(self) -> None:
        self.conf_dir.mkdir(parents=True)
        sock = self.root / "s.sock"
        self.conf.write_text(
            f"[unix_http_server]\nfile={sock}\nchmod=0700\n\n"
            f"[supervisord]\nlogfile={self.root / 'supervisord.log'}\npidfile={self.root / 'supervisord.pid'}\n"
            f"childlogdir={self.root}\nnodaemon=true\n\n"
            "[rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n"
            f"[supervisorctl]\nserverurl=unix://{sock}\n\n"
            f"[include]\nfiles={self.conf_dir}/*.conf\n")
        self.proc = subprocess.Popen([str(BIN / "supervisord"), "-c", str(self.conf), "-n"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):  # until it answers on its socket (each try: one supervisorctl run, ~0.2 s)
            if self.proc.poll() is not None:
                raise RuntimeError(f"supervisord exited: {self.proc.returncode}")
            r = subprocess.run([*self.ctl, "pid"], capture_output=True, timeout=30)
            if r.returncode == 0 and r.stdout.strip() == str(self.proc.pid).encode():
                return
        raise RuntimeError("supervisord did not answer")

    def status(self, program: str) -> str:
        return subprocess.run([*self.ctl, "status", program], capture_output=True, timeout=30).stdout.decode()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # supervisord stops its programs, then exits
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def supervised(fake_sandbox: Any, request: pytest.FixtureRequest) -> tuple[Any, Supervisord, Path]:
    if shutil.which("supervisord", path=str(BIN)) is None:
        pytest.skip("supervisor is not installed (pip install supervisor: a test dependency)")
    sb = fake_sandbox(hosts=2, versions=("0.5.9",), gpus=1)
    sv = Supervisord(sb.dir / "hosts" / "h01" / "supervisor")
    request.addfinalizer(sv.stop)
    sv.start()
    doc = yaml.safe_load(sb.inventory_path.read_text())
    for name in doc["hosts"]:
        doc["hosts"][name] = {**(doc["hosts"][name] or {}), "supervisorctl": " ".join(sv.ctl),
                              "supervisor_conf_dir": str(sv.conf_dir)}
    inv = sb.dir / "supervised.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return sb, sv, inv


def test_supervisor_launch_verify_status_stop_rolling(supervised: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _sb, sv, inv = supervised
    pb = playbook_with(tmp_path, {"manager": "supervisor"})
    code, doc = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0, json.dumps(doc)[:3000]
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, pb, "--timeout", "300")
    assert code == 0, json.dumps(doc)[:4000]
    insts = {h["host"]: h["instances"][0] for h in doc["hosts"]}
    name = insts["h01"]["instance"]
    section = (sv.conf_dir / f"fleetctl-{name}.conf").read_text()
    assert f"[program:fleetctl-{name}]" in section and "autostart=false" in section
    assert f"stdout_logfile={insts['h01']['log']}" in section
    # supervisord runs it: its pid is the launcher (the process group), the server its child
    assert "RUNNING" in sv.status(f"fleetctl-{name}"), sv.status(f"fleetctl-{name}")
    sup_pid = int(subprocess.run([*sv.ctl, "pid", f"fleetctl-{name}"], capture_output=True).stdout)
    server = insts["h01"]["pid"]
    assert Path(f"/proc/{server}/stat").read_text().split(") ")[1].split()[1] == str(sup_pid)  # its ppid

    code, doc = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 0, json.dumps(doc)[:4000]
    code, doc = cli(capsys, "servers", "-i", inv)
    assert code == 0 and all(s["running"] for h in doc["hosts"] for s in h["servers"]), doc
    assert {(s["manager"], s["program"]) for h in doc["hosts"] for s in h["servers"]} == {
        ("supervisor", f"fleetctl-{insts[h]['instance']}") for h in insts}
    code, doc = cli(capsys, "status", "-i", inv, pb)
    assert code == 0, json.dumps(doc)[:3000]

    # a rolling restart on the original code goes through supervisorctl too
    code, doc = cli(capsys, "rollback", "-i", inv)
    assert code == 0, doc
    code, doc = cli(capsys, "deploy", "--restart", "--serial", "1", "-i", inv, pb, "--timeout", "300")
    assert code == 0, json.dumps(doc)[:4000]
    code, doc = cli(capsys, "servers", "-i", inv)
    new_pid = {h["host"]: h["servers"][0]["pid"] for h in doc["hosts"]}
    assert new_pid["h01"] != server, doc
    assert "RUNNING" in sv.status(f"fleetctl-{name}")

    code, doc = cli(capsys, "stop", "-i", inv)
    assert code == 0, doc
    stops = [s for h in doc["hosts"] for s in h["instances"]]
    assert all(s["action"] == "stopped" and s["how"] == "supervisorctl stop" for s in stops), stops
    assert "STOPPED" in sv.status(f"fleetctl-{name}")
    assert not Path(f"/proc/{new_pid['h01']}").exists()


def test_supervisor_refuses_a_missing_conf_dir(supervised: Any, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    sb, sv, inv = supervised
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["h01"]["supervisor_conf_dir"] = str(sv.root / "nope")
    bad = sb.dir / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    pb = playbook_with(tmp_path, {"manager": "supervisor"})
    from fleetctl.cli import main

    capsys.readouterr()
    code = main(["launch", "--drop-unknown-flags", "-i", str(bad), str(pb), "--timeout", "300", "--limit", "h01", "--json"])
    got = capsys.readouterr()
    assert code == 1, got
    msg = json.dumps(json.loads(got.out))
    assert f"supervisor conf dir {sv.root / 'nope'} does not exist" in msg, msg[:3000]
    assert not os.listdir(sv.conf_dir)
