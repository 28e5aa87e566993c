"""Issue 17: the bare-login-shell sandbox variant, and the host-side start costs fleetctl cut
(each test asserts behaviour, never timing)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

pytestmark = pytest.mark.fleet


def test_bare_shell_sandbox_gives_each_host_its_own_empty_home(fresh_sandbox) -> None:
    from fleetctl.sandbox import fleet

    sb = fresh_sandbox(hosts=2, versions=("0.5.9", "0.5.14"), gpus=1, bare_shell=True)
    for h in sb.hosts.values():
        assert h.bare_shell and h.home == h.host_dir / "home"
        assert h.home.is_dir() and not list(h.home.iterdir())  # no .bashrc, .profile, ...
        r = sb.ssh(h.name, 'printf "%s|%s" "$HOME" "$(cd && pwd)"')
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"{h.home}|{h.home}"
    # the login shell reads rc files from that HOME: one placed there runs, so none ran before
    h01 = sb.hosts["h01"]
    (h01.home / ".bashrc").write_text("export FLEETCTL_TEST_RC=ran\n")
    assert sb.ssh("h01", 'printf %s "${FLEETCTL_TEST_RC:-none}"').stdout == "ran"
    assert sb.ssh("h02", 'printf %s "${FLEETCTL_TEST_RC:-none}"').stdout == "none"
    # recorded, and kept when a host's sshd is started again
    assert fleet.load(sb.dir).hosts["h02"].bare_shell
    sb.stop_host("h02")
    sb.start_host("h02")
    assert sb.ssh("h02", 'printf %s "$HOME"').stdout == str(sb.hosts["h02"].home)


def test_default_sandbox_keeps_the_account_home(sandbox) -> None:
    h = next(iter(sandbox.hosts.values()))
    assert not h.bare_shell and h.home is None
    r = sandbox.ssh(h.name, 'printf %s "$HOME"')
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(r.stdout) == os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)


def test_bare_shell_hosts_work_for_fleetctl(fresh_sandbox, tmp_path: Path) -> None:
    """A bare host behaves like a real one: facts, deploy and rollback of the playbook succeed."""
    import json
    import subprocess
    import sys

    sb = fresh_sandbox(hosts=1, versions=("0.5.14",), gpus=1, bare_shell=True)
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(tmp_path / "ledger"), "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)

    def run(*args: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "fleetctl", *args, "-i", str(sb.inventory_path), "--json"],
                           capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return json.loads(p.stdout)

    pb = str(repo / "playbooks" / "dynamic-spec-disable")
    assert run("deploy", pb)["ok"]
    assert run("rollback")["ok"]
