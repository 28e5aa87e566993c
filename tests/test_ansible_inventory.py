"""Ansible inventories (INI, YAML, `ansible-inventory --list` JSON, group_vars/host_vars) and
--limit patterns, held to ansible-core's own parse of the same files: ansible-core is a test
dependency only, the oracle (`ansible-inventory --list`, InventoryManager)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetctl.cli import main
from fleetctl.config import ansible_inventory as ai
from fleetctl.config.inventory import load_inventory
from fleetctl.errors import InputError

pytest.importorskip("ansible")

CORPUS = Path(__file__).parent / "data" / "ansible_inv"
SOURCES = sorted(p for p in CORPUS.glob("*/*") if p.is_file() and p.parent.name != "bad")
TOOL = str(Path(sys.executable).parent / "ansible-inventory")


def oracle(path: Path) -> dict[str, Any]:
    p = subprocess.run([TOOL, "-i", str(path), "--list"], capture_output=True, check=True, timeout=300,
                       env={"ANSIBLE_INVENTORY_UNPARSED_FAILED": "1", "PATH": "/usr/bin:/bin",
                            "ANSIBLE_LOCAL_TEMP": str(path.parent / ".ansible-tmp"), "HOME": str(path.parent)})
    return json.loads(p.stdout)


def _compare(ours: ai.AnsibleInventory, theirs: dict[str, Any]) -> None:
    hostvars = theirs["_meta"]["hostvars"]
    listed = {h for g, b in theirs.items() if g != "_meta" for h in b.get("hosts", [])}
    assert set(ours.hosts) == listed
    for h in ours.hosts:
        assert ours.host_vars(h) == hostvars.get(h, {}), h
    for g, body in theirs.items():
        if g == "_meta":
            continue
        if g != "all":  # (the JSON lists a host of `all` under ungrouped only)
            assert ours.groups[g].hosts == body.get("hosts", []), g
        assert sorted(ours.groups[g].children) == sorted(body.get("children", [])), g


@pytest.fixture(scope="module")
def oracles(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, dict[str, Any]]:
    out = {}
    for src in SOURCES:
        work = tmp_path_factory.mktemp(src.parent.name)
        import shutil

        shutil.copytree(src.parent, work, dirs_exist_ok=True)
        out[src] = oracle(work / src.name)
    return out


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_parse_is_ansibles_host_by_host(src: Path, oracles: dict[Path, dict[str, Any]]) -> None:
    """Hosts (ranges expanded), groups (own hosts, children), each host's variables combined with
    Ansible's precedence (group depth, priority, group_vars/ and host_vars/ files)."""
    theirs = oracles[src]
    assert len(theirs["_meta"]["hostvars"]) > 1
    _compare(ai.load(src), theirs)


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_ansible_inventory_list_json_reads_the_same(src: Path, oracles: dict[Path, dict[str, Any]],
                                                    tmp_path: Path) -> None:
    """The JSON of `ansible-inventory --list` (how a dynamic inventory reaches fleetctl) gives the
    same hosts, groups and variables."""
    f = tmp_path / "inv.json"
    f.write_text(json.dumps(oracles[src]))
    assert ai.detect(f) == "ansible-json"
    _compare(ai.load(f), oracles[src])
    a = {h.name: (h.address, h.port, h.user, h.python, h.gpus, h.flags) for h in load_inventory(f).hosts}
    b = {h.name: (h.address, h.port, h.user, h.python, h.gpus, h.flags) for h in load_inventory(src).hosts}
    assert a == b


def test_an_inventory_script_goes_through_ansible_inventory(tmp_path: Path,
                                                            oracles: dict[Path, dict[str, Any]]) -> None:
    src = CORPUS / "ranges_ini" / "hosts.ini"
    script = tmp_path / "dyn.py"
    script.write_text(f"#!{sys.executable}\nimport sys, json\n"
                      f"print(json.dumps({oracles[src]!r}) if '--list' in sys.argv else '{{}}')\n")
    script.chmod(0o755)
    assert ai.detect(script) == "ansible-tool"
    inv = load_inventory(script)
    assert inv.kind == "ansible-tool" and len(inv.hosts) == len(oracles[src]["_meta"]["hostvars"])


def test_ansible_variables_become_fleetctl_host_values() -> None:
    inv = load_inventory(CORPUS / "ranges_ini" / "hosts.ini")
    h = {x.name: x for x in inv.hosts}
    assert inv.kind == "ansible-ini"
    assert [n for n in h if n.startswith("gpu")] == [f"gpu{i:02d}.dc1" for i in range(1, 17)]
    assert (h["solo"].address, h["solo"].port, h["solo"].user) == ("127.0.0.2", 2201, "root")
    g = h["gpu07.dc1"]
    assert (g.address, g.user, g.python, g.gpus, g.groups) == ("gpu07.dc1", "ml", "/opt/py/bin/python3",
                                                              tuple(range(8)), ("dc1", "gpu"))
    assert h["node-b"].port == 2222 and h["edge"].port == 2022
    assert [n for n in h if n.startswith("step")] == ["step0", "step5", "step10"]
    y = {x.name: x for x in load_inventory(CORPUS / "children_yaml" / "inv.yml").hosts}
    assert y["h200-03"].flags == {"--tp": 8} and y["h200-09"].port == 2209
    assert y["h200-01"].groups == ("h200", "canary")


def test_fleetctl_own_yaml_is_still_its_own(tmp_path: Path) -> None:
    f = tmp_path / "inv.yaml"
    f.write_text("hosts:\n  a: {address: 127.0.0.1}\n")
    assert ai.detect(f) == "fleetctl" and load_inventory(f).kind == "fleetctl"


BAD = [
    ("x.ini", "[web]\nh1 ; comment\n", "expected key=value"),
    ("x.ini", "[web]\nh[1:3:0]\n", "step"),
    ("x.ini", "[web]\nh[01:3]\n", "same width"),
    ("x.ini", "[p:children]\nnope\n", "never declared"),
    ("x.ini", "[ghost:vars]\na=1\n", "never declared"),
    ("x.ini", "[web:hosts2]\nh1\n", "unknown type"),
    ("x.ini", "[web]\nh1 ansible_connection=local\n", "SSH only"),
    ("x.ini", "[web]\nh1 ansible_password=pw\n", "never takes a password"),
    ("x.ini", "[web]\nh1 fleetctl_gpuz=3\n", "unknown variable fleetctl_gpuz"),
    ("x.ini", "[web]\nh1 ansible_port=lots\n", "ansible_port='lots'"),
    ("x.yml", "all:\n  hosts:\n    h1:\n      secret: !vault |\n        $ANSIBLE_VAULT;1.1;AES256\n", "Vault"),
]


@pytest.mark.parametrize(("name", "text", "words"), BAD, ids=[b[2] for b in BAD])
def test_bad_ansible_inventories_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     name: str, text: str, words: str) -> None:
    f = tmp_path / name
    f.write_text(text)
    assert main(["facts", "-i", str(f)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err, err


@pytest.mark.parametrize("text", ["[web]\nh1 ; comment\n", "[p:children]\nnope\n", "[web]\nh[01:3]\n"])
def test_what_fleetctl_refuses_ansible_refuses_too(tmp_path: Path, text: str) -> None:
    f = tmp_path / "x.ini"
    f.write_text(text)
    p = subprocess.run([TOOL, "-i", str(f), "--list"], capture_output=True, timeout=300,
                       env={"ANSIBLE_INVENTORY_UNPARSED_FAILED": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode != 0
    with pytest.raises(InputError):
        load_inventory(f)


def test_ansible_become_variables_are_kept_per_host_and_group(tmp_path: Path) -> None:
    """ansible_become* set per host or per group (group_vars included) reach the host as fleetctl's
    become; su/doas and become passwords are refused with the fix (issue 32.1)."""
    f = tmp_path / "x.ini"
    f.write_text("[web]\nh1 ansible_become=true ansible_become_user=svc\nh2\nh3 ansible_become=no\n"
                 "[web:vars]\nansible_become=yes\nansible_become_method=sudo\n")
    hosts = {h.name: h for h in load_inventory(f).hosts}
    assert (hosts["h1"].become, hosts["h1"].become_user, hosts["h1"].become_method) == (True, "svc", "sudo")
    assert (hosts["h2"].become, hosts["h2"].become_as) == (True, "root")
    assert hosts["h3"].become is False and not hosts["h3"].becomes
    f.write_text("[web]\nh1 ansible_become=true ansible_become_method=su\n")
    with pytest.raises(InputError, match="ansible_become_method='su': su: not supported: su reads its password"):
        load_inventory(f)
    f.write_text("[web]\nh1 ansible_become=true ansible_become_pass=x\n")
    with pytest.raises(InputError, match="never takes a password from an inventory") as e:
        load_inventory(f)
    assert "--ask-become-pass" in (e.value.hint or "")


def test_fleetctl_inventory_become_per_group_and_host(tmp_path: Path) -> None:
    f = tmp_path / "inv.yaml"
    f.write_text("defaults: {become_user: svc}\ngroups:\n  gpu: {become: true}\n"
                 "hosts:\n  a: {address: 127.0.0.1, groups: [gpu]}\n"
                 "  b: {address: 127.0.0.1, groups: [gpu], become: false}\n  c: {address: 127.0.0.1}\n")
    hosts = {h.name: h for h in load_inventory(f).hosts}
    assert (hosts["a"].becomes, hosts["a"].become_as) == (True, "svc")
    assert hosts["b"].become is False and hosts["c"].become is None
    from fleetctl.transport import become

    got = {h.name: h for h in become.apply(list(hosts.values()), become.Cli(become=True, user="ops"))}
    assert (got["a"].become_as, got["b"].becomes, got["c"].becomes, got["c"].become_as) == ("svc", False, True, "svc")
    assert become.wrap(got["c"], ["python3", "-c", "x"]) == ["sudo", "-n", "-H", "-u", "svc", "--", "python3", "-c", "x"]
    assert become.wrap(got["b"], ["python3"]) == ["python3"]


# --- --limit patterns against Ansible's InventoryManager ------------------------------------------

PATTERNS = [
    "gpu", "gpu:db", "gpu,db", "dc1:!gpu", "dc1:&db", "gpu*", "gpu0?.dc1", "~gpu1[0-3]", "~node-.*",
    "gpu[0]", "gpu[2:4]", "gpu[3:]", "gpu[-1]", "dc1[0:2]:!gpu01.dc1", "solo,edge", "!gpu", "db:&dc1:!db2",
    "all:!dc1", "ungrouped", "*.dc1:&gpu", "node-[ab]", "db[1]",
]


@pytest.fixture(scope="module")
def manager() -> Any:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    return InventoryManager(loader=DataLoader(), sources=[str(CORPUS / "ranges_ini" / "hosts.ini")])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_limit_selects_what_ansible_selects(pattern: str, manager: Any) -> None:
    manager.subset(pattern)
    try:
        theirs = {h.name for h in manager.get_hosts("all")}
    finally:
        manager.subset(None)
    ours = load_inventory(CORPUS / "ranges_ini" / "hosts.ini").select(pattern)
    assert {h.name for h in ours} == theirs and theirs


def test_limit_at_file_is_a_retry_file(tmp_path: Path, manager: Any) -> None:
    f = tmp_path / "deploy.retry"
    f.write_text("gpu03.dc1\nnode-c\n")
    manager.subset(f"@{f}")
    try:
        theirs = {h.name for h in manager.get_hosts("all")}
    finally:
        manager.subset(None)
    assert {h.name for h in load_inventory(CORPUS / "ranges_ini" / "hosts.ini").select(f"@{f}")} == theirs


@pytest.mark.parametrize(("pattern", "words"), [
    ("gpu[1-2]", "[x-y] subscript was removed"), ("gpu[:2]", "unsupported subscript"),
    ("~gpu[", "not a valid regular expression"), ("gpu[99]", "past its end"), ("nosuch", "matches no host"),
    ("gpu,&", "empty pattern"),
])
def test_unsupported_or_empty_patterns_say_so(pattern: str, words: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "-i", str(CORPUS / "ranges_ini" / "hosts.ini"), "--limit", pattern]) == 2
    err = capsys.readouterr().err
    assert words in err and "typo" not in err and len(err.strip().splitlines()) == 1, err


def test_list_hosts_prints_the_selection_and_touches_no_host(capsys: pytest.CaptureFixture[str]) -> None:
    """The corpus's addresses are not reachable from here: --list-hosts must not try."""
    assert main(["status", "-i", str(CORPUS / "ranges_ini" / "hosts.ini"), "--limit", "gpu[0:1]:db1",
                 "--list-hosts"]) == 0
    assert capsys.readouterr().out == "  hosts (3):\n    gpu01.dc1\n    gpu02.dc1\n    db1\n"
    assert main(["facts", "-i", str(CORPUS / "ranges_ini" / "hosts.ini"), "--limit", "db", "--list-hosts",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["host"] for r in doc["hosts"]] == ["db1", "db2", "db3"] and doc["ok"]
