"""deploy --restart: batches, canary, failure budget; a failing batch is rolled back and later
batches are left untouched (in-process hosts, tests/fakehost.py, + the labelled server simulator, whose
servers are real processes: the rollout's decisions are ops logic, not transport)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.errors import InputError
from fleetctl.ops.rolling import batches, parse_count, parse_percent
from fleetctl.sandbox.lifecycle import Sandbox

PAYLOAD = str(Path(__file__).parent.parent / "playbooks" / "dynamic-spec-disable")
EW = "srt/speculative/eagle_worker.py"


def test_batch_arithmetic() -> None:
    hosts = list(range(10))
    assert [len(b) for b in batches(hosts, 3, 1)] == [1, 3, 3, 3]  # type: ignore[arg-type]
    assert [len(b) for b in batches(hosts, None, None)] == [10]  # type: ignore[arg-type]
    assert [len(b) for b in batches(hosts, 4, None)] == [4, 4, 2]  # type: ignore[arg-type]
    assert parse_count("25%", 10, "--serial") == 3 and parse_count("2", 10, "--serial") == 2
    assert parse_percent("20%", "--max-fail") == 20.0
    for bad in ("0", "-1", "x", "150%"):
        with pytest.raises(InputError):
            parse_count(bad, 10, "--serial")


def test_one_failing_host_in_the_second_batch(fake_sandbox: Callable[..., Sandbox], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    sb = fake_sandbox(hosts=5, versions=("0.5.9",), gpus=1)
    # h03's server dies during start-up (the simulator's documented crash knob)
    inv = sb.inventory_path.parent / "inventory-crash.yaml"
    text = sb.inventory_path.read_text()
    inv.write_text(re.sub(r"(  h03:\n(?:    .*\n)*?    env: \{PATH: '[^']*')\}", r"\1, FLEETCTL_SIM_CRASH: startup}", text))
    assert "FLEETCTL_SIM_CRASH" in inv.read_text()
    try:
        code = main(["deploy", "--restart", "--serial", "2", "--canary", "1", "--max-fail", "0%",
                     "--timeout", "300", "-i", str(inv), PAYLOAD, "--json"])
        doc = json.loads(capsys.readouterr().out)
    finally:
        main(["stop", "-i", str(inv), PAYLOAD])
        capsys.readouterr()
    assert code == 1
    ro = doc["rollout"]
    assert ro["batches"] == [["h01"], ["h02", "h03"], ["h04", "h05"]] and ro["stopped_at_batch"] == 1
    st = {h["host"]: h for h in ro["hosts"]}
    assert st["h01"]["status"] == "ok"  # the canary passed and stays
    assert st["h03"]["status"] == "failed" and "launch" in st["h03"]["steps"]
    # the crash is named as a crash, with its exception (not as a missing marker)
    assert "the server exited (status 1) before ready: RuntimeError: simulated crash" in st["h03"]["message"]
    assert st["h02"]["status"] == "rolled-back"
    assert st["h04"]["status"] == st["h05"]["status"] == "untouched"
    pristine = wheels.pristine_bytes("0.5.9", EW)
    for n in ("h02", "h03", "h04", "h05"):
        assert (sb.hosts[n].sglang_dir / EW).read_bytes() == pristine, n
    assert (sb.hosts["h01"].sglang_dir / EW).read_bytes() != pristine
    assert not (sb.hosts["h04"].state_dir / "deploys").exists() or not any((sb.hosts["h04"].state_dir / "deploys").iterdir())
