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


def _lines(tmp_path: Path) -> tuple[str, list[str], list[paramiko.PKey]]:
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
        f"[127.0.0.1]:2201 {ed[0].get_name()} {ed[0].get_base64()}",  # a duplicate (paramiko drops it)
        f"[127.0.0.1]:2201,alias2 {ed[3].get_name()} {ed[3].get_base64()}",  # a second key of a type seen
        "# a comment",
        "",
        "[127.0.0.1]:2205 ssh-ed25519",  # a line paramiko cannot parse: skipped
    ]
    return "\n".join(lines) + "\n", ["[127.0.0.1]:2201", "[127.0.0.1]:2202", "alias2", "[127.0.0.1]:2203",
                                     "[127.0.0.1]:2299", "[127.0.0.1]:2204", "*.example", "a.example"], [*ed, ec]


def _answer(keys: paramiko.HostKeys, name: str) -> list[tuple[str, str]] | None:
    """What a lookup of `name` answers: each key type in the order it is first found, with the key
    a lookup of that type gives (the first of the type; SSHClient.connect asks for the first type)."""
    found = keys.lookup(name)
    return None if found is None else [(t, found[t].get_base64()) for t in dict.fromkeys(found.keys())]


def test_every_lookup_answers_as_with_the_whole_file(tmp_path: Path) -> None:
    text, names, keys = _lines(tmp_path)
    kh = tmp_path / "known_hosts"
    kh.write_text(text)
    whole = paramiko.HostKeys(str(kh))
    known = KnownHosts.load(kh)
    for name in names:
        part = paramiko.HostKeys()
        internals.host_key_entries(part).extend(known.entries_for(name))
        assert _answer(part, name) == _answer(whole, name), name
    assert _answer(whole, "[127.0.0.1]:2201") == [("ssh-ed25519", whole.lookup("[127.0.0.1]:2201")["ssh-ed25519"]
                                                   .get_base64()), ("ecdsa-sha2-nistp256", whole.lookup(
                                                       "[127.0.0.1]:2201")["ecdsa-sha2-nistp256"].get_base64())]
    assert len(known.entries_for("[127.0.0.1]:2203")) == 2  # the hashed line and the plain one
    assert known.entries_for("[127.0.0.1]:2204") == []
    assert known.entries_for("[127.0.0.1]:2205") == []
    for name in names:  # what SSHClient.connect and the key check ask: the first key of each type
        part = paramiko.HostKeys()
        internals.host_key_entries(part).extend(known.entries_for(name))
        for k in keys:
            assert part.check(name, k) == whole.check(name, k), (name, k.get_name())


def test_loading_is_linear(tmp_path: Path, monkeypatch) -> None:
    """paramiko's HostKeys.load checks each line against every entry before it (O(N^2): 0.29 s of CPU
    at 1,000 lines, paid by every command); KnownHosts.load never does."""
    text, _, _ = _lines(tmp_path)
    kh = tmp_path / "known_hosts"
    kh.write_text(text * 3)

    def scan(*a: object) -> bool:
        raise AssertionError("HostKeys.check called while loading")

    monkeypatch.setattr(paramiko.HostKeys, "check", scan)
    monkeypatch.setattr(paramiko.HostKeys, "lookup", scan)
    known = KnownHosts.load(kh)
    assert len(known.entries) == 3 * 9


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


def test_a_key_that_is_not_base64_skips_its_line(tmp_path: Path) -> None:
    """paramiko's HostKeys.load raises on such a line and loses the whole file; OpenSSH skips it."""
    text, _, keys = _lines(tmp_path)
    kh = tmp_path / "known_hosts"
    kh.write_text("[127.0.0.1]:2206 ssh-ed25519 not-base64!\n" + text)
    known = KnownHosts.load(kh)
    assert known.entries_for("[127.0.0.1]:2206") == []
    assert [e.key.get_base64() for e in known.entries_for("[127.0.0.1]:2202")] == [keys[1].get_base64()]


def test_a_malformed_hashed_name_matches_nothing(tmp_path: Path) -> None:
    """paramiko's lookup raises on a `|1|` name whose salt is not base64, for every host of the file;
    here that line matches nothing and the others still answer."""
    text, _, keys = _lines(tmp_path)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"|1|not*base64|x {keys[0].get_name()} {keys[0].get_base64()}\n" + text)
    known = KnownHosts.load(kh)
    assert [e.key.get_base64() for e in known.entries_for("[127.0.0.1]:2202")] == [keys[1].get_base64()]
    assert len(known.entries_for("[127.0.0.1]:2203")) == 2
