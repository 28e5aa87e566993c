"""A host reached directly, with paramiko alone: fabric and invoke only when a host needs them.

Importing fabric imports invoke, and invoke imports unittest.mock, asyncio and ssl: ~75 ms of CPU
on every command, for features most inventories do not use. `direct_connection()` resolves a host
exactly as fabric's `Connection(...)` does (ssh_config lookup: HostName, User, Port,
IdentityFile; the same files read; the same connect() arguments) and answers None when the host
needs what fabric adds, so the caller builds a fabric Connection instead:

- a gateway: `ProxyJump` (fabric opens the jump host's own connection, its own ssh_config
  lookup) or `ProxyCommand`;
- a fabric config file (/etc/fabric.*, ~/.fabric.*): it may set connect_kwargs, a gateway, an
  authentication strategy, ssh_config loading;
- an ssh_config with a `Match exec` (paramiko runs the command through invoke);
- a `user@host:port` shorthand in the address (fabric parses it).

tests/test_transport_direct.py holds the two resolutions to each other.
"""

from __future__ import annotations

import errno
import getpass
import os
import socket
import threading
from pathlib import Path
from typing import Any

from fleetctl.config.ssh_config import paramiko, ssh_config

# fabric's own config files
FABRIC_FILES = tuple(f"{prefix}{ext}" for prefix in ("/etc/fabric.", "~/.fabric.")
                     for ext in ("yaml", "yml", "json", "py"))
_fabric_files: list[bool] = []


def fabric_config_present() -> bool:
    """A fabric config file exists (read once per command)."""
    if not _fabric_files:
        _fabric_files.append(any(os.path.isfile(os.path.expanduser(f)) for f in FABRIC_FILES))
    return _fabric_files[0]


class DirectConnection:
    """The part of fabric's Connection fleetctl uses (client, host, port, user, ssh_config,
    connect_timeout, is_connected, close), for a host with no gateway."""

    gateway = None

    def __init__(self, host: str, found: paramiko.SSHConfigDict, *, user: str | None, port: int | None,
                 connect_timeout: int, connect_kwargs: dict[str, Any]) -> None:
        self.original_host = host
        self.ssh_config = found
        self.host = found.get("hostname", host)
        self.user = user or found.get("user", _local_user())
        self.port = port or int(found.get("port", 22))
        self.connect_timeout = int(connect_timeout)
        kwargs = dict(connect_kwargs)
        keys = list(kwargs.get("key_filename", [])) + list(found.get("identityfile", []))
        if keys:
            kwargs["key_filename"] = keys
        self.connect_kwargs = kwargs
        self.client = paramiko.SSHClient()
        self.transport: paramiko.Transport | None = None
        self.sock: socket.socket | None = None
        self.cut_requested = False

    @property
    def is_connected(self) -> bool:
        return bool(self.transport.active) if self.transport else False

    def open_kwargs(self) -> dict[str, Any]:
        """What fabric's Connection.open() would pass to SSHClient.connect."""
        kwargs = dict(self.connect_kwargs, username=self.user, hostname=self.host, port=self.port)
        if self.connect_timeout:
            kwargs["timeout"] = self.connect_timeout
        if "key_filename" in kwargs and not kwargs["key_filename"]:
            del kwargs["key_filename"]
        return kwargs

    def open(self, kwargs: dict[str, Any]) -> None:
        files = list(kwargs.get("key_filename") or [])
        key = _loaded_key(files[0]) if files and "pkey" not in kwargs else None
        if key is not None:  # the same order of keys: pkey first, then the other files
            kwargs = dict(kwargs, pkey=key, key_filename=files[1:])
        # the TCP connection is made here, not in paramiko, so that `cut` can end the handshake at
        # any point (paramiko makes its Transport only after the socket is connected: a cut in
        # between found nothing to close and the handshake waited out its banner timeout)
        sock = self._tcp(kwargs["hostname"], kwargs.get("port", 22), kwargs.get("timeout"))
        self.sock = sock
        if self.cut_requested:
            sock.close()
            raise EOFError("connection cut")
        self.client.connect(sock=sock, **kwargs)
        self.transport = self.client.get_transport()

    @staticmethod
    def _tcp(hostname: str, port: int, timeout: float | None) -> socket.socket:
        """A connected socket to the first address of hostname that takes it; as paramiko does:
        refused and unreachable addresses are collected (NoValidConnectionsError when all are),
        any other error is raised."""
        errors: dict[tuple[str, int], OSError] = {}
        infos = socket.getaddrinfo(hostname, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        for family, _, _, _, addr in infos:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                if timeout is not None:
                    sock.settimeout(timeout)
                sock.connect(addr)
                return sock
            except OSError as e:
                sock.close()
                if e.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                    raise
                errors[addr[:2]] = e
        raise paramiko.ssh_exception.NoValidConnectionsError(errors)

    def cut(self) -> None:
        """End the connection from another thread, at any point of its handshake: every wait on
        it (banner, key exchange, authentication) ends at once."""
        self.cut_requested = True
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # not connected yet (then `open` sees cut_requested) or already closed
                pass
        t = self.client.get_transport()
        if t is not None:
            t.close()

    def close(self) -> None:
        if self.is_connected:
            self.client.close()


_keys: dict[tuple[str, int, int, int], paramiko.PKey] = {}
_keys_lock = threading.Lock()


def _loaded_key(path: str) -> paramiko.PKey | None:
    """The private key file parsed once per command (while unchanged), instead of once per connection
    and key type (paramiko tries RSA, ECDSA, then Ed25519 on each file: ~2 ms a host). None where
    paramiko's own handling is needed: a passphrase, a certificate beside it, anything unusual."""
    p = os.path.expanduser(path)
    try:
        st = os.stat(p)
        if os.path.exists(p + "-cert.pub"):
            return None
        stamp = (p, st.st_ino, st.st_size, st.st_mtime_ns)
        with _keys_lock:
            key = _keys.get(stamp)
            if key is None:
                key = _keys[stamp] = paramiko.PKey.from_path(p)
        return key
    except Exception:  # (encrypted, unknown type, unreadable, an older paramiko): paramiko decides
        return None


def _local_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def direct_connection(target: str, ssh_config_path: Path | None, *, user: str | None, port: int | None,
                      connect_timeout: int, connect_kwargs: dict[str, Any]) -> DirectConnection | None:
    """The host as a DirectConnection, or None when it needs fabric (see the module's docstring)."""
    if "@" in target or target.count(":") == 1 or fabric_config_present():
        return None
    cfg, has_exec = ssh_config(ssh_config_path)
    if has_exec:
        return None
    found = cfg.lookup(target)
    if "proxyjump" in found or "proxycommand" in found:
        return None
    return DirectConnection(target, found, user=user, port=port, connect_timeout=connect_timeout,
                            connect_kwargs=connect_kwargs)
