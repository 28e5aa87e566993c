"""The fabric/paramiko internals fleetctl relies on (fleetctl/transport/internals.py) are all still
there. If this fails after upgrading fabric or paramiko, revisit internals.py: its fallbacks keep
fleetctl working, but slower (known_hosts parsed per connection) or with an exec request that is
only bounded by abandoning a thread."""

from __future__ import annotations

import inspect
from pathlib import Path

import paramiko
import pytest

from fleetctl.transport import internals


def test_every_internal_is_still_there() -> None:
    missing = internals.problems()
    assert missing == [], (f"fabric/paramiko changed what fleetctl/transport/internals.py relies on: "
                           f"{'; '.join(missing)} (paramiko {paramiko.__version__})")


def test_a_changed_layout_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(paramiko.Transport, internals.TRANSPORT_SEND)
    assert any(internals.TRANSPORT_SEND in p for p in internals.problems())


def test_host_keys_parsed_once_are_the_clients_keys(tmp_path: Path) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(str(_keyfile(tmp_path)))
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:2222 {key.get_name()} {key.get_base64()}\n")
    parsed = paramiko.HostKeys()
    parsed.load(str(kh))
    client = paramiko.SSHClient()
    assert internals.add_host_keys(client, internals.host_key_entries(parsed), str(kh)) is True
    assert client.get_host_keys().lookup("[127.0.0.1]:2222")[key.get_name()] == key
    # what load_host_keys would have recorded (paramiko writes new keys back to it)
    assert getattr(client, internals.CLIENT_HOSTKEYS_FILE) == str(kh)
    other = paramiko.SSHClient()
    other.load_host_keys(str(kh))
    assert [e.hostnames for e in other.get_host_keys()._entries] == \
        [e.hostnames for e in client.get_host_keys()._entries]


def _keyfile(d: Path) -> Path:
    import subprocess

    p = d / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(p)], check=True)
    return p


def test_packet_macs_are_compared_in_c() -> None:
    """paramiko's packet reader gets hmac.compare_digest for its per-packet MAC check (the same
    constant-time compare as paramiko's Python loop, whose answers it gives), its host-key matching
    keeps paramiko's own."""
    import hmac

    from paramiko import hostkeys, packet, util

    assert util.constant_time_bytes_eq is hmac.compare_digest
    assert hostkeys.constant_time_bytes_eq is not hmac.compare_digest
    assert "util.constant_time_bytes_eq(" in inspect.getsource(packet.Packetizer.read_message)
    for a, b in ((b"\x01" * 32, b"\x01" * 32), (b"\x01" * 32, b"\x01" * 31 + b"\x02"), (b"ab", b"abc"), (b"", b"")):
        assert hmac.compare_digest(a, b) == hostkeys.constant_time_bytes_eq(a, b)
