"""The demo leaves nothing behind (issue 16.12): its tear-down stops the sandbox and removes the dir."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import require_sshd

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "scripts" / "demo.sh"


def alive(pid: int) -> bool:
    """Running, not a zombie (the sandbox's sshds are this test's children until reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] != "Z"


@pytest.mark.fleet
def test_demo_down_stops_the_sandbox_and_removes_its_dir(tmp_path: Path) -> None:
    require_sshd()
    from fleetctl.sandbox import lifecycle

    d = tmp_path / "fleetctl-demo.test"
    try:
        sb = lifecycle.up(d, hosts=1, versions=["0.5.9"], gpus=1)
        pids = [h.pid for h in sb.all_hosts()]
        assert pids and all(p and alive(p) for p in pids)
        p = subprocess.run(["bash", str(DEMO), "down", str(d)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert not d.exists() and f"removed {d}" in p.stdout
        assert not any(alive(pid) for pid in pids if pid)
    finally:
        lifecycle.down(d, missing_ok=True)


def test_demo_down_refuses_a_dir_that_holds_no_sandbox(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    p = subprocess.run(["bash", str(DEMO), "down", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "holds no sandbox" in p.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.slow
@pytest.mark.fleet
def test_the_whole_demo_leaves_nothing_in_its_tmpdir(tmp_path: Path) -> None:
    require_sshd()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "HOSTS": "2"}
    env.pop("DIR", None)
    env.pop("KEEP", None)
    p = subprocess.run(["bash", str(DEMO)], capture_output=True, text=True, timeout=1800, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert list(tmp.iterdir()) == []
