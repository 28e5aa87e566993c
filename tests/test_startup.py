"""Start-up stays light (issue 16.10): --help and --version import none of the
heavy dependencies; the lazy command table says exactly what the command modules define."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetctl import cli

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("paramiko", "fabric", "invoke", "pydantic", "rich", "yaml", "fleetctl.runner", "fleetctl.commands.deploys")


def imported_by(*argv: str) -> tuple[int, set[str]]:
    code = ("import json, sys\nfrom fleetctl.cli import main\n"
            f"rc = main({list(argv)!r})\n"
            "sys.stdout.write('\\n' + json.dumps([rc, sorted(sys.modules)]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    rc, mods = json.loads(p.stdout.strip().splitlines()[-1])
    return rc, set(mods)


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_light_paths_import_no_heavy_dependency(argv: list[str]) -> None:
    rc, mods = imported_by(*argv)
    assert rc == (0 if argv in (["--version"], ["--help"]) else 2)
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY or m in HEAVY)
    assert heavy == [], f"fleetctl {' '.join(argv)} imported {heavy[:8]}"


def test_a_command_loads_only_its_own_module() -> None:
    rc, mods = imported_by("patch", "--help")
    assert rc == 0 and "fleetctl.commands.patch" in mods
    assert "fleetctl.commands.deploys" not in mods and "paramiko" not in mods


def test_the_lazy_table_matches_the_commands() -> None:
    loaded: dict[str, object] = {}
    for module in dict.fromkeys(m for m, _ in cli.COMMANDS.values()):
        loaded.update(cli.load_commands(module))
    assert list(loaded) == list(cli.COMMANDS), "COMMANDS must list every command, in each module's order"
    for name, (_, help_text) in cli.COMMANDS.items():
        assert getattr(loaded[name], "help", None) == help_text, name


def test_a_command_without_a_table_row_still_runs(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delitem(cli.COMMANDS, "servers")
    assert cli.main(["servers", "--help"]) == 0
    assert "Usage: fleetctl servers" in capsys.readouterr().out
    assert cli.main(["servrs"]) == 2
    assert "Did you mean 'servers'?" in capsys.readouterr().err


TRANSPORT = ("paramiko", "fabric", "invoke", "fleetctl.runner", "fleetctl.transport")


@pytest.mark.parametrize("argv", [
    ["history", "--help"],
    ["history", "--last", "1"],
    ["status", "-i", "/nonexistent/inventory.yaml"],
    ["facts", "-i", "/nonexistent/inventory.yaml"],
    ["deploy", "playbooks/dynamic-spec-disable", "-i", "/nonexistent/inventory.yaml", "--restart", "--serial", "2"],
    ["verify-logs", "playbooks/dynamic-spec-disable", "-i", "/nonexistent/inventory.yaml"],
])
def test_a_command_imports_the_transport_only_to_connect(argv: list[str], tmp_path: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16.10: the ledger commands and every command until its input is valid (here: a missing
    inventory, exit 2) never import paramiko/fabric; 'history' imports no YAML either."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    monkeypatch.chdir(ROOT)
    rc, mods = imported_by(*argv)
    assert rc == (0 if argv[0] == "history" else 2)
    heavy = sorted(m for m in mods if m.split(".")[0] in TRANSPORT[:3] or m.startswith(TRANSPORT[3:]))
    assert heavy == [], f"fleetctl {' '.join(argv)} imported {heavy[:8]}"
    if argv[0] == "history":
        assert "yaml" not in mods and "fleetctl.config.playbook" not in mods
