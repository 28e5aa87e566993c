"""deploy / rollback / status on sandbox hosts (real SGLang trees, the real agent) reached in-process
(tests/fakehost.py): ops logic, not transport; the sshd sandbox tests cover the transport."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from faulthook import faults_on

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.patching import make_patch
from fleetctl.sandbox import lifecycle as sbx

pytestmark = [pytest.mark.usefixtures("ledger_dir")]

VERSIONS = ["0.5.9", "0.5.14"]
EW2 = "srt/speculative/eagle_worker_v2.py"
SA = "srt/server_args.py"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def make_playbook(d: Path, name: str, edits: dict[str, str], versions: list[str] = VERSIONS) -> Path:
    """A small real playbook: for each version and file, insert a comment line after line 1."""
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"name: {name}", "versions:"]
    for v in versions:
        lines += [f'  "{v}":', "    files:"]
        for rel, comment in edits.items():
            old = wheels.pristine_bytes(v, rel)
            first, rest = old.split(b"\n", 1)
            new = first + b"\n" + f"# {comment} \u2013 fleetctl test\n".encode() + rest
            pf = d / "patches" / v / (Path(rel).name + ".diff")
            pf.parent.mkdir(parents=True, exist_ok=True)
            pf.write_bytes(make_patch(old, new, rel))
            lines += [f"      - path: {rel}", f"        patch: patches/{v}/{pf.name}", f"        sha256: {sha(old)}"]
    (d / "playbook.yaml").write_text("\n".join(lines) + "\n")
    return d / "playbook.yaml"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sbx.Sandbox]:
    import fakehost

    d = tmp_path_factory.mktemp("deployfleet")
    with fakehost.sandbox(d / "sb", hosts=4, versions=VERSIONS, gpus=2) as sb:  # (taken down also on failure)
        yield sb



@pytest.fixture(autouse=True)
def _in_process(fleet: sbx.Sandbox) -> Iterator[None]:
    """Every test here reaches the module's hosts in-process."""
    import fakehost

    with fakehost.installed(fleet.fake):  # type: ignore[attr-defined]
        yield


@pytest.fixture
def pristine(fleet: sbx.Sandbox) -> Iterator[sbx.Sandbox]:
    """Give each test a fleet whose package trees are pristine and whose state dirs are empty."""
    yield fleet
    for h in fleet.hosts.values():
        for sub in ("srt/speculative", "srt"):
            src = wheels.package_dir(h.version) / sub
            for f in src.iterdir():
                if f.is_file():
                    dst = h.sglang_dir / sub / f.name
                    if not dst.exists() or dst.read_bytes() != f.read_bytes():
                        dst.write_bytes(f.read_bytes())
        shutil.rmtree(h.state_dir / "deploys", ignore_errors=True)
        (h.state_dir / "lock").unlink(missing_ok=True)
    fleet.fake.down.clear()  # type: ignore[attr-defined]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    c = capsys.readouterr()
    return code, c.out, c.err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code, out, _err = run(capsys, *args, "--json")
    return code, json.loads(out)


def host_sha(h: sbx.SandboxHost, rel: str) -> str:
    return sha((h.sglang_dir / rel).read_bytes())


def test_check_deploy_noop_rollback_mixed_versions(pristine: sbx.Sandbox, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    sb = pristine
    pb = make_playbook(tmp_path / "pb", "two-files", {EW2: "a", SA: "b"})
    inv = str(sb.inventory_path)
    before = {(n, rel): host_sha(h, rel) for n, h in sb.hosts.items() for rel in (EW2, SA)}

    code, doc = run_json(capsys, "deploy", "--check", "-i", inv, str(pb))
    assert code == 0
    assert {f["state"] for h in doc["plan"]["hosts"] for f in h["files"]} == {"pristine"}
    assert before == {(n, rel): host_sha(h, rel) for n, h in sb.hosts.items() for rel in (EW2, SA)}

    code, out, _ = run(capsys, "deploy", "--check", "--diff", "-i", inv, str(pb))
    assert code == 0 and "+# a \u2013 fleetctl test" in out and "(intended)" in out

    code, doc = run_json(capsys, "deploy", "-i", inv, str(pb))
    assert code == 0, doc
    assert {r["status"] for r in doc["hosts"]} == {"changed"}
    intended = {}
    for _n, h in sb.hosts.items():
        for rel in (EW2, SA):
            data = (h.sglang_dir / rel).read_bytes()
            assert b"fleetctl test" in data
            intended[(h.version, rel)] = intended.get((h.version, rel), data)
            assert data == intended[(h.version, rel)]  # every host of a version holds the same bytes
        backups = list((h.state_dir / "deploys").glob("*/backup/srt/server_args.py"))
        assert len(backups) == 1 and backups[0].read_bytes() == wheels.pristine_bytes(h.version, SA)

    # again: a no-op, no new deploy dir, no body sent
    code, doc = run_json(capsys, "deploy", "-i", inv, str(pb))
    assert code == 0 and {r["status"] for r in doc["hosts"]} == {"unchanged"}
    for h in sb.hosts.values():
        assert len(list((h.state_dir / "deploys").iterdir())) == 1

    code, doc = run_json(capsys, "rollback", "-i", inv)
    assert code == 0 and {r["status"] for r in doc["hosts"]} == {"changed"}
    for h in sb.hosts.values():
        for rel in (EW2, SA):
            assert (h.sglang_dir / rel).read_bytes() == wheels.pristine_bytes(h.version, rel)
    code, doc = run_json(capsys, "rollback", "-i", inv)  # idempotent
    assert code == 0 and {r["status"] for r in doc["hosts"]} == {"unchanged"}

    code, out, _ = run(capsys, "history")
    assert code == 0 and "deploy" in out and "rollback" in out


def test_drifted_host_refused_others_deploy_then_force(pristine: sbx.Sandbox, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    sb = pristine
    pb = make_playbook(tmp_path / "pb", "one", {EW2: "x"})
    inv = str(sb.inventory_path)
    h1 = sb.hosts["h01"]
    drift = (h1.sglang_dir / EW2).read_bytes() + b"# hand edit\n"
    (h1.sglang_dir / EW2).write_bytes(drift)
    code, doc = run_json(capsys, "deploy", "-i", inv, str(pb))
    assert code == 1
    res = {r["host"]: r for r in doc["hosts"]}
    assert res["h01"]["status"] == "refused" and "drifted" in res["h01"]["message"]
    assert all(res[n]["status"] == "changed" for n in sb.hosts if n != "h01")
    assert (h1.sglang_dir / EW2).read_bytes() == drift

    code, out, _ = run(capsys, "deploy", "--check", "--diff", "-i", inv, "--limit", "h01", str(pb))
    assert code == 1 and "+# hand edit" in out and "(pristine 0.5.9)" in out

    code, doc = run_json(capsys, "deploy", "--force", "-i", inv, "--limit", "h01", str(pb))
    assert code == 0 and doc["hosts"][0]["status"] == "changed"
    assert b"# x \xe2\x80\x93 fleetctl test" in (h1.sglang_dir / EW2).read_bytes()
    # rollback gives back the drifted bytes exactly (they were backed up)
    code, doc = run_json(capsys, "rollback", "-i", inv, "--limit", "h01")
    assert code == 0 and (h1.sglang_dir / EW2).read_bytes() == drift


def test_rollback_refuses_file_changed_since_deploy_unless_force(pristine: sbx.Sandbox, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    sb = pristine
    pb = make_playbook(tmp_path / "pb", "one", {EW2: "y"})
    inv = str(sb.inventory_path)
    assert run_json(capsys, "deploy", "-i", inv, "--limit", "h02", str(pb))[0] == 0
    h = sb.hosts["h02"]
    (h.sglang_dir / EW2).write_bytes((h.sglang_dir / EW2).read_bytes() + b"# later edit\n")
    code, doc = run_json(capsys, "rollback", "-i", inv, "--limit", "h02")
    assert code == 1 and doc["hosts"][0]["status"] == "refused"
    code, doc = run_json(capsys, "rollback", "--force", "-i", inv, "--limit", "h02")
    assert code == 0
    assert (h.sglang_dir / EW2).read_bytes() == wheels.pristine_bytes(h.version, EW2)


def test_rollback_to_an_older_deploy(pristine: sbx.Sandbox, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    sb = pristine
    inv = str(sb.inventory_path)
    pa = make_playbook(tmp_path / "a", "a", {EW2: "A"})
    pbb = make_playbook(tmp_path / "b", "b", {SA: "B"})
    code, da = run_json(capsys, "deploy", "-i", inv, str(pa))
    assert code == 0
    code, db = run_json(capsys, "deploy", "-i", inv, str(pbb))
    assert code == 0
    # roll back only the last one: a stays
    code, doc = run_json(capsys, "rollback", "--check", "-i", inv)
    assert code == 0 and all(p["deploy_ids"] == [db["op_id"]] for p in doc["plan"])
    code, doc = run_json(capsys, "rollback", "-i", inv, "--to", da["op_id"])
    assert code == 0
    for h in sb.hosts.values():
        for rel in (EW2, SA):
            assert (h.sglang_dir / rel).read_bytes() == wheels.pristine_bytes(h.version, rel)


def test_unreachable_host_reported_others_deploy(pristine: sbx.Sandbox, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    sb = pristine
    pb = make_playbook(tmp_path / "pb", "one", {EW2: "u"})
    sb.fake.down.add("h03")  # type: ignore[attr-defined]
    code, doc = run_json(capsys, "deploy", "-i", str(sb.inventory_path), str(pb))
    assert code == 1
    res = {r["host"]: r for r in doc["hosts"]}
    # (the entry names its host; its message does not repeat it: docs/json.md)
    assert res["h03"]["status"] == "unreachable" and res["h03"]["message"].startswith("cannot connect to ")
    assert [res[n]["status"] for n in ("h01", "h02", "h04")] == ["changed"] * 3


def test_host_killed_mid_deploy_is_reported_and_repaired(pristine: sbx.Sandbox, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The host's agent dies between two file renames: reported failed, status shows the mixed host,
    the next deploy repairs it (and a rollback after that restores the wheel's bytes)."""
    from fleetctl.commands.context import fleet_context
    from fleetctl.config.playbook import load_playbook
    from fleetctl.ops.deploy import apply_plan, build_plan, gather, new_op_id

    sb = pristine
    inv = sb.inventory_path
    pbp = make_playbook(tmp_path / "pb", "two", {EW2: "k", SA: "k"})
    pb = load_playbook(pbp)
    with fleet_context(inv, "h01,h02", 4, json=True, debug=False) as ctx:
        plan = build_plan(ctx.fleet, pb, gather(ctx.fleet, pb))
        with faults_on({"h01": {"at": "applied", "n": 1, "how": "exit"}}):  # dies after 1 rename
            res = apply_plan(ctx.fleet, plan, pb, new_op_id())
    assert res["h01"].status == "failed" and res["h02"].status == "changed"
    h1 = sb.hosts["h01"]
    states = {rel: b"fleetctl test" in (h1.sglang_dir / rel).read_bytes() for rel in (EW2, SA)}
    assert sorted(states.values()) == [False, True]  # really mixed on disk

    code, doc = run_json(capsys, "status", "-i", str(inv), "--limit", "h01", str(pbp))
    assert code == 1
    assert any("interrupted deploy" in p for p in doc["hosts"][0]["problems"])
    code, doc = run_json(capsys, "deploy", "--check", "-i", str(inv), "--limit", "h01", str(pbp))
    assert doc["plan"]["hosts"][0]["interrupted"]

    code, doc = run_json(capsys, "deploy", "-i", str(inv), "--limit", "h01", str(pbp))
    assert code == 0, doc
    assert any("repaired interrupted deploy" in n for n in doc["hosts"][0]["notes"])
    assert all(b"fleetctl test" in (h1.sglang_dir / rel).read_bytes() for rel in (EW2, SA))
    assert run_json(capsys, "rollback", "-i", str(inv), "--limit", "h01")[0] == 0
    for rel in (EW2, SA):
        assert (h1.sglang_dir / rel).read_bytes() == wheels.pristine_bytes("0.5.9", rel)
    leftovers = [p for p in h1.sglang_dir.rglob("*.tmp")]
    assert leftovers == []


def test_changed_host_answers_its_servers_in_the_deploy_request(pristine: sbx.Sandbox, tmp_path: Path) -> None:
    """The restart reminder's facts come in the deploy's own answer (`then_facts`): a changed host
    answers two agent requests (facts, deploy), not three; an unchanged host is not asked at all."""
    from fleetctl.commands.context import fleet_context
    from fleetctl.config.playbook import load_playbook
    from fleetctl.model.result import HostResult
    from fleetctl.ops.deploy import apply_plan, build_plan, gather, new_op_id
    from fleetctl.ops.discover import Servers, discover_facts

    pb = load_playbook(make_playbook(tmp_path / "pb", "servers", {EW2: "s"}))
    with fleet_context(pristine.inventory_path, "h01,h02", 4, json=True, debug=False) as ctx:
        plan = build_plan(ctx.fleet, pb, gather(ctx.fleet, pb))
        res = apply_plan(ctx.fleet, plan, pb, new_op_id(), then_facts=lambda h: discover_facts(h, pb))
        assert {n: r.status for n, r in res.items()} == {"h01": "changed", "h02": "changed"}
        for name in ("h01", "h02"):
            got = res[name].detail.servers
            assert isinstance(got, HostResult) and got.status == "ok" and got.detail == Servers(), got
            assert ctx.fleet.connection(next(h for h in ctx.fleet.hosts if h.name == name)).done == ["facts", "deploy"]
        plan = build_plan(ctx.fleet, pb, gather(ctx.fleet, pb))
        res = apply_plan(ctx.fleet, plan, pb, new_op_id(), then_facts=lambda h: discover_facts(h, pb))
        assert {n: (r.status, r.detail.servers) for n, r in res.items()} == {"h01": ("unchanged", None),
                                                                     "h02": ("unchanged", None)}


def test_unsupported_version_refused_before_any_change(pristine: sbx.Sandbox, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    sb = pristine
    pb = make_playbook(tmp_path / "pb", "only-059", {EW2: "v"}, versions=["0.5.9"])
    code, doc = run_json(capsys, "deploy", "-i", str(sb.inventory_path), str(pb))
    assert code == 1
    res = {r["host"]: r for r in doc["hosts"]}
    for n, h in sb.hosts.items():
        if h.version == "0.5.14":
            assert res[n]["status"] == "refused"
            assert "0.5.14 has no patch set" in res[n]["message"] and "supported: 0.5.9" in res[n]["message"]
            assert (h.sglang_dir / EW2).read_bytes() == wheels.pristine_bytes("0.5.14", EW2)
        else:
            assert res[n]["status"] == "changed"


@pytest.mark.parametrize(("text", "pattern"), [
    ("name: x\nversions:\n  '0.5.9':\n    files:\n      - path: ../../etc/passwd\n        patch: p.diff\n"
     "        sha256: " + "ab" * 32 + "\n", r"playbook.yaml:5: .*escapes the package dir"),
    ("name: x\nversions:\n  '0.5.9':\n    files:\n      - path: /etc/passwd\n        patch: p.diff\n"
     "        sha256: " + "ab" * 32 + "\n", r"playbook.yaml:5: .*escapes the package dir"),
    ("name: x\nversions:\n  '0.5.9':\n    files:\n      - path: srt/a.py\n        patch: missing.diff\n"
     "        sha256: " + "ab" * 32 + "\n", r"playbook.yaml:6: .*cannot read missing.diff"),
    ("name: x\nversions:\n  'latest':\n    files:\n      - path: srt/a.py\n        patch: p.diff\n"
     "        sha256: " + "ab" * 32 + "\n", r"playbook.yaml:2: versions: version 'latest' is not an exact release"),
    ("name: x\nversion: {}\n", r"playbook.yaml:2: version: unknown key"),
    ("name: [x\n", r"playbook.yaml:\d+: malformed YAML"),
])
def test_bad_playbooks_one_line_exit_2(fleet: sbx.Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       text: str, pattern: str) -> None:
    import re

    (tmp_path / "playbook.yaml").write_text(text)
    (tmp_path / "p.diff").write_text("")
    code, out, err = run(capsys, "deploy", "-i", str(fleet.inventory_path), str(tmp_path / "playbook.yaml"))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and re.search(pattern, lines[0]), err


def test_playbook_sha_mismatch_refused(fleet: sbx.Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pb = make_playbook(tmp_path / "pb", "one", {EW2: "s"}, versions=["0.5.9"])
    text = pb.read_text()
    real = sha(wheels.pristine_bytes("0.5.9", EW2))
    pb.write_text(text.replace(real, "c" * 64))
    code, _, err = run(capsys, "deploy", "--check", "-i", str(fleet.inventory_path), str(pb))
    assert code == 2 and "does not match the real sglang 0.5.9 file" in err
