"""Host key policy: verify against known_hosts; unknown keys refused (or trusted on first use
with --accept-new-host-keys, and recorded); a changed key is always refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetctlError
from fleetctl.transport.internals import paramiko

_write_lock = threading.Lock()


class HostKeyError(FleetctlError):
    """The host's key is unknown (and not accepted) or has changed."""

    reference = "host-key-rejected"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class StrictPolicy(paramiko.MissingHostKeyPolicy):
    def __init__(self, known_hosts: Path, host_label: str, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.host_label = host_label
        self.accept_new = accept_new
        self.accepted: str | None = None  # the line that reports a key recorded on first use

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostKeyError(
                f"{self.host_label}: unknown host key {key.get_name()} {fp} for {hostname} (not in {self.known_hosts})",
                hint="check the fingerprint out of band, then rerun with --accept-new-host-keys to record it",
            )
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _write_lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as fh:
                fh.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted = (f"{self.host_label}: recorded new host key {key.get_name()} {fp} for {hostname} in "
                         f"{self.known_hosts} (--accept-new-host-keys)")


def lookup_name(host: str, port: int) -> str:
    """The name paramiko's SSHClient.connect looks a server's key up under."""
    return host if port == 22 else f"[{host}]:{port}"


class KnownHosts:
    """A known_hosts file parsed once per command, indexed by host name.

    paramiko's HostKeys.lookup scans every entry for each lookup (two per connection): with a line
    per host that is O(N) per host and O(N^2) per command (~0.3 ms a lookup at 1,000 lines).
    `entries_for(name)` gives the entries that lookup would find for `name` (an exact name, or a
    hashed `|1|salt|hash` one that hashes to it; paramiko matches nothing else), in file order, so a
    client given only those answers every lookup of that name as with the whole file."""

    @classmethod
    def load(cls, path: str | Path) -> KnownHosts:
        """Parse a known_hosts file line by line as paramiko's HostKeys.load does (blank lines,
        comments and lines paramiko cannot parse skipped, as are keys that are not base64: paramiko
        gives up on the whole file there, OpenSSH skips the line), without its de-duplication: that checks
        each line's names against every entry before it (O(N^2): 0.29 s of CPU for 1,000 lines, on
        every command, a one-host command too) and only drops a later line of a name and key type
        that an earlier line already answers, so every lookup answers the same either way."""
        from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

        entries = []
        with open(path) as fh:
            for lineno, line in enumerate(fh, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    entry = HostKeyEntry.from_line(line, lineno)
                except (paramiko.SSHException, InvalidHostKey):
                    continue  # (paramiko's load raises InvalidHostKey there; OpenSSH skips the line)
                if entry is not None:
                    entries.append(entry)
        return cls(entries)

    def __init__(self, keys: list[Any]) -> None:
        self.entries = keys
        self._exact: dict[str, list[int]] = {}  # every name as written (paramiko compares it whole)
        self._hashed: list[tuple[int, str]] = []  # (entry, `|1|salt|hash` name)
        for i, e in enumerate(keys):
            for h in e.hostnames or []:
                self._exact.setdefault(h, []).append(i)
                if h.startswith("|1|"):
                    self._hashed.append((i, h))

    def entries_for(self, name: str) -> list[Any]:
        found = set(self._exact.get(name, ()))
        if not name.startswith("|1|"):
            found.update(i for i, h in self._hashed if i not in found and _hashes_to(name, h))
        return [self.entries[i] for i in sorted(found)]


def _hashes_to(name: str, h: str) -> bool:
    """Is `h`, a hashed known_hosts name (`|1|salt|hash`), the hash of `name`? A malformed one matches
    nothing (OpenSSH skips it; paramiko's lookup raised on it for every host of the file)."""
    try:
        return hmac.compare_digest(paramiko.HostKeys.hash_host(name, h).encode(), h.encode())
    except (ValueError, TypeError):  # (binascii.Error is a ValueError)
        return False
