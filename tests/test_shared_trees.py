"""One machine, several inventory entries; one package tree, several hosts (issue 31 items 5 and 6),
on in-process sandbox hosts (tests/fakehost.py; B through a second sshd of its machine: real sshd):

  * two inventory entries (A/B servers on other GPUs and ports) for one sandbox host, its one state
    dir and its one package tree: one deploy transaction (B reports A's as what it is), each entry's
    servers its own (`status` lists each once, `stop --limit B` stops B only), one rollback;
  * one tree shared by two sandbox hosts (h01's package dir bind-mounted onto h02's, each host its own
    state dir; h02 with another hostname: another machine to the agent): deployed and rolled back
    once, recorded inside the tree where both read it, h02 alone plans it as deployed (not
    `no-record`), verify-logs passes on both, h02 alone rolls it back;
  * the identity rule itself (fleetctl/plan/trees.py): equal inode numbers on two machines are two trees.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_faults import run_json, sha, write_inventory
from waiting import until

from fleetctl.engines import wheels
from fleetctl.model.facts import HostFacts, TorchCheck
from fleetctl.plan.trees import group_trees, same_tree
from fleetctl.protocol.answers import StateFacts, TreeIdentity
from fleetctl.sandbox import lifecycle as sbx

# (the tests that start sshd use the sandbox fixtures, which give them the `fleet` marker: tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("ledger_dir"),
              pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="OpenSSH sshd is not installed")]

VERSION = "0.5.9"
PLAYBOOK = Path(__file__).resolve().parents[1] / "playbooks" / "scheduler-log-line" / "playbook.yaml"
REL = "srt/managers/scheduler.py"


def _hash(pkg: Path) -> str:
    return sha((pkg / REL).read_bytes())


def _pristine() -> str:
    return sha(wheels.pristine_bytes(VERSION, REL))


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["host"]: r for r in doc["hosts"]}


# ------------------------------------------------------------------ 5: two entries for one machine


def _two_entries(sb: sbx.Sandbox, path: Path, b_ssh_port: int | None = None) -> Path:
    """A and B: one sandbox host (python, state dir, home), GPU 0 / GPU 1, two server ports; B through
    the same sshd, or through another sshd of that host (`b_ssh_port`)."""
    base = write_inventory(sb, path, command_timeout=60)
    doc = yaml.safe_load(base.read_text())
    h = doc["hosts"].pop("h01")
    port = int(h["flags"]["--port"])
    doc["hosts"] = {"A": {**h, "gpus": [0], "flags": {"--port": port}},
                    "B": {**h, "gpus": [1], "flags": {"--port": port + 1}}}
    if b_ssh_port is not None:
        doc["hosts"]["B"]["port"] = b_ssh_port
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _second_sshd(sb: sbx.Sandbox, name: str, request: pytest.FixtureRequest) -> int:
    """Another real sshd for host `name` (its host key, home, environment) on another port; stopped by
    its pid when the test ends. Returns its port (added to the sandbox's known_hosts)."""
    import os
    import signal

    from ports import free_port

    from fleetctl.sandbox import sshd

    h = sb.hosts[name]
    port = free_port()
    cfg = h.host_dir / "sshd_config.second"
    cfg.write_text(h.sshd_config.read_text()
                   .replace(f"{sshd.LOOPBACK}:{h.port}", f"{sshd.LOOPBACK}:{port}")
                   .replace(f"PidFile {h.pid_file}", f"PidFile {h.host_dir / 'sshd.second.pid'}"))
    proc = subprocess.Popen([sshd.sshd_binary(), "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            close_fds=True, env=sbx._sshd_env(sb.dir))

    def stop() -> None:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)

    request.addfinalizer(stop)
    until(lambda: proc.poll() is not None or sshd.banner_ok(port), "the second sshd to listen or exit")
    assert proc.poll() is None, f"the second sshd exited with {proc.returncode}"
    line = next(x for x in sb.known_hosts_path.read_text().splitlines() if x.startswith(f"[127.0.0.1]:{h.port} "))
    with open(sb.known_hosts_path, "a") as fh:
        fh.write(line.replace(f":{h.port} ", f":{port} ", 1) + "\n")
    return port


def _one_machine_env(sb: sbx.Sandbox) -> None:
    """A and B reach in-process h01: the login environment h01's sshd gives every session."""
    sb.fake.login_env["A"] = sb.fake.login_env["B"] = sb.fake.login_env["h01"]  # type: ignore[attr-defined]


def test_two_entries_one_machine(fake_sandbox, tmp_path: Path,  # type: ignore[no-untyped-def]
                                 capsys: pytest.CaptureFixture[str]) -> None:
    sb = fake_sandbox(hosts=1, versions=(VERSION,), gpus=2)
    _one_machine_env(sb)
    _check_two_entries_one_machine(sb, _two_entries(sb, tmp_path / "inv.yaml"), capsys)


def test_two_entries_one_machine_two_sshds(fresh_sandbox, tmp_path: Path,  # type: ignore[no-untyped-def]
                                           capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> None:
    """The same, B reaching the machine through another sshd of it (another port: transport)."""
    sb = fresh_sandbox(hosts=1, versions=(VERSION,), gpus=2)
    _check_two_entries_one_machine(sb, _two_entries(sb, tmp_path / "inv.yaml", _second_sshd(sb, "h01", request)),
                                   capsys)


def _check_two_entries_one_machine(sb: sbx.Sandbox, inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    i, pb = ("-i", str(inv)), str(PLAYBOOK)
    pkg = sb.hosts["h01"].sglang_dir

    # one tree, one transaction: A deploys it, B reports A's deploy (was: one of them failed 'locked')
    code, dep = run_json(capsys, "deploy", *i, pb)
    assert code == 0, dep
    a, b = _rows(dep)["A"], _rows(dep)["B"]
    assert a["status"] == b["status"] == "changed" and a["deploy_id"] == b["deploy_id"], dep
    assert "deployed once, by A's transaction" in b["message"], b
    manifests = list((sb.hosts["h01"].state_dir / "deploys").glob("*/manifest.json"))
    assert len(manifests) == 1, manifests
    assert _hash(pkg) != _pristine()
    code, chk = run_json(capsys, "deploy", *i, pb, "--check", "--limit", "B")
    assert code == 0 and chk["hosts"][0]["status"] == "noop", chk

    # each entry's servers are its own
    code, la = run_json(capsys, "launch", *i, pb)
    assert code == 0, la
    code, st = run_json(capsys, "status", *i)
    assert code == 0, st
    listed = {h: [s["instance"] for s in r["servers"]] for h, r in _rows(st).items()}
    ports = {h: f"port-{p}" for h, p in (("A", _port(inv, "A")), ("B", _port(inv, "B")))}
    assert listed == {"A": [ports["A"]], "B": [ports["B"]]}, listed
    assert st["summary"]["servers_running"] == 2, st["summary"]
    code, vl = run_json(capsys, "verify-logs", *i, pb)
    assert code == 0, vl

    code, stop = run_json(capsys, "stop", *i, "--limit", "B")
    assert code == 0, stop
    assert [(x["instance"], x["action"]) for x in stop["hosts"][0]["instances"]] == [(ports["B"], "stopped")], stop
    code, srv = run_json(capsys, "servers", *i)
    running = {h: [s["instance"] for s in r["servers"] if s["running"]] for h, r in _rows(srv).items()}
    assert running == {"A": [ports["A"]], "B": []}, running  # A's server still runs (was: stopped too)
    assert run_json(capsys, "stop", *i)[0] == 0

    # one rollback of the one tree
    code, rb = run_json(capsys, "rollback", *i)
    assert code == 0, rb
    assert _rows(rb)["A"]["status"] == "changed" and "rolled back once, by A" in _rows(rb)["B"]["message"], rb
    assert _hash(pkg) == _pristine()
    code, st = run_json(capsys, "status", *i)
    assert code == 0 and all(not r["problems"] for r in st["hosts"]), st


def test_two_entries_one_machine_two_trees(fake_sandbox, tmp_path: Path,  # type: ignore[no-untyped-def]
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A and B reach one machine and share its state dir, each with its own SGLang (B runs h02's
    python over h01's sshd): each entry's deploys are its own (was: B failed 'locked' or 'deploy ...
    already exists', and A's status called B's deploy a tree that moved)."""
    sb = fake_sandbox(hosts=2, versions=(VERSION,), gpus=2)
    _one_machine_env(sb)
    inv = _two_entries(sb, tmp_path / "inv.yaml")
    doc = yaml.safe_load(inv.read_text())
    h2 = sb.hosts["h02"]
    doc["hosts"]["B"].update(python=str(h2.python), env={"PATH": h2.path_env()})
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    i, pb = ("-i", str(inv)), str(PLAYBOOK)
    pkg_a, pkg_b = sb.hosts["h01"].sglang_dir, h2.sglang_dir

    code, dep = run_json(capsys, "deploy", *i, pb)
    assert code == 0 and {r["status"] for r in dep["hosts"]} == {"changed"}, dep
    assert _hash(pkg_a) == _hash(pkg_b) != _pristine()
    assert len(list((sb.hosts["h01"].state_dir / "deploys").glob("*/manifest.json"))) == 2
    code, st = run_json(capsys, "status", *i)
    assert code == 0 and all(not r["problems"] for r in st["hosts"]), st
    code, rb = run_json(capsys, "rollback", *i, "--limit", "B")
    assert code == 0 and rb["hosts"][0]["status"] == "changed", rb
    assert _hash(pkg_b) == _pristine() != _hash(pkg_a)
    code, rb = run_json(capsys, "rollback", *i)
    assert code == 0 and [r["status"] for r in rb["hosts"]] == ["changed", "unchanged"], rb
    assert _hash(pkg_a) == _pristine()


def _port(inv: Path, host: str) -> int:
    return int(yaml.safe_load(inv.read_text())["hosts"][host]["flags"]["--port"])


# ------------------------------------------------------------------ 6: one tree, two hosts


@pytest.fixture(params=["bind-mount", "symlink"])
def shared_tree(fake_sandbox, tmp_path: Path,  # type: ignore[no-untyped-def]
                request: pytest.FixtureRequest) -> Iterator[tuple[sbx.Sandbox, Path, Path]]:
    """h02 reaches h01's package tree and keeps its own python and state dir: h01's package dir
    bind-mounted onto h02's (h02 keeps its own path: as an NFS client would), or h02's package dir a
    symlink to h01's (a shared dir linked in); h02 is another machine to its agent (another hostname:
    tests/fakehost.py FakeHosts.hostname, what an sshd in its own UTS namespace gives). Yields the
    sandbox, its inventory and where the tree's records go. Unmounted at the end, also on failure."""
    sb = fake_sandbox(hosts=2, versions=(VERSION,), gpus=1)
    src, dst = sb.hosts["h01"].sglang_dir, sb.hosts["h02"].sglang_dir
    mounted = request.param == "bind-mount"
    if mounted:
        got = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True, text=True)
        if got.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {got.stderr.strip()}")
        records = src / ".fleetctl-tree"  # inside the tree: h02 mounts the package dir itself
    else:
        shutil.rmtree(dst)
        dst.symlink_to(src)
        records = src.parent / ".fleetctl-tree-sglang"  # beside it: the parent is reached too
    try:
        sb.fake.hostname["h02"] = "other-machine"
        yield sb, write_inventory(sb, tmp_path / "inv.yaml", command_timeout=60), records
    finally:
        if mounted:
            subprocess.run(["umount", str(dst)], check=True)


def test_tree_shared_by_two_hosts(shared_tree: tuple[sbx.Sandbox, Path, Path],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, records = shared_tree
    i, pb = ("-i", str(inv)), str(PLAYBOOK)
    pkg1, pkg2 = sb.hosts["h01"].sglang_dir, sb.hosts["h02"].sglang_dir

    code, plan = run_json(capsys, "deploy", *i, pb, "--check")
    assert code == 0, plan
    assert _rows(plan)["h02"]["shared_tree"]["owner"] == "h01", plan
    assert "deployed once, by h01's transaction" in _rows(plan)["h02"]["reason"], plan

    # one transaction (was: both wrote the files, or one failed 'changed since the plan')
    code, dep = run_json(capsys, "deploy", *i, pb)
    assert code == 0, dep
    r1, r2 = _rows(dep)["h01"], _rows(dep)["h02"]
    assert r1["status"] == r2["status"] == "changed" and r1["deploy_id"] == r2["deploy_id"], dep
    assert "deployed once, by h01's transaction" in r2["message"], r2
    assert len(list((records / "deploys").glob("*/manifest.json"))) == 1 and (records / "id").is_file()
    assert not list((sb.hosts["h02"].state_dir / "deploys").glob("*/manifest.json"))
    assert _hash(pkg1) == _hash(pkg2) != _pristine()

    # h02 alone sees the deploy as what it is (was: refused as no-record)
    code, chk = run_json(capsys, "deploy", *i, pb, "--check", "--limit", "h02")
    assert code == 0 and chk["hosts"][0]["status"] == "noop", chk
    code, st = run_json(capsys, "status", *i, "--limit", "h02")
    assert code == 0 and not st["hosts"][0]["problems"], st
    assert st["hosts"][0]["last_deploy"] == r1["deploy_id"], st

    # every host's server verified against it (was: FAIL 'no deploy ... is on disk here' on h02)
    code, la = run_json(capsys, "launch", *i, pb)
    assert code == 0, la
    code, vl = run_json(capsys, "verify-logs", *i, pb)
    assert code == 0, vl
    assert run_json(capsys, "stop", *i)[0] == 0

    # h02 alone rolls the tree back, once, from the records both read
    code, rb = run_json(capsys, "rollback", *i, "--limit", "h02")
    assert code == 0 and rb["hosts"][0]["status"] == "changed", rb
    assert _hash(pkg1) == _pristine()
    code, rb = run_json(capsys, "rollback", *i)
    assert code == 0 and {r["status"] for r in rb["hosts"]} == {"unchanged"}, rb
    code, st = run_json(capsys, "status", *i)
    assert code == 0 and all(not r["problems"] for r in st["hosts"]), st


# ------------------------------------------------------------------ the identity rule


def _tree(**kw: Any) -> TreeIdentity:
    base: dict[str, Any] = {"real": "/opt/venv/lib/python3.12/site-packages/sglang", "dev": 2049, "ino": 131074,
                            "records_dir": "/opt/venv/lib/python3.12/site-packages/.fleetctl-tree-sglang",
                            "fs": "ext4", "source": "/dev/vda1", "mount": "/", "boot_id": "b-1"}
    base.update(kw)
    return TreeIdentity(**base)


def test_tree_identity_rule() -> None:
    # two machines whose local trees have equal device and inode numbers (a cloned image): two trees
    assert not same_tree(_tree(), _tree(boot_id="b-2"))
    # one machine (two entries, or two containers of it): one tree
    assert same_tree(_tree(), _tree(real="/srv/other/view/sglang"))
    # a network tree: the same export and inode, whatever machine and mount point
    nfs = {"fs": "nfs4", "source": "nas:/export/venvs", "network": True}
    assert same_tree(_tree(**nfs, mount="/opt", real="/opt/v/sglang"),
                     _tree(**nfs, mount="/mnt/venvs", real="/mnt/venvs/v/sglang", boot_id="b-2", dev=77))
    assert not same_tree(_tree(**nfs), _tree(**nfs, ino=5))
    # the tree's id file: different ids (or one without) are two trees; equal ids join network trees
    assert not same_tree(_tree(id="x"), _tree(id="y"))
    assert not same_tree(_tree(id="x"), _tree())
    assert same_tree(_tree(**{**nfs, "source": "10.0.0.5:/export/venvs"}, id="x"), _tree(**nfs, id="x"))


def _facts(host: str, tree: TreeIdentity, state_dir: str) -> HostFacts:
    return HostFacts(host, "Linux", "/usr/bin/python3", "3.12.3", "root", True, VERSION, tree.real, "wheel",
                     TorchCheck(None, [], None), {}, None, "", 0.0,
                     state=StateFacts(deploys=[], state_dir=state_dir, tree=tree))


def test_where_a_shared_tree_is_recorded() -> None:
    # two entries of one machine and one state dir: one transaction, records stay in that state dir
    g = group_trees(["A", "B"], {"A": _facts("A", _tree(), "/root/.fleetctl"),
                                 "B": _facts("B", _tree(), "/root/.fleetctl")})
    assert g["A"] is g["B"] and g["A"].owner == "A" and g["A"].records_dir is None
    # one machine, two state dirs: beside the tree (its parent is on the same filesystem)
    g = group_trees(["A", "B"], {"A": _facts("A", _tree(), "/root/.fleetctl"),
                                 "B": _facts("B", _tree(), "/home/b/.fleetctl")})
    assert g["B"].records_dir == _tree().records_dir
    # a host that mounts the package dir itself: inside it, at the owner's path
    g = group_trees(["A", "B"], {"A": _facts("A", _tree(), "/root/.fleetctl"),
                                 "B": _facts("B", _tree(real="/mnt/sglang", mount="/mnt/sglang", mount_root=True),
                                             "/home/b/.fleetctl")})
    assert g["B"].records_dir == _tree().real + "/.fleetctl-tree"
    # a tree on NFS is recorded with it even when one host is selected (the others read it later)
    nfs = _tree(fs="nfs4", source="nas:/export", network=True)
    assert group_trees(["A"], {"A": _facts("A", nfs, "/root/.fleetctl")})["A"].records_dir == nfs.records_dir
    assert group_trees(["A"], {"A": _facts("A", _tree(), "/root/.fleetctl")})["A"].records_dir is None
