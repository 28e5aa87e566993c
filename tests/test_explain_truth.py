"""explain tells the whole truth before launch (issue 30.5): what it says on a sandbox host.

The first test is explain's smoke on a real sshd host (the table, refused); the others decide on
in-process hosts (`fake_sandbox`, tests/fakehost.py): what explain, facts and launch conclude from
a host's files is ops logic, not transport."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetctl.cli import main

pytestmark = [pytest.mark.usefixtures("ledger_dir")]  # (fresh_sandbox brings the `fleet` marker)
ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = str(ROOT / "playbooks" / "dynamic-spec-disable")


def with_env(inv: Path, env: str) -> Path:
    out = inv.parent / "inventory-env.yaml"
    out.write_text(re.sub(r"env: \{PATH: ('[^']*')\}", rf"env: {{PATH: \1, {env}}}", inv.read_text()))
    return out


def test_no_line_says_patched_and_refused(fresh_sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    """0.5.9 with the v2 worker selected: the payload patches eagle_worker_v2.py but does not support
    EAGLEWorkerV2 there. The refusal is its own line, not '... patches it: yes [REFUSED]'."""
    sb = fresh_sandbox(hosts=1, versions=("0.5.9",), gpus=1)
    inv = with_env(sb.inventory_path, "SGLANG_ENABLE_SPEC_V2: '1'")
    code = main(["explain", "-i", str(inv), PAYLOAD])
    out = capsys.readouterr().out
    assert code == 1 and "REFUSED" in out and "patches it: yes" in out, out
    assert not [ln for ln in out.splitlines() if "patches it: yes" in ln and "REFUSED" in ln], out


def edited_inventory(inv: Path, host: dict) -> Path:
    import yaml

    doc = yaml.safe_load(inv.read_text())
    for h in doc["hosts"].values():
        for k, v in host.items():
            h[k] = {**h.get(k, {}), **v} if isinstance(v, dict) else v.format(**h) if isinstance(v, str) else v
    out = inv.parent / "inventory-edited.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def test_explain_says_what_the_launch_itself_does(fake_sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    """Before launch, not only in verify-logs: a --log-level that hides INFO (launch refuses it), a
    launch command whose `env` prefix overrides the playbook/inventory env, a threshold that never fires."""
    import json

    sb = fake_sandbox(hosts=1, versions=("0.5.9",), gpus=1)
    quiet = edited_inventory(sb.inventory_path, {"flags": {"--log-level": "warning"}})
    code = main(["explain", "-i", str(quiet), PAYLOAD, "--json"])
    h = json.loads(capsys.readouterr().out)["hosts"][0]
    assert code == 1 and "--log-level warning hides INFO lines" in (h.get("refused") or ""), h

    over = edited_inventory(sb.inventory_path, {"env": {"SGLANG_ENABLE_SPEC_V2": "1"},
                                                "launch_command": "env SGLANG_ENABLE_SPEC_V2=0 {launch_command}"})
    code = main(["explain", "-i", str(over), PAYLOAD])
    out = capsys.readouterr().out
    assert "the launch command sets SGLANG_ENABLE_SPEC_V2='0', overriding SGLANG_ENABLE_SPEC_V2='1'" in out, out
    assert "EAGLEWorker in" in out  # and the answer is the command's: overlap off, v1 worker

    never = edited_inventory(sb.inventory_path, {"flags": {"--max-running-requests": 8,
                                                           "--speculative-disable-batch-threshold": 8}})
    code = main(["explain", "-i", str(never), PAYLOAD])
    out = capsys.readouterr().out
    assert "warning:" in out and "max_running_requests" in out, out


def test_explain_shows_a_value_the_patched_server_args_refuses(fake_sandbox, capsys) -> None:
    """0.5.14, topk 4: fleetctl's table lets EAGLEWorkerV2 start, but the payload's own check in the
    patched server_args.py (replayed from the patched file, with the release's adaptive_unsupported_reason)
    refuses --speculative-disable-batch-threshold with a topk other than 1: explain says so, before the crash."""
    import json

    sb = fake_sandbox(hosts=1, versions=("0.5.14",), gpus=1)
    inv = edited_inventory(sb.inventory_path, {"flags": {"--speculative-eagle-topk": 4,
                                                         "--speculative-num-draft-tokens": 8}})
    code = main(["explain", "-i", str(inv), PAYLOAD, "--json"])
    h = json.loads(capsys.readouterr().out)["hosts"][0]
    assert code == 1, h
    assert "patched srt/server_args.py refuses this launch" in h["refused"] and "only topk=1" in h["refused"], h
    code = main(["explain", "-i", str(sb.inventory_path), PAYLOAD, "--json"])  # topk 1: nothing refused
    h = json.loads(capsys.readouterr().out)["hosts"][0]
    assert code == 0 and not h.get("refused"), h


def test_facts_fails_a_sglang_dir_the_launch_does_not_import(fake_sandbox, capsys) -> None:
    """facts checks an inventory sglang_dir against what the launch's python imports: another tree
    (here the release's own pristine tree elsewhere) fails the host, naming both; the imported one is ok."""
    import json

    from fleetctl.engines import wheels

    sb = fake_sandbox(hosts=1, versions=("0.5.9",), gpus=1)
    other = wheels.package_dir("0.5.9")
    code = main(["facts", "-i", str(edited_inventory(sb.inventory_path, {"sglang_dir": str(other)})), "--json"])
    h = json.loads(capsys.readouterr().out)["hosts"][0]
    assert code == 1 and h["state"] == "mismatch" and not h["ok"], h
    imported = sb.hosts["h01"].host_dir / "site-packages" / "sglang"
    assert str(other) in h["message"] and str(imported) in h["message"], h
    code = main(["facts", "-i", str(edited_inventory(sb.inventory_path, {"sglang_dir": str(imported)})), "--json"])
    h = json.loads(capsys.readouterr().out)["hosts"][0]
    assert code == 0 and h["state"] == "ok", h


def test_launch_refuses_what_the_patched_server_args_refuses(fake_sandbox, capsys) -> None:
    """Deployed on 0.5.14, launched with topk 4: launch refuses the host before starting anything,
    with the payload's own refusal (the real server would crash on it at start-up)."""
    import json

    sb = fake_sandbox(hosts=1, versions=("0.5.14",), gpus=1)
    assert main(["deploy", "-i", str(sb.inventory_path), PAYLOAD]) == 0
    capsys.readouterr()
    inv = edited_inventory(sb.inventory_path, {"flags": {"--speculative-eagle-topk": 4,
                                                         "--speculative-num-draft-tokens": 8}})
    code = main(["launch", "-i", str(inv), PAYLOAD, "--json", "--timeout", "300"])
    h = json.loads(capsys.readouterr().out)["hosts"][0]
    assert code == 1 and h["status"] == "refused", h
    assert "patched srt/server_args.py refuses this launch" in json.dumps(h) and "only topk=1" in json.dumps(h), h
    assert main(["rollback", "-i", str(sb.inventory_path)]) == 0
