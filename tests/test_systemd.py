"""launch.manager systemd (issue 32.3), for what runs here: systemd is not PID 1 on this machine, so
no unit can be started. Tested for real instead: the unit fleetctl writes, checked by systemd's own
`systemd-analyze verify`; and the journal as verify-logs reads it, from a real journal file
(written by systemd-journal-remote from export-format entries of two invocations of the unit) read
back through the real journalctl: only this invocation's lines reach the launch's log, incrementally
(by cursor), including a message that is not UTF-8 (journalctl's byte-array form), and the agent's
grep (what verify-logs asks) sees exactly those."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetctl.remote import core as rcore
from fleetctl.remote import servers as a

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
INV = "4c3f2b8a1d2e4f5a9b8c7d6e5f4a3b2c"
OTHER = "0123456789abcdef0123456789abcdef"  # an earlier start of the same unit


def test_unit_has_the_launch_argv_env_and_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "fleetctl.sandbox.simulator", "--model-path", "/models/a b",
            "--speculative-num-steps", "3", "--json-arg", '{"k": "v\\\\"}', "--pct", "90%", "--dollar", "$HOME"]
    env = {"PATH": "/usr/bin:/bin", "NCCL_DEBUG": "WARN", "ODD": 'a "quoted" 50% $x \\ back'}
    unit = a.systemd_unit("fleetctl-port-30000.service", "port-30000", "l1", argv, env,
                          str(tmp_path / "l1.env"), "/tmp", 30)
    assert unit.splitlines()[0].startswith("# written by fleetctl")
    assert f'ExecStart="{sys.executable}" "-m" "fleetctl.sandbox.simulator" "--model-path" "/models/a b"' in unit
    assert '"--pct" "90%%" "--dollar" "$$HOME"' in unit and '"--json-arg" "{\\"k\\": \\"v\\\\\\\\\\"}"' in unit
    assert 'Environment="ODD=a \\"quoted\\" 50%% $x \\\\ back"' in unit
    assert "Restart=no" in unit and "TimeoutStopSec=30" in unit and "[Install]" not in unit
    (tmp_path / "l1.env").write_text(a.env_file_text({"HF_TOKEN": 'se"cr$et'}))
    assert (tmp_path / "l1.env").read_text() == 'HF_TOKEN="se\\"cr\\$et"\n'
    path = tmp_path / "fleetctl-port-30000.service"
    path.write_text(unit)
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    # ... and verify does catch a broken line (the check above is not vacuous)
    path.write_text(unit.replace("Type=exec", "Type=bogus"))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True)
    assert "Failed to parse service type" in r.stderr
    with pytest.raises(rcore.AgentError, match="newline"):
        a.systemd_unit("u.service", "u", "l1", ["/bin/x", "a\nb"], {}, None, "/", 5)


def test_dropin_for_an_operators_template_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd_unit: sglang@.service` in the inventory: fleetctl writes a drop-in for the instance
    of the operator's template (its ExecStart= cleared, then the launch's), checked by systemd with
    the operator's unit it overrides."""
    unit = a.operator_unit("sglang@.service", "port-30000")
    assert unit == "sglang@port-30000.service" and a.operator_unit("sglang.service", "x") == "sglang.service"
    with pytest.raises(rcore.AgentError, match="name a service unit"):
        a.operator_unit("../evil.service", "x")
    drop = a.systemd_dropin(unit, "l1", [sys.executable, "-c", "print(1)"], {"NCCL_DEBUG": "WARN"}, None, "/tmp", 20)
    lines = drop.splitlines()
    assert lines[1:4] == ["[Service]", "ExecStart=", f'ExecStart="{sys.executable}" "-c" "print(1)"'], lines
    assert 'Environment="NCCL_DEBUG=WARN"' in lines and "TimeoutStopSec=20" in lines
    (tmp_path / "sglang@.service").write_text("[Unit]\nDescription=the operator's SGLang\n\n[Service]\n"
                                              "ExecStart=/usr/bin/false\nUser=root\n")
    d = tmp_path / f"{unit}.d"
    d.mkdir()
    (d / "50-fleetctl.conf").write_text(drop)
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / unit)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    (d / "50-fleetctl.conf").write_text(drop.replace("KillMode=control-group", "KillMode=bogus"))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / unit)], capture_output=True, text=True)
    assert "50-fleetctl.conf" in r.stderr  # the drop-in is read with the unit (the check above is not vacuous)


def _export(entries: list[dict[str, bytes | str]]) -> bytes:
    """systemd's journal export format (binary-safe fields length-prefixed)."""
    out = b""
    for fields in entries:
        for k, v in fields.items():
            b = v if isinstance(v, bytes) else v.encode()
            if b"\n" in b or any(c >= 128 for c in b):
                out += k.encode() + b"\n" + struct.pack("<Q", len(b)) + b + b"\n"
            else:
                out += k.encode() + b"=" + b + b"\n"
        out += b"\n"
    return out


def write_journal(path: Path, messages: list[tuple[str, bytes]], start: int) -> None:
    now = int(time.time() * 1e6)
    entries = [{"__CURSOR": f"s=1;i={start + i}", "__REALTIME_TIMESTAMP": str(now + i),
                "__MONOTONIC_TIMESTAMP": str(1000 + start + i), "_BOOT_ID": "0" * 32, "MESSAGE": msg,
                "_SYSTEMD_INVOCATION_ID": inv, "_SYSTEMD_UNIT": "fleetctl-port-30000.service", "_PID": "4242",
                "SYSLOG_IDENTIFIER": "fleetctl-port-30000", "PRIORITY": "6"} for i, (inv, msg) in enumerate(messages)]
    src = path.with_suffix(".export")
    src.write_bytes(_export(entries))
    r = subprocess.run([JOURNAL_REMOTE, "-o", str(path), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def journal_tools() -> None:
    if shutil.which("journalctl") is None or not os.access(JOURNAL_REMOTE, os.X_OK):
        pytest.skip("journalctl / systemd-journal-remote are not installed (scripts/setup.sh installs them)")


def test_journal_of_this_invocation_only_feeds_the_launch_log(journal_tools: None, tmp_path: Path) -> None:
    j1 = tmp_path / "a.journal"
    write_journal(j1, [(OTHER, b"2026-01-01 00:00:00 an earlier start: marker from the old run"),
                       (INV, b"[2026-12-02 10:00:00] server args: ..."),
                       (INV, "r\u00e9sum\u00e9 \u00e9".encode()),
                       (INV, b"bad byte \xff here"),
                       (OTHER, b"late line of the old run")], 1)
    raw = subprocess.run(["journalctl", "--file", str(j1), "-o", "json", "--no-pager",
                          f"_SYSTEMD_INVOCATION_ID={INV}"], capture_output=True, check=True).stdout
    assert b'"MESSAGE":[98,97,100' in raw  # journalctl's own form of a message that is not UTF-8
    lines, cursor = a.parse_journal(raw, INV)
    assert lines == ["[2026-12-02 10:00:00] server args: ...", "r\u00e9sum\u00e9 \u00e9", "bad byte \ufffd here"]
    assert cursor and cursor.startswith("s=")
    # an entry of another invocation is dropped even if journalctl were to send it
    all_raw = subprocess.run(["journalctl", "--file", str(j1), "-o", "json", "--no-pager"], capture_output=True,
                             check=True).stdout
    assert a.parse_journal(all_raw, INV)[0] == lines
    with pytest.raises(rcore.AgentError, match="not JSON"):
        a.parse_journal(b"Hint: You are currently not seeing messages from other users\n", INV)

    # sync_journal: the record's journal appended to its log, then only what came after the cursor
    state = tmp_path / "state"
    name, lid = "port-30000", "l20261202-100000-abcd"
    d = state / "servers" / name
    for sub in ("logs", "launches"):
        (d / sub).mkdir(parents=True)
    log = d / "logs" / f"{lid}.log"
    log.write_bytes(b"")
    rec = {"instance": name, "launch_id": lid, "manager": "systemd", "program": "fleetctl-port-30000.service",
           "invocation_id": INV, "log": str(log), "journalctl": ["journalctl", "--file", str(j1)], "pid": None}
    a.save_record(str(state), rec)
    a.sync_journal(rec)
    assert log.read_text().splitlines() == lines
    a.sync_journal(rec)  # nothing new: nothing appended
    assert log.read_text().splitlines() == lines
    # the grep verify-logs asks for: this invocation's lines only (the old run's marker is not there)
    got = a.action_server_grep({"state_dir": str(state), "instances": [name], "patterns": ["marker", "server args"]})
    m = got["instances"][name]["matches"]
    assert m["marker"]["count"] == 0 and m["server args"]["count"] == 1, json.dumps(got)[:2000]


def _systemd_runs() -> bool:
    try:
        return Path("/proc/1/comm").read_text().strip() == "systemd" and os.getuid() == 0 \
            and shutil.which("systemctl") is not None
    except OSError:
        return False


@pytest.mark.fleet
@pytest.mark.usefixtures("ledger_dir")
@pytest.mark.skipif(not _systemd_runs(), reason="systemd is not PID 1 here (or not root): no unit can run")
def test_live_systemd_launch_verify_replace_stop(fresh_sandbox: object, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Where systemd runs (not on the machine fleetctl was built on): the whole path through
    systemctl and the journal, units in /run/systemd/system (gone at reboot), removed at the end."""
    import yaml

    from tests.jsoncli import cli
    from tests.test_managers import PAYLOAD, playbook_with

    sb = fresh_sandbox(hosts=1, versions=("0.5.9",), gpus=1)  # type: ignore[operator]
    doc = yaml.safe_load(sb.inventory_path.read_text())
    doc["hosts"]["h01"]["systemd_unit_dir"] = "/run/systemd/system"
    inv = sb.dir / "systemd.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    pb = playbook_with(tmp_path, {"manager": "systemd"}, PAYLOAD)
    units: list[Path] = []
    try:
        code, d = cli(capsys, "deploy", "-i", inv, pb)
        assert code == 0, d
        code, d = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, pb, "--timeout", "300")
        assert code == 0, json.dumps(d)[:3000]
        name = d["hosts"][0]["instances"][0]["instance"]
        units.append(Path(f"/run/systemd/system/fleetctl-{name}.service"))
        code, d = cli(capsys, "verify-logs", "-i", inv, pb)
        assert code == 0, json.dumps(d)[:3000]
        code, d = cli(capsys, "launch", "--replace", "--drop-unknown-flags", "-i", inv, pb, "--timeout", "300")
        assert code == 0, json.dumps(d)[:3000]
        code, d = cli(capsys, "verify-logs", "-i", inv, pb)  # the new invocation's journal only
        assert code == 0, json.dumps(d)[:3000]
        code, d = cli(capsys, "stop", "-i", inv)
        assert code == 0 and d["hosts"][0]["instances"][0]["how"] == "systemctl stop", d
    finally:
        cli(capsys, "stop", "-i", inv)
        for u in units:
            u.unlink(missing_ok=True)
        subprocess.run(["systemctl", "daemon-reload"], check=False)
