"""The new user's papercuts (issue 30.7), each as the class: what a first user met, held here.

- --json with bad input printed nothing on stdout: now the error envelope, always.
- `message: ""` in --json envelopes: a document and each host row always say something.
- history filled up with no-op deploys/rollbacks and had no playbook column.
- "started by not fleetctl".
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fleetctl.cli import main

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "playbooks" / "dynamic-spec-disable"


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    c = capsys.readouterr()
    return code, c.out, c.err


# ---------------------------------------------------------------------------- --json: always one document


@pytest.mark.parametrize("args", [
    ["status", "--json", "--no-such-option"],  # a usage error (click's)
    ["status", "--json", "-i", "/nonexistent/inventory.yaml"],  # a file that is not there
    ["deploy", "--json", "-i", "/nonexistent/inventory.yaml"],  # a missing argument
    ["history", "nosuchid", "--json"],  # a bad id
    ["patch", "check", "--json", "/nonexistent/pb"],
])
def test_json_with_bad_input_prints_the_error_envelope(args: list[str], capsys: pytest.CaptureFixture[str],
                                                       ledger_dir: Path) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    doc = json.loads(out)  # before: stdout was empty
    assert doc["ok"] is False and doc["error"] == {"exit_code": 2, "bad_input": True}
    assert doc["command"] == " ".join(a for a in args if not a.startswith("-"))[:len(doc["command"])]
    assert doc["message"] and doc["message"] in err, (doc["message"], err)
    assert doc["hosts"] == [] and doc["summary"]["hosts"] == 0


def test_no_envelope_message_is_empty() -> None:
    from fleetctl.jsonout import envelope, host_row

    rows = [host_row({"host": "h01", "status": "unchanged", "message": ""}, ok=True),
            host_row({"host": "h02", "status": "changed"}, ok=True)]
    assert [r["message"] for r in rows] == ["unchanged", "changed"]
    doc = envelope("stop", ok=True, hosts=rows)
    assert doc["message"] == "stop: 2 host(s): 2 ok, 0 not"
    assert envelope("sandbox down", ok=True)["message"] == "sandbox down: ok"


# ---------------------------------------------------------------------------- history


def test_history_collapses_no_op_runs_and_names_the_playbook(ledger_dir: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from fleetctl.ledger import Ledger

    lg = Ledger(ledger_dir / "ledger.sqlite")
    pb = FULL / "playbook.yaml"
    ops = [("d20260101-000000-0001", "deploy", "changed"), ("d20260101-000001-0002", "deploy", "unchanged"),
           ("d20260101-000002-0003", "deploy", "unchanged"), ("d20260101-000003-0004", "deploy", "unchanged"),
           ("r20260101-000004-0005", "rollback", "changed")]
    for op_id, kind, st in ops:
        lg.start(op_id, kind, inventory=None, playbook=pb, args={}, hosts=["h01", "h02"])
        lg.finish(op_id, "ok", [{"host": h, "status": st} for h in ("h01", "h02")])
        time.sleep(0.01)  # (distinct start times order the list; not synchronisation)
    lg.close()
    code, out, err = run(capsys, "history")
    assert code == 0, err
    assert "playbook" in out and out.count("dynamic-spec-disable") == 3, out  # 5 operations, 3 rows
    assert "no-op x3" in out and "d20260101-000001-0002..0004" in out, out
    assert "d20260101-000002-0003" not in out  # inside the collapsed row only
    code, out, _ = run(capsys, "history", "--json")
    ops_json = json.loads(out)["operations"]  # nothing collapsed in --json
    assert [o["noop"] for o in ops_json] == [False, True, True, True, False]
    assert all(o["playbook"] == str(pb) for o in ops_json)
