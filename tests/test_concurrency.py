"""Two operations on one host at once: exactly one holds the host's lock, the other is refused with
who holds it (exit 1) and changes nothing. The first holds the lock deterministically through the
agent's test-only fault point `locked` (how=wait). Plus the stale-lock take-over race, run on the
agent itself (no sshd needed)."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faulthook import faulted
from test_faults import (
    EW,
    EW2,
    SA,
    VERSION,
    intended_bytes,
    make_playbook,
    reset_host,
    run_json,
    sha,
    spawn_faulted,
    wait_file,
    write_inventory,
)

from fleetctl.engines import wheels
from fleetctl.remote import agent_source
from fleetctl.sandbox import lifecycle as sbx
from fleetctl.transport.session import HELLO, HELLO_SIZE
from fleetctl.transport.ssh import BOOTSTRAP

pytestmark = [pytest.mark.usefixtures("ledger_dir")]



@pytest.fixture(scope="module")
def cfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sbx.Sandbox, Path, Path, Path]]:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("OpenSSH sshd is not installed")
    d = tmp_path_factory.mktemp("concfleet")
    try:
        sb = sbx.up(d / "sb", hosts=2, versions=[VERSION], gpus=1)
        inv = write_inventory(sb, d / "inventory.yaml", command_timeout=30)
        yield sb, inv, make_playbook(d / "a", files=(EW2, SA), tag="a"), make_playbook(d / "b", files=(EW,), tag="b")
    finally:
        sbx.down(d / "sb", missing_ok=True)


@pytest.fixture
def clean(cfleet: tuple) -> tuple:
    for h in cfleet[0].hosts.values():
        reset_host(h, (EW2, SA, EW))
    return cfleet


def hold(sb: sbx.Sandbox, host: str, ledger: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """Start `fleetctl ARGS --json` whose agent on `host` sits on the lock until `finish` releases it
    (the test says when: no hold time races the second command on a loaded machine)."""
    marker = sb.hosts[host].state_dir.parent / "lock-held"
    marker.unlink(missing_ok=True)
    release = marker.with_name("lock-release")
    release.unlink(missing_ok=True)
    proc = spawn_faulted({host: {"at": "locked", "how": "until", "release": str(release), "hold": 600,
                                 "marker": str(marker)}}, *args, "--json", ledger=ledger)
    proc.release = release  # type: ignore[attr-defined]
    try:
        wait_file(marker)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, marker


def finish(proc: subprocess.Popen[str]) -> tuple[int, dict]:
    release = getattr(proc, "release", None)
    if release is not None:
        release.write_text("go")
    out, _err = proc.communicate(timeout=600)  # a hang bound
    return proc.returncode, json.loads(out)


def files_of(h: sbx.SandboxHost) -> dict[str, str]:
    return {rel: sha((h.sglang_dir / rel).read_bytes()) for rel in (EW2, SA, EW)}


@pytest.mark.fleet
def test_two_deploys_at_once_second_refused_with_the_holder(clean: tuple, ledger_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pa, _ = clean
    h1 = sb.hosts["h01"]
    first, _ = hold(sb, "h01", ledger_dir, "deploy", "-i", str(inv), str(pa))
    before = files_of(h1)
    code, doc = run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pa))
    assert code == 1
    (r,) = doc["hosts"]
    assert r["status"] == "failed" and "locked: deploy d" in r["message"] and " by " in r["message"], r
    assert files_of(h1) == before  # the refused deploy changed nothing
    code1, doc1 = finish(first)
    assert code1 == 0, doc1
    assert doc1["op_id"] in r["message"]  # it named the holder: the first deploy's id
    it = intended_bytes(pa)
    for rel in (EW2, SA):
        assert (h1.sglang_dir / rel).read_bytes() == it[rel]
    assert not (h1.state_dir / "lock").exists()


@pytest.mark.fleet
def test_deploy_holding_the_lock_refuses_a_rollback(clean: tuple, ledger_dir: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pa, pb = clean
    h1 = sb.hosts["h01"]
    assert run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pa))[0] == 0
    first, _ = hold(sb, "h01", ledger_dir, "deploy", "-i", str(inv), "--limit", "h01", str(pb))
    before = files_of(h1)
    code, doc = run_json(capsys, "rollback", "-i", str(inv), "--limit", "h01")
    assert code == 1
    (r,) = doc["hosts"]
    assert r["status"] == "failed" and "locked: deploy d" in r["message"], r
    assert files_of(h1) == before
    code1, doc1 = finish(first)
    assert code1 == 0 and doc1["op_id"] in r["message"], doc1
    assert (h1.sglang_dir / EW).read_bytes() == intended_bytes(pb)[EW]


@pytest.mark.fleet
def test_rollback_holding_the_lock_refuses_a_deploy(clean: tuple, ledger_dir: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pa, pb = clean
    h1 = sb.hosts["h01"]
    assert run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pa))[0] == 0
    first, _ = hold(sb, "h01", ledger_dir, "rollback", "-i", str(inv), "--limit", "h01")
    before = files_of(h1)
    code, doc = run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pb))
    assert code == 1
    (r,) = doc["hosts"]
    assert r["status"] == "failed" and "locked: rollback r" in r["message"], r
    assert files_of(h1) == before
    code1, doc1 = finish(first)
    assert code1 == 0 and doc1["op_id"] in r["message"], doc1
    for rel in (EW2, SA, EW):
        assert (h1.sglang_dir / rel).read_bytes() == wheels.pristine_bytes(VERSION, rel)


@pytest.mark.fleet
def test_wait_lock_waits_for_the_holder_then_deploys(clean: tuple, ledger_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A second controller with --wait-lock SECONDS waits for the lock instead of failing at once
    (issue 30.7; before: no such option), then deploys; without it the refusal names the option. The
    holder lets go only once the waiting agent says it waits (fault point lock_wait): no timing."""
    sb, inv, pa, pb = clean
    h1 = sb.hosts["h01"]
    assert run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pa),
                    "--allow-uncovered")[0] == 0  # (coverage is not what this test is about)
    first, _ = hold(sb, "h01", ledger_dir, "rollback", "-i", str(inv), "--limit", "h01")
    code, doc = run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pb), "--allow-uncovered")
    assert code == 1 and "--wait-lock SECONDS" in doc["hosts"][0]["message"], doc["hosts"][0]
    waiting = h1.state_dir.parent / "lock-waiting"
    waiting.unlink(missing_ok=True)
    second = spawn_faulted({"h01": {"at": "lock_wait", "how": "mark", "marker": str(waiting)}},
                           "deploy", "-i", str(inv), "--limit", "h01", str(pb), "--allow-uncovered",
                           "--wait-lock", "600", "--json", ledger=ledger_dir)
    try:
        wait_file(waiting)  # the second agent waits for the lock the first holds
    finally:
        code1, doc1 = finish(first)
        out2, err2 = second.communicate(timeout=600)  # a hang bound
    assert code1 == 0, doc1
    doc2 = json.loads(out2)
    assert second.returncode == 0 and doc2["hosts"][0]["state"] == "changed", (doc2, err2)
    assert (h1.sglang_dir / EW).read_bytes() == intended_bytes(pb)[EW]


# ------------------------------------------------------------------ the stale-lock take-over race (local)


def _agent(p: dict) -> subprocess.Popen[bytes]:
    src = agent_source()
    proc = subprocess.Popen([sys.executable, "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.read(HELLO_SIZE).startswith(HELLO)  # no cache dir: it asks for the code
    proc.stdin.write(b"P%010d" % len(src) + src + marshal.dumps(p, 4))
    proc.stdin.close()
    return proc


def _result(proc: subprocess.Popen[bytes]) -> dict:
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(30)
    return json.loads(out)


def test_stale_lock_taken_over_by_exactly_one_of_two_agents(tmp_path: Path) -> None:
    """Two agents find the same stale lock at once. Only one may take it over: the other must be
    refused, never remove the winner's fresh lock and run alongside it."""
    pkg = tmp_path / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "a.py").write_bytes(b"A = 1\n")
    sd = tmp_path / "state"
    sd.mkdir(mode=0o700)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (sd / "lock").write_text(json.dumps({"pid": int(dead.stdout), "op": "deploy", "id": "dOLD", "by": "x",
                                         "since": 0}))

    def payload(did: str, fault: Any) -> dict:
        return faulted({"action": "deploy", "state_dir": str(sd), "deploy_id": did, "package_dir": str(pkg),
                        "by": did, "files": [{"path": "srt/a.py", "sha_before": sha(b"A = 1\n"),
                                              "sha_after": sha(b"A = 2\n"), "content": b"A = 2\n"}],
                        "verify_paths": ["srt/a.py"]}, fault)

    # Each step is held until the test says (fault points "until" a release file): A inside the
    # take-over's guard; B found the stale lock too and waits for that guard; then A takes over and
    # holds its fresh lock until B has had its answer. Before: 1.5 s holds, which a loaded machine
    # outran (A finished its whole deploy before B looked, and both "won", one after the other).
    ma, mb0, mb = tmp_path / "a-saw-stale", tmp_path / "b-at-guard", tmp_path / "b-locked"
    go_a, done_b = tmp_path / "go-a", tmp_path / "done-b"
    a = _agent(payload("dA", [
        {"at": "stale_lock_seen", "how": "until", "release": str(go_a), "hold": 600, "marker": str(ma)},
        {"at": "locked", "how": "until", "release": str(done_b), "hold": 600}]))
    wait_file(ma)
    b = _agent(payload("dB", [
        {"at": "guard_wait", "how": "mark", "marker": str(mb0)},
        {"at": "locked", "how": "mark", "marker": str(mb)}]))
    wait_file(mb0)
    go_a.write_text("go")
    rb = _result(b)
    done_b.write_text("go")
    ra = _result(a)
    a_won = ra.get("ok") or "locked" not in ra.get("error", "")
    b_won = mb.exists()
    assert a_won != b_won, (ra, rb, b_won)
    loser = rb if a_won else ra
    assert not loser["ok"] and loser["kind"] == "locked" and "locked:" in loser["error"], loser
    assert (pkg / "srt" / "a.py").read_bytes() == b"A = 2\n"
    assert not (sd / "lock").exists()


def test_lock_file_is_never_seen_empty(tmp_path: Path) -> None:
    """A lock is created with its content in one step (link of a complete temp file), so a competitor
    never reads an empty, 'unreadable' lock and takes it for stale; a young unreadable lock is not stale."""
    from fleetctl.remote import lock as rlock

    sd = str(tmp_path / "state")
    rlock.acquire_lock(sd, "deploy", "d1", "t")
    info = json.loads((tmp_path / "state" / "lock").read_text())
    assert info["pid"] == os.getpid() and info["id"] == "d1"
    rlock.release_lock(sd)
    (tmp_path / "state" / "lock").write_text("")  # e.g. written by an older agent that was cut off just now
    assert rlock.read_lock(sd)["stale"] is False
    old = time.time() - 3600
    os.utime(tmp_path / "state" / "lock", (old, old))
    assert rlock.read_lock(sd)["stale"] is True
