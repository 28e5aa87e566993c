"""Start-up stays light (issue 16.10): --help and --version import none of the
heavy dependencies; the lazy command table says exactly what the command modules define."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetctl import cli, commands

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("paramiko", "fabric", "invoke", "pydantic", "rich", "yaml", "fleetctl.ops.runner", "fleetctl.commands.deploys")


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
    for module in dict.fromkeys(c.options for c in cli.COMMANDS.values()):
        loaded.update(cli.load_commands(module))
    assert list(loaded) == list(cli.COMMANDS), "COMMANDS must list every command, in each module's order"
    for name, info in cli.COMMANDS.items():
        assert getattr(loaded[name], "help", None) == info.summary, name
        if info.impl is not None:  # the table names a function that exists (imported here, not at start-up)
            assert callable(commands.implementation(name)), name


def test_no_command_body_imports_its_implementation_by_hand() -> None:
    """Issue 33.5: a command's options module hands its options to commands.run(name, ...); the table
    (fleetctl/commands/__init__.py) is the one place that names the module that runs it."""
    impls = {c.impl.split(":")[0] for c in cli.COMMANDS.values() if c.impl}
    for module in {c.options for c in cli.COMMANDS.values() if c.impl}:
        text = (ROOT / "fleetctl" / "commands" / f"{module}.py").read_text()
        assert not [m for m in impls if re.search(rf"\bimport {m}\b|\b{m}\.(?!py\b)", text)], module


def test_a_command_without_a_table_row_still_runs(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delitem(cli.COMMANDS, "servers")
    assert cli.main(["servers", "--help"]) == 0
    assert "Usage: fleetctl servers" in capsys.readouterr().out
    assert cli.main(["servrs"]) == 2
    assert "Did you mean 'servers'?" in capsys.readouterr().err


TRANSPORT = ("paramiko", "fabric", "invoke", "fleetctl.ops.runner", "fleetctl.transport")


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


# -- option values converted without pydantic (fleetctl/commands/coerce.py) -------------------------

def _typer_params() -> list[Any]:
    params = []
    for module in dict.fromkeys(c.options for c in cli.COMMANDS.values()):
        for c in cli.load_commands(module).values():
            for sub in [c, *getattr(c, "commands", {}).values()]:
                params += [p for p in sub.params if hasattr(p, "type_descriptor")]
    return params


VALUES = ["3", "007", "0", "1024", "1025", "-1", "+3", " 4", "4 ", "1_000", "1.5", "0.1", "0.05", "2.", ".5",
          "1e3", "nan", "inf", "banana", "", "x\x00y", "a/b.yaml", "-", "~/inv.yaml", "true", "1", 5, 0, 2.5,
          True, False, ("a", "b"), [], Path("p.yaml")]


def _outcome(rp: Any, value: Any, param: Any) -> tuple[str, Any]:
    from typer._click.exceptions import BadParameter

    try:
        got = rp._coerce_value(value, param=param, ctx=None)
        return "ok", (type(got).__name__, got)
    except (BadParameter, ValueError, TypeError) as e:
        return "error", str(getattr(e, "message", e))


def test_fast_option_conversion_equals_typers_own() -> None:
    """Every fleetctl option annotation, on canonical, edge and bad values: the fast path accepts
    exactly what typer's pydantic conversion accepts, with the same result and the same message. This
    also fails loudly when a typer upgrade renames what coerce.py hooks into."""
    from fleetctl.commands import coerce

    params = _typer_params()
    kinds = {(p.type_descriptor.annotation, p.type_descriptor.parameter_info.min,
              p.type_descriptor.parameter_info.max): p for p in params}
    assert len(kinds) >= 6 and any(isinstance(p._runtime_param or coerce.build_runtime_param(p.type_descriptor),
                                              coerce.FastRuntimeParam) for p in params)
    checked = 0
    for p in kinds.values():
        fast = coerce.build_runtime_param(p.type_descriptor)
        slow = coerce._ORIGINAL(p.type_descriptor)
        for v in VALUES:
            assert _outcome(fast, v, p) == _outcome(slow, v, p), (p.name, p.type_descriptor.annotation, v)
            checked += 1
    assert checked > 100


def test_parsing_options_imports_no_pydantic(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    monkeypatch.chdir(ROOT)
    for argv in (["history", "--last", "3"], ["status", "--help"], ["deploy", "--help"]):
        rc, mods = imported_by(*argv)
        assert rc == 0 and "pydantic" not in mods, argv


def test_a_forgotten_option_value_is_named_not_misparsed(capsys: pytest.CaptureFixture[str], tmp_path: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`stop -i --limit h03` (the inventory forgotten) took '--limit' as the inventory and 'h03' as the
    playbook: "h03: playbook file not found". Now a usage error naming both options, exit 2."""
    assert cli.main(["stop", "-i", "--limit", "h03"]) == 2
    got = capsys.readouterr().err
    assert "Option '-i' needs a value, and the next word is the option '--limit'" in got, got
    assert "playbook file not found" not in got and "Usage: fleetctl stop" in got
    assert cli.main(["patch", "check", "--sglang", "--json", "playbooks/dynamic-spec-disable"]) == 2  # nested groups
    assert "Option '--sglang' needs a value" in capsys.readouterr().err
    # after '--' a word is a value, even one spelled like an option
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    assert cli.main(["history", "--last", "1", "--json", "--", "--last"]) == 2
    assert "needs a value" not in capsys.readouterr().err


def test_a_playbook_given_to_a_command_that_takes_none_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`rollback -i INV PLAYBOOK`, typed after `deploy -i INV PLAYBOOK`, said only "Got unexpected extra
    argument(s)". Now a usage error (exit 2) that says the command takes no playbook and what it works
    from; a stray word that is no playbook keeps click's own message."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    inv = str(tmp_path / "inventory.yaml")
    for argv in (["rollback", "-i", inv, "playbooks/dynamic-spec-disable"],
                 ["rollback", "playbooks/dynamic-spec-disable/playbook.yaml", "-i", inv, "--check"],
                 ["facts", "-i", inv, "-f", "4", "playbooks/dynamic-spec-disable"],
                 ["servers", "--limit", "h01", "playbooks/dynamic-spec-disable", "-i", inv]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"'{argv[0]}' takes no playbook (got 'playbooks/dynamic-spec-disable" in err, (argv, err)
        assert "unexpected extra" not in err and f"Usage: fleetctl {argv[0]}" in err
    assert "restores each host's files from that host's own deploy records" in cli.NO_PLAYBOOK["rollback"]
    # an option's value that names a playbook is the option's (here: an inventory that does not parse)
    assert cli.main(["rollback", "-i", "playbooks/dynamic-spec-disable/playbook.yaml"]) == 2
    assert "takes no playbook" not in capsys.readouterr().err
    assert cli.main(["rollback", "-i", inv, "h01"]) == 2  # no playbook: click's words
    err = capsys.readouterr().err
    assert "takes no playbook" not in err and "unexpected extra argument" in err


def test_the_shared_option_block_is_declared_once_in_the_same_place() -> None:
    """Issue 12.5: every command that acts on hosts takes the block of common.fleet_options: after its
    arguments -i/--limit/-f, after its own options --json/--debug/--accept-new-host-keys and the
    become options (-b, --become-user, --become-method, -K), --log-file and --wait-lock."""
    loaded: dict[str, Any] = {}
    for module in ("deploys", "servers", "facts"):
        loaded.update(cli.load_commands(module))
    head = ["inventory", "limit", "forks", "list_hosts"]
    tail = ["json_out", "debug", "accept_new_host_keys", "become", "become_user", "become_method", "ask_become_pass",
            "log_file", "wait_lock"]
    fleet = [n for n in loaded if n != "history"]
    assert len(fleet) == 9
    for name in fleet:
        params = [p.name for p in loaded[name].params]
        n_args = sum(1 for p in loaded[name].params if p.param_type_name == "argument")
        assert params[n_args:n_args + 4] == head and params[-len(tail):] == tail, (name, params)


@pytest.mark.parametrize("argv", [["status", "-i", "/nonexistent/inventory.yaml"],
                                  ["stop", "-i", "/nonexistent/inventory.yaml", "--limit", "h03"],
                                  ["rollback", "-i", "/nonexistent/inventory.yaml"]])
def test_a_command_without_a_playbook_loads_no_playbook_code(argv: list[str], tmp_path: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to its first connect a command given no playbook imports neither the playbook models nor
    the agent protocol's answer types (both cost CPU at import: issue 16.10)."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    rc, mods = imported_by(*argv)
    assert rc == 2
    assert not {"fleetctl.config.playbook", "fleetctl.protocol.answers"} & mods, argv
