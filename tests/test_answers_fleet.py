"""A host whose agent answers are hostile (null, a list, missing keys, wrong types) fails alone, with
one bounded "host answered an invalid ..." line; the other hosts succeed; no "internal error".

The hosts are in-process (tests/fakehost.py: the real agent, its real files and servers); the hostile
host's agent has every answer it frames rewritten by tests/data/hostile_agent.py's `mutate` (what a
`python:` wrapper around the real agent does on a real host: how the answer reaches the controller is
transport, not the subject here)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from test_faults import EW2, SA, VERSION, make_playbook, run, write_inventory

from fleetctl.remote import servers as srv

pytestmark = [pytest.mark.usefixtures("ledger_dir")]

HOSTILE = "h03"
GOOD = ("h01", "h02")
MODES = ("null", "list", "missing", "type")
# (a --json host entry does not repeat its host name: docs/json.md)
LINE = re.compile(r"^host answered an invalid '(facts|server_grep)' answer: \S.*: \S")


def _mutate() -> Any:
    sys.path.insert(0, str(Path(__file__).parent / "data"))
    try:
        from hostile_agent import mutate
    finally:
        sys.path.pop(0)
    return mutate


@pytest.fixture(scope="module")
def fake_afleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """3 in-process hosts (0.5.9); servers launched on h01 and h02; one inventory."""
    import fakehost

    d = tmp_path_factory.mktemp("answers")
    with fakehost.sandbox(d / "sb", hosts=3, versions=[VERSION], gpus=1) as sb:
        try:
            pb = make_playbook(d / "pb", files=(EW2, SA))
            with pb.open("a") as fh:  # a marker the simulator logs on every rank, patched or not
                fh.write("verify:\n  markers: ['Load weight end.']\n")  # (make_playbook writes launch:)
            inv = write_inventory(sb, d / "inventory.yaml", command_timeout=60)
            doc = yaml.safe_load(inv.read_text())
            for name in doc["hosts"]:
                doc["hosts"][name]["flags"] = {"--port": free_port()}
            inv.write_text(yaml.safe_dump(doc, sort_keys=False))
            from fleetctl.cli import main

            with fakehost.installed(sb.fake):
                # deployed first: verify-logs never passes without the playbook's deploy on disk
                assert main(["deploy", "-i", str(inv), "--limit", ",".join(GOOD), str(pb), "--json"]) == 0
                assert main(["launch", "-i", str(inv), "--limit", ",".join(GOOD), str(pb), "--timeout", "300",
                             "--json"]) == 0
            yield {"sb": sb, "pb": pb, "inv": inv}
        finally:
            for h in sb.hosts.values():
                for name in srv.list_instances(str(h.state_dir)):
                    rec = srv.current_record(str(h.state_dir), name)
                    if rec and srv.record_alive(rec):
                        srv.stop_record(rec, 5.0)


@pytest.fixture
def hostile(fake_afleet: dict[str, Any]) -> Iterator[Any]:
    """Reach fake_afleet's hosts in-process; `hostile(mode)` rewrites h03's answers as `mode` says."""
    import fakehost

    mutate, fake = _mutate(), fake_afleet["sb"].fake

    def set_mode(mode: str) -> dict[str, Any]:
        fake.rewrite[HOSTILE] = lambda answer: json.dumps(mutate(json.loads(answer), mode)).encode()
        return fake_afleet

    try:
        with fakehost.installed(fake):
            yield set_mode
    finally:
        fake.rewrite.pop(HOSTILE, None)


def _rows(command: str, doc: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    """host -> (succeeded, its message) from a command's --json document."""
    if command == "status":
        return {r["host"]: (r["status"] == "ok" and not r["problems"], " ".join(r["problems"])) for r in doc["hosts"]}
    if command == "deploy":
        return {h["host"]: (h["status"] in ("change", "noop"), h["reason"]) for h in doc["plan"]["hosts"]}
    if command == "rollback":
        return {p["host"]: (p["status"] in ("noop", "change"), p["reason"]) for p in doc["plan"]}
    if command == "verify-logs":
        return {h["host"]: (h["ok"], h["message"]) for h in doc["hosts"]}
    return {h["host"]: (h["status"] == "ok", h["message"]) for h in doc["hosts"]}  # facts, servers


COMMANDS = {
    "facts": lambda inv, pb: ["facts", "-i", inv],
    "status": lambda inv, pb: ["status", "-i", inv],
    "servers": lambda inv, pb: ["servers", "-i", inv],
    "deploy": lambda inv, pb: ["deploy", "--check", "-i", inv, pb],
    "rollback": lambda inv, pb: ["rollback", "--check", "-i", inv],
    "verify-logs": lambda inv, pb: ["verify-logs", "-i", inv, pb],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_hostile_answers_fail_that_host_only(hostile: Any, command: str, mode: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    afleet = hostile(mode)
    args = COMMANDS[command](str(afleet["inv"]), str(afleet["pb"]))
    code, out, err = run(capsys, *args, "--json")
    assert "internal error" not in out + err and "Traceback" not in out + err, out + err
    assert code == 1, (code, out, err)
    rows = _rows(command, json.loads(out))
    assert set(rows) == {*GOOD, HOSTILE}
    for name in GOOD:
        assert rows[name][0], (name, rows[name])
    ok, msg = rows[HOSTILE]
    assert not ok and LINE.search(msg), msg
    assert len(msg) <= 300 and "\n" not in msg
    if mode == "missing":
        assert msg.endswith(": missing"), msg
    if mode == "type":
        assert "expected a string, got a number" in msg or "expected true or false, got a string" in msg, msg


@pytest.mark.parametrize("command", list(COMMANDS))
def test_hostile_answers_in_table_output(hostile: Any, command: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    afleet = hostile("missing")
    args = COMMANDS[command](str(afleet["inv"]), str(afleet["pb"]))
    code, out, err = run(capsys, *args)
    assert "internal error" not in out + err and "Traceback" not in out + err, out + err
    assert code == 1, (code, out, err)
    flat = re.sub(r"[\s│┃|]+", "", out + err)
    assert "h03:hostansweredaninvalid" in flat, out + err
