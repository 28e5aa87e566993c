"""`fleetctl patch check` passes the shipped payload on every version it supports (real wheels)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.cli import main
from fleetctl.config.playbook import load_playbook
from fleetctl.engines import wheels
from fleetctl.engines.sglang.releases import KNOWN_VERSIONS

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("name", ["dynamic-spec-disable", "origin-wrong-file"])
def test_patch_check_passes_shipped_playbooks(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    pb = ROOT / "playbooks" / name
    code = main(["patch", "check", str(pb)])
    got = capsys.readouterr()
    for v in load_playbook(pb).supported():
        assert v in got.out
    if name == "origin-wrong-file":  # its files apply and compile, but its launch runs EAGLEWorker
        assert code == 1 and "your patch changes only eagle_worker_v2.py" in got.err
    else:
        assert code == 0, got.out + got.err


def test_payload_covers_every_release() -> None:
    """Every release fleetctl knows (0.5.4.post3 - 0.5.23) has the payload: server_args (plus the spec
    field namespace from 0.5.20) and every EAGLE worker file the release has."""
    pb = load_playbook(ROOT / "playbooks" / "dynamic-spec-disable")
    assert list(pb.supported()) == list(KNOWN_VERSIONS)
    for v in KNOWN_VERSIONS:
        paths = {f.path for f in pb.files_for(v) or []}
        workers = {"srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py"}
        assert "srt/server_args.py" in paths
        assert paths & workers == {w for w in workers if (wheels.package_dir(v) / w).is_file()}, v
