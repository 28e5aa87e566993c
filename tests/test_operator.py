"""The operator's guard rails (issue 16.1-3, 16.6, issue 11.8): --limit, option checks before any
connection, --any-errors-fatal, and history's "interrupted" for controllers that were killed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port as closed_port
from waiting import until

from fleetctl.cli import main
from fleetctl.ops.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
PB = ROOT / "playbooks" / "dynamic-spec-disable"

pytestmark = pytest.mark.usefixtures("ledger_dir")


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    c = capsys.readouterr()
    return code, c.out, c.err


# ----------------------------------------------------------------------------- before connecting


class Trap:
    """A loopback TCP listener standing in for every host: counts the connections a command opens."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def connections(self) -> int:
        n = 0
        while True:
            try:
                c, _ = self.sock.accept()
            except BlockingIOError:
                return n
            c.close()
            n += 1


@pytest.fixture
def trap(tmp_path: Path) -> Iterator[tuple[Path, Trap]]:
    t = Trap()
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "defaults": {"address": "127.0.0.1", "port": t.port, "connect_timeout": 2, "command_timeout": 5},
        "hosts": {"h01": {"groups": ["a"]}, "h02": {"groups": ["a"]}}}))
    try:
        yield inv, t
    finally:
        t.sock.close()


NONE_LEFT = ["--limit", "!h01,!a"]  # only exclusions that exclude everything

BAD_BEFORE_CONNECTING: list[tuple[list[Any], str]] = [
    # 16.1: an empty selection is bad input for every command
    *[([cmd, *pb, "-i", "{inv}", *NONE_LEFT], "no host matches --limit")
      for cmd, pb in (("facts", []), ("explain", [PB]), ("deploy", [PB]), ("rollback", []), ("status", []),
                      ("launch", [PB]), ("stop", []), ("verify-logs", [PB]), ("servers", []))],
    (["deploy", PB, "-i", "{inv}", "--restart", *NONE_LEFT], "no host matches --limit"),
    # 16.3: every option checked first
    (["deploy", PB, "-i", "{inv}", "--restart", "--serial", "banana"], "--serial 'banana'"),
    (["deploy", PB, "-i", "{inv}", "--restart", "--canary", "0"], "--canary '0'"),
    (["deploy", PB, "-i", "{inv}", "--restart", "--max-fail", "150%"], "--max-fail '150%'"),
    (["deploy", PB, "-i", "{inv}", "--serial", "2"], "with --restart"),
    (["deploy", PB, "-i", "{inv}", "--max-fail", "5%"], "with --restart"),
    (["deploy", PB, "-i", "{inv}", "--timeout", "30"], "with --restart"),
    (["deploy", PB, "-i", "{inv}", "--diff", "--json"], "--diff and --json do not go together"),
    (["deploy", PB, "-i", "{inv}", "--limit", "h01,!zz"], "'zz' matches no host"),
    # 16.2: a deploy id's shape
    (["rollback", "-i", "{inv}", "--to", "nosuchid"], "--to 'nosuchid' is not a deploy id"),
    (["rollback", "-i", "{inv}", "--to", "r20260101-120000-ab12"], "deploy ids start with 'd'"),
    (["rollback", "-i", "{inv}", "--check", "--to", "d2026"], "is not a deploy id"),
    (["stop", "-i", "{inv}", "--instance", "port-1;id"], "not an instance name"),
    (["stop", "-i", "{inv}", "--instance", "30000"], "did you mean port-30000?"),  # was: 'never launched', exit 0
    (["history", "--last", "0"], "--last"),
]


@pytest.mark.parametrize(("argv", "expect"), BAD_BEFORE_CONNECTING,
                         ids=[" ".join(str(a) for a in c[0] if a != PB) for c in BAD_BEFORE_CONNECTING])
def test_bad_options_exit_2_before_any_connection(trap: tuple[Path, Trap], ledger_dir: Path,
                                                  capsys: pytest.CaptureFixture[str], argv: list[Any],
                                                  expect: str) -> None:
    inv, t = trap
    code, out, err = run(capsys, *[str(inv) if a == "{inv}" else a for a in argv])
    assert code == 2, (out, err)
    assert expect in err and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 3  # one line (click usage errors: 3)
    assert t.connections() == 0, "a host was contacted before the options were checked"
    assert not (ledger_dir / "ledger.sqlite").exists() or not Ledger(ledger_dir / "ledger.sqlite").list()


def test_patch_new_checks_the_release_number_before_fetching(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "x.py"
    f.write_text("x = 1\n")
    code, _, err = run(capsys, "patch", "new", f, "--sglang", "0.5.9 --index-url=http://x", "--file", "srt/x.py")
    assert code == 2 and "not an SGLang release number" in err


# ----------------------------------------------------------------------------- on the sandbox


def sandbox_inventory(sb: Any, path: Path, extra_hosts: dict[str, dict[str, Any]] | None = None) -> Path:
    doc = yaml.safe_load(sb.inventory_path.read_text())
    base = sb.inventory_path.parent
    doc["ssh_config"] = str(base / doc["ssh_config"])
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(base / doc["defaults"][k])
    doc["hosts"].update(extra_hosts or {})
    path.write_text(yaml.safe_dump(doc))
    return path


def tree_digest(sb: Any) -> dict[str, str]:
    """sha256 of every file under each host's srt/speculative and server_args (what a deploy changes)."""
    got = {}
    for h in sb.hosts.values():
        for f in sorted((h.sglang_dir / "srt").rglob("*.py")):
            if "speculative" in f.parts or f.name == "server_args.py":
                got[f"{h.name}:{f}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return got


def ledger_ops(ledger_dir: Path) -> list[dict[str, Any]]:
    p = ledger_dir / "ledger.sqlite"
    if not p.exists():
        return []
    lg = Ledger(p)
    try:
        return lg.list()
    finally:
        lg.close()


def test_limit_with_only_exclusions_means_all_but_them(sandbox: Any, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    inv = sandbox_inventory(sandbox, tmp_path / "inv.yaml")
    code, out, err = run(capsys, "deploy", PB, "-i", inv, "--check", "--json", "--limit", "!h01")
    assert code in (0, 1), err
    assert [h["host"] for h in json.loads(out)["plan"]["hosts"]] == ["h02", "h03"]
    code, out, err = run(capsys, "facts", "-i", inv, "--json", "--limit", "all,!h02")
    assert code == 0, err
    assert [h["host"] for h in json.loads(out)["hosts"]] == ["h01", "h03"]


def test_rollback_to_an_id_no_host_has_exits_2_and_records_nothing(sandbox: Any, tmp_path: Path, ledger_dir: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    inv = sandbox_inventory(sandbox, tmp_path / "inv.yaml")
    for extra in ([], ["--check"], ["--json"]):
        code, out, err = run(capsys, "rollback", "-i", inv, "--to", "d20200101-000000-abcd", *extra)
        assert code == 2, (out, err)
        assert "deploy d20200101-000000-abcd is not on any of the 3 selected host(s)" in err
    assert ledger_ops(ledger_dir) == []


def test_any_errors_fatal_changes_no_host_when_one_is_unreachable(sandbox: Any, tmp_path: Path, ledger_dir: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    inv = sandbox_inventory(sandbox, tmp_path / "inv.yaml",
                            {"h99": {"address": "127.0.0.1", "port": closed_port(), "connect_timeout": 3}})
    before = tree_digest(sandbox)
    code, out, err = run(capsys, "deploy", PB, "-i", inv, "--any-errors-fatal", "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["changed"] is False and doc["any_errors_fatal"] is True
    assert [b["host"] for b in doc["blocking"]] == ["h99"] and doc["blocking"][0]["status"] == "unreachable"
    plan = {h["host"]: h["status"] for h in doc["plan"]["hosts"]}
    assert plan["h01"] == "change"  # it would have been patched without the option
    code, out, err = run(capsys, "deploy", PB, "-i", inv, "--any-errors-fatal", "--restart", "--serial", "1")
    assert code == 1 and "--any-errors-fatal" in err and "nothing was changed on any host" in err
    code, out, err = run(capsys, "rollback", "-i", inv, "--any-errors-fatal")
    assert code == 1 and "nothing was changed on any host" in err
    assert tree_digest(sandbox) == before
    assert all(not (h.state_dir / "deploys").exists() or not any((h.state_dir / "deploys").iterdir())
               for h in sandbox.hosts.values())
    assert ledger_ops(ledger_dir) == []


# ----------------------------------------------------------------------------- history: interrupted (11.8)


def _entry(lg: Ledger, op_id: str, pid: int, start: str | None) -> None:
    lg.start(op_id, "deploy", inventory=None, playbook=None, args={}, hosts=["h01", "h02"])
    with lg.db:
        lg.db.execute("UPDATE operations SET pid=?, proc_start=? WHERE id=?", (pid, start, op_id))


def test_ledger_marks_only_dead_controllers_interrupted(tmp_path: Path) -> None:
    from fleetctl.ops.ledger import proc_start

    path = tmp_path / "l.sqlite"
    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        lg = Ledger(path)
        _entry(lg, "d20260101-000000-0001", live.pid, proc_start(live.pid))
        _entry(lg, "d20260101-000000-0002", dead.pid, proc_start(dead.pid))
        _entry(lg, "d20260101-000000-0003", live.pid, "1")  # the pid now names another process
        lg.start("d20260101-000000-0004", "deploy", inventory=None, playbook=None, args={}, hosts=["h01"])
        lg.finish("d20260101-000000-0004", "ok", [{"host": "h01", "status": "changed"}])
        lg.close()
        lg = Ledger(path)
        got = {r["id"][-1]: r for r in lg.list()}
        assert {k: r["outcome"] for k, r in got.items()} == {"1": None, "2": "interrupted", "3": "interrupted",
                                                             "4": "ok"}
        assert got["2"]["hosts_pending"] == 2 and got["4"]["hosts_pending"] == 0
        assert [h["status"] for h in lg.get("d20260101-000000-0002")["hosts"]] == ["pending", "pending"]
        lg.close()
    finally:
        live.kill()
        live.wait()


def _wait_for(pred: Callable[[], Any], what: str) -> Any:
    return until(pred, what)


def test_a_killed_controller_shows_as_interrupted(sandbox: Any, tmp_path: Path, ledger_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from test_launch import make_inventory, playbook_with, reset_host_files, stop_all_local

    inv = make_inventory(sandbox, tmp_path / "inv.yaml", hosts=["h01"],
                         env={"h01": {"FLEETCTL_SIM_START_DELAY": "120"}})
    pb = playbook_with(tmp_path, {})
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(ledger_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl", "launch", "--drop-unknown-flags", "-i", str(inv),
                             str(pb), "--timeout", "300", "--json"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def started() -> Any:
            if proc.poll() is not None:
                raise AssertionError(f"launch ended early: {proc.stderr.read().decode() if proc.stderr else ''}")
            db = ledger_dir / "ledger.sqlite"
            if not db.exists():
                return None
            try:
                with sqlite3.connect(db) as c:
                    return c.execute("SELECT id FROM operations WHERE kind='launch'").fetchone()
            except sqlite3.OperationalError:  # the schema is being created
                return None

        (op_id,) = _wait_for(started, "the launch's ledger entry")
        _wait_for(lambda: list((sandbox.hosts["h01"].state_dir / "servers").glob(f"*/launches/{op_id}.json")),
                  "the server's launch record")
        os.kill(proc.pid, signal.SIGKILL)  # our own child, by pid
        proc.wait(timeout=30)
        code, out, err = run(capsys, "history", "--json")
        assert code == 0, err
        row = next(r for r in json.loads(out)["operations"] if r["id"] == op_id)
        assert row["outcome"] == "interrupted" and row["pid"] == proc.pid and row["hosts_pending"] == 1
        code, out, _ = run(capsys, "history", op_id)
        assert code == 0 and f"launch {op_id}" in out and ": interrupted" in out
        assert f"controller process {proc.pid}" in out and "without a result: h01" in out
        code, out, _ = run(capsys, "history")
        assert "interrupted" in out and "running" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
        stop_all_local(sandbox)
        reset_host_files(sandbox)


# ----------------------------------------------------------------------------- patch check: the origin mistake (16.11)


def test_patch_check_refuses_when_the_launch_runs_an_unpatched_worker(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "patch", "check", ROOT / "playbooks" / "origin-wrong-file", "--sglang", "0.5.9",
                         "--json")
    assert code == 1, err
    doc = json.loads(out)
    (w,) = [p for p in doc["problems"] if p.get("worker_class")]
    assert (w["version"], w["worker_class"], w["worker_file"], w["env"]) == (
        "0.5.9", "EAGLEWorker", "srt/speculative/eagle_worker.py", {})
    code, _, err = run(capsys, "patch", "check", ROOT / "playbooks" / "origin-wrong-file", "--sglang", "0.5.9")
    assert code == 1
    assert ("error: 0.5.9: the playbook's launch (no env) does not run what it patches: 0.5.9 with "
            "SGLANG_ENABLE_SPEC_V2 unset -> disable_overlap_schedule=True -> EAGLEWorker in "
            "srt/speculative/eagle_worker.py; the playbook patches it: no; your patch changes only "
            "eagle_worker_v2.py") in err
    code, out, err = run(capsys, "patch", "check", PB, "--json", "--sglang", "0.5.9", "--sglang", "0.5.14")
    assert code == 0, err
    assert json.loads(out)["problems"] == []  # the real payload patches the worker each release runs


def test_an_unfinished_entry_of_this_very_process_stays_running(tmp_path: Path) -> None:
    lg = Ledger(tmp_path / "l.sqlite")
    lg.start("d20260101-000000-0009", "deploy", inventory=None, playbook=None, args={}, hosts=["h01"])
    assert lg.mark_interrupted() == []
    assert Ledger(tmp_path / "l.sqlite").get("d20260101-000000-0009")["outcome"] is None
    lg.close()


def test_history_counts_a_rollouts_kept_out_hosts_as_not_failed(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "ledger.sqlite")
    try:
        led.start("d20260101-000000-abcd", "deploy", inventory=None, playbook=None, args={})
        led.finish("d20260101-000000-abcd", "failed", [
            {"host": "h01", "status": "ok"}, {"host": "h02", "status": "failed"},
            {"host": "h03", "status": "rolled-back"}, {"host": "h04", "status": "untouched"}])
        (op,) = led.list()
        assert op["hosts"] == 4 and op["hosts_failed"] == 1
    finally:
        led.close()


def test_ctrl_c_before_the_fleet_step_says_interrupted(tmp_path: Path) -> None:
    """A Ctrl-C while the inventory is still being read (here: a FIFO nobody writes) was a silent exit
    130 (typer swallows KeyboardInterrupt): it must say so on stderr. A real SIGINT to our own child."""
    import os
    import signal
    import subprocess
    import sys

    fifo = tmp_path / "inv.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl", "facts", "-i", str(fifo)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    writer = -1
    try:

        def opened() -> int:  # succeeds once the child has the FIFO open; kept open, its read() blocks (no EOF)
            assert proc.poll() is None, proc.communicate()
            try:
                return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK) + 1  # (+1: fd 0 is an answer too)
            except OSError:
                return 0

        writer = until(opened, "fleetctl to open the inventory") - 1
        # (a SIGINT that lands after the FIFO is open but before read() blocks only sets CPython's
        # flag, which the blocked read never checks: as for a user, the next Ctrl-C is seen)
        for _ in range(60):
            proc.send_signal(signal.SIGINT)
            try:
                _out, err = proc.communicate(timeout=2)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            raise AssertionError("fleetctl ignored Ctrl-C")
    finally:
        if writer >= 0:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert b"interrupted (Ctrl-C)" in err and b"Traceback" not in err, err
