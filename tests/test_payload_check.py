"""`fleetctl patch check` passes the shipped payload on every version it supports (real wheels)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.cli import main
from fleetctl.config.playbook import load_playbook

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("name", ["dynamic-spec-disable", "origin-wrong-file"])
def test_patch_check_passes_shipped_playbooks(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    pb = ROOT / "playbooks" / name
    code = main(["patch", "check", str(pb)])
    out = capsys.readouterr().out
    assert code == 0, out
    for v in load_playbook(pb).supported():
        assert v in out


def test_payload_covers_the_required_versions() -> None:
    pb = load_playbook(ROOT / "playbooks" / "dynamic-spec-disable")
    assert {"0.5.5.post3", "0.5.9", "0.5.10.post1", "0.5.14"} <= set(pb.supported())
    for v in ("0.5.5.post3", "0.5.9", "0.5.10.post1"):
        paths = {f.path for f in pb.files_for(v) or []}
        assert {"srt/server_args.py", "srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py"} <= paths
    assert {f.path for f in pb.files_for("0.5.14") or []} >= {"srt/server_args.py", "srt/speculative/eagle_worker_v2.py"}
