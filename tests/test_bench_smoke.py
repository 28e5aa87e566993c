"""Smoke run of the bench (bench/run.sh --smoke): N=2, one run, fleetctl + the lean paramiko push.

Keeps the bench working; asserts nothing about timing, only that every tool ran, exited 0 and left
every host correct, and that the JSON and markdown were written. pyinfra and ansible-core need
their own virtualenvs (pip installs, minutes), so they are off here unless BENCH_SMOKE_TOOLS names
them, e.g. BENCH_SMOKE_TOOLS=fleetctl,lean,pyinfra,ansible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS = os.environ.get("BENCH_SMOKE_TOOLS", "fleetctl,lean")

pytestmark = pytest.mark.fleet


def test_bench_smoke(tmp_path: Path) -> None:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("/usr/sbin/sshd is missing: the bench runs a sandbox fleet (apt-get install openssh-server)")
    out = tmp_path / "results"
    env = dict(os.environ)
    env["FLEETCTL_PYTHON"] = sys.executable  # this venv has fleetctl
    env["BENCH_LEAN_PYTHON"] = sys.executable  # and paramiko: no pip install for the lean push
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "run.sh"), "--smoke", "--tools", TOOLS, "--out", str(out),
         "--work", str(tmp_path / "work")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    doc = json.loads((out / "results.json").read_text())
    assert (out / "results.md").exists()
    size = doc["sizes"]["2"]
    tools = [t.strip() for t in TOOLS.split(",")]
    assert sorted(size["tools"]) == sorted(tools)
    for tool in tools:
        ops = size["tools"][tool]
        assert {"deploy", "noop"} <= set(ops), (tool, ops)
        for op, d in ops.items():
            assert d["all_rc0"], (tool, op, d["runs"])
            assert d["median"]["wall"] > 0 and d["median"]["maxrss_mb"] > 0
            if "hosts_correct_min" in d:
                assert d["hosts_correct_min"] == 2, (tool, op, d["runs"])
    # both default login-shell variants ran (interleaved), each left every host correct
    assert sorted(doc["variants"]) == ["bare", "rc-own"]
    assert doc["variants"]["rc-own"]["sizes"]["2"] == size
    bare = doc["variants"]["bare"]["sizes"]["2"]
    assert sorted(bare["tools"]) == sorted(tools)
    assert all(d["hosts_correct_min"] == 2 for ops in bare["tools"].values() for d in ops.values()
               if "hosts_correct_min" in d)
    assert "## Login shell: bare" in (out / "results.md").read_text()
    fl = size["tools"]["fleetctl"]
    assert {"check", "deploy", "noop", "rollback"} <= set(fl)
    assert fl["rollback"]["hosts_correct_min"] == 2  # back to pristine

    # the bench took its sandbox down
    from fleetctl.sandbox import lifecycle

    assert not [s.name for s in lifecycle.status(tmp_path / "work" / "sandbox-rc-own") if s.alive]
    assert not [s.name for s in lifecycle.status(tmp_path / "work" / "sandbox-bare") if s.alive]


def test_rc_own_homes_give_each_host_the_accounts_rc_and_its_own_pyenv_root(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """bench --shells rc-own (bench.own_rc_homes): each host's HOME gets copies of the account's rc
    files and a pyenv root whose shims (pyenv's rehash lock) and version are its own, the rest
    symlinked; running it again changes nothing."""
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "bench"))
    try:
        import bench
    finally:
        sys.path.remove(str(REPO / "bench"))
    account = tmp_path / "root"
    (account / ".pyenv" / "shims").mkdir(parents=True)
    (account / ".pyenv" / "libexec").mkdir()
    (account / ".pyenv" / "versions" / "3.11.7" / "bin").mkdir(parents=True)
    (account / ".pyenv" / "version").write_text("3.11.7\n")
    (account / ".pyenv" / "shims" / "python").write_text("#!/bin/sh\n")
    (account / ".cargo").mkdir()
    (account / ".bashrc").write_text('export PYENV_ROOT="$HOME/.pyenv"\n')
    (account / ".profile").write_text(". ~/.bashrc\n")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: account))
    hosts = {n: SimpleNamespace(home=tmp_path / n / "home") for n in ("h01", "h02")}
    hosts["jump"] = SimpleNamespace(home=None)
    sb = SimpleNamespace(hosts=hosts)
    for _ in range(2):
        bench.own_rc_homes(sb)
    for n in ("h01", "h02"):
        home = hosts[n].home
        assert (home / ".bashrc").read_text() == 'export PYENV_ROOT="$HOME/.pyenv"\n'
        assert not (home / ".bashrc").is_symlink() and (home / ".profile").is_file()
        assert (home / ".cargo").resolve() == account / ".cargo"
        own = home / ".pyenv"
        assert (own / "shims").is_dir() and not (own / "shims").is_symlink()
        assert list((own / "shims").iterdir()) == []  # the host's own: filled by its first rehash
        assert (own / "version").read_text() == "3.11.7\n" and not (own / "version").is_symlink()
        assert (own / "libexec").resolve() == account / ".pyenv" / "libexec"
        assert (own / "versions" / "3.11.7" / "bin").is_dir()
    assert not (tmp_path / "jump").exists()
