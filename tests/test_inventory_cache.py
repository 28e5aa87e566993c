"""The kept resolution of an inventory (config/inventory_cache.py): taken only when every input of
load_inventory is what it was made from (the inventory's bytes and real path, its ssh_config's bytes,
each path value resolved again, the code), equal to what load_inventory builds, and never kept with a
secret value or a value JSON would change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetctl.config import inventory_cache
from fleetctl.config.inventory import load_inventory

pytestmark = pytest.mark.usefixtures("ledger_dir")


def _write(tmp: Path, extra: str = "") -> Path:
    (tmp / "keys").mkdir(exist_ok=True)
    (tmp / "keys" / "a").write_text("not a key\n")
    (tmp / "keys" / "b").write_text("not a key either\n")
    (tmp / "key").symlink_to(tmp / "keys" / "a")
    (tmp / "ssh_config").write_text("Host alias1\n  HostName 127.0.0.1\n")
    inv = tmp / "inventory.yaml"
    inv.write_text("ssh_config: ssh_config\n"
                   "defaults: {user: root, identity_file: key, known_hosts: ~/kh, gpus: [0, 1]}\n"
                   "groups: {g: {flags: {--tp-size: 2}, env: {A: x}}}\n"
                   "hosts:\n"
                   "  h1: {address: 127.0.0.1, port: 2222, groups: [g], env: {B: 1, C: true}}\n"
                   "  alias1: {python: /opt/py/bin/python3, probe: true}\n" + extra)
    return inv


def _keep(inv_path: Path) -> None:
    inventory_cache.save(load_inventory(inv_path), inventory_cache.file_sha(inv_path))


def test_the_kept_copy_equals_the_validated_inventory(tmp_path: Path) -> None:
    inv = _write(tmp_path)
    assert inventory_cache.lookup(inv) is None
    _keep(inv)
    kept = inventory_cache.lookup(inv)
    assert kept is not None and kept == load_inventory(inv)
    assert kept.hosts[1].from_ssh_config and kept.hosts[0].gpus == (0, 1)
    assert kept.hosts[0].identity_file == str(tmp_path / "keys" / "a")
    assert kept.select("g") == [kept.hosts[0]]


@pytest.mark.parametrize("change", ["inventory", "ssh_config", "code", "symlink", "home", "moved"])
def test_any_other_input_finds_nothing(tmp_path: Path, change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = _write(tmp_path)
    _keep(inv)
    if change == "inventory":
        inv.write_text(inv.read_text().replace("2222", "2223"))
    elif change == "ssh_config":
        (tmp_path / "ssh_config").write_text("Host alias1\n  HostName 127.0.0.2\n")
    elif change == "code":
        monkeypatch.setattr(inventory_cache, "code_id", lambda: "other")
    elif change == "symlink":  # identity_file: key -> keys/b now; the same inventory bytes
        (tmp_path / "key").unlink()
        (tmp_path / "key").symlink_to(tmp_path / "keys" / "b")
    elif change == "home":  # known_hosts: ~/kh
        monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    else:
        moved = tmp_path / "sub"
        moved.mkdir()
        (moved / "inventory.yaml").write_bytes(inv.read_bytes())
        (moved / "ssh_config").write_bytes((tmp_path / "ssh_config").read_bytes())
        inv = moved / "inventory.yaml"
    assert inventory_cache.lookup(inv) is None
    if change != "code":  # what loading the file gives now differs from the kept copy
        _keep(inv)
        assert inventory_cache.lookup(inv) == load_inventory(inv)


@pytest.mark.parametrize("extra", [
    "  h3: {address: 127.0.0.1, env: {TOKEN: {value: s3cret, secret: true}}}\n",  # a secret value
    "  h3: {address: 127.0.0.1, flags: {--since: 2024-01-02}}\n",  # a YAML date: not JSON
])
def test_secrets_and_values_json_changes_are_never_kept(tmp_path: Path, extra: str) -> None:
    inv = _write(tmp_path)
    _keep(inv)  # a copy of the inventory before the edit...
    inv.write_text(inv.read_text() + extra)
    _keep(inv)  # ...is removed, not left behind
    assert not inventory_cache._store(inv).exists()
    assert inventory_cache.lookup(inv) is None


@pytest.mark.parametrize("damage", ["cut", "port", "field"])
def test_a_damaged_copy_is_as_if_none_were_kept(tmp_path: Path, damage: str) -> None:
    inv = _write(tmp_path)
    _keep(inv)
    f = inventory_cache._store(inv)
    if damage == "cut":
        f.write_text(f.read_text()[:-40])
    else:
        doc = json.loads(f.read_text())
        h = doc["inventory"]["hosts"][0]
        if damage == "port":
            h["port"] = "22"
        else:
            h["extra"] = 1
        f.write_text(json.dumps(doc))
    assert inventory_cache.lookup(inv) is None


def test_a_fifo_inventory_is_neither_hashed_nor_opened(tmp_path: Path) -> None:
    """An inventory that is not a regular file (a FIFO a generator writes into) is read once, by the
    loader: the cache neither reads it nor opens it (an open would let a writer blocked in its own
    open go on, and then find no reader)."""
    import os
    import threading

    fifo = tmp_path / "inventory.yaml"
    os.mkfifo(fifo)
    opened: list[int] = []
    writer = threading.Thread(target=lambda: opened.append(os.open(fifo, os.O_WRONLY)), daemon=True)
    writer.start()
    writer.join(0.1)  # (setup only: the writer is blocked in open() until a reader comes)
    assert inventory_cache.file_sha(fifo) is None
    assert inventory_cache.lookup(fifo) is None
    writer.join(0.3)
    still_blocked = writer.is_alive()
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # let the writer go, whatever happened
    writer.join(10)
    os.close(reader)
    for fd in opened:
        os.close(fd)
    assert still_blocked, "the cache opened the FIFO"
