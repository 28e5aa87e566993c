"""The host's deploy state is never reported as something it is not (issue 11 defects 5, 6, 7, 10;
issue 14 item 7), on sandbox hosts (in-process, or real sshd where the subject needs it):

  * the state dir deleted (or `state_dir` changed): "deployed without a record", rollback refuses,
    `rollback --from-pristine` restores the release's verified pristine bytes;
  * the package dir a symlink flipped to another tree after a deploy: reported, rollback refuses
    (`--old-tree` restores the tree the deploy patched);
  * a state dir shared by two machines: another machine's lock is never taken over (`--break-lock`),
    its manifests are never acted on; "another machine" is a host whose agent sees another hostname
    (tests/fakehost.py FakeHosts.hostname, as an sshd in its own UTS namespace gives it): what another
    machine looks like to the agent;
  * a no-op deploy (and a no-op rollback) says "unchanged" only after checking under the host lock;
  * the package reinstalled or upgraded under a deploy: "no longer on disk", its backups never written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_faults import (
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

from fleetctl.engines import engine, wheels
from fleetctl.remote import core as rcore
from fleetctl.remote import lock as rlock
from fleetctl.remote import transaction as rtx
from fleetctl.sandbox import lifecycle as sbx

pytestmark = [pytest.mark.usefixtures("ledger_dir")]
# real sshd hosts for the tests whose other controller is a process of its own (spawn_faulted: it
# reaches the hosts over SSH, and the lock it holds is held across processes); the others run on
# in-process hosts (tests/fakehost.py), "another machine" there a host whose agent sees another
# hostname (FakeHosts.hostname), as an sshd in its own UTS namespace would give it
needs_sshd = pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="OpenSSH sshd is not installed")

FILES = (EW2, SA)


@pytest.fixture(scope="module")
def hfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sbx.Sandbox, Path, Path]]:
    d = tmp_path_factory.mktemp("hoststate")
    try:
        sb = sbx.up(d / "sb", hosts=2, versions=[VERSION], gpus=1)
        inv = write_inventory(sb, d / "inventory.yaml", command_timeout=60)
        yield sb, inv, make_playbook(d / "pb", files=FILES, tag="hs")
    finally:
        sbx.down(d / "sb", missing_ok=True)


@pytest.fixture(scope="module")
def fake_hfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sbx.Sandbox, Path, Path]]:
    """hfleet's hosts reached in-process (tests/fakehost.py): for the tests of what the agent decides."""
    import fakehost

    d = tmp_path_factory.mktemp("hoststate-fake")
    with fakehost.sandbox(d / "sb", hosts=2, versions=[VERSION], gpus=1) as sb:
        inv = write_inventory(sb, d / "inventory.yaml", command_timeout=60)
        yield sb, inv, make_playbook(d / "pb", files=FILES, tag="hs")


def _clean(fleet: tuple) -> Iterator[tuple]:
    for h in fleet[0].hosts.values():
        reset_host(h, FILES)
    yield fleet
    for h in fleet[0].hosts.values():
        reset_host(h, FILES)


@pytest.fixture
def clean(hfleet: tuple) -> Iterator[tuple]:
    yield from _clean(hfleet)


@pytest.fixture
def fclean(fake_hfleet: tuple) -> Iterator[tuple]:
    import fakehost

    with fakehost.installed(fake_hfleet[0].fake):
        yield from _clean(fake_hfleet)


def hashes(root: Path) -> dict[str, str]:
    return {rel: sha((root / rel).read_bytes()) for rel in FILES}


def pristine() -> dict[str, str]:
    return {rel: sha(wheels.pristine_bytes(VERSION, rel)) for rel in FILES}


def patched(pb: Path) -> dict[str, str]:
    return {rel: sha(b) for rel, b in intended_bytes(pb).items()}


def problems(doc: dict, host: str) -> str:
    (row,) = [r for r in doc["hosts"] if r["host"] == host]
    return "\n".join(row["problems"])


# ------------------------------------------------------------------ 5: state dir gone


def test_state_dir_gone_is_deployed_without_a_record(fclean: tuple, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = fclean
    h = sb.hosts["h01"]
    assert run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pb))[0] == 0
    assert hashes(h.sglang_dir) == patched(pb)

    # the inventory's state_dir changed: nothing says this host is patched there
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["h01"]["state_dir"] = str(tmp_path / "elsewhere")
    inv2 = tmp_path / "moved-state.yaml"
    inv2.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, st = run_json(capsys, "status", "-i", str(inv2), "--limit", "h01")
    assert code == 1 and "without a record" in problems(st, "h01"), st
    assert EW2 in problems(st, "h01") and SA in problems(st, "h01")

    # the state dir itself deleted
    shutil.rmtree(h.state_dir)
    code, st = run_json(capsys, "status", "-i", str(inv), "--limit", "h01")
    assert code == 1 and "without a record" in problems(st, "h01"), st
    code, chk = run_json(capsys, "deploy", "--check", "-i", str(inv), "--limit", "h01", str(pb))
    assert code == 1, chk
    (hp,) = chk["plan"]["hosts"]
    assert {f["state"] for f in hp["files"]} == {"no-record"} and "--from-pristine" in hp["reason"], hp
    code, rb = run_json(capsys, "rollback", "-i", str(inv), "--limit", "h01")
    assert code == 1, rb
    (r,) = rb["hosts"]
    assert r["status"] == "refused" and "without a record" in r["message"]
    assert "rollback --from-pristine" in r["message"], r
    assert hashes(h.sglang_dir) == patched(pb)  # refused: nothing written

    # a playbook whose stated pristine sha256 is not the release's: refused before anything is written
    bad = tmp_path / "badpb"
    shutil.copytree(pb.parent, bad)
    text = (bad / "playbook.yaml").read_text()
    (bad / "playbook.yaml").write_text(text.replace(pristine()[SA], "a" * 64))
    code, _out, err = _run(capsys, "rollback", "--from-pristine", "-p", str(bad / "playbook.yaml"), "-i", str(inv),
                           "--limit", "h01")
    assert code == 2 and "the playbook says aaaaaaaaaaaa" in err, err
    assert hashes(h.sglang_dir) == patched(pb)

    code, rb = run_json(capsys, "rollback", "--from-pristine", "-p", str(pb), "-i", str(inv), "--limit", "h01")
    assert code == 0, rb
    (r,) = rb["hosts"]
    assert r["status"] == "changed" and "2 file(s) restored to pristine sglang 0.5.9" in r["message"], r
    assert hashes(h.sglang_dir) == pristine()
    # the transaction's record: backups of the patched bytes, closed as restored-pristine
    (m,) = [json.loads(p.read_text()) for p in (h.state_dir / "deploys").glob("*/manifest.json")]
    assert m["kind"] == "restore-pristine" and m["state"] == "restored-pristine", m
    code, st = run_json(capsys, "status", "-i", str(inv), "--limit", "h01")
    assert code == 0 and not problems(st, "h01"), st
    code, rb = run_json(capsys, "rollback", "-i", str(inv), "--limit", "h01")
    assert code == 0 and rb["hosts"][0]["status"] == "unchanged", rb  # nothing left to undo
    assert hashes(h.sglang_dir) == pristine()


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from test_faults import run

    return run(capsys, *args)


# ------------------------------------------------------------------ 6: package dir moved under a deploy


def test_package_dir_flipped_to_another_tree(fclean: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = fclean
    h = sb.hosts["h02"]
    tree_a, tree_b = h.host_dir / "tree-a", h.host_dir / "tree-b"
    tree_a.mkdir()
    os.replace(h.sglang_dir, tree_a / "sglang")
    try:
        h.sglang_dir.symlink_to(tree_a / "sglang", target_is_directory=True)
        assert run_json(capsys, "deploy", "-i", str(inv), "--limit", "h02", str(pb))[0] == 0
        assert hashes(tree_a / "sglang") == patched(pb)
        shutil.copytree(wheels.package_dir(VERSION), tree_b / "sglang")
        tmp = h.site_packages / ".flip"
        tmp.symlink_to(tree_b / "sglang", target_is_directory=True)
        os.replace(tmp, h.sglang_dir)  # the symlink flipped: this python now imports tree-b

        code, st = run_json(capsys, "status", "-i", str(inv), "--limit", "h02")
        msg = problems(st, "h02")
        assert code == 1 and f"patched {tree_a / 'sglang'}; this python now imports {tree_b / 'sglang'}" in msg, st
        code, rb = run_json(capsys, "rollback", "-i", str(inv), "--limit", "h02")
        assert code == 1, rb
        (r,) = rb["hosts"]
        assert r["status"] == "refused" and "this python now imports" in r["message"] and "--old-tree" in r["message"]
        assert hashes(tree_a / "sglang") == patched(pb)  # refused: the old tree untouched
        code, rb = run_json(capsys, "rollback", "--old-tree", "-i", str(inv), "--limit", "h02")
        assert code == 0 and "2 file(s) restored" in rb["hosts"][0]["message"], rb
        assert hashes(tree_a / "sglang") == pristine()
        assert hashes(tree_b / "sglang") == pristine()
    finally:
        h.sglang_dir.unlink(missing_ok=True)
        os.replace(tree_a / "sglang", h.sglang_dir)
        shutil.rmtree(tree_a)
        shutil.rmtree(tree_b, ignore_errors=True)


# ------------------------------------------------------------------ 14.7: reinstalled / upgraded under a deploy


def test_reinstall_and_upgrade_under_a_deploy(fclean: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = fclean
    h = sb.hosts["h01"]
    args = ("-i", str(inv), "--limit", "h01")
    code, dep = run_json(capsys, "deploy", *args, str(pb))
    assert code == 0
    did = dep["op_id"]
    for rel in FILES:  # `pip install --force-reinstall` of the same release
        (h.sglang_dir / rel).write_bytes(wheels.pristine_bytes(VERSION, rel))
    code, st = run_json(capsys, "status", *args)
    assert code == 1 and f"deploy {did} is no longer on disk (package reinstalled/upgraded" in problems(st, "h01")
    assert st["hosts"][0]["last_deploy"] is None, st
    code, rb = run_json(capsys, "rollback", *args)
    assert code == 0 and "record closed, nothing restored" in rb["hosts"][0]["message"], rb
    assert run_json(capsys, "status", *args)[0] == 0

    # upgraded to another release under a second deploy
    code, dep = run_json(capsys, "deploy", *args, str(pb))
    assert code == 0
    did = dep["op_id"]
    old = h.host_dir / "old-sglang"
    os.replace(h.sglang_dir, old)
    try:
        shutil.copytree(wheels.package_dir("0.5.14"), h.sglang_dir)
        before = {rel: sha((h.sglang_dir / rel).read_bytes()) for rel in FILES}
        code, st = run_json(capsys, "status", *args)
        msg = problems(st, "h01")
        assert code == 1 and f"deploy {did} is no longer on disk (package reinstalled/upgraded: it patched " \
                             f"sglang 0.5.9" in msg and "0.5.14" in msg, st
        code, rb = run_json(capsys, "rollback", "--force", *args)
        assert code == 0, rb
        assert "no longer on disk" in rb["hosts"][0]["message"], rb
        # 0.5.9 backups were never written into the 0.5.14 tree
        assert {rel: sha((h.sglang_dir / rel).read_bytes()) for rel in FILES} == before
        m = json.loads((h.state_dir / "deploys" / did / "manifest.json").read_text())
        assert m["state"] == "superseded", m
    finally:
        shutil.rmtree(h.sglang_dir)
        os.replace(old, h.sglang_dir)


# ------------------------------------------------------------------ 10: no-op deploy races a rollback


def _hold(sb: sbx.Sandbox, host: str, ledger: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """A controller that holds `host`'s lock (at the 'locked' fault point) until the test writes the
    returned release file: no window of time decides what the other command meets."""
    marker = sb.hosts[host].host_dir / "lock-held"
    release = sb.hosts[host].host_dir / "lock-release"
    marker.unlink(missing_ok=True)
    release.unlink(missing_ok=True)
    proc = spawn_faulted({host: {"at": "locked", "how": "until", "hold": 600, "release": str(release),
                                 "marker": str(marker)}},
                         *args, "--json", ledger=ledger)
    try:
        wait_file(marker)
    except BaseException:
        release.write_text("go")
        proc.kill()
        proc.communicate()
        raise
    return proc, release


@pytest.mark.fleet
@needs_sshd
def test_noop_deploy_during_a_rollback_is_not_unchanged(clean: tuple, ledger_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = clean
    h = sb.hosts["h01"]
    assert run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pb))[0] == 0
    rollback, release = _hold(sb, "h01", ledger_dir, "rollback", "-i", str(inv), "--limit", "h01")
    try:
        # facts read now still show the patched files: a plan with nothing to do
        code, doc = run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pb))
    finally:
        release.write_text("go")
        out, _ = rollback.communicate(timeout=300)
    assert code == 1, doc
    (r,) = doc["hosts"]
    assert r["status"] == "failed" and "locked: rollback r" in r["message"], r
    assert rollback.returncode == 0, out
    assert hashes(h.sglang_dir) == pristine()  # the host ended pristine: "unchanged" would have been false


@pytest.mark.fleet
@needs_sshd
def test_noop_rollback_during_a_deploy_is_not_nothing_to_do(clean: tuple, ledger_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = clean
    h = sb.hosts["h01"]
    deploy, release = _hold(sb, "h01", ledger_dir, "deploy", "-i", str(inv), "--limit", "h01", str(pb))
    try:
        code, doc = run_json(capsys, "rollback", "-i", str(inv), "--limit", "h01")
    finally:
        release.write_text("go")
        out, _ = deploy.communicate(timeout=300)
    assert code == 1, doc
    assert "locked: deploy d" in doc["hosts"][0]["message"], doc
    assert deploy.returncode == 0, out
    assert hashes(h.sglang_dir) == patched(pb)


def test_agent_rechecks_the_plan_under_the_lock(tmp_path: Path) -> None:
    """A file the plan leaves alone ('as intended') that changed after the facts: the agent refuses
    under the lock; a deploy record that appeared after a rollback's facts: refused too."""
    pkg = tmp_path / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "a.py").write_bytes(b"A = 1\n")
    sd = str(tmp_path / "state")
    p = {"state_dir": sd, "deploy_id": "d1", "package_dir": str(pkg), "files": [], "verify_paths": ["srt/a.py"],
         "expect": {"srt/a.py": sha(b"A = 2\n")}}
    with pytest.raises(rcore.AgentError, match=r"srt/a\.py changed since the plan"):
        rtx.action_deploy(p)
    p["expect"] = {"srt/a.py": sha(b"A = 1\n")}
    assert rtx.action_deploy(p)["deploy_id"] is None
    with pytest.raises(rcore.AgentError, match="changed since the plan"):
        rtx.action_rollback({"state_dir": sd, "deploy_ids": [], "expect_live": ["d0"]})
    assert not (tmp_path / "state" / "lock").exists()


# ------------------------------------------------------------------ 7: a state dir shared by two machines


def test_shared_state_dir_two_machines(fake_sandbox, tmp_path: Path,  # type: ignore[no-untyped-def]
                                       capsys: pytest.CaptureFixture[str]) -> None:
    sb = fake_sandbox(hosts=2, versions=(VERSION,), gpus=1)
    sb.fake.hostname["h02"] = "other-machine"  # its agent's uname: another machine (this boot id)
    shared = tmp_path / "nfs-home" / ".fleetctl"
    inv = write_inventory(sb, tmp_path / "inv.yaml", command_timeout=60)
    doc = yaml.safe_load(inv.read_text())
    for name in ("h01", "h02"):
        doc["hosts"][name]["state_dir"] = str(shared)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    pb = make_playbook(tmp_path / "pb", files=FILES, tag="shared")
    h1, h2 = sb.hosts["h01"], sb.hosts["h02"]
    i = ("-i", str(inv))

    # h01's deploy is never rolled back by h02's agent (it used to be: same state dir, same files reachable)
    code, dep = run_json(capsys, "deploy", *i, "--limit", "h01", str(pb))
    assert code == 0, dep
    code, rb = run_json(capsys, "rollback", *i, "--limit", "h02")
    assert code == 0 and rb["hosts"][0]["status"] == "unchanged", rb
    assert hashes(h1.sglang_dir) == patched(pb)
    code, st = run_json(capsys, "status", *i, "--limit", "h02")
    assert code == 0, st
    assert "written by another machine" in "\n".join(st["hosts"][0]["notes"]), st
    assert run_json(capsys, "rollback", *i, "--limit", "h01")[0] == 0
    assert hashes(h1.sglang_dir) == pristine()

    # one deploy id on both hosts of one command: each records its own, in its own directory
    code, dep = run_json(capsys, "deploy", *i, "-f", "1", str(pb))
    assert code == 0, dep
    did = dep["op_id"]
    dirs = sorted(p.name for p in (shared / "deploys").iterdir() if p.name.startswith(did))
    assert dirs == sorted([did, f"{did}@other-machine"]), dirs
    code, rb = run_json(capsys, "rollback", *i, "-f", "1")
    assert code == 0 and all("2 file(s) restored" in r["message"] for r in rb["hosts"]), rb
    assert hashes(h1.sglang_dir) == pristine() and hashes(h2.sglang_dir) == pristine()

    # a lock another machine holds is never taken over, even if its pid means nothing here
    p = subprocess.Popen(["true"])  # a pid that ran and ended here
    p.wait()
    lock = {"pid": p.pid, "start": 1, "op": "deploy", "id": "dTHEIRS", "by": "ops@other", "since": time.time(),
            "host": "other-machine", "writer": {"hostname": "other-machine", "boot_id": "b" * 36, "pid": p.pid}}
    (shared / "lock").write_text(json.dumps(lock))
    code, dep = run_json(capsys, "deploy", *i, "--limit", "h01", str(pb))
    assert code == 1, dep
    msg = dep["hosts"][0]["message"]
    assert "locked by another machine" in msg and "dTHEIRS" in msg and "other-machine" in msg, msg
    assert json.loads((shared / "lock").read_text())["id"] == "dTHEIRS"
    assert hashes(h1.sglang_dir) == pristine()
    code, st = run_json(capsys, "status", *i, "--limit", "h01")
    assert code == 1 and "lock held by another machine (other-machine" in problems(st, "h01"), st
    code, _o, err = _run(capsys, "deploy", *i, "--limit", "h01", "--break-lock", "h09", str(pb))
    assert code == 2 and "--break-lock names h09" in err, err
    code, dep = run_json(capsys, "deploy", *i, "--limit", "h01", "--break-lock", "h01", str(pb))
    assert code == 0, dep
    assert any("broke the lock of another machine" in n for n in dep["hosts"][0]["notes"]), dep
    assert hashes(h1.sglang_dir) == patched(pb)
    assert not (shared / "lock").exists()


def test_lock_identity_another_machine_or_another_boot(tmp_path: Path) -> None:
    """On the agent itself: a lock naming another machine is never stale (its pid means nothing here)
    and is taken over only with break_lock; a lock of this machine from an earlier boot is stale."""

    sd = tmp_path / "state"
    sd.mkdir(mode=0o700)
    p = subprocess.Popen(["true"])
    p.wait()  # a pid that ran and ended here
    me = rlock.machine_identity()
    theirs = {"pid": p.pid, "start": 1, "op": "deploy", "id": "dTHEIRS", "by": "x", "since": 0,
              "host": me["hostname"] + "-other", "writer": {"hostname": me["hostname"] + "-other", "pid": p.pid}}
    (sd / "lock").write_text(json.dumps(theirs))
    held = rlock.read_lock(str(sd))
    assert held["foreign"] and not held["stale"], held
    with pytest.raises(rcore.AgentError, match="locked by another machine"):
        rlock.acquire_lock(str(sd), "deploy", "dMINE", "t")
    assert json.loads((sd / "lock").read_text())["id"] == "dTHEIRS"
    notes = rlock.acquire_lock(str(sd), "deploy", "dMINE", "t", {"break_lock": True})
    assert "broke the lock of another machine" in notes[0], notes
    mine = json.loads((sd / "lock").read_text())
    assert mine["id"] == "dMINE" and mine["writer"]["boot_id"] == me["boot_id"], mine
    rlock.release_lock(str(sd))
    # this machine, an earlier boot, the holder's pid alive now (reused): stale all the same
    earlier = dict(theirs, pid=os.getpid(), start=None, host=me["hostname"],
                   writer=dict(me, boot_id=f"not-{me['boot_id']}"))
    (sd / "lock").write_text(json.dumps(earlier))
    assert rlock.read_lock(str(sd))["stale"] is True


def test_restart_would_lose_a_patch_no_longer_on_disk(fclean: tuple, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A server launched on a deploy whose files were reinstalled since: status says a restart would
    lose the patch (the server still runs it; the files on disk no longer hold it)."""
    from test_launch import FULL, make_inventory, stop_all_local

    from fleetctl.config.playbook import load_playbook

    sb, _inv, _pb = fclean
    h = sb.hosts["h01"]
    inv = str(make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"]))
    files = [f.path for f in load_playbook(FULL).files_for(VERSION) or []]
    try:
        code, dep = run_json(capsys, "deploy", "-i", inv, "--limit", "h01", str(FULL))
        assert code == 0, dep
        code, la = run_json(capsys, "launch", "--drop-unknown-flags", "-i", inv, "--limit", "h01", str(FULL),
                            "--timeout", "300")
        assert code == 0, la
        for rel in files:  # reinstalled under the running server
            (h.sglang_dir / rel).write_bytes(wheels.pristine_bytes(VERSION, rel))
        code, st = run_json(capsys, "status", "-i", inv, "--limit", "h01")
        msg = problems(st, "h01")
        assert code == 1 and f"runs deploy {dep['op_id']}, which is no longer on disk: a restart would lose " \
                             "the patch" in msg, st
    finally:
        stop_all_local(sb)
        reset_host(h, tuple(files))


@pytest.mark.parametrize("state", ["complete", "applying"])
def test_agent_never_writes_another_releases_backups(tmp_path: Path, state: str) -> None:
    """On the agent itself: a deploy (complete, or cut off half-way) recorded on sglang 0.5.9 whose
    tree now holds 0.5.14. `rollback --force` (or the repair of the interrupted deploy) must not write
    the 0.5.9 backup into it: the record is closed as superseded, nothing restored."""

    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text('__version__ = "0.5.14"\n')
    (pkg / "srt" / "a.py").write_bytes(b"A = 14\n")
    ddir = tmp_path / "state" / "deploys" / "d1"
    (ddir / "backup" / "srt").mkdir(parents=True)
    (ddir / "backup" / "srt" / "a.py").write_bytes(b"A = 9\n")
    m = {"id": "d1", "kind": "deploy", "state": state, "created": 1.0, "package_dir": str(pkg), "version": "0.5.9",
         "writer": rlock.writer_identity(),
         "files": [{"path": "srt/a.py", "sha_before": sha(b"A = 9\n"), "sha_after": sha(b"A = 9 patched\n"),
                    "status": "applied", "backed_up": True, "mode": 0o644, "uid": None, "gid": None}]}
    (ddir / "manifest.json").write_text(json.dumps(m))
    res = rtx.action_rollback({"state_dir": str(tmp_path / "state"), "engine": engine().agent_facts(), "package_dir": str(pkg),
                              "force": True,
                              "deploy_ids": ["d1"] if state == "complete" else []})
    assert (pkg / "srt" / "a.py").read_bytes() == b"A = 14\n"
    assert any("no longer on disk" in n and "0.5.9" in n and "0.5.14" in n for n in res["notes"]), res
    assert json.loads((ddir / "manifest.json").read_text())["state"] == "superseded"
