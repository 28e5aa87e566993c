"""Retry files and run logs (issue 32.5): a run with failed hosts writes `<state>/retry/CMD.retry` and
prints the command that reruns on them alone (which runs as printed); every fleet command appends
JSON-lines events to `<state>/runs.jsonl` (or --log-file); `history show ID` reads them back.

On in-process hosts (tests/fakehost.py, `fake_sandbox`): what is logged and retried is the
controller's, whatever the transport; `dead` is a host that is down."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl.cli import main
from tests import ports

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks" / "dynamic-spec-disable"


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def runs(path: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in events(path):
        out.setdefault(e["run"], []).append(e)
    return out


@pytest.fixture
def fleet(fake_sandbox: Any, tmp_path: Path) -> tuple[Any, Path]:
    """Two sandbox hosts and `dead`, a loopback port nobody listens on (unreachable at once)."""
    sb = fake_sandbox(hosts=2, versions=("0.5.9",), gpus=1)
    sb.fake.down.add("dead")
    doc = yaml.safe_load(sb.inventory_path.read_text())
    doc["hosts"]["dead"] = {"address": "127.0.0.1", "port": ports.free_port(), "connect_timeout": 5}
    inv = sb.dir / "with-dead.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return sb, inv


def test_failed_hosts_get_a_retry_file_and_a_rerun_that_runs_as_printed(
        fleet: tuple[Any, Path], ledger_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _sb, inv = fleet
    capsys.readouterr()
    assert main(["facts", "-i", str(inv), "--limit", "h*:dead", "--json"]) == 1
    said = capsys.readouterr().err.splitlines()
    retry = ledger_dir / "retry" / "facts.retry"
    assert retry.read_text() == "dead\n"
    hint = [ln for ln in said if ln.startswith("retry: ")]
    assert hint == [f"retry: 1 host(s) failed; rerun on them alone: fleetctl facts -i {inv} --limit @{retry}"], said
    argv = shlex.split(hint[0].split(": ", 2)[2])
    assert argv[0] == "fleetctl"
    code = main([*argv[1:], "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and [h["host"] for h in doc["hosts"]] == ["dead"], doc

    log = runs(ledger_dir / "runs.jsonl")
    first, second = list(log.values())
    kinds = [e["event"] for e in first]
    assert kinds[0] == "start" and kinds[-1] == "end", kinds
    start, end = first[0], first[-1]
    assert [h["host"] for h in start["hosts"]] == ["h01", "h02", "dead"]
    assert start["argv"][:3] == ["facts", "-i", str(inv)] and start["command"] == "facts"
    ends = {e["host"]: e for e in first if e["event"] == "host" and e["phase"] == "end"}
    assert {h: e["status"] for h, e in ends.items()} == {"h01": "ok", "h02": "ok", "dead": "unreachable"}
    assert all(e["elapsed"] >= 0 for e in ends.values())
    assert {e["host"] for e in first if e["event"] == "host" and e["phase"] == "start"} == {"h01", "h02", "dead"}
    assert end["exit_code"] == 1 and end["failed"] == ["dead"] and end["retry_file"] == str(retry)
    assert [e["seq"] for e in first] == list(range(1, len(first) + 1))
    assert [h["host"] for h in second[0]["hosts"]] == ["dead"]

    # history show reads a run back, by its run id
    run_id = first[0]["run"]
    assert main(["history", "show", run_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [e["seq"] for e in shown["events"]] == [e["seq"] for e in first]
    assert main(["history", "show", "x20000101-000000-0000"]) == 2
    assert "no run x20000101-000000-0000" in capsys.readouterr().err


def test_plan_result_and_op_id_of_a_deploy_and_log_file(
        fleet: tuple[Any, Path], ledger_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _sb, inv = fleet
    own = tmp_path / "logs" / "mine.jsonl"
    assert main(["deploy", "-i", str(inv), str(PLAYBOOK), "--log-file", str(own), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    op_id = doc["op_id"]
    assert not (ledger_dir / "runs.jsonl").exists()  # --log-file: another place, not the default one
    (evs,) = runs(own).values()
    by = {e["event"]: e for e in evs}
    assert [h["host"] for h in by["plan"]["plan"]["hosts"]] == ["h01", "h02", "dead"]
    assert by["result"]["op_id"] == op_id
    assert {h["host"]: (h["ok"], h["state"]) for h in by["result"]["hosts"]} == {
        "h01": (True, "changed"), "h02": (True, "changed"), "dead": (False, "unreachable")}
    assert by["end"]["failed"] == ["dead"] and by["end"]["op_id"] == op_id
    assert (ledger_dir / "retry" / "deploy.retry").read_text() == "dead\n"
    steps = {e["step"] for e in evs if e["event"] == "host"}
    assert {"facts", "deploy"} <= steps, steps
    # history show takes the ledger's op id too, with the run log the command wrote
    assert main(["history", "show", op_id, "--log-file", str(own)]) == 0
    text = capsys.readouterr().out
    assert f"deploy {op_id}" in text and "dead: unreachable" in text and "h01 deploy end: ok" in text, text
    assert main(["rollback", "-i", str(inv), "--limit", "h*", "--json"]) == 0
    capsys.readouterr()
    (rb,) = runs(ledger_dir / "runs.jsonl").values()
    assert rb[-1]["event"] == "end" and rb[-1]["exit_code"] == 0 and rb[-1]["failed"] == []


def test_refused_hosts_are_not_offered_a_retry(
        fleet: tuple[Any, Path], ledger_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A refusal names its own fix; rerunning the same command is refused again (issue 30.7). Before:
    deploy and launch printed "retry: 3 host(s) failed; rerun on them alone: ..." with the two refused
    hosts in the retry file. Now the retry file and its rerun are for the host that failed (unreachable)
    alone, and the refused hosts get one line that says what to do instead."""
    _sb, inv = fleet
    for cmd in ("deploy", "launch"):
        capsys.readouterr()
        assert main([cmd, "-i", str(inv), str(REPO / "playbooks" / "origin-wrong-file")]) == 1
        said = capsys.readouterr().err.splitlines()
        retry = ledger_dir / "retry" / f"{cmd}.retry"
        assert retry.read_text() == "dead\n"
        assert [ln for ln in said if ln.startswith("retry: ")] == [
            f"retry: 1 host(s) failed; rerun on them alone: fleetctl {cmd} -i {inv} "
            f"{REPO / 'playbooks' / 'origin-wrong-file'} --limit @{retry}"], said
        (line,) = [ln for ln in said if ln.startswith("refused: ")]
        assert line.startswith("refused: h01, h02 (2 hosts): no retry") and "fleetctl" not in line, line
        end = list(runs(ledger_dir / "runs.jsonl").values())[-1][-1]
        assert end["failed"] == ["dead"] and end["refused"] == ["h01", "h02"], end
    # refused alone: no retry file written, no rerun printed
    (ledger_dir / "retry" / "deploy.retry").unlink()
    capsys.readouterr()
    assert main(["deploy", "-i", str(inv), str(REPO / "playbooks" / "origin-wrong-file"), "--limit", "h*"]) == 1
    said = capsys.readouterr().err
    assert "retry: " not in said and "refused: h01, h02 (2 hosts): no retry" in said, said
    assert not (ledger_dir / "retry" / "deploy.retry").exists()
