"""Issue 16.8: every command's --json document is the one envelope (fleetctl/ui/jsonout.py) and validates
against its JSON Schema in docs/schemas/ (draft 2020-12): the `sandbox` commands on a real sshd
sandbox, every other command on in-process hosts (tests/fakehost.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import require_sshd
from ports import free_port as _closed_port
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from test_launch import FULL, make_inventory, stop_all_local

from fleetctl.cli import main
from fleetctl.ui.jsonout import counts, envelope, host_row

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schemas"
# the command name in a document -> its schema file
SCHEMA_OF = {"facts": "facts", "explain": "explain", "deploy": "deploy", "rollback": "rollback",
             "status": "status", "history": "history", "launch": "launch", "verify-logs": "verify-logs",
             "stop": "stop", "servers": "servers", "patch check": "patch-check", "sandbox up": "sandbox-up",
             "sandbox status": "sandbox-status", "sandbox down": "sandbox-down", "sandbox restart": "sandbox-restart"}


def _registry() -> Registry:
    return Registry().with_resources(
        (p.name, Resource.from_contents(json.loads(p.read_text()), default_specification=DRAFT202012))
        for p in sorted(SCHEMAS.glob("*.schema.json")))


def validate(doc: dict[str, Any], registry: Registry) -> None:
    name = SCHEMA_OF[doc["command"]]
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)


# ----------------------------------------------------------------------------- no hosts needed


def test_schema_files_are_valid_draft_2020_12_and_each_command_has_one() -> None:
    files = {p.name for p in SCHEMAS.glob("*.schema.json")}
    assert files == {f"{n}.schema.json" for n in SCHEMA_OF.values()} | {"envelope.schema.json"}
    for f in files:
        schema = json.loads((SCHEMAS / f).read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


def test_the_envelope_counts_and_refuses_a_clashing_key() -> None:
    rows = [host_row({"host": "h01", "status": "changed", "message": "m"}, ok=True),
            host_row({"host": "h02", "status": "refused", "reason": "why"}, ok=False),
            host_row({"host": "h03", "status": "changed"}, ok=True)]
    assert rows[1] == {"host": "h02", "ok": False, "state": "refused", "message": "why", "status": "refused",
                       "reason": "why"}
    doc = envelope("deploy", ok=False, hosts=rows, op_id="d1", summary={"batches": 2}, plan={})
    assert doc["summary"] == {"hosts": 3, "ok": 2, "failed": 1, "states": {"changed": 2, "refused": 1},
                              "batches": 2}
    assert list(doc)[:6] == ["command", "op_id", "ok", "message", "summary", "hosts"]
    with pytest.raises(ValueError, match="clash"):
        counts(rows, failed=1)  # a command's own count may not hide the host counts


# ----------------------------------------------------------------------------- every command on a fleet

# the `sandbox` commands build, start and stop sshd hosts themselves: their documents are checked on
# a real sshd sandbox; every other command's on in-process hosts (tests/fakehost.py), where what the
# hosts answer is the same (the subject here is the document, not the transport)
SANDBOX_COMMANDS = frozenset(c for c in SCHEMA_OF if c.startswith("sandbox "))


class Runner:
    """Runs a command with --json; its document validates against its schema and keeps the
    envelope's own promises (beyond the schema)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.registry = _registry()
        self.seen: list[tuple[str, str]] = []

    def __call__(self, *args: Any, expect: int | None = 0) -> dict[str, Any]:
        self.capsys.readouterr()
        code = main([*map(str, args), "--json"])
        out, err = self.capsys.readouterr()
        assert expect is None or code == expect, (args, code, err)
        doc = json.loads(out)
        validate(doc, self.registry)
        assert doc["ok"] is (code == 0), (args, doc["ok"], code)
        s = doc["summary"]
        assert s["hosts"] == len(doc["hosts"]) and s["ok"] + s["failed"] == s["hosts"]
        assert s["ok"] == sum(1 for h in doc["hosts"] if h["ok"]) and sum(s["states"].values()) == s["hosts"]
        self.seen.append((doc["command"], " ".join(str(a) for a in args[:2])))
        return doc


@pytest.mark.fleet
def test_every_sandbox_command_json_validates_against_its_schema(tmp_path: Path, request: pytest.FixtureRequest,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    require_sshd()
    from fleetctl.sandbox import lifecycle

    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    d = tmp_path / "sb"
    request.addfinalizer(lambda: lifecycle.down(d, missing_ok=True))  # before `up`: stopped even if up fails
    run = Runner(capsys)

    up = run("sandbox", "up", "--dir", d, "--hosts", "2", "--versions", "0.5.9,0.5.14", "--gpus", "2")
    assert [h["host"] for h in up["hosts"]] == ["h01", "h02", "jump"] and up["op_id"] is None
    sb = lifecycle.load(d)
    st = run("sandbox", "status", "--dir", d)
    assert all(h["ok"] and h["state"] == "running" for h in st["hosts"])
    sb.stop_host("h02")
    rs = run("sandbox", "restart", "--dir", d)  # the host that is down, on its port again
    assert [(h["host"], h["state"]) for h in rs["hosts"]] == [("h02", "running")]
    down = run("sandbox", "down", "--dir", d)
    assert down["summary"]["stopped"] >= 3

    assert {c for c, _ in run.seen} == SANDBOX_COMMANDS


@pytest.mark.usefixtures("ledger_dir")
def test_every_fleet_command_json_validates_against_its_schema(fake_sandbox: Any, tmp_path: Path,
                                                               request: pytest.FixtureRequest,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    sb = fake_sandbox(hosts=2, versions=("0.5.9", "0.5.14"), gpus=2)
    request.addfinalizer(lambda: stop_all_local(sb))
    run = Runner(capsys)

    inv = make_inventory(sb, tmp_path / "inv.yaml")
    facts = run("facts", "-i", inv)
    assert facts["summary"]["states"] == {"ok": 2}
    run("explain", FULL, "-i", inv)
    check = run("deploy", FULL, "-i", inv, "--check")
    assert check["op_id"] is None and {h["state"] for h in check["hosts"]} == {"change"}
    dep = run("deploy", FULL, "-i", inv)
    assert dep["op_id"].startswith("d") and dep["summary"]["states"] == {"changed": 2}
    assert all(h["deploy_id"] == dep["op_id"] for h in dep["hosts"])
    lst = run("history")
    assert lst["hosts"] == [] and lst["summary"]["operations"] == 1
    one = run("history", dep["op_id"])
    assert one["op_id"] == dep["op_id"] and one["operation"]["kind"] == "deploy"
    run("status", FULL, "-i", inv)
    plan = run("launch", FULL, "-i", inv, "--drop-unknown-flags", "--check")
    assert plan["op_id"] is None and plan["check"] is True and {h["state"] for h in plan["hosts"]} == {"start"}
    launch = run("launch", FULL, "-i", inv, "--drop-unknown-flags", "--timeout", "300")
    assert launch["op_id"].startswith("l") and launch["summary"]["ready"] == launch["summary"]["instances"] == 2
    ver = run("verify-logs", FULL, "-i", inv)
    assert ver["summary"]["instances_passed"] == 2
    srv = run("servers", "-i", inv)
    assert srv["summary"]["running"] == 2
    run("servers", "-i", inv, "--discover")
    roll = run("deploy", FULL, "-i", inv, "--restart", "--serial", "1", "--timeout", "300")
    assert roll["op_id"] == roll["rollout"]["deploy_id"] and roll["summary"]["batches"] == 2
    stop = run("stop", "-i", inv)
    assert stop["summary"]["stopped"] == 2
    rb_check = run("rollback", "-i", inv, "--check")
    assert rb_check["op_id"] is None
    rb = run("rollback", "-i", inv)
    assert rb["op_id"].startswith("r") and rb["summary"]["states"] == {"changed": 2}
    run("rollback", "-i", inv, "--from-pristine")

    # --any-errors-fatal with one host unreachable: refused before any change (exit 1)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["h99"] = {"address": "127.0.0.1", "port": _closed_port(), "connect_timeout": 3}
    sb.fake.down.add("h99")  # (an in-process host: nothing listens on its port, so it is down)
    bad_inv = tmp_path / "bad-inv.yaml"
    bad_inv.write_text(yaml.safe_dump(doc))
    fatal = run("deploy", FULL, "-i", bad_inv, "--any-errors-fatal", expect=1)
    assert [h["host"] for h in fatal["hosts"] if not h["ok"]] == ["h99"] and fatal["changed"] is False
    run("rollback", "-i", bad_inv, "--any-errors-fatal", expect=1)
    unreach = run("facts", "-i", bad_inv, expect=1)
    assert unreach["summary"]["failed"] == 1 and unreach["hosts"][2]["state"] == "unreachable"

    pc = run("patch", "check", FULL)
    assert pc["hosts"] == [] and pc["summary"]["files"] == len(pc["results"])

    # every command that emits JSON was run: these, and the sandbox commands above
    assert {c for c, _ in run.seen} == set(SCHEMA_OF) - SANDBOX_COMMANDS
