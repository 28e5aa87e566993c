"""hostkeys.KnownHosts: a known_hosts parsed once per command gives each connection only the entries
paramiko's own lookup would find for that host, and every lookup answers as with the whole file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko

from fleetctl.transport import internals
from fleetctl.transport.hostkeys import KnownHosts, lookup_name
from fleetctl.transport.ssh import _load_known_hosts


def _key(d: Path, kind: str, n: int) -> paramiko.PKey:
    p = d / f"k{kind}{n}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(p)], check=True)
    return paramiko.PKey.from_path(str(p)) if hasattr(paramiko.PKey, "from_path") else \
        paramiko.Ed25519Key.from_private_key_file(str(p))


def _lines(tmp_path: Path) -> tuple[str, list[str]]:
    ed = [_key(tmp_path, "ed25519", i) for i in range(4)]
    ec = _key(tmp_path, "ecdsa", 0)
    hashed = paramiko.HostKeys.hash_host("[127.0.0.1]:2203")
    hashed_other = paramiko.HostKeys.hash_host("[127.0.0.1]:2299")
    lines = [
        f"[127.0.0.1]:2201 {ed[0].get_name()} {ed[0].get_base64()}",
        f"[127.0.0.1]:2202,alias2 {ed[1].get_name()} {ed[1].get_base64()}",
        f"{hashed} {ed[2].get_name()} {ed[2].get_base64()}",
        f"{hashed_other} {ed[3].get_name()} {ed[3].get_base64()}",
        f"[127.0.0.1]:2201 {ec.get_name()} {ec.get_base64()}",  # a second key type, later in the file
        f"[127.0.0.1]:2203 {ed[0].get_name()} {ed[0].get_base64()}",  # a plain line after the hashed one
        f"*.example {ed[1].get_name()} {ed[1].get_base64()}",  # a pattern: paramiko matches it literally
    ]
    return "\n".join(lines) + "\n", ["[127.0.0.1]:2201", "[127.0.0.1]:2202", "alias2", "[127.0.0.1]:2203",
                                     "[127.0.0.1]:2299", "[127.0.0.1]:2204", "*.example", "a.example"]


def _answer(keys: paramiko.HostKeys, name: str) -> list[tuple[str, str]] | None:
    found = keys.lookup(name)
    return None if found is None else [(t, found[t].get_base64()) for t in found.keys()]


def test_every_lookup_answers_as_with_the_whole_file(tmp_path: Path) -> None:
    text, names = _lines(tmp_path)
    kh = tmp_path / "known_hosts"
    kh.write_text(text)
    whole = paramiko.HostKeys(str(kh))
    known = KnownHosts(internals.host_key_entries(paramiko.HostKeys(str(kh))))
    for name in names:
        part = paramiko.HostKeys()
        internals.host_key_entries(part).extend(known.entries_for(name))
        assert _answer(part, name) == _answer(whole, name), name
    assert _answer(whole, "[127.0.0.1]:2201") == [("ssh-ed25519", whole.lookup("[127.0.0.1]:2201")["ssh-ed25519"]
                                                   .get_base64()), ("ecdsa-sha2-nistp256", whole.lookup(
                                                       "[127.0.0.1]:2201")["ecdsa-sha2-nistp256"].get_base64())]
    assert len(known.entries_for("[127.0.0.1]:2203")) == 2  # the hashed line and the plain one
    assert known.entries_for("[127.0.0.1]:2204") == []


def test_a_client_holds_only_its_hosts_entries(tmp_path: Path) -> None:
    """At 1,000 lines each connection's client gets its own host's line, not the file (paramiko
    scans a client's entries on every lookup: O(N) per host, O(N^2) per command)."""
    key = _key(tmp_path, "ed25519", 9)
    kh = tmp_path / "known_hosts"
    kh.write_text("".join(f"[127.0.0.1]:{20000 + i} {key.get_name()} {key.get_base64()}\n" for i in range(1000)))
    for port in (20000, 20500, 20999):
        client = paramiko.SSHClient()
        _load_known_hosts(client, kh, lookup_name("127.0.0.1", port), share=True)
        entries = internals.host_key_entries(client.get_host_keys())
        assert [e.hostnames for e in entries] == [[f"[127.0.0.1]:{port}"]]
        assert client.get_host_keys().check(f"[127.0.0.1]:{port}", key)
    client = paramiko.SSHClient()
    _load_known_hosts(client, kh, lookup_name("127.0.0.1", 22), share=False)
    assert client.get_host_keys().lookup("127.0.0.1") is None  # port 22 is looked up bare: not in the file


def test_lookup_name_is_paramikos() -> None:
    assert lookup_name("h", 22) == "h"
    assert lookup_name("127.0.0.1", 2201) == "[127.0.0.1]:2201"
