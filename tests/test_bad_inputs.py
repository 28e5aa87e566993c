"""Bad input, file by file (tests/bad_inputs/cases.yaml) and host by host (a sandbox host broken on
purpose): each gives ONE clear line (file:line or host, what, the fix), exit 2 for input errors and
1 for host failures, no traceback without --debug, and no file changed anywhere (package trees and
outside targets hashed before and after; for input errors the hosts' state dirs too).

The file corpus runs on in-process hosts (tests/fakehost.py: no sshd; what it checks is input,
refused before any change); the broken hosts keep real sshd (keys, host keys, mounts, the `fleet`
marker)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
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
    tree_hashes,
    write_inventory,
)

from fleetctl.engines import wheels
from fleetctl.sandbox import lifecycle as sbx
from fleetctl.sandbox.sshd import write_ed25519

CORPUS = Path(__file__).parent / "bad_inputs"
CASES = yaml.safe_load((CORPUS / "cases.yaml").read_text())

pytestmark = [pytest.mark.usefixtures("ledger_dir"),
              pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="OpenSSH sshd is not installed")]



@pytest.fixture(scope="module")
def bfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sbx.Sandbox, Path, Path]]:
    d = tmp_path_factory.mktemp("badfleet")
    try:
        sb = sbx.up(d / "sb", hosts=2, versions=[VERSION], gpus=1)
        yield sb, write_inventory(sb, d / "inventory.yaml", command_timeout=30), make_playbook(d / "pb", files=(EW2, SA))
    finally:
        sbx.down(d / "sb", missing_ok=True)


@pytest.fixture(scope="module")
def fake_bfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sbx.Sandbox, Path, Path]]:
    """bfleet's hosts reached in-process (tests/fakehost.py): the corpus is input checking, found before
    anything changes, whatever the transport (the hosts are contacted ahead, by the prefetch)."""
    import fakehost

    d = tmp_path_factory.mktemp("badfleet-fake")
    with fakehost.sandbox(d / "sb", hosts=2, versions=[VERSION], gpus=1) as sb:
        yield sb, write_inventory(sb, d / "inventory.yaml", command_timeout=30), make_playbook(d / "pb", files=(EW2, SA))


@pytest.fixture
def cfleet(fake_bfleet: tuple) -> Iterator[tuple[sbx.Sandbox, Path, Path]]:
    import fakehost

    with fakehost.installed(fake_bfleet[0].fake):  # type: ignore[attr-defined]
        yield fake_bfleet


def tree_sig(root: Path) -> dict[str, tuple]:
    """Every file's (inode, size, mtime_ns, mode) and every dir's mode: any replace, write, chmod,
    create or delete of a file shows (a dir's mtime moves when a temp file comes and goes: ignored)."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.join(dirpath, name)] = (os.lstat(os.path.join(dirpath, name)).st_mode,)
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def snapshot(sb: sbx.Sandbox, state: bool = True) -> dict[str, dict]:
    """The package trees (stat signatures) and the playbook targets' content; the state dirs too."""
    out: dict[str, dict] = {}
    for n, h in sb.hosts.items():
        out[n] = tree_sig(h.sglang_dir)
        out[n + ":targets"] = {rel: hashlib.sha256((h.sglang_dir / rel).read_bytes()).hexdigest()
                               for rel in (EW2, SA) if (h.sglang_dir / rel).is_file()}
        if state:  # the agent's compiled-code cache (state_dir/cache) is not deploy state
            out[n + ":state"] = {k: v for k, v in tree_hashes(h.state_dir).items()
                                 if not k.startswith("cache/") and k != "cache"}
    return out


def assert_same(sb: sbx.Sandbox, before: dict[str, dict], after: dict[str, dict]) -> None:
    """Equal, except files that were replaced by a copy of the same bytes and mode (a restore): those
    must hold the pristine wheel's bytes."""
    assert before.keys() == after.keys()
    for k in before:
        if before[k] == after[k]:
            continue
        assert before[k].keys() == after[k].keys(), (k, set(before[k]) ^ set(after[k]))
        h = sb.hosts[k.split(":")[0]]
        for path, sig in before[k].items():
            now = after[k][path]
            if sig == now:
                continue
            assert ":" not in k and len(sig) == 4 and sig[3] == now[3] and sig[1] == now[1], (path, sig, now)
            rel = os.path.relpath(path, h.sglang_dir)
            assert Path(path).read_bytes() == wheels.pristine_bytes(h.version or VERSION, rel), path


def no_traceback(out: str, err: str) -> None:
    assert "Traceback" not in out + err and "internal error" not in out + err, out + err


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_corpus(cfleet: tuple, case: dict, capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = cfleet
    for h in sb.hosts.values():
        reset_host(h, (EW2, SA))
    f = CORPUS / case["file"]
    args = ["deploy", "-i", str(f), str(pb)] if case["kind"] == "inventory" else ["deploy", "-i", str(inv), str(f)]
    before = snapshot(sb)
    code, out, err = run(capsys, *args)
    assert code == case["exit"], (case["name"], code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (case["name"], err)
    assert re.search(case["expect"], lines[0]), (case["name"], lines[0])
    assert str(f.name) in lines[0] or "p.diff" in lines[0] or "ssh_config" in lines[0], lines[0]
    assert out == "", out
    no_traceback(out, err)
    assert_same(sb, before, snapshot(sb))


def test_corpus_covers_every_file() -> None:
    listed = {c["file"] for c in CASES}
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.yaml") if p.name != "cases.yaml"}
    assert on_disk == listed


# ---------------------------------------------------------------------------------------- host failures


def host_inventory(sb: sbx.Sandbox, path: Path, name: str, **fields: object) -> Path:
    """The sandbox inventory with `fields` set on host `name` (host values override defaults)."""
    inv = write_inventory(sb, path, command_timeout=30)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][name].update(fields)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def expect_host_failure(capsys: pytest.CaptureFixture[str], sb: sbx.Sandbox, inv: Path, pb: Path,
                        pattern: str, status: str = "failed", extra: Callable[[], object] | None = None) -> str:
    """deploy --limit h01 must exit 1 with one clear line naming h01, and change no package file."""
    before = snapshot(sb, state=False)
    outside = extra() if extra else None
    code, out, err = run(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pb), "--json")
    no_traceback(out, err)
    assert code == 1, (out, err)
    (r,) = json.loads(out)["hosts"]
    assert r["status"] == status, r
    msg = r["message"]
    assert "\n" not in msg and r["host"] == "h01" and not msg.startswith("h01: ") and re.search(pattern, msg), msg
    code2, out2, err2 = run(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pb))
    assert code2 == 1
    no_traceback(out2, err2)
    assert_same(sb, before, snapshot(sb, state=False))
    if extra:
        assert extra() == outside
    h = sb.hosts["h01"]
    assert not (h.state_dir / "lock").exists()
    for m in (h.state_dir / "deploys").glob("*/manifest.json") if (h.state_dir / "deploys").exists() else []:
        assert json.loads(m.read_text())["state"] not in ("preparing", "applying", "rolling-back"), m
    return msg


@pytest.fixture
def hfleet(bfleet: tuple) -> Iterator[tuple]:
    sb = bfleet[0]
    for h in sb.hosts.values():
        reset_host(h, (EW2, SA))
    yield bfleet
    for h in sb.hosts.values():
        if not h.alive:
            sb.start_host(h.name)
        reset_host(h, (EW2, SA))


@pytest.mark.fleet
def test_unreachable_host(hfleet: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, _, pb = hfleet
    sb.stop_host("h01")
    inv = host_inventory(sb, tmp_path / "inv.yaml", "h01")
    expect_host_failure(capsys, sb, inv, pb, r"cannot connect to .*connection refused \(is sshd running",
                        status="unreachable")


@pytest.mark.fleet
def test_wrong_key(hfleet: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, _, pb = hfleet
    write_ed25519(tmp_path / "other_key", "not authorized anywhere")
    inv = host_inventory(sb, tmp_path / "inv.yaml", "h01", identity_file=str(tmp_path / "other_key"))
    expect_host_failure(capsys, sb, inv, pb, r"authentication failed .*check 'user:' and 'identity_file:'",
                        status="unreachable")


@pytest.mark.fleet
def test_changed_host_key(hfleet: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, _, pb = hfleet
    write_ed25519(tmp_path / "impostor", "x")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sb.hosts['h01'].port} " + " ".join((tmp_path / "impostor.pub").read_text().split()[:2]) + "\n")
    inv = host_inventory(sb, tmp_path / "inv.yaml", "h01", known_hosts=str(kh))
    expect_host_failure(capsys, sb, inv, pb, r"host key of .* CHANGED: .*man-in-the-middle", status="unreachable")


@pytest.mark.fleet
def test_wrong_python_and_wrong_sglang_dir(hfleet: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, _, pb = hfleet
    inv = host_inventory(sb, tmp_path / "inv.yaml", "h01", python="/no/such/python3")
    expect_host_failure(capsys, sb, inv, pb, r"python interpreter '/no/such/python3' cannot run.*fix 'python:'")
    inv = host_inventory(sb, tmp_path / "inv2.yaml", "h01", sglang_dir="/no/such/sglang")
    expect_host_failure(capsys, sb, inv, pb, r"sglang_dir /no/such/sglang holds no __init__.py")


@pytest.mark.fleet
def test_target_symlink_pointing_outside(hfleet: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = hfleet
    h = sb.hosts["h01"]
    outside = tmp_path / "outside.py"
    outside.write_bytes((h.sglang_dir / EW2).read_bytes())
    (h.sglang_dir / EW2).unlink()
    (h.sglang_dir / EW2).symlink_to(outside)
    msg = expect_host_failure(capsys, sb, inv, pb, r"is unsafe \(is a symlink to .*outside the package dir\); "
                              r"fleetctl never writes through a symlink", status="refused",
                              extra=lambda: outside.read_bytes())
    assert str(outside) in msg


@pytest.mark.fleet
def test_parent_dir_symlink_pointing_outside(hfleet: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = hfleet
    h = sb.hosts["h01"]
    spec = h.sglang_dir / "srt" / "speculative"
    moved = tmp_path / "speculative-elsewhere"
    shutil.move(str(spec), moved)
    spec.symlink_to(moved)
    try:
        expect_host_failure(capsys, sb, inv, pb, r"is unsafe .*outside the package dir", status="refused",
                            extra=lambda: tree_hashes(moved))
    finally:
        spec.unlink()
        shutil.move(str(moved), spec)


@pytest.mark.fleet
def test_immutable_target_permission_denied(hfleet: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    """`chattr +i` on the second file: even root cannot replace it. The first file was already
    swapped in; it is restored, and the host reports the failure."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    sb, inv, pb = hfleet
    target = sb.hosts["h01"].sglang_dir / SA
    if subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem does not support chattr +i")
    try:
        msg = expect_host_failure(capsys, sb, inv, pb, r"Operation not permitted.*restored to its original files")
        assert SA in msg
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)


def _mount(args: list[str], where: Path, request: pytest.FixtureRequest) -> None:
    p = subprocess.run(["mount", *args, str(where)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount here ({p.stderr.strip()}): needs root and mount rights")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(where)], check=False))


@pytest.mark.fleet
def test_read_only_package_dir(hfleet: tuple, request: pytest.FixtureRequest,
                               capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb = hfleet
    spec = sb.hosts["h01"].sglang_dir / "srt" / "speculative"
    _mount(["--bind", str(spec)], spec, request)
    p = subprocess.run(["mount", "-o", "remount,bind,ro", str(spec)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot remount read-only: {p.stderr.strip()}")
    # refused at plan time (deploy --check says so too), before anything is written
    msg = expect_host_failure(capsys, sb, inv, pb, r"is unwritable \(its directory is on a read-only file "
                              r"system\); the files cannot be replaced there", status="refused")
    assert EW2 in msg or "speculative" in msg


@pytest.mark.fleet
def test_full_disk_in_package_dir(hfleet: tuple, tmp_path: Path, request: pytest.FixtureRequest,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """srt/speculative on a tmpfs just big enough for its files: the temp copy of the new file
    cannot be written (ENOSPC), nothing changes."""
    sb, inv, pb = hfleet
    spec = sb.hosts["h01"].sglang_dir / "srt" / "speculative"
    keep = tmp_path / "spec-copy"
    shutil.copytree(spec, keep)
    pages = sum(-(-p.stat().st_size // 4096) for p in keep.rglob("*") if p.is_file()) + 2
    _mount(["-t", "tmpfs", "-o", f"size={pages * 4}k,nr_inodes=400", "tmpfs"], spec, request)
    subprocess.run(["cp", "-a", f"{keep}/.", str(spec)], check=True)
    expect_host_failure(capsys, sb, inv, pb, r"No space left on device")


@pytest.mark.fleet
def test_full_disk_in_state_dir(hfleet: tuple, request: pytest.FixtureRequest,
                                capsys: pytest.CaptureFixture[str]) -> None:
    """The state dir on a 16 KB tmpfs: the backups do not fit. Nothing in the package changes and
    no deploy is left open ('interrupted') for status to complain about."""
    sb, inv, pb = hfleet
    sd = sb.hosts["h01"].state_dir
    _mount(["-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs"], sd, request)
    expect_host_failure(capsys, sb, inv, pb, r"No space left on device")
    code, out, _ = run(capsys, "status", "-i", str(inv), "--limit", "h01", "--json")
    assert code == 0, out
    os.sync()
