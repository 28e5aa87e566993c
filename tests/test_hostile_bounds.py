"""Hosts that hang, flood or exhaust the controller (issue 11: defects 1, 4, 9), on real sshd.

* A host that stops answering exactly at the exec request (its sshd and sessions SIGSTOPped, or its
  packets dropped by a loopback TCP proxy) is reported with that step within its bound; the other
  hosts finish. Before: paramiko's exec_command waited forever.
* Ctrl-C: the first press starts no new host and reports per host (exit 130); a second exits at once.
* An answer larger than max_answer_bytes fails the host from its frame header, before it is
  buffered: the controller's peak RSS stays far below what the host streams.
* More than 1024 open file descriptors: commands still work (no select()).

Every test bounds its own run time: the fleet runs in a daemon thread joined with a timeout, CLI
subprocesses are killed at a deadline; frozen processes (only the sandbox's own, which the test
started) are continued and stopped in finalizers.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from eventpipe import EventPipe
from test_faults import write_inventory
from waiting import until

from fleetctl.config.inventory import load_inventory
from fleetctl.ops.runner import Fleet, HostOutcome
from fleetctl.sandbox import procs
from fleetctl.sandbox.lifecycle import Sandbox

pytestmark = pytest.mark.usefixtures("ledger_dir")

# Hang bound only: a run that waits it out has failed. No test here asserts how long a run took;
# each asserts the outcome it signals (the message naming the bound that cut the host). 300 s is still
# far below what the unbounded behaviour took (945 s until the kernel gave up on a dropped peer), so a
# missing bound still fails here, while a loaded machine never does.
BOUND = 300.0
# A small bound is given only to the host under test; the healthy hosts keep the generous ones (on a
# loaded 2-core machine starting their agent alone can take longer than 3 s).
SMALL = {"command_timeout": 3}


# ---- helpers -----------------------------------------------------------------------------------


class Freezer:
    """SIGSTOPs a sandbox host's sshd listener and its session processes (pids of a sandbox this
    test started, nothing else); `thaw` continues them (registered as a finalizer by the fixture)."""

    def __init__(self) -> None:
        self.frozen: list[int] = []

    def freeze(self, sb: Sandbox, name: str) -> list[int]:
        pid = sb.host(name).pid
        assert pid is not None, f"{name}: sshd is not running"
        os.kill(pid, signal.SIGSTOP)  # the listener first: it starts no session after this
        stopped = [pid]
        for p in sorted(procs.descendants([pid])):
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:  # a session (of an earlier command) that ended meanwhile
                continue
            stopped.append(p)
        self.frozen += stopped
        return stopped

    def thaw(self) -> None:
        while self.frozen:
            try:
                os.kill(self.frozen.pop(), signal.SIGCONT)
            except ProcessLookupError:
                pass


@pytest.fixture
def freezer() -> Iterator[Freezer]:
    f = Freezer()
    try:
        yield f
    finally:
        f.thaw()


class BlackholeProxy:
    """A loopback TCP proxy to 127.0.0.1:port that forwards both ways until `drop()`; from then on it
    reads and discards everything (packets "dropped": no RST, no FIN, no answer)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropping = threading.Event()
        self.closed = threading.Event()
        self.socks: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                if not self.dropping.is_set():
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                return
            if not self.dropping.is_set():
                try:
                    dst.sendall(data)
                except OSError:
                    return

    def drop(self) -> None:
        self.dropping.set()

    def close(self) -> None:
        self.closed.set()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def at_open_session(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, Callable[[], None]], None]:
    """Run `action` right after the controller's session channel to the host on `port` is open,
    i.e. just before the exec request that starts the agent (once). Works on any fleetctl version:
    both the old and the new transport open a session through paramiko's Transport.open_session."""
    original = paramiko.Transport.open_session
    armed: dict[int, Callable[[], None]] = {}

    def open_session(self: paramiko.Transport, *a: Any, **kw: Any) -> paramiko.Channel:
        chan = original(self, *a, **kw)
        action = armed.pop(self.getpeername()[1], None)
        if action is not None:
            action()
        return chan

    monkeypatch.setattr(paramiko.Transport, "open_session", open_session)

    def arm(port: int, action: Callable[[], None]) -> None:
        armed[port] = action

    return arm


def run_bounded(fleet: Fleet, fn: Callable[[Any], Any], bound: float = BOUND) -> list[HostOutcome]:
    """fleet.run(fn) in a daemon thread; fails (instead of hanging) if it has not returned by `bound`."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["out"] = fleet.run(fn)
        except BaseException as e:  # reported below
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(bound)
    assert not t.is_alive(), f"the fleet run hung: still running after {bound:.0f}s"
    if "error" in box:
        raise box["error"]
    return box["out"]  # type: ignore[no-any-return]


# ---- defect 1: no step without a bound -------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet3(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Sandbox:
    """A private 3-host sandbox for this module (its hosts get frozen)."""
    from conftest import _down, _new_dir, require_sshd

    require_sshd()
    from fleetctl.sandbox import lifecycle

    d = _new_dir(tmp_path_factory, "bounds")
    request.addfinalizer(lambda: _down(d))
    return lifecycle.up(d, hosts=3, versions=["0.5.9"], gpus=1)


def _by_host(outs: list[HostOutcome]) -> dict[str, HostOutcome]:
    return {o.host: o for o in outs}


@pytest.mark.fleet
def test_host_frozen_at_the_exec_request_is_reported_and_the_others_finish(
        fleet3: Sandbox, freezer: Freezer, at_open_session: Any, tmp_path: Path) -> None:
    """h03's sshd and its sessions are SIGSTOPped right after its session channel opened: the exec
    request that starts the agent gets no answer. Before: the command hung forever."""
    inv = load_inventory(write_inventory(fleet3, tmp_path / "inv.yaml", hosts={"h03": SMALL}))
    at_open_session(fleet3.host("h03").port, lambda: freezer.freeze(fleet3, "h03"))
    with Fleet(inv, inv.hosts, forks=3) as fleet:
        outs = run_bounded(fleet, lambda c: c.agent("ping"))
    got = _by_host(outs)
    assert got["h01"].ok and got["h02"].ok, [o.message for o in outs]
    assert got["h03"].status == "unreachable"
    assert got["h03"].message.startswith("h03: no answer to the exec request (starting the agent) within 3s"), \
        got["h03"].message
    assert freezer.frozen, "the fault was never injected"


@pytest.mark.fleet
def test_packets_dropped_at_the_exec_request_are_bounded(
        fleet3: Sandbox, at_open_session: Any, tmp_path: Path) -> None:
    """h02 is reached through a loopback proxy that drops every packet from the exec request on (no
    RST, no FIN). Before: 945 s until the kernel gave up, then an empty reason; now its bound."""
    real = fleet3.host("h02").port
    proxy = BlackholeProxy(real)
    try:
        kh = tmp_path / "known_hosts"
        lines = fleet3.known_hosts_path.read_text().splitlines()
        mine = [ln for ln in lines if ln.startswith(f"[127.0.0.1]:{real} ")]
        assert mine, "no known_hosts entry for h02"
        kh.write_text("\n".join([*lines, *(ln.replace(f":{real} ", f":{proxy.port} ", 1) for ln in mine)]) + "\n")
        inv = load_inventory(write_inventory(fleet3, tmp_path / "inv.yaml",
                                             hosts={"h02": {"port": proxy.port, **SMALL}}, known_hosts=str(kh)))
        at_open_session(proxy.port, proxy.drop)
        with Fleet(inv, inv.hosts, forks=3) as fleet:
            outs = run_bounded(fleet, lambda c: c.agent("ping"))
    finally:
        proxy.close()
    got = _by_host(outs)
    assert proxy.dropping.is_set(), "the fault was never injected"
    assert got["h01"].ok and got["h03"].ok, [o.message for o in outs]
    assert got["h02"].status == "unreachable"
    assert got["h02"].message.startswith("h02: no answer to the exec request (starting the agent) within 3s"), \
        got["h02"].message


@pytest.mark.fleet
def test_host_frozen_mid_request_is_cut_at_command_timeout(fleet3: Sandbox, freezer: Freezer, tmp_path: Path) -> None:
    """A host frozen after its agent started: the next request is bounded by command_timeout and
    names the request; the other hosts answer it."""
    inv = load_inventory(write_inventory(fleet3, tmp_path / "inv.yaml"))
    with Fleet(inv, inv.hosts, forks=3) as fleet:
        outs = run_bounded(fleet, lambda c: c.agent("ping"))
        assert all(o.ok for o in outs), [o.message for o in outs]
        freezer.freeze(fleet3, "h01")

        def ping(c: Any) -> Any:
            if c.host.name == "h01":  # its agent is up: only now is its bound made small (see SMALL)
                c.host = dataclasses.replace(c.host, **SMALL)
            return c.agent("ping")

        outs = run_bounded(fleet, ping)
    got = _by_host(outs)
    assert got["h02"].ok and got["h03"].ok
    assert got["h01"].status == "unreachable"
    assert got["h01"].message.startswith("h01: 'ping' timed out: no answer within 3s"), got["h01"].message


FREEZE_DRIVER = """\
import json, os, signal, sys
import paramiko
from fleetctl.sandbox import procs
port, listener, record = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
original = paramiko.Transport.open_session
def open_session(self, *a, **kw):
    chan = original(self, *a, **kw)
    if self.getpeername()[1] == port and not os.path.exists(record):
        # freeze the host right before the exec request: its sshd and every session process
        pids = [listener, *sorted(procs.descendants([listener]))]
        with open(record, "w") as f:
            json.dump(pids, f)
        for p in pids:
            os.kill(p, signal.SIGSTOP)
    return chan
paramiko.Transport.open_session = open_session
from fleetctl.cli import main
sys.exit(main(sys.argv[4:]))
"""


@pytest.mark.fleet
def test_deploy_returns_when_a_host_freezes_at_the_exec_request(fleet3: Sandbox, tmp_path: Path,
                                                                ledger_dir: Path) -> None:
    """The issue's case end to end: `fleetctl deploy` while h03 freezes (sshd and sessions
    SIGSTOPped) as its agent is started. Before: deploy never returned. Now: h03 is reported with
    the step, h01 and h02 are deployed, exit 1."""
    import json

    from test_faults import FILES, intended_bytes, make_playbook

    from fleetctl.engines import wheels

    pb = make_playbook(tmp_path / "pb", tag="frozen")
    want = intended_bytes(pb)
    inv = write_inventory(fleet3, tmp_path / "inv.yaml", hosts={"h03": {"command_timeout": 15}})
    h03 = fleet3.host("h03")
    record = tmp_path / "frozen.json"
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(ledger_dir)}
    proc = subprocess.Popen([sys.executable, "-c", FREEZE_DRIVER, str(h03.port), str(h03.pid), str(record),
                             "deploy", "-i", str(inv), "--json", str(pb)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        code, out, err = _finish(proc, BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in json.loads(record.read_text()) if record.exists() else []:
            try:
                os.kill(pid, signal.SIGCONT)  # pids of this test's own sandbox, frozen by its driver
            except ProcessLookupError:
                pass
    try:
        assert record.exists(), "the fault was never injected"
        assert code == 1, err
        res = {r["host"]: r for r in json.loads(out)["hosts"]}
        assert res["h01"]["status"] == res["h02"]["status"] == "changed", res
        assert res["h03"]["status"] == "unreachable"
        assert res["h03"]["message"].startswith(
            "no answer to the exec request (starting the agent) within 15s"), res["h03"]["message"]
        for name in ("h01", "h02", "h03"):
            h = fleet3.host(name)
            got = {rel: (h.sglang_dir / rel).read_bytes() for rel in FILES}
            assert got == (want if name != "h03" else {rel: wheels.pristine_bytes(h.version, rel) for rel in FILES})
    finally:  # leave the module's sandbox pristine
        subprocess.run([sys.executable, "-m", "fleetctl", "rollback", "-i", str(inv)], capture_output=True,
                       env=env, timeout=BOUND)


@pytest.mark.fleet
def test_per_host_deadline_cuts_a_host_whose_steps_each_keep_their_bound(
        fleet3: Sandbox, tmp_path: Path) -> None:
    """host_timeout bounds a host's whole part of a command, however many steps it takes."""
    inv = load_inventory(write_inventory(fleet3, tmp_path / "inv.yaml", hosts={"h01": {"host_timeout": 2}}))

    def endless(c: Any) -> None:
        while True:  # each request is quick and bounded: only the per-host deadline can stop this
            c.agent("ping")
            # the host's own work between its steps (the deadline is enforced between steps; each
            # step keeps its own bound): workload, not synchronisation (tests/test_no_timing.py)
            time.sleep(0.25)

    with Fleet(inv, inv.hosts[:1], forks=1) as fleet:
        outs = run_bounded(fleet, endless)
    assert outs[0].status == "unreachable"
    assert outs[0].message.startswith("h01: past its per-host deadline of 2s"), outs[0].message


@pytest.mark.fleet
def test_a_host_stuck_outside_the_network_is_given_up_on(fleet3: Sandbox, tmp_path: Path) -> None:
    """The watchdog's backstop: a host whose thread does not return even after its connection was
    cut (here: stuck in a local wait) is reported at its deadline plus the abandon grace, and the
    run returns."""
    inv = load_inventory(write_inventory(fleet3, tmp_path / "inv.yaml", hosts={"h01": {"host_timeout": 1}}))
    release = threading.Event()
    with Fleet(inv, inv.hosts, forks=3) as fleet:
        try:
            # h01 never returns by itself: only the watchdog giving it up lets the run return
            outs = run_bounded(fleet, lambda c: release.wait() if c.host.name == "h01" else c.agent("ping"))
        finally:
            release.set()
    got = _by_host(outs)
    assert got["h02"].ok and got["h03"].ok
    assert got["h01"].status == "unreachable"
    assert got["h01"].message.startswith("h01: past its per-host deadline of 1s"), got["h01"].message


# ---- defect 1: Ctrl-C ---------------------------------------------------------------------------------

def _finish(proc: subprocess.Popen[str], bound: float) -> tuple[int, str, str]:
    """The CLI's exit; fails (after killing it) if it has not exited by `bound` (a hang bound)."""
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own CLI subprocess (its own session)
        out, err = proc.communicate()
        raise AssertionError(f"the CLI did not exit within {bound:.0f}s; stderr: {err[-2000:]}") from None
    return proc.returncode, out, err


class SilentHost:
    """A loopback port that accepts SSH connections and never sends a banner (a host hung at the
    handshake), until `cut()` closes them: then the client reads EOF at once. `accepted` is set on
    the first connection. No timing is involved: the test decides when the host "fails"."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(c)
            self.accepted.set()

    def cut(self) -> None:
        for c in self.conns:
            c.close()

    def close(self) -> None:
        try:  # (close alone leaves a blocked accept() taking connections on Linux)
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.cut()


@pytest.fixture
def silent_host() -> Iterator[SilentHost]:
    s = SilentHost()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def event_pipe() -> Iterator[EventPipe]:
    p = EventPipe()
    try:
        yield p
    finally:
        p.close()


# Every Ctrl-C test acts on what the CLI signals (fleetctl/transport/events.py): a host in flight ("host-start"),
# the first Ctrl-C taken ("interrupt"); the hosts' timeouts are far longer than any test, so no
# bound races the signal on a loaded machine (before: a 0.3 s sleep, then a 4 s connect timeout).

@pytest.mark.fleet
def test_first_ctrl_c_starts_no_new_host_and_reports_each(fleet3: Sandbox, silent_host: SilentHost,
                                                           event_pipe: EventPipe, tmp_path: Path,
                                                           ledger_dir: Path) -> None:
    """forks=1; h01 hangs at its SSH banner. One SIGINT while h01 is in flight: h02 and h03 never
    start; h01's handshake then fails (its host closes the connection), each host is reported, exit 130."""
    inv = write_inventory(fleet3, tmp_path / "inv.yaml", hosts={"h01": {"port": silent_host.port}},
                          connect_timeout=600, command_timeout=600)
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(ledger_dir)}
    proc = event_pipe.popen(["status", "-i", str(inv), "-f", "1"], env)
    try:
        event_pipe.wait("host-start h01")
        assert silent_host.accepted.wait(BOUND), "h01 was never connected"
        proc.send_signal(signal.SIGINT)  # the CLI subprocess this test started
        event_pipe.wait("interrupt")
        silent_host.close()  # its connection closed, and no other accepted (a retry is refused)
        code, _, err = _finish(proc, BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 130, err
    assert "interrupt: starting no new host; waiting for 1 host(s) in flight" in err
    assert "h01: in flight at the SSH connection when interrupted; then unreachable: h01: " in err, err
    assert "  h02: not started" in err and "  h03: not started" in err, err
    assert "host-start h02" not in event_pipe.seen and "host-start h03" not in event_pipe.seen
    assert "Traceback" not in err


@pytest.mark.fleet
def test_ctrl_c_with_json_prints_one_document_saying_so(fleet3: Sandbox, freezer: Freezer, event_pipe: EventPipe,
                                                       tmp_path: Path, ledger_dir: Path) -> None:
    """--json, Ctrl-C before the command had a result (a rollback; h01 frozen while facts are gathered,
    so the apply step never starts): stdout is still one JSON document, ok false, interrupted, each
    host's state; exit 130."""
    import json

    inv = write_inventory(fleet3, tmp_path / "inv.yaml", connect_timeout=600, command_timeout=600)
    freezer.freeze(fleet3, "h01")
    proc = event_pipe.popen(["rollback", "-i", str(inv), "-f", "1", "--json"],
                            {**os.environ, "FLEETCTL_STATE_DIR": str(ledger_dir)})
    try:
        event_pipe.wait("host-start h01")
        proc.send_signal(signal.SIGINT)  # the CLI subprocess this test started
        event_pipe.wait("interrupt")
        freezer.thaw()  # h01 answers: its facts step ends, and the rollback goes no further
        code, out, err = _finish(proc, BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 130, err
    doc = json.loads(out)
    assert doc["command"] == "rollback" and doc["ok"] is False and doc["interrupted"] is True, doc
    states = {h["host"]: h["state"] for h in doc["hosts"]}
    assert states == {"h01": "in-flight", "h02": "not-started", "h03": "not-started"}, doc["hosts"]
    assert doc["summary"]["failed"] == 3 and doc["message"].startswith("interrupted: 2 host(s) not started")
    assert "  h02: not started" in err and "Traceback" not in err  # the report on stderr too


@pytest.mark.fleet
def test_ctrl_c_while_planning_starts_no_later_step(fleet3: Sandbox, freezer: Freezer, event_pipe: EventPipe,
                                                   tmp_path: Path, ledger_dir: Path) -> None:
    """A rollback interrupted while it gathers facts never goes on to its apply step: no host is
    reported as 'skipped' or 'failed' by a step that never ran, and none is counted twice."""
    inv = write_inventory(fleet3, tmp_path / "inv.yaml", connect_timeout=600, command_timeout=600)
    freezer.freeze(fleet3, "h01")
    proc = event_pipe.popen(["rollback", "-i", str(inv), "-f", "1"],
                            {**os.environ, "FLEETCTL_STATE_DIR": str(ledger_dir)})
    try:
        event_pipe.wait("host-start h01")
        proc.send_signal(signal.SIGINT)  # the CLI subprocess this test started
        event_pipe.wait("interrupt")
        freezer.thaw()  # h01 answers after all: its facts step ends done, and the rollback must stop there
        code, out, err = _finish(proc, BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 130, err
    assert "interrupted: 2 host(s) not started, 1 were in flight" in err, err
    assert "  h01: in flight at " in err and "when interrupted; then done" in err, err
    assert "  h02: not started" in err and "  h03: not started" in err, err
    assert "skipped" not in err and "Traceback" not in err, (out, err)
    assert [e for e in event_pipe.seen if e.startswith("host-start")] == ["host-start h01"], event_pipe.seen


@pytest.mark.fleet
def test_second_ctrl_c_exits_at_once_and_points_at_status(fleet3: Sandbox, freezer: Freezer, event_pipe: EventPipe,
                                                          tmp_path: Path, ledger_dir: Path) -> None:
    inv = write_inventory(fleet3, tmp_path / "inv.yaml", connect_timeout=600, command_timeout=600)
    freezer.freeze(fleet3, "h02")
    proc = event_pipe.popen(["status", "-i", str(inv), "-f", "3"],
                            {**os.environ, "FLEETCTL_STATE_DIR": str(ledger_dir)})
    try:
        event_pipe.wait("host-start h02")
        event_pipe.wait("step h02 the_SSH_connection")
        proc.send_signal(signal.SIGINT)
        event_pipe.wait("interrupt")
        proc.send_signal(signal.SIGINT)
        code, _, err = _finish(proc, BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 130, err
    again = err[err.index("interrupted again: exiting now; "):]  # h01/h03 may still be in flight on a slow machine
    assert "h02 (at the SSH connection)" in again.splitlines()[0], err
    assert f"'fleetctl status -i {inv}' shows it" in err
    # (it exited without waiting out h02's 600 s connect_timeout: _finish gives it BOUND, less than that)


@pytest.mark.fleet
def test_ctrl_c_during_deploy_lets_the_transaction_in_flight_finish(fleet3: Sandbox, tmp_path: Path,
                                                                   ledger_dir: Path, event_pipe: EventPipe) -> None:
    """forks=1; h01's deploy transaction is held between its renames (the agent's test-only fault
    point) until the CLI has taken the Ctrl-C (its "interrupt" event; before: a 3 s hold raced the
    SIGINT on a loaded machine). Then h01's transaction completes (all files intended, no mixed
    state), h02 and h03 are not started (still pristine), exit 130, and status is clean afterwards."""
    import json

    from test_faults import DRIVER, FILES, intended_bytes, make_playbook

    from fleetctl.engines import wheels

    pb = make_playbook(tmp_path / "pb", tag="ctrlc")
    want = intended_bytes(pb)
    inv = write_inventory(fleet3, tmp_path / "inv.yaml", command_timeout=60)
    marker, release = tmp_path / "at-fault", tmp_path / "release"
    fault = {"h01": {"at": "between_renames", "n": 1, "how": "until", "release": str(release), "hold": 600,
                     "marker": str(marker)}}
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(ledger_dir), "FLEETCTL_EVENT_FD": str(event_pipe.w)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(fault), "deploy", "-i", str(inv), "-f", "1",
                             str(pb), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, pass_fds=(event_pipe.w,))
    os.close(event_pipe.w)
    event_pipe.w = -1
    try:
        until(marker.exists, "h01's deploy to reach its fault point")  # (written by the agent on the host)
        proc.send_signal(signal.SIGINT)
        event_pipe.wait("interrupt")
        release.write_text("go")  # h01's transaction goes on only now
        code, out, err = _finish(proc, BOUND)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        assert code == 130, err
        # --json: the deploy's own document, marked as interrupted (exit 130 is never ok: true)
        doc = json.loads(out)
        assert doc["command"] == "deploy" and doc["ok"] is False and doc["interrupted"] is True, doc
        assert doc["message"].startswith("interrupted"), doc["message"]
        assert {h["host"]: h["state"] for h in doc["hosts"]}.get("h01") == "changed", doc["hosts"]
        assert "  h01: in flight at the 'deploy' request when interrupted; then done" in err, err
        # not "h02: not started (done: ...)", which read as if the deploy had not happened when it had
        assert "  h02: next step not started (done: facts)" in err, err
        assert "  h03: next step not started (done: facts)" in err, err
        for name in ("h01", "h02", "h03"):
            h = fleet3.host(name)
            got = {rel: (h.sglang_dir / rel).read_bytes() for rel in FILES}
            expect = want if name == "h01" else {rel: wheels.pristine_bytes(h.version, rel) for rel in FILES}
            assert got == expect, f"{name} is not {'all intended' if name == 'h01' else 'pristine'}"
        st = subprocess.run([sys.executable, "-m", "fleetctl", "status", "-i", str(inv)], capture_output=True,
                            text=True, env=env, timeout=BOUND)
        assert st.returncode == 0, st.stdout + st.stderr
    finally:  # leave the module's sandbox pristine
        subprocess.run([sys.executable, "-m", "fleetctl", "rollback", "-i", str(inv)], capture_output=True,
                       env=env, timeout=BOUND)


# ---- defect 4: answer size cap ----------------------------------------------------------------------

HOSTILE = """\
import os, sys
# a hostile "python": speaks the agent's framing, claims {claim} bytes and streams {stream} bytes
out = sys.stdout.buffer
if {hello}:
    out.write(b"FLAGENTC0000000000")  # the bootstrap's hello: the code is cached here, no parts
if {framed}:
    out.write(b"%010d" % {claim})
chunk = {fill!r} * (1 << 20)
left = {stream}
try:
    while left > 0:
        n = min(left, len(chunk))
        out.write(chunk[:n])
        left -= n
    out.flush()
    sys.stdin.buffer.read()
except BrokenPipeError:
    pass
"""


def hostile_python(tmp_path: Path, name: str, *, claim: int, stream: int, framed: bool = True,
                   fill: bytes = b"x", hello: bool | None = None) -> str:
    script = tmp_path / f"{name}.py"
    script.write_text(HOSTILE.format(claim=claim, stream=stream, framed=framed, fill=fill,
                                     hello=framed if hello is None else hello))
    wrapper = tmp_path / f"{name}.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -S {script}\n")
    wrapper.chmod(0o755)
    return str(wrapper)


# the command's own peak: VmHWM of this image, not getrusage's ru_maxrss, which on Linux also keeps the
# peak of the image before exec (the forked copy of the test process: a pytest-xdist worker that ran
# hundreds of tests reads ~700 MB there whatever fleetctl does)
RSS_PROBE = """\
import re, sys
from fleetctl.cli import main
code = main(sys.argv[1:])
hwm = re.search(r"^VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read(), re.M).group(1)
sys.stderr.write("MAXRSS_KB %s\\n" % hwm)
sys.exit(code)
"""


@pytest.mark.fleet
def test_huge_answer_fails_the_host_before_it_is_buffered(fleet3: Sandbox, tmp_path: Path, ledger_dir: Path) -> None:
    """h01's python streams a 1 GiB answer (framed, header says 1 GiB). Before: the controller
    buffered it (RSS 65 MB -> 1.1 GB). Now: refused from the header; peak RSS stays small."""
    gib = 1 << 30
    py = hostile_python(tmp_path, "flood", claim=gib, stream=gib)
    inv = write_inventory(fleet3, tmp_path / "inv.yaml", hosts={"h01": {"python": py}})
    proc = subprocess.Popen([sys.executable, "-c", RSS_PROBE, "facts", "-i", str(inv), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FLEETCTL_STATE_DIR": str(ledger_dir)}, start_new_session=True)
    code, out, err = _finish(proc, BOUND)
    rss_mb = int(err.rsplit("MAXRSS_KB ", 1)[1].split()[0]) / 1024
    assert code == 1, err
    assert f"\"answer to 'facts' too large ({gib} bytes > cap {64 << 20})" in out, out[:2000]
    assert '"h02"' in out and '"h03"' in out
    assert rss_mb < 250, f"controller peak RSS {rss_mb:.0f} MB while the host streamed 1 GiB"
    print(f"peak RSS {rss_mb:.0f} MB")


@pytest.mark.fleet
def test_answer_cap_is_configurable_and_counts_real_bytes(fleet3: Sandbox, tmp_path: Path) -> None:
    py = hostile_python(tmp_path, "big", claim=300_000, stream=300_000)
    inv = load_inventory(write_inventory(fleet3, tmp_path / "inv.yaml", hosts={"h01": {"python": py}},
                                         max_answer_bytes=200_000))
    assert inv.hosts[1].max_answer_bytes == 200_000
    with Fleet(inv, inv.hosts, forks=3) as fleet:
        outs = run_bounded(fleet, lambda c: c.agent("ping"))
    got = _by_host(outs)
    assert got["h01"].status == "failed"
    assert got["h01"].message.startswith("h01: answer to 'ping' too large (300000 bytes > cap 200000)")
    assert got["h02"].ok and got["h03"].ok  # a real agent's answers fit


@pytest.mark.fleet
def test_stdout_that_is_not_a_frame_is_bounded(fleet3: Sandbox, tmp_path: Path) -> None:
    """A host streaming 1 GiB that is not a frame is cut by what it sent, not by a clock: its
    command_timeout (600 s) is longer than run_bounded's hang bound, which a cut by time would fail."""
    py = hostile_python(tmp_path, "junk", claim=0, stream=1 << 30, framed=False, fill=b"y\n")
    inv = load_inventory(write_inventory(fleet3, tmp_path / "inv.yaml", hosts={"h01": {"python": py}},
                                         command_timeout=600))
    with Fleet(inv, inv.hosts[:1], forks=1) as fleet:
        outs = run_bounded(fleet, lambda c: c.agent("ping"))
    assert outs[0].status == "failed"
    assert outs[0].message.startswith("h01: the agent's start answered something that is not its hello: "
                                      "b'y\\ny\\n"), \
        outs[0].message
    # the same after a well-formed hello: the first answer is not a frame
    py = hostile_python(tmp_path, "junk2", claim=0, stream=1 << 30, framed=False, fill=b"y\n", hello=True)
    inv = load_inventory(write_inventory(fleet3, tmp_path / "inv2.yaml", hosts={"h01": {"python": py}},
                                         command_timeout=600))
    with Fleet(inv, inv.hosts[:1], forks=1) as fleet:
        outs = run_bounded(fleet, lambda c: c.agent("ping"))
    assert outs[0].status == "failed"
    assert outs[0].message.startswith("h01: 'ping' answered something that is not an agent answer: b'y\\ny\\n"), \
        outs[0].message


# ---- defect 9: file descriptors above 1024 ----------------------------------------------------------

@pytest.mark.fleet
def test_commands_work_with_more_than_1024_open_files(fleet3: Sandbox, tmp_path: Path) -> None:
    """Before: channel fds above 1024 made select() raise 'filedescriptor out of range in select()'."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1400
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the hard open-files limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    held = []
    try:
        while len(held) < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        assert max(held) > 1024
        inv = load_inventory(write_inventory(fleet3, tmp_path / "inv.yaml"))
        with Fleet(inv, inv.hosts, forks=3) as fleet:
            outs = run_bounded(fleet, lambda c: c.agent("facts", {"gpus": False}))
            assert all(o.ok for o in outs), [o.message for o in outs]
            outs = run_bounded(fleet, lambda c: c.agent("ping"))
            assert all(o.ok for o in outs), [o.message for o in outs]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


FD_PROBE = """\
import resource, sys
from fleetctl.ops.runner import raise_fd_limit
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
note = raise_fd_limit(int(sys.argv[3]))
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
print(note or "")
"""


@pytest.mark.parametrize("soft,hard,hosts,want_soft,warns", [
    (1024, 8192, 1000, 256 + 4 * 1000, False),  # raised to what 1,000 hosts need
    (1024, 8192, 100, 1024, False),  # enough already: unchanged
    (512, 2048, 1000, 2048, True),  # raised to the hard limit, and says so
])
def test_open_files_limit_is_raised_for_big_fleets(soft: int, hard: int, hosts: int, want_soft: int,
                                                   warns: bool) -> None:
    cur_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if cur_hard != resource.RLIM_INFINITY and cur_hard < hard:
        pytest.skip(f"the hard open-files limit is {cur_hard}")
    p = subprocess.run([sys.executable, "-c", FD_PROBE, str(soft), str(hard), str(hosts)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got_soft, note = [*p.stdout.split("\n"), ""][:2]
    assert int(got_soft) == want_soft
    assert bool(note) == warns, note
    if warns:
        assert note.startswith(f"fleetctl: {hosts} hosts need about {256 + 4 * hosts} open files but the hard "
                               f"limit is {hard}")
