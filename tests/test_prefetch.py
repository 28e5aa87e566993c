"""Connections opened ahead of a command's first run (Fleet.prefetch; commands/context.py), against
real sshd hosts: the run uses the connection the prefetch opened, a failed handshake is reported by
the host's run exactly once, a closed fleet cuts a handshake in flight, and bad input given on the
command line contacts no host."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetctl.cli import main
from fleetctl.config.inventory import load_inventory
from fleetctl.ops.runner import Fleet
from fleetctl.sandbox.lifecycle import Sandbox

pytestmark = [pytest.mark.fleet, pytest.mark.usefixtures("ledger_dir")]

PB = Path(__file__).resolve().parents[1] / "playbooks" / "dynamic-spec-disable"


class Accepted(list):  # type: ignore[type-arg]
    """The connections a silent listener accepted; `first` is set when there is one."""

    def __init__(self) -> None:
        super().__init__()
        self.first = threading.Event()


@pytest.fixture
def silent_listener() -> Iterator[tuple[int, Accepted]]:
    """A loopback TCP port that accepts connections and never says anything (no SSH banner)."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted = Accepted()

    def loop() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:  # closed: the test is over
                return
            accepted.append(c)
            accepted.first.set()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], accepted
    finally:
        try:  # (close alone leaves a blocked accept() taking connections on Linux)
            srv.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        srv.close()
        for c in accepted:
            c.close()


def _inventory(sb: Sandbox, tmp: Path, port: int, *, known_hosts: Path | None = None,
               connect_timeout: int = 30) -> Path:
    inv = tmp / "inventory.yaml"
    kh = known_hosts or sb.dir / "known_hosts"
    inv.write_text(f"defaults: {{user: root, identity_file: {sb.dir / 'client_key'}, known_hosts: {kh}}}\n"
                   f"hosts:\n  x1: {{address: 127.0.0.1, port: {port}, connect_timeout: {connect_timeout}}}\n")
    return inv


def _fleet(inventory: Path, limit: str | None = None) -> Fleet:
    inv = load_inventory(inventory)
    return Fleet(inv, inv.select(limit), forks=4)


def _echo(conn: object) -> bytes | None:
    return conn.run_command(["echo", "hi"], "a test", 100)  # type: ignore[attr-defined]


def test_the_run_uses_the_prefetched_connection(sandbox: Sandbox) -> None:
    fleet = _fleet(sandbox.inventory_path)
    with fleet:
        fleet.prefetch()
        for w in fleet._warm.values():
            assert w.done.wait(60)
        opened = {name: c._conn for name, c in fleet._conns.items()}  # type: ignore[attr-defined]
        assert set(opened) == set(sandbox.hosts) and all(c is not None for c in opened.values())
        outs = fleet.run(_echo)
        assert [o.status for o in outs] == ["ok"] * len(sandbox.hosts) and outs[0].detail == b"hi\n"
        assert {name: c._conn for name, c in fleet._conns.items()} == opened  # type: ignore[attr-defined]


def test_a_failed_prefetch_is_the_hosts_outcome_once(fresh_sandbox: Callable[..., Sandbox]) -> None:
    sb = fresh_sandbox(hosts=2)
    sb.stop_host("h02")
    fleet = _fleet(sb.inventory_path)
    with fleet:
        fleet.prefetch()
        assert fleet._warm["h02"].done.wait(60)
        first = {o.host: o for o in fleet.run(_echo)}
        assert first["h01"].status == "ok"
        assert first["h02"].status == "unreachable" and "connection refused" in first["h02"].message
        # the kept failure was reported; the next run tries the host afresh (and now reaches it)
        sb.start_host("h02")
        again = {o.host: o for o in fleet.run(_echo)}
        assert again["h02"].status == "ok", again["h02"].message


def test_a_host_no_prefetch_reached_is_connected_by_its_run(sandbox: Sandbox) -> None:
    fleet = _fleet(sandbox.inventory_path)
    with fleet:
        fleet.prefetch()
        outs = fleet.run(_echo)  # at once: some hosts may still be pending or in flight
        assert [o.status for o in outs] == ["ok"] * len(sandbox.hosts)
        assert all(w.claimed and w.done.is_set() for w in fleet._warm.values())


def test_close_cuts_a_handshake_in_flight(sandbox: Sandbox, tmp_path: Path,
                                         silent_listener: tuple[int, Accepted]) -> None:
    """The handshake is cut wherever it is when the fleet closes: here just after the host accepted
    (before: a cut between paramiko's TCP connect and its Transport found nothing to close, and the
    handshake waited out its banner timeout)."""
    port, accepted = silent_listener
    fleet = _fleet(_inventory(sandbox, tmp_path, port, connect_timeout=3600))
    fleet.prefetch()
    w = fleet._warm["x1"]
    assert accepted.first.wait(600)  # (a hang bound) the host accepted; it never sends its banner
    assert not w.done.is_set()
    fleet.close()
    assert w.done.wait(600)  # (a hang bound) ended by the cut: the connect timeout is an hour
    assert w.error is not None


@pytest.mark.parametrize("where", ["before-tcp", "after-tcp"])
def test_a_cut_at_any_point_of_the_handshake_ends_it(sandbox: Sandbox, tmp_path: Path, where: str,
                                                     silent_listener: tuple[int, Accepted],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut lands exactly at the point named (the connecting thread is held there by the test),
    and the handshake ends at once instead of at its (hour-long) connect timeout."""
    from fleetctl.transport import direct

    port, _ = silent_listener
    inv = load_inventory(_inventory(sandbox, tmp_path, port, connect_timeout=3600))
    at, go = threading.Event(), threading.Event()
    real_tcp = direct.DirectConnection._tcp

    def held_tcp(hostname: str, port: int, timeout: float | None) -> socket.socket:
        if where == "before-tcp":
            at.set()
            go.wait()
        sock = real_tcp(hostname, port, timeout)
        if where == "after-tcp":  # connected; paramiko has no Transport yet
            at.set()
            go.wait()
        return sock

    monkeypatch.setattr(direct.DirectConnection, "_tcp", staticmethod(held_tcp))
    fleet = Fleet(inv, inv.hosts, forks=1)
    out: list[object] = []
    t = threading.Thread(target=lambda: out.extend(fleet.run(lambda c: None)), daemon=True)
    t.start()
    assert at.wait(600)
    fleet.inflight["x1"].abort("cut by the test")
    go.set()
    t.join(600)
    assert not t.is_alive()
    (o,) = out
    assert o.status == "unreachable" and o.message == "cut by the test", o  # type: ignore[attr-defined]
    fleet.close()


def _fleet_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of Fleet's connecting methods called from now on (each still runs): a command
    that calls none of them started no connection, and none can start after it returned."""
    calls: list[str] = []
    for name in ("prefetch", "run", "connection"):
        real = getattr(Fleet, name)

        def spy(self: Fleet, *a: object, _real: Callable[..., object] = real, _name: str = name,
                **k: object) -> object:
            calls.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(Fleet, name, spy)
    return calls


def test_a_missing_playbook_contacts_no_host(sandbox: Sandbox, tmp_path: Path,
                                            silent_listener: tuple[int, Accepted],
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    port, accepted = silent_listener
    inv = _inventory(sandbox, tmp_path, port)
    calls = _fleet_calls(monkeypatch)
    code = main(["deploy", str(tmp_path / "no-such-playbook"), "-i", str(inv), "--json"])
    assert code == 2
    assert "playbook file not found" in capsys.readouterr().err
    assert calls == [] and accepted == []  # no connection was started (not: none yet)


def test_accept_new_host_keys_records_nothing_for_bad_input(sandbox: Sandbox, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """With --accept-new-host-keys nothing is connected before the playbook is read: a malformed
    playbook records no key (without it, connections may open while the playbook loads)."""
    kh = tmp_path / "known_hosts"
    inv = _inventory(sandbox, tmp_path, sandbox.hosts["h01"].port, known_hosts=kh)
    bad = tmp_path / "playbook.yaml"
    bad.write_text("name: [unclosed\n")
    calls = _fleet_calls(monkeypatch)
    code = main(["deploy", str(bad), "-i", str(inv), "--accept-new-host-keys"])
    assert code == 2
    assert "malformed YAML" in capsys.readouterr().err
    assert calls == [] and not kh.exists()  # no connection was started, so none can record a key



def _count_loads(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[Path]:
    """The paths `module.name(path)` is called with from now on (the real loader still runs)."""
    loads: list[Path] = []
    real = getattr(module, name)

    def spy(path: Path) -> object:
        loads.append(path)
        return real(path)

    monkeypatch.setattr(module, name, spy)
    return loads


def test_a_kept_inventory_is_not_parsed_again(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The second command on the same inventory takes the kept resolution (config/inventory_cache.py)
    instead of loading the file; other bytes load it again."""
    import fleetctl.config.inventory as inventory_mod

    inv = _inventory(sandbox, tmp_path, sandbox.hosts["h01"].port)
    loads = _count_loads(monkeypatch, inventory_mod, "load_inventory")
    assert main(["facts", "-i", str(inv), "--json"]) == 0
    assert main(["facts", "-i", str(inv), "--json"]) == 0
    assert len(loads) == 1
    assert capsys.readouterr().out.count('"status": "ok"') == 2
    inv.write_text(inv.read_text() + "# edited\n")
    assert main(["facts", "-i", str(inv), "--json"]) == 0
    assert len(loads) == 2


def test_a_kept_playbook_is_not_loaded_again(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The second deploy of the same playbook takes the kept copy (config/playbook_cache.py) instead
    of loading the file; an edited playbook is loaded again, and its plan is the edited one's."""
    import shutil

    import fleetctl.config.playbook as playbook_mod

    inv = sandbox.dir / "inventory.yaml"
    pb = tmp_path / "pb"
    shutil.copytree(PB, pb)
    loads = _count_loads(monkeypatch, playbook_mod, "load_playbook_from")
    for _ in range(2):
        assert main(["deploy", str(pb), "-i", str(inv), "--limit", "h01", "--check", "--json"]) == 0
    assert loads == [pb / "playbook.yaml"]
    import json

    docs = [json.loads(d + "}") for d in capsys.readouterr().out.split("\n}\n") if d.strip()]
    assert len(docs) == 2 and docs[0]["plan"] == docs[1]["plan"] and docs[0]["ok"]
    text = (pb / "playbook.yaml").read_text()
    (pb / "playbook.yaml").write_text(text.replace("--speculative-disable-batch-threshold: 16",
                                                   "--speculative-disable-batch-threshold: 17"))
    assert main(["deploy", str(pb), "-i", str(inv), "--limit", "h01", "--check", "--json"]) == 0
    assert len(loads) == 2
    from fleetctl.config import playbook_cache

    kept = playbook_cache.lookup(pb)
    assert kept is not None and kept.launch.flags["--speculative-disable-batch-threshold"] == 17


def test_handshakes_in_flight_are_bounded(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """However many forks, at most HANDSHAKES_AT_ONCE handshakes run at once (here 1 of 3 hosts, each
    handshake held open 0.3 s so that unbounded ones would overlap), and every host is reached."""
    import threading

    from fleetctl.transport import direct, ssh
    from fleetctl.transport.slots import Slots

    monkeypatch.setattr(ssh, "_handshakes", Slots(1))
    lock = threading.Lock()
    now, most = [0], [0]
    real = direct.DirectConnection.open

    def spy(self: direct.DirectConnection, kwargs: dict) -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            threading.Event().wait(0.3)
            real(self, kwargs)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(direct.DirectConnection, "open", spy)
    assert main(["facts", "-i", str(sandbox.dir / "inventory.yaml"), "--limit", "h01,h02,h03", "-f", "3",
                 "--json"]) == 0
    assert capsys.readouterr().out.count('"status": "ok"') == 3
    assert most[0] == 1
