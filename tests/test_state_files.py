"""Playbooks ship non-package files (issue 15.4): a file under the host's state dir, deployed and
rolled back in the same transaction as the package files, and the adaptive-spec playbook built on
it (upstream --speculative-adaptive with a steps=0 large-batch slot), launched and verified on the
sandbox for 0.5.14+ hosts."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from faulthook import faulted
from jsoncli import cli, ok

from fleetctl.cli import main
from fleetctl.config.playbook import load_playbook
from fleetctl.engines import wheels
from fleetctl.engines.sglang import adaptive
from fleetctl.errors import InputError
from fleetctl.model import statefiles
from fleetctl.remote import records as rrecords
from fleetctl.remote import transaction as rtx
from fleetctl.remote.core import AgentError
from fleetctl.sandbox.simulator import adaptive_lines

ROOT = Path(__file__).resolve().parents[1]
ADAPTIVE = ROOT / "playbooks" / "adaptive-spec"
SHOWN = "{state_dir}/files/adaptive-spec/adaptive.json"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ----------------------------------------------------------------------------- the agent transaction


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    p = tmp_path / "site" / "sglang"
    (p / "srt").mkdir(parents=True)
    (p / "__init__.py").write_text("")
    (p / "srt" / "a.py").write_bytes(b"A = 1\n")
    return p


def payload(tmp_path: Path, pkg: Path, new_a: bytes | None, state: dict[str, bytes], did: str = "d1") -> dict:
    files = []
    if new_a is not None:
        files.append({"path": "srt/a.py", "sha_before": sha((pkg / "srt/a.py").read_bytes()), "sha_after": sha(new_a),
                      "content": new_a})
    return {"state_dir": str(tmp_path / "state"), "deploy_id": did, "package_dir": str(pkg), "version": "0",
            "playbook": "t", "by": "test", "files": files, "verify_paths": ["srt/a.py"],
            "state_files": [{"name": n, "sha_after": sha(d), "mode": 0o644,
                             "content": d} for n, d in state.items()]}


def test_state_file_deployed_and_rolled_back_with_the_package_files(tmp_path: Path, pkg: Path) -> None:
    sd = tmp_path / "state"
    target = sd / "files" / "pb" / "cfg.json"
    res = rtx.action_deploy(payload(tmp_path, pkg, b"A = 2\n", {"pb/cfg.json": b'{"1": 1}'}))
    assert [f["path"] for f in res["files"]] == ["srt/a.py", "{state_dir}/files/pb/cfg.json"]
    assert target.read_bytes() == b'{"1": 1}' and oct(target.stat().st_mode & 0o777) == oct(0o644)
    assert res["final"]["{state_dir}/files/pb/cfg.json"] == sha(b'{"1": 1}')
    m = rrecords.load_manifest(str(sd), "d1")
    st = [f for f in m["files"] if f.get("root") == "state"]
    assert m["state"] == "complete" and st[0]["sha_before"] is None and st[0]["status"] == "applied"
    # a second deploy changes only the state file: its old bytes are backed up and come back
    res2 = rtx.action_deploy(payload(tmp_path, pkg, None, {"pb/cfg.json": b'{"17": 0}'}, did="d2"))
    assert res2["deploy_id"] == "d2" and target.read_bytes() == b'{"17": 0}'
    rtx.action_rollback({"state_dir": str(sd), "deploy_ids": ["d2"], "by": "t"})
    assert target.read_bytes() == b'{"1": 1}'
    out = rtx.action_rollback({"state_dir": str(sd), "deploy_ids": ["d1"], "by": "t"})
    assert not target.exists()  # the deploy created it: rollback removes it
    assert (pkg / "srt/a.py").read_bytes() == b"A = 1\n"
    assert {r["path"]: r["action"] for r in out["rollbacks"][0]["files"]} == {
        "srt/a.py": "restored", "{state_dir}/files/pb/cfg.json": "removed"}
    # facts show the state file with its hash now (what launch checks)
    summary = rrecords.manifest_summary(rrecords.load_manifest(str(sd), "d2"))
    assert [f["sha_now"] for f in summary["files"]] == [None]


def test_failure_writing_the_state_file_restores_the_package_file(tmp_path: Path, pkg: Path) -> None:
    sd = tmp_path / "state"
    (sd / "files" / "pb").mkdir(parents=True)
    (sd / "files" / "pb" / "cfg.json").write_bytes(b"old")
    # the package file is renamed first; the state file's bytes then do not hash as planned (damaged
    # on the way): the whole transaction is undone, both files as they were
    p = payload(tmp_path, pkg, b"A = 2\n", {"pb/cfg.json": b"new"})
    p["state_files"][0]["content"] = b"nEw"
    with pytest.raises(AgentError, match="restored to its original files"):
        rtx.action_deploy(p)
    assert (pkg / "srt/a.py").read_bytes() == b"A = 1\n"
    assert (sd / "files" / "pb" / "cfg.json").read_bytes() == b"old"
    assert rrecords.load_manifest(str(sd), "d1")["state"] == "failed-restored"
    assert [x.name for x in (sd / "files" / "pb").iterdir()] == ["cfg.json"]  # no temp file left
    # and a state file created by the failed deploy is removed again
    p = payload(tmp_path, pkg, b"A = 2\n", {"pb/new.json": b"new"}, did="d2")
    p["state_files"][0]["content"] = b"nEw"
    with pytest.raises(AgentError, match="restored to its original files"):
        rtx.action_deploy(p)
    assert not (sd / "files" / "pb" / "new.json").exists() and (pkg / "srt/a.py").read_bytes() == b"A = 1\n"


def test_killed_between_package_and_state_file_is_repaired(tmp_path: Path, pkg: Path) -> None:
    from tests.test_agent_local import run_agent_subprocess

    sd = tmp_path / "state"
    (sd / "files" / "pb").mkdir(parents=True)
    (sd / "files" / "pb" / "cfg.json").write_bytes(b"old")
    p = payload(tmp_path, pkg, b"A = 2\n", {"pb/cfg.json": b"new"})
    p["action"] = "deploy"
    got = run_agent_subprocess(faulted(p, {"at": "between_renames", "n": 1, "how": "exit"}))  # after srt/a.py
    assert got.returncode == 99
    assert (pkg / "srt/a.py").read_bytes() == b"A = 2\n"  # half done, as a kill leaves it
    assert rrecords.load_manifest(str(sd), "d1")["state"] == "applying"
    res = rtx.action_deploy(payload(tmp_path, pkg, None, {}, did="d2"))  # the next call repairs it
    assert any("repaired interrupted deploy d1" in n for n in res["notes"])
    assert (pkg / "srt/a.py").read_bytes() == b"A = 1\n" and (sd / "files" / "pb" / "cfg.json").read_bytes() == b"old"


def test_state_file_names_are_refused_outside_the_files_dir(tmp_path: Path, pkg: Path) -> None:
    for bad in ("../lock", "/etc/passwd", "pb/../../x", ".hidden", ""):
        with pytest.raises(AgentError, match="state file name"):
            rtx.action_deploy(payload(tmp_path, pkg, b"A = 2\n", {bad: b"x"}))
    assert (pkg / "srt/a.py").read_bytes() == b"A = 1\n"


# ----------------------------------------------------------------------------- the playbook


def test_adaptive_playbook_loads_and_refs_are_checked(tmp_path: Path) -> None:
    pb = load_playbook(ADAPTIVE)
    assert [f.name for f in pb.state_files] == ["adaptive.json"] and all(not fs for fs in pb.versions.values())
    assert statefiles.expand("{file:adaptive.json}", pb, "/home/u/.fleetctl") == \
        "/home/u/.fleetctl/files/adaptive-spec/adaptive.json"
    text = (ADAPTIVE / "playbook.yaml").read_text().replace("{file:adaptive.json}", "{file:other.json}")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "adaptive.json").write_bytes((ADAPTIVE / "files" / "adaptive.json").read_bytes())
    (tmp_path / "playbook.yaml").write_text(text)
    with pytest.raises(InputError, match=r"\{file:other.json\} names no entry of state_files"):
        load_playbook(tmp_path)


def test_config_format_change_points_are_the_wheels() -> None:
    """What fleetctl.engines.sglang.adaptive says about each release, checked against its real code."""
    pb = load_playbook(ADAPTIVE)
    for v in ("0.5.11", "0.5.12", "0.5.13", *pb.versions):
        params = wheels.pristine_bytes(v, "srt/speculative/adaptive_spec_params.py").decode()
        worker = wheels.pristine_bytes(v, "srt/speculative/eagle_worker_v2.py").decode()
        fmt = adaptive.config_format(v)
        assert ("isdigit()" in params) == (fmt != "flat"), v
        assert ("s >= 0 for s in steps" in params) == (fmt == "per_bs"), v
        assert "AdaptiveSpeculativeParams initialized: " in params, v
        assert ('f"Built adaptive runtime state steps={speculative_num_steps}: "' in worker) == (v != "0.5.11"), v
    assert set(pb.versions) == {v for v in wheels_known() if adaptive.allows_zero_steps(v)}


def wheels_known() -> list[str]:
    from fleetctl.engines.sglang.releases import KNOWN_VERSIONS

    return list(KNOWN_VERSIONS)


@pytest.mark.parametrize("version", ["0.5.13", "0.5.14", "0.5.23"])
def test_simulated_adaptive_lines_follow_the_release(version: str, tmp_path: Path) -> None:
    cfg = tmp_path / "adaptive.json"
    cfg.write_bytes((ADAPTIVE / "files" / "adaptive.json").read_bytes())
    args = {"speculative_adaptive": True, "speculative_adaptive_config": str(cfg), "speculative_num_steps": 3}
    if version == "0.5.13":  # this release refuses a steps=0 slot, as its loader does
        with pytest.raises(ValueError, match="candidate_steps must be a list of positive ints"):
            adaptive_lines(version, "EAGLEWorkerV2", args)
        return
    lines = adaptive_lines(version, "EAGLEWorkerV2", args)
    assert lines[0] == "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3, 7]"
    assert [re.sub(r":.*", "", ln) for ln in lines[1:]] == [
        f"Built adaptive runtime state steps={s}" for s in (0, 1, 7)]
    assert all("fleetctl simulator" in ln for ln in lines[1:])
    assert adaptive_lines(version, "EAGLEWorkerV2", {**args, "speculative_adaptive": False}) == []


def adaptive_copy(tmp_path: Path, versions: tuple[str, ...], flags: dict[str, Any] | None = None) -> Path:
    """adaptive-spec with other versions and/or extra launch flags, in tmp_path."""
    doc = yaml.safe_load((ADAPTIVE / "playbook.yaml").read_text())
    doc["versions"] = {v: {} for v in versions}
    doc["launch"]["flags"].update(flags or {})
    (tmp_path / "files").mkdir(exist_ok=True)
    (tmp_path / "files" / "adaptive.json").write_bytes((ADAPTIVE / "files" / "adaptive.json").read_bytes())
    (tmp_path / "playbook.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def test_patch_check_shows_the_state_files_per_release(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pb = load_playbook(ADAPTIVE)
    data = (ADAPTIVE / "files" / "adaptive.json").read_bytes()
    code, doc = cli(capsys, "patch", "check", ADAPTIVE)
    assert code == 0 and doc["results"] == [] and doc["ok"]
    assert [r["version"] for r in doc["state_files"]] == pb.supported()
    for r in doc["state_files"]:
        assert r["path"] == SHOWN and r["ok"] and f"sha256 {sha(data)}" in r["detail"]
        assert f"SGLang {r['version']} loads it: slots 1: [1, 3, 7], 17: [0]" in r["detail"]
        assert "steps=0 from batch size 17" in r["detail"]
    assert doc["message"] == (f"patch check: adaptive-spec passes on {len(pb.versions)} release(s): 0 of 0 package "
                              f"file(s) ok; {len(pb.versions)} of {len(pb.versions)} state file check(s) ok "
                              "(1 file(s) shipped as-is on every release)")
    # the table a person reads: one row per release, and the verdict (on a terminal wide enough that
    # no cell is folded: off a terminal tables fit 80 columns)
    monkeypatch.setenv("COLUMNS", "250")
    capsys.readouterr()
    assert main(["patch", "check", str(ADAPTIVE), "--sglang", "0.5.23"]) == 0
    out = capsys.readouterr().out
    # cells fold to fit 80 columns (non-tty): read each column's text back whole
    rows = [ln.split("│")[1:-1] for ln in out.splitlines() if ln.startswith("│")]
    cols = ["".join(r[i].strip() for r in rows) for i in range(len(rows[0]))]
    assert "adaptive-spec/adaptive.json" in cols[1] and sha(data) in cols[3], cols
    assert "patch check: adaptive-spec passes on 1 release(s)" in out


def test_patch_check_refuses_a_config_the_release_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = cli(capsys, "patch", "check", adaptive_copy(tmp_path, ("0.5.13", "0.5.14")))
    assert code == 1 and not doc["ok"]
    rows = {r["version"]: r for r in doc["state_files"]}
    assert rows["0.5.14"]["ok"] and not rows["0.5.13"]["ok"]
    assert "SGLang 0.5.13 refuses it: BS 17: candidate_steps must be a list of positive ints" in rows["0.5.13"]["detail"]
    assert doc["message"].startswith("patch check: adaptive-spec failed on 0.5.13 on 2 release(s)")


def test_steps_zero_slot_beyond_max_running_requests_is_warned(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    pb = load_playbook(ADAPTIVE)  # its steps=0 slot is "17"
    assert adaptive.idle_slot_warnings(pb, {}) == []  # no limit set: the server picks one, no claim
    assert adaptive.idle_slot_warnings(pb, {"--max-running-requests": 32}) == []
    assert "acts only on a full batch" in adaptive.idle_slot_warnings(pb, {"--max-running-requests": "17"})[0]
    [w] = adaptive.idle_slot_warnings(pb, {"--max-running-requests": 16})
    assert w.startswith('adaptive-spec: adaptive.json: the steps=0 slot "17" (batches of 17+ requests) never acts')
    code, doc = cli(capsys, "patch", "check", adaptive_copy(tmp_path, ("0.5.14",), {"--max-running-requests": 8}))
    assert code == 0 and any("never acts: --max-running-requests 8" in x["message"] for x in doc["warnings"])


def test_release_refusal_names_the_release_and_why() -> None:
    pb = load_playbook(ADAPTIVE)
    need = "adaptive-spec needs SGLang 0.5.14+ (steps=0 slots): SGLang"
    assert adaptive.release_refusal(pb, "0.5.9") == f"{need} 0.5.9 has no --speculative-adaptive"
    assert adaptive.release_refusal(pb, "0.5.12") == f"{need} 0.5.12 takes no per-batch-size slots"
    assert adaptive.release_refusal(pb, "0.5.13") == f"{need} 0.5.13 refuses candidate_steps 0"
    assert adaptive.release_refusal(pb, "0.5.14") is None
    assert adaptive.release_refusal(load_playbook(ROOT / "playbooks" / "dynamic-spec-disable"), "0.5.9") is None


# ----------------------------------------------------------------------------- on the sandbox




@pytest.mark.usefixtures("ledger_dir")
def test_adaptive_spec_deploy_launch_verify_rollback(fake_sandbox: Any, capsys: pytest.CaptureFixture[str]) -> None:
    sb = fake_sandbox(hosts=2, versions=("0.5.14", "0.5.23"), gpus=2)  # tp=2: ranks TP0 and TP1
    inv = str(sb.inventory_path)
    try:
        code, doc = cli(capsys, "launch", "-i", inv, ADAPTIVE, "--timeout", "300")
        assert code == 1 and all("is not on" in h["message"] and "run 'fleetctl deploy -i " in h["message"]
                                 for h in doc["hosts"])
        code, check = cli(capsys, "deploy", "--check", "-i", inv, ADAPTIVE)
        assert code == 0 and "adaptive.json will be written" in json.dumps(check), json.dumps(check)[:2000]
        dep = ok(capsys, "deploy", "-i", inv, ADAPTIVE)
        assert {h["host"]: h["status"] for h in dep["hosts"]} == {"h01": "changed", "h02": "changed"}
        for h in sb.hosts.values():
            shipped = h.state_dir / "files" / "adaptive-spec" / "adaptive.json"
            assert shipped.read_bytes() == (ADAPTIVE / "files" / "adaptive.json").read_bytes()
        ok(capsys, "launch", "-i", inv, ADAPTIVE, "--timeout", "300")
        doc = ok(capsys, "verify-logs", "-i", inv, ADAPTIVE)
        for h in doc["hosts"]:
            iv = h["instances"][0]
            assert iv["ok"] and iv["args"]["speculative_adaptive"] is True
            assert iv["args"]["speculative_adaptive_config"].endswith("/files/adaptive-spec/adaptive.json")
            # logged on TP rank 0 only (per_rank: false): found once, counted for every rank
            assert [r["rank"] for r in iv["ranks"]] == ["TP0", "TP1"]
            assert all(all(r["markers"].values()) for r in iv["ranks"])
        # settings upstream's adaptive refuses (topk 2): it logs that it falls back to static params,
        # a forbidden line of this playbook, so the launch fails on it and names it
        inv2 = sb.inventory_path.parent / "inventory-topk2.yaml"
        inv_doc = yaml.safe_load(sb.inventory_path.read_text())
        for hd in inv_doc["hosts"].values():
            hd["flags"] = {**(hd.get("flags") or {}), "--speculative-eagle-topk": 2,
                           "--speculative-num-draft-tokens": 8}
        inv2.write_text(yaml.safe_dump(inv_doc))
        code, doc = cli(capsys, "launch", "--replace", "-i", inv2, ADAPTIVE, "--timeout", "300")
        assert code == 1 and all("speculative_adaptive disabled: speculative_eagle_topk=2" in i["message"]
                                 for h in doc["hosts"] for i in h["instances"]), json.dumps(doc)[:3000]
        code, again = cli(capsys, "deploy", "--check", "-i", inv, ADAPTIVE)  # nothing left to write
        assert code == 0 and "will be written" not in json.dumps(again)
        ok(capsys, "stop", "-i", inv)
        ok(capsys, "rollback", "-i", inv)
        for h in sb.hosts.values():
            assert not (h.state_dir / "files" / "adaptive-spec" / "adaptive.json").exists()
        code, doc = cli(capsys, "launch", "-i", inv, ADAPTIVE, "--timeout", "300")  # rolled back: refused again
        assert code == 1 and "run 'fleetctl deploy -i " in json.dumps(doc)
    finally:
        main(["stop", "-i", inv])
