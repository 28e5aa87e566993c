"""Bytes controller -> host of the agent's first contact, measured on the wire: a TCP relay on
loopback between fleetctl and the sandbox's sshd counts the bytes each way. SSH encrypts, so the
agent's share is what a first contact moves beyond a no-agent session of the same client: `facts`
on a host whose state dir holds no agent (first contact) and the same `facts` again (repeat: the
agent cached there) are measured, and a session that connects, authenticates, opens one channel
and runs `true` (`--check-only` ... the transport's own `run`) is the baseline."""

from __future__ import annotations

import re
import shutil
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetctl.sandbox import Sandbox

pytestmark = pytest.mark.fleet

BOUND = 40_000  # bytes controller -> host for the first contact, SSH framing aside (issue 33/34)


class Relay:
    """Listens on 127.0.0.1 (a free port), forwards each connection to `port`, counts bytes."""

    def __init__(self, port: int) -> None:
        self.port_to = port
        self.up = 0  # controller -> host
        self.down = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.port_to))
            for a, b, up in ((c, s, True), (s, c, False)):
                t = threading.Thread(target=self._pump, args=(a, b, up), daemon=True)
                t.start()
                self.threads.append(t)

    def _pump(self, a: socket.socket, b: socket.socket, up: bool) -> None:
        try:
            while data := a.recv(65536):
                with self.lock:
                    if up:
                        self.up += len(data)
                    else:
                        self.down += len(data)
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def take(self) -> int:
        for t in self.threads:
            t.join(timeout=60)  # each pump ends when its session closed (an event, not a clock)
        self.threads.clear()
        with self.lock:
            n, self.up, self.down = self.up, 0, 0
        return n

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def relay_inventory(fresh_sandbox: Callable[..., Sandbox], tmp_path: Path) -> Iterator[tuple[Relay, Path, Sandbox]]:
    sb = fresh_sandbox(hosts=1)
    h = sb.hosts["h01"]
    relay = Relay(h.port)
    inv = sb.inventory_path.parent / "inventory-relay.yaml"
    kh = tmp_path / "known_hosts"
    text = re.sub(rf"port: {h.port}\b", f"port: {relay.port}", sb.inventory_path.read_text(), count=1)
    inv.write_text(text.replace("known_hosts: known_hosts", f"known_hosts: {kh}"))
    # the host's own key, recorded for the relay's address (the relay passes the handshake as is)
    kh.write_text("".join(line.replace(f"]:{h.port} ", f"]:{relay.port} ", 1) + "\n"
                          for line in sb.known_hosts_path.read_text().splitlines() if f"]:{h.port} " in line))
    try:
        yield relay, inv, sb
    finally:
        relay.close()


def test_first_contact_moves_under_40_kb(relay_inventory: tuple[Relay, Path, Sandbox],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from fleetctl.cli import main
    from fleetctl.config.inventory import load_inventory
    from fleetctl.transport.ssh import HostConnection

    relay, inv, _sb = relay_inventory

    def facts(command: str = "facts") -> int:
        code = main([command, "-i", str(inv)])
        out = capsys.readouterr()
        assert code == 0, out
        return relay.take()

    (host,) = load_inventory(inv).select("h01")
    with HostConnection(host, load_inventory(inv)) as conn:
        conn.run_command(["true"], "baseline", 1024)
    baseline = relay.take()
    cache = Path(host.state_dir) / "cache"  # (the agent's cache on the host: BOOTSTRAP's first argument)
    shutil.rmtree(cache, ignore_errors=True)
    first = facts()
    repeat = facts()
    assert any(f.name.startswith("agent-") for f in cache.iterdir())
    shutil.rmtree(cache)
    again = facts()  # a new host again: the same bytes (within the SSH padding)
    assert any(f.name.startswith("agent-") for f in cache.iterdir())
    # `servers` needs the serverfacts part: sent with its first request that needs it (the hello says
    # the host has the core cached, not the part), kept, then key only; a small part (~5 KB: the
    # whole servers part, launch actions and all, was ~14 KB when a deploy's restart reminder took it)
    servers_first = facts("servers")
    servers_repeat = facts("servers")
    parts = [f for f in cache.iterdir() if f.name.startswith("part-")]
    assert len(parts) == 1
    parts[0].write_bytes(b"print('not ours')")  # changed on the host: said cached, not run, sent again
    servers_changed = facts("servers")
    print(f"controller->host bytes: baseline {baseline}, first contact {first}, repeat {repeat}, "
          f"again {again}; servers: part sent {servers_first}, cached {servers_repeat}, cache changed {servers_changed}")
    assert servers_repeat < servers_first - 3_000 and servers_changed > servers_repeat + 3_000
    assert servers_first - servers_repeat < 8_000, (servers_first, servers_repeat)
    assert first - baseline <= BOUND, (first, baseline)
    assert repeat < first - 20_000 and abs(again - first) < 2_000, (first, repeat, again)


def test_a_deploy_sends_its_files_once(relay_inventory: tuple[Relay, Path, Sandbox],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A deploy to a host that has the agent's core cached but not its servers part (after `facts`, or
    `deploy --check`): the deploy request asks for the part (the restart reminder's facts), and used
    to be answered need_part and sent again whole, the files twice (bench: 760 KB against the lean
    push's 376 KB at first contact). A request larger than the part's source takes it along."""
    from fleetctl.cli import main
    from fleetctl.config.playbook import load_playbook
    from fleetctl.plan.intended import intended_for

    relay, inv, sb = relay_inventory
    pb = Path(__file__).resolve().parents[1] / "playbooks" / "dynamic-spec-disable"
    assert main(["facts", "-i", str(inv), "--limit", "h01"]) == 0, capsys.readouterr()
    relay.take()
    code = main(["deploy", str(pb), "-i", str(inv), "--limit", "h01", "--json"])
    out = capsys.readouterr()
    assert code == 0, out
    sent = relay.take()
    it = intended_for(load_playbook(pb), sb.hosts["h01"].version)
    assert it is not None
    files = sum(len(i.data) for i in it.values())
    print(f"deploy: {sent} bytes controller -> host for {files} bytes of files")
    assert files < sent < files * 1.5, (sent, files)


def test_the_hello_names_the_parts_the_host_has(relay_inventory: tuple[Relay, Path, Sandbox],
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34.2: the bootstrap's hello lists the on-demand parts in the host's cache, so the
    controller sends the code of exactly those it lacks, with the first request that needs them: a
    host with the core cached but not the serverfacts part gets the part at once (one request, where it
    used to be sent the key, answered need_part and sent the request again); a host with the part
    cached but not the core (a fleetctl whose core changed) gets the core and not the part."""
    from fleetctl.cli import main
    from fleetctl.config.inventory import load_inventory
    from fleetctl.remote import part_key
    from fleetctl.transport.session import AgentTransport

    relay, inv, _sb = relay_inventory
    calls: list[str] = []
    orig = AgentTransport._agent_call

    def counted(self: AgentTransport, action: str, *a: object, **k: object) -> object:
        calls.append(action)
        return orig(self, action, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(AgentTransport, "_agent_call", counted)

    def run(command: str) -> tuple[int, list[str]]:
        calls.clear()
        code = main([command, "-i", str(inv)])
        out = capsys.readouterr()
        assert code == 0, out
        return relay.take(), list(calls)

    (host,) = load_inventory(inv).select("h01")
    cache = Path(host.state_dir) / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    run("facts")  # the core, cached
    part_sent, asked = run("servers")
    assert len(asked) == 1, asked  # one request: no need_part round trip
    # kept compiled (the host's python has the controller's bytecode magic), under the part's key
    assert [f.name for f in cache.iterdir() if f.name.startswith("part-")] == \
        [f"part-{part_key('serverfacts')}.{sys.implementation.cache_tag}"]
    for f in cache.iterdir():
        if f.name.startswith("agent-"):
            f.unlink()  # the core gone, the part kept
    core_only, asked = run("servers")
    assert len(asked) == 1, asked
    shutil.rmtree(cache)
    both, asked = run("servers")
    assert len(asked) == 1, asked
    print(f"servers: part sent to a host with the core {part_sent}, core sent to a host with the part "
          f"{core_only}, both sent {both}")
    assert core_only < both - 3_000, (core_only, both)  # the part's code (~5 KB compressed) not sent
    assert part_sent < both - 20_000, (part_sent, both)  # (the core: ~28 KB)
