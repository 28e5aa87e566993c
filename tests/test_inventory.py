"""Inventory loading: values resolved, bad files refused with one file:line line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.cli import main
from fleetctl.config.inventory import load_inventory
from fleetctl.errors import InputError

GOOD = """\
defaults:
  user: deploy
  port: 2222
  python: /usr/bin/python3
  env: {A: "1"}
groups:
  h200: {flags: {--tp-size: 8}, env: {B: "2"}}
hosts:
  a1: {address: 127.0.0.1, groups: [h200, east]}
  a2: {address: 127.0.0.1, port: 22, env: {A: "9", S: {value: hush, secret: true}}}
  b1: {address: 127.0.0.1, groups: [west], gpus: [0, 2]}
"""


def write(tmp_path: Path, text: str, name: str = "inv.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_values_resolve_host_over_group_over_defaults(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, GOOD))
    a1, a2, b1 = inv.hosts
    assert (a1.user, a1.port, a1.env, a1.flags) == ("deploy", 2222, {"A": "1", "B": "2"}, {"--tp-size": 8})
    assert a2.port == 22 and a2.env["A"] == "9" and a2.env["S"] == "hush"
    assert a2.public_env()["S"] == "***" and "S" in a2.secret_env_keys
    assert b1.gpus == (0, 2) and a1.gpus == ()
    assert a1.state_dir == "~/.fleetctl"


@pytest.mark.parametrize(
    ("limit", "expect"),
    [
        ("a1", ["a1"]),
        ("a*", ["a1", "a2"]),
        ("h200", ["a1"]),
        ("west,a2", ["a2", "b1"]),
        ("a*,!a2", ["a1"]),
        (None, ["a1", "a2", "b1"]),
        # Ansible's meaning: only exclusions = every host but them; order does not matter
        ("!a1", ["a2", "b1"]),
        ("!a1,!west", ["a2"]),
        ("!a2,a*", ["a1"]),
        ("all", ["a1", "a2", "b1"]),
        ("all,!h200", ["a2", "b1"]),
        ("a*,&h200", ["a1"]),
        ("&east", ["a1"]),
    ],
)
def test_limit_patterns(tmp_path: Path, limit: str | None, expect: list[str]) -> None:
    inv = load_inventory(write(tmp_path, GOOD))
    assert [h.name for h in inv.select(limit)] == expect


def test_limit_matching_nothing_is_an_input_error(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, GOOD))
    with pytest.raises(InputError, match="'zz' matches no host"):
        inv.select("zz")


@pytest.mark.parametrize("limit", ["!all", "a1,!a*", "west,&east", " , ", ""])
def test_an_empty_selection_is_an_input_error(tmp_path: Path, limit: str) -> None:
    inv = load_inventory(write(tmp_path, GOOD))
    with pytest.raises(InputError, match="no host"):
        inv.select(limit)


BAD = [
    ("hosts:\n  a: {address: 127.0.0.1\n", r"inv.yaml:\d+: malformed YAML"),
    ("hosts:\n  a:\n    address: 127.0.0.1\n    adress: x\n", r"inv.yaml:4: hosts.a.adress: unknown key"),
    ("hosts:\n  a:\n    address: 127.0.0.1\n    port: many\n", r"inv.yaml:4: hosts.a.port: .*integer"),
    ("defaults:\n  user: root\nhosts:\n  a:\n    port: 22\n", r"inv.yaml:4: hosts.a.address: missing"),
    ("hosts:\n  a:\n    address: 127.0.0.1\n    env: {'BAD-NAME': x}\n", r"inv.yaml:4: hosts.a.env: .*not a valid name"),
    ("hosts:\n  a:\n    address: 127.0.0.1\n    flags: {tp: 2}\n", r"inv.yaml:4: hosts.a.flags: .*--some-flag"),
    ("- just\n- a list\n", r"inv.yaml:1: inventory must be a YAML mapping"),
    ("defaults: {}\n", r"inv.yaml:1: hosts: missing"),
]


@pytest.mark.parametrize(("text", "pattern"), BAD)
def test_bad_inventories_one_line_file_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     text: str, pattern: str) -> None:
    p = write(tmp_path, text)
    code = main(["facts", "-i", str(p)])
    captured = capsys.readouterr()
    assert code == 2
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert len(lines) == 1, captured.err
    import re

    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in captured.err and captured.out == ""


def test_missing_inventory_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["facts", "-i", str(tmp_path / "nope.yaml")]) == 2
    assert "inventory file not found" in capsys.readouterr().err


def test_an_inventory_that_is_a_directory_names_the_file_to_pass(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`-i SANDBOX_DIR` (the directory, not its inventory.yaml): one line naming the file to pass,
    exit 2 (was: "cannot read inventory: IsADirectoryError: [Errno 21] ...")."""
    d = tmp_path / "sb"
    d.mkdir()
    assert main(["facts", "-i", str(d)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {d}: is a directory, not an inventory file (pass the inventory YAML file itself)\n", err
    for name in ("a.yaml", "b.yml", "c.yaml", "d.yaml"):
        (d / name).write_text("hosts: {}\n")
    assert main(["facts", "-i", str(d)]) == 2
    assert "(pass one of its YAML files: a.yaml, b.yml, c.yaml (+1 more))" in capsys.readouterr().err
    (d / "inventory.yaml").write_text("hosts: {}\n")
    assert main(["status", "-i", str(d)]) == 2
    err = capsys.readouterr().err
    assert f"(pass the file: {d / 'inventory.yaml'})" in err and "Errno" not in err and "Traceback" not in err


def test_no_inventory_given_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["facts"]) == 2
    assert "no inventory given" in capsys.readouterr().err


def test_example_inventory_documents_every_key() -> None:
    """The shipped example must load (it is documentation) and mention every host key."""
    from fleetctl.config.inventory import HostFields

    path = Path(__file__).parent.parent / "inventories" / "example.yaml"
    text = path.read_text()
    load_inventory(path)  # validates; never connects
    for key in HostFields.model_fields:
        assert f"{key}:" in text, key
