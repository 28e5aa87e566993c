"""An Ansible INI inventory with a host range drives the whole loop on the real sshd sandbox (issue
32): the hosts come from `h0[1:3]`, their connection from `[gpu:vars]` (ansible_host, ansible_user,
the ssh key) and each host's own port, interpreter and fleetctl keys from `host_vars/<host>.yml`,
as an operator who already keeps an Ansible inventory writes it. ansible-core (a test dependency)
reads the same file and must name the same hosts with the same ports: the oracle for the parse;
fleetctl then deploys, launches, verifies, stops and rolls back through it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_launch import FULL, make_inventory, ssb  # noqa: F401  (the fixture: the session sandbox on sshd, left as found)

from fleetctl.cli import main

pytestmark = pytest.mark.fleet


@pytest.fixture
def sb(ssb: Any) -> Any:  # noqa: F811
    """test_launch's session sandbox on sshd, left as found (its `sb` is the in-process fleet)."""
    return ssb


def ansible_ini(sb: Any, d: Path) -> Path:
    """The sandbox as an Ansible INI inventory with a range, group vars and host_vars files."""
    d.mkdir(parents=True)
    own = yaml.safe_load(make_inventory(sb, d / "fleetctl.yaml").read_text())
    defaults = own["defaults"]
    (d / "host_vars").mkdir()
    for name, h in own["hosts"].items():
        hv = {"ansible_port": h["port"], "ansible_python_interpreter": h["python"],
              "fleetctl_state_dir": h["state_dir"], "fleetctl_gpus": h["gpus"], "fleetctl_env": h["env"],
              "fleetctl_flags": h["flags"]}
        (d / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump(hv))
    names = sorted(own["hosts"])
    assert names == ["h01", "h02", "h03"]
    ini = d / "hosts.ini"
    ini.write_text("\n".join([
        "[gpu]", "h0[1:3]", "",
        "[gpu:vars]",
        "ansible_host=127.0.0.1",
        f"ansible_user={defaults['user']}",
        f"ansible_ssh_private_key_file={defaults['identity_file']}",
        f"fleetctl_known_hosts={defaults['known_hosts']}",
        "fleetctl_launch_command='{python} -m fleetctl.sandbox.simulator'", ""]))
    return ini


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main([*map(str, args), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_an_ansible_ini_inventory_with_a_range_runs_the_loop(sb: Any, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    ini = ansible_ini(sb, tmp_path / "ansible")
    ports = {n: yaml.safe_load((ini.parent / "host_vars" / f"{n}.yml").read_text())["ansible_port"]
             for n in ("h01", "h02", "h03")}
    oracle = shutil.which("ansible-inventory") or str(Path(__file__).resolve().parents[1] / ".venv" / "bin"
                                                      / "ansible-inventory")
    if Path(oracle).exists():  # Ansible's own reading of the same file: the same hosts and ports
        listed = json.loads(subprocess.run([oracle, "-i", str(ini), "--list"], capture_output=True, text=True,
                                           check=True, timeout=120).stdout)
        assert sorted(listed["gpu"]["hosts"]) == ["h01", "h02", "h03"]
        assert {n: listed["_meta"]["hostvars"][n]["ansible_port"] for n in ports} == ports
    code, doc = run(capsys, "facts", "-i", ini)
    assert code == 0, doc
    assert [h["host"] for h in doc["hosts"]] == ["h01", "h02", "h03"]
    try:
        code, doc = run(capsys, "deploy", "-i", ini, FULL, "--limit", "gpu[0:1]")
        assert code == 0 and [h["host"] for h in doc["hosts"]] == ["h01", "h02"], doc
        assert all(h["status"] == "changed" for h in doc["hosts"]), doc
        code, doc = run(capsys, "launch", "-i", ini, FULL, "--limit", "gpu[0:1]", "--timeout", "120")
        assert code == 0, doc
        code, doc = run(capsys, "verify-logs", "-i", ini, FULL, "--limit", "gpu[0:1]")
        assert code == 0 and doc["ok"], doc
        code, doc = run(capsys, "stop", "-i", ini, "--limit", "gpu[0:1]")
        assert code == 0, doc
        code, doc = run(capsys, "rollback", "-i", ini, "--limit", "gpu[0:1]")
        assert code == 0 and all(h["status"] == "changed" for h in doc["hosts"]), doc
        code, doc = run(capsys, "status", "-i", ini, "--limit", "gpu[0:1]")
        assert code == 0, doc
    finally:
        main(["stop", "-i", str(ini)])
