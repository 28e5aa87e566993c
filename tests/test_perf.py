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


JSON_CASES = [
    None, True, False, 0, -7, 2**70, 1.5, -0.0, 1e300, float("nan"), float("inf"), float("-inf"),
    "", "plain/path.py", 'quote " and \\ backslash', "ctl \x00\x01\x1f\x7f \n\r\t\b\f", "é ü 中文 \U0001F600",
    "surrogate \udcff from a path", [], {}, [1, [2, [3, {}]]], (1, "a"),
    {"k": {"nested": [None, True, 1.25, "x"]}, 3: "int key", 2.5: "float key", True: "bool key", None: "null"},
]


@pytest.mark.parametrize("obj", JSON_CASES, ids=range(len(JSON_CASES)))
def test_probe_dumps_reads_back_as_json_dumps(obj) -> None:
    """The probe writes its answer with its own small JSON writer (no json import): the agent's
    json.loads must read exactly what json.dumps would have given."""
    import json
    import math

    from fleetctl.remote import probe

    got = json.loads(probe.dumps(obj))
    want = json.loads(json.dumps(obj))
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == want and type(got) is type(want)
    assert probe.dumps(obj) == json.dumps(obj) or (isinstance(obj, float) and math.isnan(obj))


def test_probe_dumps_refuses_what_json_refuses() -> None:
    from fleetctl.remote import probe

    with pytest.raises(TypeError):
        probe.dumps({"x": object()})
    with pytest.raises(TypeError):
        probe.dumps({(1, 2): "tuple key"})


def test_probe_imports_no_json(sandbox) -> None:
    """The probe (one Python start per host per locate) answers without importing json/re/enum,
    under a sandbox host's own python; the agent reads the answer as before."""
    import subprocess

    from fleetctl.remote import agent
    from fleetctl.remote.agent import PROBE_SOURCE

    h = next(iter(sandbox.hosts.values()))
    import marshal

    req = marshal.dumps({"path0": None, "files": ["srt/server_args.py"], "checks": []}, 2)
    p = subprocess.run([str(h.python), "-X", "importtime", "-c", PROBE_SOURCE], input=req, capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {ln.split("|")[-1].strip() for ln in p.stderr.decode().splitlines() if "import time:" in ln}
    assert "json" not in imported and "re" not in imported, sorted(imported)
    import json

    ans = json.loads(p.stdout)
    assert ans["sglang_dir"] == str(h.sglang_dir)
    assert ans["files"]["srt/server_args.py"]["loader"] == "source"
    # and through the agent's own call, with a launch like the inventory's
    got = agent.run_probe({"interpreter": str(h.python), "options": [], "env": {}, "inherit": ["PATH", "HOME"],
                           "target_kind": "module", "target": "sglang.launch_server"}, ["srt/server_args.py"])
    assert got["sglang_dir"] == str(h.sglang_dir), got
