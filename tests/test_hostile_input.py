"""Hostile input: shell metacharacters, spaces, quotes and newlines in inventory paths, env values,
host names, CLI values are passed through exactly or refused, never executed; secrets never show
in output, ledger, manifests, logs or remote command lines; remote state files are private; a
stale deploy lock is detected, reported and cleared."""

from __future__ import annotations

import json
import marshal
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_faults import (
    EW2,
    SA,
    VERSION,
    make_playbook,
    reset_host,
    run,
    run_json,
    spawn_faulted,
    wait_file,
    write_inventory,
)

from fleetctl.engines import wheels
from fleetctl.sandbox import lifecycle as sbx

pytestmark = [pytest.mark.usefixtures("ledger_dir"), pytest.mark.fleet,
              pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="OpenSSH sshd is not installed")]

EVIL = "$(touch {p}/PWNED-a) `touch {p}/PWNED-b`; touch {p}/PWNED-c | x && y \"dq\" 'sq' \\ *\nline2 >{p}/PWNED-d"
SECRET = "s3cr3t-Zq9$(touch /tmp/never)-VALUE"



@pytest.fixture(scope="module")
def hfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sbx.Sandbox, Path]]:
    d = tmp_path_factory.mktemp("hostile")
    try:
        sb = sbx.up(d / "sb", hosts=1, versions=[VERSION], gpus=1)
        yield sb, make_playbook(d / "pb", files=(EW2, SA), tag="hostile")
    finally:
        sbx.down(d / "sb", missing_ok=True)


@pytest.fixture
def fleet(hfleet: tuple) -> Iterator[tuple[sbx.Sandbox, Path]]:
    for h in hfleet[0].hosts.values():
        reset_host(h, (EW2, SA))
    yield hfleet
    for h in hfleet[0].hosts.values():
        reset_host(h, (EW2, SA))


def pwned(*dirs: Path) -> list[Path]:
    found = []
    for d in dirs:
        found += [p for p in d.rglob("PWNED*")]
    return found + [p for p in Path("/tmp").glob("PWNED*")] + [p for p in Path.cwd().glob("PWNED*")]


def hold_agent(sb: sbx.Sandbox, inv: Path, pb: Path, ledger: Path, at: str = "locked",
               n: int | None = None) -> tuple[subprocess.Popen[str], int]:
    """A deploy whose agent on h01 waits at `at`; returns the process and the agent's pid."""
    marker = sb.hosts["h01"].host_dir / "hold-marker"
    marker.unlink(missing_ok=True)
    f = {"at": at, "how": "wait", "hold": 2.0, "marker": str(marker), **({"n": n} if n else {})}
    proc = spawn_faulted({"h01": f}, "deploy", "-i", str(inv), str(pb), "--json", ledger=ledger)
    wait_file(marker)
    return proc, int(marker.read_text())


def test_metacharacters_in_paths_and_env_are_data(fleet: tuple, tmp_path: Path, ledger_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sb, pb = fleet
    h = sb.hosts["h01"]
    evil = EVIL.format(p=tmp_path)
    # the host's python, sglang_dir and state_dir, at paths full of shell syntax
    # (a venv of the host's interpreter there: a bare symlink to a venv's python is not in the venv)
    pydir = sbx.install_host_python(tmp_path / "py $(touch PWNED-py); 'q' \"dq\" `x`", sb.host_python,
                                    [h.site_packages, sb.dir / sbx.HOSTLIB]).parent
    sgdir = tmp_path / "sg dir;$(touch PWNED-sg)&&'"
    sgdir.symlink_to(h.sglang_dir, target_is_directory=True)
    state = tmp_path / "state $(touch PWNED-st) `x` ; \"q\" 'q'\nnl"
    inv = write_inventory(sb, tmp_path / "inv.yaml")
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["h01"].update({"python": str(pydir / "python"), "sglang_dir": str(sgdir), "state_dir": str(state)})
    doc["hosts"]["h01"]["env"].update({"EVIL": evil, "EVIL2": "; touch PWNED-e2", "EVIL3": "$(touch PWNED-e3)",
                                       "EMPTY": "", "SPACES": "  a  b  "})
    doc["hosts"]["h01"]["flags"] = {"--served-model-name": evil}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))

    proc, pid = hold_agent(sb, inv, pb, ledger_dir)
    env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    proc_out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, proc_out
    assert env[b"EVIL"] == evil.encode() and env[b"EVIL2"] == b"; touch PWNED-e2"  # passed through exactly
    assert env[b"EMPTY"] == b"" and env[b"SPACES"] == b"  a  b  "
    assert (state / "deploys").is_dir() and (state / "deploys").stat().st_mode & 0o777 == 0o700
    for args in (["status", "-i", str(inv), str(pb)], ["explain", "-i", str(inv), str(pb)],
                 ["facts", "-i", str(inv)], ["rollback", "-i", str(inv)]):
        code, out, err = run(capsys, *args)
        assert code in (0, 1) and "Traceback" not in out + err, (args, out, err)
    assert (h.sglang_dir / EW2).read_bytes() == wheels.pristine_bytes(VERSION, EW2)
    assert pwned(tmp_path, sb.dir) == []


@pytest.mark.parametrize("name", ["h01;touch PWNED", "$(touch PWNED)", "h 01", "h'01", 'h"01', "h01\ntouch PWNED",
                                  "`touch PWNED`", "-oProxyCommand=touch PWNED", "h01|x"])
def test_hostile_host_names_refused(fleet: tuple, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    sb, pb = fleet
    inv = write_inventory(sb, tmp_path / "inv.yaml")
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"] = {name: doc["hosts"]["h01"]}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, out, err = run(capsys, "deploy", "-i", str(inv), str(pb))
    assert code == 2 and out == "", (out, err)
    assert len(err.strip().splitlines()) == 1 and "inv.yaml:" in err and "not a valid name" in err
    assert pwned(tmp_path, sb.dir) == []


def test_hostile_cli_values(fleet: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    sb, pb = fleet
    monkeypatch.chdir(tmp_path)
    inv = str(sb.inventory_path)
    code, out, err = run(capsys, "deploy", "-i", inv, "--limit", "$(touch PWNED-l);h01", str(pb))
    assert code == 2 and "matches no host" in err
    code, out, err = run(capsys, "rollback", "-i", inv, "--to", "../../$(touch PWNED-to); touch PWNED-to2")
    assert code == 2 and "is not a deploy id" in err and out == ""  # refused by its shape, before any host
    code, out, err = run(capsys, "deploy", "-i", inv, str(tmp_path / "pb $(touch PWNED-pb).yaml"))
    assert code == 2 and "playbook file not found" in err
    code, out, err = run(capsys, "history", "$(touch PWNED-h)")
    assert code in (1, 2) and "no operation" in err  # exit 1 today: commands/deploys raises FleetctlError
    assert pwned(tmp_path, sb.dir) == []


def test_secrets_never_shown_logged_or_on_a_command_line(fleet: tuple, tmp_path: Path, ledger_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    sb, pb = fleet
    h = sb.hosts["h01"]
    inv = write_inventory(sb, tmp_path / "inv.yaml")
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["h01"]["env"]["HF_TOKEN"] = {"value": SECRET, "secret": True}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    seen: list[str] = []

    proc, pid = hold_agent(sb, inv, pb, ledger_dir)
    cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes() for p in [pid, *_ancestors(pid)]]
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    o, e = proc.communicate(timeout=60)
    assert proc.returncode == 0, o + e
    seen += [o, e]
    assert all(SECRET.encode() not in c for c in cmdlines), cmdlines  # not on any command line
    assert SECRET.encode() not in environ  # nor in the initial environment (it comes over stdin)
    i, p = str(inv), str(pb)
    for args in (["facts", "-i", i, "--json"], ["facts", "-i", i, "--debug"], ["status", "-i", i, p, "--json"],
                 ["explain", "-i", i, p], ["explain", "-i", i, p, "--json", "--debug"],
                 ["rollback", "-i", i, "--debug"], ["deploy", "-i", i, p, "--json"], ["deploy", "-i", i, p],
                 ["rollback", "-i", i, "--json"], ["history"], ["history", "--json"]):
        _code, out, err = run(capsys, *args)
        seen += [out, err]
    blob = "\n".join(seen)
    assert SECRET not in blob and "s3cr3t" not in blob
    db = ledger_dir / "ledger.sqlite"
    assert SECRET.encode() not in db.read_bytes()
    rows = sqlite3.connect(db).execute("SELECT * FROM host_results").fetchall()
    assert rows and SECRET not in json.dumps(rows)
    for f in [*h.state_dir.rglob("*"), h.log]:
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f
    assert not Path("/tmp/never").exists()


def test_secret_env_reaches_the_agent_over_stdin(tmp_path: Path) -> None:
    """The BOOTSTRAP's secret-env block: the agent's os.environ (and so whatever it starts) has the
    value, exactly, though it was on no command line."""
    from fleetctl.transport.session import HELLO_SIZE
    from fleetctl.transport.ssh import BOOTSTRAP

    src = b"import os, sys\ndef serve_once(d):\n    sys.stdout.write(os.environ['HF_TOKEN'] + '|' + d.decode())\n    return 0\n"
    block = marshal.dumps({"HF_TOKEN": SECRET + "\n'\"$x"}, 4)
    data = b"P%010d" % len(src) + src + b"E%010d" % len(block) + block + b'{"action": "ping"}'
    r = subprocess.run([sys.executable, "-c", BOOTSTRAP], input=data, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout[:7] == b"FLAGENT"  # the hello (no cache dir: it reads the code block)
    assert r.stdout[HELLO_SIZE:].decode() == SECRET + "\n'\"$x" + '|{"action": "ping"}'


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        try:
            stat_ = Path(f"/proc/{pid}/stat").read_bytes()
        except FileNotFoundError:
            break
        pid = int(stat_[stat_.rfind(b")") + 2:].split()[1])
        out.append(pid)
    return out[:6]


def test_remote_temp_backup_and_state_files_are_private(fleet: tuple, tmp_path: Path, ledger_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    sb, pb = fleet
    h = sb.hosts["h01"]
    inv = sb.inventory_path
    # the temp file beside the target, caught before its rename
    proc, _ = hold_agent(sb, inv, pb, ledger_dir, at="mid_write", n=1)
    tmp_modes = [stat.S_IMODE(p.stat().st_mode) for p in (h.sglang_dir / "srt").rglob(".*.tmp")]
    lock_mode = stat.S_IMODE((h.state_dir / "lock").stat().st_mode)
    o, e = proc.communicate(timeout=60)
    assert proc.returncode == 0, o + e
    assert tmp_modes == [0o600]
    assert lock_mode == 0o600
    # a drifted file rolled back with --force: its bytes are kept in a forced-* copy
    (h.sglang_dir / SA).write_bytes((h.sglang_dir / SA).read_bytes() + b"# hand edit\n")
    code, doc = run_json(capsys, "rollback", "--force", "-i", str(inv))
    assert code == 0, doc
    forced = list((h.state_dir / "deploys").glob("*/forced-*/srt/server_args.py"))
    assert len(forced) == 1
    bad = []
    for p in (h.state_dir / "deploys").rglob("*"):
        mode = stat.S_IMODE(p.lstat().st_mode)
        if (p.is_dir() and mode != 0o700) or (p.is_file() and mode != 0o600):
            bad.append((str(p.relative_to(h.state_dir)), oct(mode)))
    assert bad == []
    assert stat.S_IMODE((h.state_dir / "deploys").stat().st_mode) == 0o700


def test_stale_lock_detected_reported_and_cleared(fleet: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, pb = fleet
    h = sb.hosts["h01"]
    inv = str(sb.inventory_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    h.state_dir.mkdir(exist_ok=True)
    (h.state_dir / "lock").write_text(json.dumps({"pid": int(dead.stdout), "op": "deploy", "id": "dGONE",
                                                  "by": "bob@ctl", "since": 0}))
    code, doc = run_json(capsys, "status", "-i", inv)
    assert code == 1 and any("stale lock: deploy dGONE by bob@ctl" in p for p in doc["hosts"][0]["problems"]), doc
    code, doc = run_json(capsys, "rollback", "--check", "-i", inv)
    assert doc["plan"][0]["status"] == "change" and "stale lock" in doc["plan"][0]["reason"]
    code, doc = run_json(capsys, "rollback", "-i", inv)  # nothing to roll back, but the stale lock goes
    assert code == 0 and "removed a stale lock of deploy dGONE by bob@ctl" in doc["hosts"][0]["message"], doc
    assert not (h.state_dir / "lock").exists()
    code, doc = run_json(capsys, "status", "-i", inv)
    assert code == 0 and not doc["hosts"][0]["problems"]
    # the same through deploy, and a live holder is never taken for stale
    (h.state_dir / "lock").write_text(json.dumps({"pid": int(dead.stdout), "op": "rollback", "id": "rGONE",
                                                  "by": "eve@ctl", "since": 0}))
    code, doc = run_json(capsys, "deploy", "-i", inv, str(pb))
    assert code == 0 and any("removed a stale lock of rollback rGONE" in n for n in doc["hosts"][0]["notes"]), doc
    (h.state_dir / "lock").write_text(json.dumps({"pid": os.getpid(), "op": "deploy", "id": "dLIVE", "by": "me",
                                                  "since": 0}))
    code, doc = run_json(capsys, "rollback", "-i", inv)
    assert code == 1 and "locked: deploy dLIVE by me" in doc["hosts"][0]["message"]
    (h.state_dir / "lock").unlink()
