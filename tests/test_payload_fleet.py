"""The payload on a sandbox fleet that mixes releases of every kind the playbook covers: 0.5.7 and 0.5.9
(EAGLEWorker, the default), 0.5.12 (EAGLEWorkerV2, the default there, with the payload's own skipped
step; EAGLEWorker with SGLANG_ENABLE_SPEC_V2=0), 0.5.14 and 0.5.23 (EAGLEWorkerV2, steps=0 state). explain -> deploy ->
launch -> verify-logs -> rollback, each host held to its own release's worker and startup dump.

The mixed-release loop runs on in-process hosts (`fake_sandbox`, tests/fakehost.py: the servers are
real processes of each host's python, their logs real files): what it checks is the playbook per
release, not the transport. The suite's end-to-end smoke of the same loop over real sshd is here too
(test_sshd_smoke_deploy_launch_verify_rollback: one host of the session sandbox, the `fleet` marker)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from jsoncli import cli, ok

from fleetctl.engines import wheels
from fleetctl.sandbox.lifecycle import Sandbox

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "playbooks" / "dynamic-spec-disable"
ADAPTIVE = ROOT / "playbooks" / "adaptive-spec"
ADAPTIVE_MARKERS = ("AdaptiveSpeculativeParams initialized:", "Built adaptive runtime state steps=0:")
MARKER = "Dynamic speculation disable enabled"
VERSIONS = ("0.5.7", "0.5.9", "0.5.12", "0.5.14", "0.5.23")
# the worker each host runs with the playbook's launch (no SGLANG_ENABLE_SPEC_V2 anywhere)
WORKER = {"h01": "EAGLEWorker", "h02": "EAGLEWorker", "h03": "EAGLEWorkerV2", "h04": "EAGLEWorkerV2",
          "h05": "EAGLEWorkerV2"}
pytestmark = pytest.mark.usefixtures("ledger_dir")



def payload_files_pristine(sb: Sandbox) -> dict[str, bool]:
    """Per host: every file the playbook patches on its release equals the release's pristine file."""
    from fleetctl.config.playbook import load_playbook

    pb = load_playbook(PAYLOAD)
    return {name: all((h.sglang_dir / f.path).read_bytes() == wheels.pristine_bytes(h.version, f.path)
                      for f in pb.files_for(h.version) or [])
            for name, h in sb.hosts.items()}


def test_sshd_smoke_deploy_launch_verify_rollback(sandbox: Sandbox, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """deploy -> launch -> verify-logs -> stop -> rollback over real ssh (the agent through sshd and
    the host's login shell, launch's health GET through an SSH direct-tcpip channel) on h01 (0.5.9)
    of the session sandbox, left as found."""
    from test_launch import make_inventory, reset_host_files, stop_all_local

    inv = make_inventory(sandbox, tmp_path / "smoke.yaml", hosts=["h01"])
    try:
        dep = ok(capsys, "deploy", "-i", inv, PAYLOAD)
        assert dep["hosts"][0]["status"] == "changed", dep
        assert not payload_files_pristine(sandbox)["h01"]
        doc = ok(capsys, "launch", "-i", inv, PAYLOAD, "--timeout", "300")
        (it,) = doc["hosts"][0]["instances"]
        assert it["status"] == "ready" and it["health"] == 200, it
        doc = ok(capsys, "verify-logs", "-i", inv, PAYLOAD)
        (iv,) = doc["hosts"][0]["instances"]
        assert iv["ok"] and iv["ranks"] and all(r["markers"][MARKER] for r in iv["ranks"]), iv["problems"]
        ok(capsys, "stop", "-i", inv)
        ok(capsys, "rollback", "-i", inv)
        assert payload_files_pristine(sandbox)["h01"]
    finally:
        stop_all_local(sandbox)
        reset_host_files(sandbox)


def test_mixed_release_fleet_deploy_launch_verify_rollback(fake_sandbox: Callable[..., Sandbox], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from test_launch import make_inventory, stop_all_local

    sb = fake_sandbox(hosts=len(VERSIONS), versions=VERSIONS, gpus=2)
    assert {n: h.version for n, h in sb.hosts.items()} == dict(zip(sorted(sb.hosts), VERSIONS, strict=True))
    try:
        # 0.5.12's default worker is EAGLEWorkerV2, which carries the feature there (issue 35): no
        # SGLANG_ENABLE_SPEC_V2 needed; with =0 the host runs EAGLEWorker, covered too
        v1 = make_inventory(sb, tmp_path / "v1.yaml", hosts=["h03"], env={"h03": {"SGLANG_ENABLE_SPEC_V2": "0"}})
        blob = json.dumps(ok(capsys, "explain", "-i", v1, PAYLOAD))
        assert "EAGLEWorker" in blob and "eagle_worker.py" in blob, blob[:2000]

        inv = make_inventory(sb, tmp_path / "inv.yaml")
        blob = json.dumps(ok(capsys, "explain", "-i", inv, PAYLOAD))
        assert "eagle_worker_v2.py" in blob
        ok(capsys, "deploy", "-i", inv, PAYLOAD)
        assert not any(payload_files_pristine(sb).values())
        ok(capsys, "launch", "-i", inv, PAYLOAD, "--timeout", "300")
        doc = ok(capsys, "verify-logs", "-i", inv, PAYLOAD)
        ivs = {i["host"]: i for h in doc["hosts"] for i in h["instances"]}
        assert sorted(ivs) == sorted(sb.hosts)
        for name, iv in ivs.items():
            assert iv["version"] == sb.hosts[name].version
            assert iv["ok"] and iv["ranks"], (name, iv["problems"])
            assert all(r["markers"][MARKER] for r in iv["ranks"]), name
            assert iv["args"]["speculative_disable_batch_threshold"] == 16
            # the startup dump names the scheduler that picked the worker: non-overlap = EAGLEWorker
            assert iv["args"]["disable_overlap_schedule"] is (WORKER[name] == "EAGLEWorker"), name
        for name, h in sb.hosts.items():
            logs = sorted((h.state_dir / "servers").rglob("*.log"))
            assert any(f"worker={WORKER[name]}, threshold=16" in p.read_text(errors="replace") for p in logs), name

        ok(capsys, "stop", "-i", inv)
        ok(capsys, "rollback", "-i", inv)
        assert all(payload_files_pristine(sb).values())

        adaptive_spec_on_the_same_fleet(sb, tmp_path, capsys)
    finally:
        stop_all_local(sb)


def adaptive_spec_on_the_same_fleet(sb: Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15's done-when, second half: adaptive-spec launches and verifies on the 0.5.14+ hosts of
    the mixed fleet; the older ones are refused by explain and deploy, naming their release and why."""
    from test_launch import make_inventory

    old, new = ["h01", "h02", "h03"], ["h04", "h05"]
    shipped = {n: h.state_dir / "files" / "adaptive-spec" / "adaptive.json" for n, h in sb.hosts.items()}
    inv = make_inventory(sb, tmp_path / "adaptive-all.yaml")
    code, doc = cli(capsys, "explain", "-i", inv, ADAPTIVE)
    assert code == 1
    rows = {h["host"]: h for h in doc["hosts"]}
    for name in old:
        blob = json.dumps(rows[name])
        assert "adaptive-spec needs SGLang 0.5.14+ (steps=0 slots)" in blob, blob[:2000]
        assert f"SGLang {sb.hosts[name].version} " in blob, blob[:2000]
    assert all(rows[n]["ok"] for n in new), json.dumps(doc)[:3000]
    code, doc = cli(capsys, "deploy", "-i", inv, ADAPTIVE)
    assert code == 1
    blob = {h["host"]: json.dumps(h) for h in doc["hosts"]}
    assert all("adaptive-spec needs SGLang 0.5.14+ (steps=0 slots)" in blob[n] for n in old), blob
    assert [n for n in sorted(shipped) if shipped[n].exists()] == new  # the refused hosts got nothing
    assert all(payload_files_pristine(sb).values())

    # a launch whose --max-running-requests never reaches the steps=0 slot ("17"): explain warns
    capped = make_inventory(sb, tmp_path / "adaptive-capped.yaml", hosts=["h04"],
                            flags={"h04": {"--max-running-requests": 16}})
    code, doc = cli(capsys, "explain", "-i", capped, ADAPTIVE)
    idle = 'the steps=0 slot \\"17\\" (batches of 17+ requests) never acts: --max-running-requests 16'
    assert code == 0 and idle in json.dumps(doc), json.dumps(doc)[:3000]
    code, doc = cli(capsys, "deploy", "--check", "-i", capped, ADAPTIVE)  # and deploy --check
    assert code == 0 and idle in json.dumps(doc["hosts"]), json.dumps(doc)[:3000]
    doc = ok(capsys, "launch", "-i", capped, ADAPTIVE, "--timeout", "300")  # and launch (it still starts)
    assert idle in json.dumps(doc["hosts"]), json.dumps(doc)[:3000]
    ok(capsys, "stop", "-i", capped)

    inv_new = make_inventory(sb, tmp_path / "adaptive-new.yaml", hosts=new)
    ok(capsys, "launch", "-i", inv_new, ADAPTIVE, "--timeout", "300")
    doc = ok(capsys, "verify-logs", "-i", inv_new, ADAPTIVE)
    ivs = {i["host"]: i for h in doc["hosts"] for i in h["instances"]}
    assert sorted(ivs) == new
    for name, iv in ivs.items():
        assert iv["version"] == sb.hosts[name].version and iv["ok"], (name, iv["problems"])
        assert iv["args"]["speculative_adaptive"] is True
        assert iv["args"]["speculative_adaptive_config"] == str(shipped[name])
        assert iv["ranks"] and all(all(r["markers"][m] for m in ADAPTIVE_MARKERS) for r in iv["ranks"]), name
    ok(capsys, "stop", "-i", inv_new)
    upgrade_under_the_state_file(sb, tmp_path, capsys, shipped["h04"])
    ok(capsys, "rollback", "-i", inv_new)
    assert not any(p.exists() for p in shipped.values())


def upgrade_under_the_state_file(sb: Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 shipped: Path) -> None:
    """h04 (0.5.14) is upgraded to 0.5.23 under its adaptive-spec deploy: status names the state file
    the deploy left; the rollback that closes the record removes it (it was created by the deploy);
    launch refuses until a deploy writes it again under a new record."""
    from test_launch import make_inventory

    h = sb.hosts["h04"]
    inv = make_inventory(sb, tmp_path / "adaptive-h04.yaml", hosts=["h04"])
    old = h.host_dir / "old-sglang"
    os.replace(h.sglang_dir, old)
    try:
        shutil.copytree(wheels.package_dir("0.5.23"), h.sglang_dir)
        code, st = cli(capsys, "status", "-i", inv)
        blob = json.dumps(st)
        assert code == 1 and "is no longer on disk (package reinstalled/upgraded" in blob
        left = "{state_dir}/files/adaptive-spec/adaptive.json is still there from deploy"
        assert left in blob, blob[:3000]
        rb = ok(capsys, "rollback", "-i", inv)  # closes the record, and takes the state file away
        assert "its state file {state_dir}/files/adaptive-spec/adaptive.json removed" in json.dumps(rb), rb
        assert not shipped.exists()
        code, st = cli(capsys, "status", "-i", inv)
        assert code == 0 and left not in json.dumps(st), json.dumps(st)[:3000]
        code, doc = cli(capsys, "launch", "-i", inv, ADAPTIVE, "--timeout", "300")
        assert code == 1 and "run 'fleetctl deploy -i " in json.dumps(doc), json.dumps(doc)[:3000]
        dep = ok(capsys, "deploy", "-i", inv, ADAPTIVE)
        assert dep["hosts"][0]["status"] == "changed", dep
        code, st = cli(capsys, "status", "-i", inv)
        assert code == 0 and left not in json.dumps(st)  # tracked again by the new deploy
        ok(capsys, "rollback", "-i", inv)
        ok(capsys, "deploy", "-i", inv, ADAPTIVE)  # as before the upgrade, for the caller's rollback
    finally:
        shutil.rmtree(h.sglang_dir)
        os.replace(old, h.sglang_dir)
