"""Issue 17: the modules a command's fixed start imports. A deploy/status/rollback with --json, on
a 1-host sandbox reached directly, imports neither rich (nothing is rendered for a person) nor
fabric/invoke (and so not invoke's unittest.mock, asyncio); a host behind a ProxyJump still goes
through fabric. Asserts what is loaded (sys.modules after main()), never timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PB = str(ROOT / "playbooks" / "dynamic-spec-disable")

# never imported by a --json run that reaches its hosts directly
NOT_WITH_JSON = ("rich", "fabric", "invoke", "unittest", "asyncio", "fleetctl.ui.safeconsole")
# never imported by --version either
NOT_WITH_VERSION = (*NOT_WITH_JSON, "paramiko", "pydantic", "yaml", "packaging", "cryptography",
                    "fleetctl.config", "fleetctl.transport", "fleetctl.commands.deploys")

# stdout stays the command's own (the JSON document); the module list goes to a file
_WRAPPER = """
import json, sys
from fleetctl.cli import main
rc = main(sys.argv[2:])
sys.stdout.flush()
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "modules": sorted(sys.modules)}, f)
"""


def run(tmp_path: Path, *argv: str) -> tuple[int, str, set[str]]:
    where = tmp_path / "modules.json"
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(tmp_path / "ledger")}
    p = subprocess.run([sys.executable, "-c", _WRAPPER, str(where), *argv], capture_output=True, text=True,
                       env=env, timeout=300, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert where.exists(), p.stderr[-2000:]
    got = json.loads(where.read_text())
    return got["rc"], p.stdout, set(got["modules"])


def loaded(mods: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == n or m.startswith(n + ".") for n in names))


def test_version_imports_nothing_heavy(tmp_path: Path) -> None:
    rc, out, mods = run(tmp_path, "--version")
    assert rc == 0 and out.startswith("fleetctl ")
    assert loaded(mods, NOT_WITH_VERSION) == []


def test_json_runs_import_no_rich_fabric_invoke_asyncio(fresh_sandbox: Any, tmp_path: Path) -> None:
    sb = fresh_sandbox(hosts=1, bare_shell=True)
    inv = str(sb.inventory_path)
    lines = [("deploy", PB, "-i", inv, "--check", "--json"), ("deploy", PB, "-i", inv, "--json"),
             ("deploy", PB, "-i", inv, "--json"),  # the no-op
             ("status", PB, "-i", inv, "--json"), ("rollback", "-i", inv, "--json")]
    for argv in lines:
        rc, out, mods = run(tmp_path, *argv)
        doc = json.loads(out)
        assert rc == 0 and doc["ok"] is True, (argv, out[-2000:])
        assert "paramiko" in mods  # the run really connected
        assert loaded(mods, NOT_WITH_JSON) == [], argv
        assert argv[0] != "deploy" or "fleetctl.ops.rolling" not in mods  # only a --restart needs it
    assert doc["hosts"][0]["state"] == "changed"  # the rollback restored the deployed files
    # verify-logs with no server launched: a failed verification (exit 1), the same imports
    rc, out, mods = run(tmp_path, "verify-logs", PB, "-i", inv, "--json")
    assert rc == 1 and json.loads(out)["ok"] is False, out[-2000:]
    assert "paramiko" in mods and loaded(mods, NOT_WITH_JSON) == []

    # without --json the same command renders with rich (the lazy console is really used)
    rc, out, mods = run(tmp_path, "deploy", PB, "-i", inv, "--check")
    assert rc == 0 and "rich" in mods and "fabric" not in mods and "h01" in out


@pytest.mark.parametrize("limit", ["h01-via-jump"])
def test_a_proxyjump_host_still_goes_through_fabric(sandbox: Any, tmp_path: Path, limit: str) -> None:
    rc, out, mods = run(tmp_path, "facts", "-i", str(sandbox.jump_inventory_path), "--limit", limit, "--json")
    assert rc == 0 and json.loads(out)["ok"] is True, out[-2000:]
    assert "fabric" in mods and "invoke" in mods


def test_a_yaml_file_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """load_yaml builds the node tree (lines for errors) and the data from one parse (it parsed
    the text twice: compose, then load), with the same data and the same duplicate-key check."""
    import yaml

    from fleetctl.config import yamlpos

    made: list[int] = []

    class Counting(yamlpos._LOADER):  # type: ignore[name-defined,misc]
        def __init__(self, stream: Any) -> None:
            made.append(1)
            super().__init__(stream)

    monkeypatch.setattr(yamlpos, "_LOADER", Counting)
    pb = ROOT / "playbooks" / "dynamic-spec-disable" / "playbook.yaml"
    doc = yamlpos.load_yaml(pb, "playbook")
    assert len(made) == 1
    assert doc.data == yaml.load(pb.read_text(), Loader=yaml.SafeLoader)
    assert doc.line_of(("versions",)) > 1
    dup = tmp_path / "dup.yaml"
    dup.write_text("a: 1\nb:\n  c: 2\n  c: 3\n")
    with pytest.raises(Exception, match=r"dup.yaml:4: duplicate key 'c' \(first at line 3\)"):
        yamlpos.load_yaml(dup, "inventory")


def test_an_ssh_config_alias_is_reached_directly(sandbox: Any, tmp_path: Path) -> None:
    """A host known only by its ssh_config alias (HostName, Port, User, IdentityFile and
    UserKnownHostsFile all from ssh_config, nothing in the inventory) connects without fabric."""
    h = sandbox.hosts["h01"]
    inv = tmp_path / "alias.yaml"
    inv.write_text(f"ssh_config: {sandbox.dir / 'ssh_config'}\n"
                   f"hosts:\n  h01:\n    python: {h.host_dir / 'bin' / 'python'}\n    state_dir: {tmp_path / 'state'}\n")
    rc, out, mods = run(tmp_path, "facts", "-i", str(inv), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] is True, out[-2000:]
    assert doc["hosts"][0]["host"] == "h01"
    assert "paramiko" in mods and loaded(mods, ("fabric", "invoke")) == []
