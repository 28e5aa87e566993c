"""Every fabric/paramiko internal fleetctl relies on, in one place.

Each use has a plain fallback when the layout differs (slower, or an unbounded paramiko wait run in
a thread we stop waiting for), and tests/test_transport_internals.py fails loudly when an upgrade
of fabric or paramiko changes any of them, so they are revisited instead of silently degraded.
"""

from __future__ import annotations

import copy
import hmac
import inspect
from typing import TYPE_CHECKING, Any

# paramiko with invoke kept out, and what gives invoke back, live with the one ssh_config parse on the
# config floor (config/ssh_config.py); every fleetctl module imports paramiko from there or from here
from fleetctl.config.ssh_config import PARAMIKO_CONFIG_INVOKE, memoize_lookup, paramiko, with_invoke

if TYPE_CHECKING:
    from fabric import Connection

__all__ = ["PARAMIKO_CONFIG_INVOKE", "memoize_lookup", "paramiko", "with_invoke"]  # re-exported for transport/


# (object, attribute) pairs read or written below; INTERNALS is what the test checks
HOSTKEYS_ENTRIES = "_entries"  # paramiko.HostKeys: its list of HostKeyEntry
CLIENT_HOSTKEYS_FILE = "_host_keys_filename"  # paramiko.SSHClient: what load_host_keys records
CHANNEL_EXEC = ("_event_pending", "event", "event_ready", "remote_chanid")  # paramiko.Channel
TRANSPORT_SEND = "_send_user_message"  # paramiko.Transport
# what fabric's Connection.open() reads and does, replayed by open_kwargs()/open_connection()
FABRIC_OPEN_READS = ("connect_kwargs", "connect_timeout", "key_filename", "authentication",
                     "strategy_class", "open_gateway", "client.connect")


# paramiko checks the MAC of every packet it reads with util.constant_time_bytes_eq, a constant-time
# compare written in Python (a loop over the bytes): ~10 % of a sealed no-op's controller CPU at N=64
# (yappi). hmac.compare_digest is the same constant-time compare, in C. Only packet.py's use, which
# reads it from the module (`util.constant_time_bytes_eq(`), takes it; hostkeys.py keeps its own copy
# (it compares text, which compare_digest refuses when it is not ASCII).


def compare_macs_in_c() -> None:
    """Give paramiko's packet reader hmac.compare_digest for its MAC check (where this paramiko reads
    it elsewhere, nothing changes: problems() says so)."""
    from paramiko import util as paramiko_util

    paramiko_util.constant_time_bytes_eq = hmac.compare_digest


def problems() -> list[str]:
    """What of the above this fabric/paramiko no longer has (empty: all present)."""
    out = []
    keys = paramiko.HostKeys()
    if not isinstance(getattr(keys, HOSTKEYS_ENTRIES, None), list):
        out.append(f"paramiko.HostKeys.{HOSTKEYS_ENTRIES} is not a list")
    client = paramiko.SSHClient()
    if not hasattr(client, CLIENT_HOSTKEYS_FILE):
        out.append(f"paramiko.SSHClient.{CLIENT_HOSTKEYS_FILE} is missing")
    chan_src = inspect.getsource(paramiko.Channel)
    for a in CHANNEL_EXEC:
        if a not in chan_src:
            out.append(f"paramiko.Channel.{a} is missing")
    exec_src = inspect.getsource(paramiko.Channel.exec_command)
    for word in ("_event_pending", '"exec"', "_send_user_message", "_wait_for_event"):
        if word not in exec_src:
            out.append(f"paramiko.Channel.exec_command no longer uses {word}")
    if not hasattr(paramiko.Transport, TRANSPORT_SEND):
        out.append(f"paramiko.Transport.{TRANSPORT_SEND} is missing")
    import paramiko.config as pc

    for name in PARAMIKO_CONFIG_INVOKE:
        if not hasattr(pc, name):
            out.append(f"paramiko.config.{name} is missing (its Match exec support changed)")
    from fabric import Connection

    open_src = inspect.getsource(Connection.open)
    for word in FABRIC_OPEN_READS:
        if word not in open_src:
            out.append(f"fabric Connection.open() no longer reads {word}")
    from paramiko import packet as paramiko_packet

    if "util.constant_time_bytes_eq(" not in inspect.getsource(paramiko_packet.Packetizer.read_message):
        out.append("paramiko.packet no longer checks MACs with util.constant_time_bytes_eq (compare_macs_in_c)")
    return out


compare_macs_in_c()


def host_key_entries(keys: paramiko.HostKeys) -> list[Any] | None:
    """The parsed entries of a HostKeys, in file order (None if this paramiko's layout differs)."""
    entries = getattr(keys, HOSTKEYS_ENTRIES, None)
    return entries if isinstance(entries, list) else None


def add_host_keys(client: paramiko.SSHClient, entries: list[Any], path: str, *, share: bool = False) -> bool:
    """client.load_host_keys(path) from entries already parsed from that file (all of them, or those
    the client's lookups can find); False if this paramiko's layout differs (the caller then loads
    the plain way). share: the parsed entries themselves, not copies (only when nothing will add a
    key to this client: HostKeys.add replaces an entry's key in place)."""
    mine = host_key_entries(client.get_host_keys())
    if mine is None:
        return False
    mine.extend(entries if share else (copy.copy(e) for e in entries))
    setattr(client, CLIENT_HOSTKEYS_FILE, path)
    return True


def send_exec(chan: paramiko.Channel, cmd: str, limit: float) -> bool | None:
    """chan.exec_command(cmd) waiting at most `limit` seconds for the host's answer (paramiko waits
    on the channel's event with no timeout). True: accepted; False: no answer in time; raises what
    paramiko raises when refused; None if this paramiko's layout differs (nothing was sent)."""
    if not all(hasattr(chan, a) for a in CHANNEL_EXEC) or not hasattr(chan.transport, TRANSPORT_SEND):
        return None
    m = paramiko.Message()
    m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
    m.add_int(chan.remote_chanid)
    m.add_string("exec")
    m.add_boolean(True)
    m.add_string(cmd)
    chan._event_pending()
    getattr(chan.transport, TRANSPORT_SEND)(m)
    answered = chan.event.wait(limit)
    if answered and not chan.event_ready:  # refused, or the channel/connection closed
        raise chan.transport.get_exception() or paramiko.SSHException("Channel closed.")
    return answered


def open_kwargs(conn: Connection) -> dict[str, Any]:
    """What fabric's Connection.open() passes to SSHClient.connect, read from the connection and its
    (shared) config; call it under the config lock."""
    kwargs = dict(conn.connect_kwargs, username=conn.user, hostname=conn.host, port=conn.port)
    if conn.connect_timeout:
        kwargs["timeout"] = conn.connect_timeout
    if "key_filename" in kwargs and not kwargs["key_filename"]:
        del kwargs["key_filename"]
    auth = conn.config.get("authentication") or {}
    strategy = auth.get("strategy_class") if hasattr(auth, "get") else None
    if strategy is not None:  # fabric >= 3.1 lets the config name an auth strategy: keep honouring it
        for key in ("allow_agent", "key_filename", "look_for_keys", "passphrase", "password", "pkey", "username"):
            kwargs.pop(key, None)
        kwargs["auth_strategy"] = strategy(ssh_config=conn.ssh_config, fabric_config=conn.config, username=conn.user)
    return kwargs


def open_connection(conn: Connection, kwargs: dict[str, Any]) -> None:
    """fabric's Connection.open() with the config already read: the gateway (ProxyJump, its own
    cloned config; or ProxyCommand), then paramiko's connect."""
    if conn.gateway:
        kwargs = {**kwargs, "sock": conn.open_gateway()}
    conn.client.connect(**kwargs)
    conn.transport = conn.client.get_transport()

