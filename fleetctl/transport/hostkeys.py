"""Host key policy: verify against known_hosts; unknown keys refused (or trusted on first use
with --accept-new-host-keys, and recorded); a changed key is always refused."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path

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
