"""Ops (deploy, status, rollback) run fast against a temporary "host" through the local transport:
the real agent, started by the host's python over pipes (fleetctl/transport/local.py), with the
same session, framing and answer checks as over SSH. No sshd: these are the quick unit tests of ops;
the real-sshd tests (test_deploy_fleet.py, ...) stay."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from faulthook import faults_on

from fleetctl.config.inventory import Inventory, load_inventory
from fleetctl.config.playbook import Playbook, load_playbook
from fleetctl.engines import wheels
from fleetctl.model import hoststate
from fleetctl.ops.deploy import apply_plan, build_plan, gather, new_op_id
from fleetctl.ops.rollback import apply_rollback, plan_rollback
from fleetctl.ops.runner import Fleet
from fleetctl.transport.base import RemoteError
from fleetctl.transport.local import LocalTransport

VERSION = "0.5.9"
PLAYBOOK = Path(__file__).resolve().parent.parent / "playbooks" / "dynamic-spec-disable"


def make_host(root: Path, name: str = "t01", version: str = VERSION) -> dict[str, object]:
    """A temporary host: a copy of the real SGLang wheel tree in its own site-packages, a torch
    stand-in (metadata only, as in the sandbox) and a state dir; its python is this interpreter."""
    tree = wheels.extracted(version)
    site = root / name / "site-packages"
    site.mkdir(parents=True)
    cp = shutil.which("cp")
    if cp:
        subprocess.run([cp, "-R", "--no-preserve=all", str(tree / "sglang"), str(site / "sglang")], check=True)
    else:
        shutil.copytree(tree / "sglang", site / "sglang")
    for info in tree.glob("sglang-*.dist-info"):
        shutil.copytree(info, site / info.name)
    torch = site / "torch-2.9.1.dist-info"
    torch.mkdir()
    (torch / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1\n")
    state = root / name / "state"
    state.mkdir()
    return {"address": "127.0.0.1", "python": sys.executable, "state_dir": str(state), "gpus": 0,
            "env": {"PYTHONPATH": str(site)}}


def inventory(root: Path, hosts: dict[str, dict[str, object]]) -> Inventory:
    path = root / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return load_inventory(path)


def local_fleet(inv: Inventory) -> Fleet:
    return Fleet(inv, inv.select(None), forks=4,
                 transport=lambda h, i, accept: LocalTransport(h, i, accept_new_host_keys=accept))


@pytest.fixture(scope="module")
def host_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("localhost")


@pytest.fixture(scope="module")
def pb() -> Playbook:
    return load_playbook(PLAYBOOK)


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_deploy_status_rollback_on_a_temporary_host(tmp_path: Path, pb: Playbook,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    inv = inventory(tmp_path, {"t01": make_host(tmp_path)})
    files = [f.path for f in pb.files_for(VERSION) or []]
    assert files
    pkg = tmp_path / "t01" / "site-packages" / "sglang"
    before = {f: digest(pkg / f) for f in files}
    with local_fleet(inv) as fleet:
        g = gather(fleet, pb)
        assert g.outcomes["t01"].ok, g.outcomes["t01"].message
        assert g.facts["t01"].package_version == VERSION
        plan = build_plan(fleet, pb, g)
        (hp,) = plan.hosts
        assert hp.status == "change", hp.message
        res = apply_plan(fleet, plan, pb, new_op_id())
        assert res["t01"].status == "changed", res["t01"].message
        after = {f: digest(pkg / f) for f in files}
        intended = plan.intended[VERSION]
        assert after == {f: hashlib.sha256(intended[f].data).hexdigest() for f in files}
        assert after != before

        # status: the host now holds one complete deploy and its files as intended
        g2 = gather(fleet, pb)
        facts = g2.facts["t01"]
        assert [m.state for m in hoststate.own(facts)] == ["complete"]
        assert [m.id for m in hoststate.on_disk(facts)] == [res["t01"].detail.deploy_id]
        assert not hoststate.interrupted(facts) and facts.state and facts.state.lock is None
        pristine, _ = hoststate.release_pristine(VERSION)
        assert pristine is not None and hoststate.unrecorded(facts, pristine) == []
        assert build_plan(fleet, pb, g2).hosts[0].status == "noop"

        rp = plan_rollback(fleet, g2, None, False, playbook=pb)
        out = apply_rollback(fleet, rp, new_op_id("r"), False, profile=pb.launch)
        assert out["t01"].status == "changed", out
    assert {f: digest(pkg / f) for f in files} == before


def test_an_interrupted_deploy_is_reported_and_repaired_by_rollback(tmp_path: Path, pb: Playbook,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    inv = inventory(tmp_path, {"t01": make_host(tmp_path)})
    files = [f.path for f in pb.files_for(VERSION) or []]
    pkg = tmp_path / "t01" / "site-packages" / "sglang"
    before = {f: digest(pkg / f) for f in files}
    with local_fleet(inv) as fleet:
        plan = build_plan(fleet, pb, gather(fleet, pb))
        with faults_on({"t01": {"at": "applied", "n": 1, "how": "exit"}}):  # dies after 1 rename
            res = apply_plan(fleet, plan, pb, new_op_id())
        assert res["t01"].status != "changed"
        g = gather(fleet, pb)
        (m,) = hoststate.interrupted(g.facts["t01"])
        assert m.state == "applying"
        assert {f: digest(pkg / f) for f in files} != before  # mixed: one file replaced
        assert build_plan(fleet, pb, g).hosts[0].interrupted
        out = apply_rollback(fleet, plan_rollback(fleet, g, None, False, playbook=pb), new_op_id("r"), False,
                             profile=pb.launch)
        assert out["t01"].status == "changed", out
        assert not hoststate.interrupted(gather(fleet, pb).facts["t01"])
    assert {f: digest(pkg / f) for f in files} == before


def test_agent_errors_and_bounds_over_a_pipe(tmp_path: Path) -> None:
    """The session's checks hold on any pipe: a python that cannot run is one clear line, an agent
    that stops answering is a bounded timeout, and the next call starts a new agent process."""
    inv = inventory(tmp_path, {"t01": make_host(tmp_path), "bad": {
        "address": "127.0.0.1", "python": str(tmp_path / "no-such-python"), "state_dir": str(tmp_path / "s")}})
    bad = inv.select("bad")[0]
    with LocalTransport(bad, inv) as conn, pytest.raises(RemoteError) as err:
        conn.agent("ping")
    assert err.value.kind == "bad_python" and "no-such-python" in err.value.message

    import os
    import signal

    host = inv.select("t01")[0]
    with LocalTransport(host, inv) as conn:
        first = conn.agent("ping").pid
        assert conn.agent("ping").pid == first  # one process serves every call
        os.kill(first, signal.SIGSTOP)
        try:
            with pytest.raises(RemoteError) as err:  # a stopped agent never answers: only the bound ends it
                conn.agent("ping", timeout=1)
            assert err.value.kind == "timeout"
        finally:
            with contextlib.suppress(ProcessLookupError):  # the transport may have ended it already
                os.kill(first, signal.SIGKILL)
        assert conn.agent("ping").pid != first


def test_launch_plan_on_a_temporary_host(tmp_path: Path, pb: Playbook) -> None:
    """launch --check's plan (facts -> plan_launch) through the local transport: what would start,
    and a port in use refuses the host before anything starts."""
    import socket

    from fleetctl.ops.launch import check_fleet

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = {**make_host(tmp_path), "flags": {"--port": port}}
    inv = inventory(tmp_path, {"t01": host})
    with local_fleet(inv) as fleet:
        (lp,) = check_fleet(fleet, pb, drop_unknown_flags=True)
        assert lp.status == "start", lp.message
        (st,) = lp.instances
        assert st.port == port and str(port) in st.argv and st.problems == []
        assert st.worker["class"] and lp.stop == [] and lp.hash_files
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
            (lp,) = check_fleet(fleet, pb, drop_unknown_flags=True)
        assert lp.status == "refused" and f"port {port} is in use on the host" in lp.instances[0].problems
        assert lp.to_json()["instances"][0]["problems"] == lp.instances[0].problems
