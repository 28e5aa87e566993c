"""The in-process host (tests/fakehost.py) answers as the same agent run as a process does, and the
rule that keeps sshd behind the `fleet` marker holds."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from fakehost import FakeHosts
from test_transport_local import PLAYBOOK, inventory, make_host

from fleetctl.config.playbook import load_playbook
from fleetctl.ops.deploy import gather
from fleetctl.ops.runner import Fleet
from fleetctl.transport.local import LocalTransport

# what differs between two agent processes by nature: their pid and the time they answered
VOLATILE = ("pid", "time", "elapsed", "took", "at", "now", "start", "started")


def _plain(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: _plain(v) for k, v in o.items() if k not in VOLATILE}
    if isinstance(o, list):
        return [_plain(v) for v in o]
    return o


def test_facts_are_the_agent_process_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts of one host asked through a real agent process (transport/local.py) and through the
    in-process host are the same document: its python, sys.path-based answers, environment, package,
    state and hashes (the stand-ins for os/sys give the agent its process's view)."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    inv = inventory(tmp_path, {"t01": make_host(tmp_path)})
    pb = load_playbook(PLAYBOOK)
    fake = FakeHosts()
    got = {}
    for name, factory in (("process", lambda h, i, a: LocalTransport(h, i)), ("in-process", fake.transport)):
        with Fleet(inv, inv.select(None), forks=1, transport=factory) as fleet:
            g = gather(fleet, pb)
            assert g.outcomes["t01"].ok, g.outcomes["t01"].message
            got[name] = _plain(g.facts["t01"].to_json())
    assert got["in-process"] == got["process"]
    assert fake.started["t01"] and all("-c" in argv for argv in fake.started["t01"])


def test_an_agent_session_has_a_pid_of_its_own(tmp_path: Path) -> None:
    """One live pid per agent session (locks and liveness checks see a process), gone when the
    session ends; killing it ends the session, and the next call starts a new one."""
    inv = inventory(tmp_path, {"t01": make_host(tmp_path)})
    host = inv.select("t01")[0]
    fake = FakeHosts()
    conn = fake.transport(host, inv)
    try:
        first = conn.agent("ping").pid
        assert first != os.getpid() and conn.agent("ping").pid == first
        os.kill(first, signal.SIGKILL)
        fake.agents["t01"][0].standin.wait(30)  # (the signal is delivered: the pid is dead)
        second = conn.agent("ping").pid
        assert second != first
    finally:
        conn.close()
    a, b = fake.agents["t01"]
    assert a.exit_status(0) == -signal.SIGKILL  # the session whose pid was killed
    assert b.exit_status(30) == 0 and b.standin.wait(30) is not None  # ended with its stdin: pid gone


def test_a_host_that_is_down_is_unreachable(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {"t01": make_host(tmp_path), "t02": make_host(tmp_path, "t02")})
    fake = FakeHosts()
    fake.down.add("t02")
    with Fleet(inv, inv.select(None), forks=2, transport=fake.transport) as fleet:
        outs = {o.host: o for o in fleet.run(lambda c: c.agent("ping"))}
    assert outs["t01"].ok and outs["t02"].status == "unreachable", outs


def test_a_test_without_the_fleet_marker_cannot_start_sshd(tmp_path: Path) -> None:
    """(conftest.py _sshd_only_under_the_fleet_marker) so `-m "not fleet"` starts no sshd."""
    from fleetctl.sandbox import sshd

    with pytest.raises(pytest.fail.Exception, match="without the `fleet` marker"):
        sshd.start("/usr/sbin/sshd", None, {})  # type: ignore[arg-type]


def test_a_child_the_agent_starts_gets_the_hosts_environment(tmp_path: Path) -> None:
    """A child the agent starts without `env=` (supervisorctl, git, journalctl) inherits the agent
    process's environment on a host, so in-process it gets the host's login environment, not this
    test process's: the agent's `import subprocess` is the session's view."""
    inv = inventory(tmp_path, {"t01": make_host(tmp_path)})
    host = inv.select("t01")[0]
    fake = FakeHosts()
    conn = fake.transport(host, inv)
    try:
        conn.agent("ping")
        proc = fake.agents["t01"][0]
        proc.env["FLEETCTL_TEST_HOST_ONLY"] = "from-the-host"
        assert "FLEETCTL_TEST_HOST_ONLY" not in os.environ
        sp = proc._namespace(None, "")["__builtins__"]["__import__"]("subprocess")
        argv = ["/bin/sh", "-c", 'printf %s "$FLEETCTL_TEST_HOST_ONLY"']
        assert sp.run(argv, stdout=sp.PIPE).stdout == b"from-the-host"
        assert sp.check_output(argv) == b"from-the-host"
        p = sp.Popen(argv, stdout=sp.PIPE)
        assert p.communicate()[0] == b"from-the-host"
        # an explicit env= is the caller's, as on a host
        assert sp.run(argv, stdout=sp.PIPE, env={"FLEETCTL_TEST_HOST_ONLY": "given"}).stdout == b"given"
    finally:
        conn.close()


def test_the_hello_names_the_parts_cached_on_the_fake_host(fake_sandbox: Any, ledger_dir: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The bootstrap's argv carries the keys of the on-demand parts after its fifth word, and the hello
    says which of them the host's cache holds: the fake passes every word, so a second `servers`
    finds the part it kept (serverfacts: what `servers` reads; was: cut to five words, every session said "none cached")."""
    import sys

    from fleetctl.cli import main
    from fleetctl.remote import part_key

    sb = fake_sandbox(hosts=1, versions=("0.5.9",))
    fake = sb.fake
    for _ in range(2):
        assert main(["servers", "-i", str(sb.inventory_path)]) == 0, capsys.readouterr()
    last = fake.agents["h01"][-1]
    assert part_key("serverfacts") in last.args[5:], last.args
    cache = Path(sb.hosts["h01"].state_dir) / "cache"
    kept = [cache / f"part-{part_key('serverfacts')}.{x}" for x in (sys.implementation.cache_tag, "src")]
    assert any(f.is_file() for f in kept), sorted(p.name for p in cache.iterdir())
    i = last.args[5:].index(part_key("serverfacts"))
    assert last._parts_here(str(cache)) & (1 << i), (last.args, sorted(p.name for p in cache.iterdir()))
