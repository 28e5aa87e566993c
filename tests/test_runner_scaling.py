"""The controller's per-host work stays linear in the fleet's size (issue 34.2): each test counts the
operations a step makes at a large N, never its time.

- Fleet.run's watchdog: a host that ends no longer makes it check every running host's deadline
  (N ends x N running: ~N^2/2 checks for a fleet that finishes together);
- planning: group_trees finds a host's tree group through an index, not by comparing the tree with
  every group so far (N distinct trees: ~N^2/2 comparisons), with the same groups as before.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from fleetctl.config.hosts import Host, Inventory
from fleetctl.ops import runner
from fleetctl.ops.runner import Fleet
from fleetctl.plan import trees
from fleetctl.protocol.answers import TreeIdentity


def _host(i: int) -> Host:
    return Host(name=f"h{i:04d}", address="127.0.0.1", port=22, user=None, identity_file=None, known_hosts=None,
                python="python3", sglang_dir=None, state_dir="~/.fleetctl", env={}, secret_env_keys=frozenset(),
                flags={}, launch_command=None, gpus=(), groups=(), connect_timeout=10.0, command_timeout=60.0)


class CountingTransport:
    """A host that is always connected; counts the watchdog's deadline checks (class-wide)."""

    checks = 0
    lock = threading.Lock()

    def __init__(self, host: Host, inventory: Inventory, accept_new_host_keys: bool = False) -> None:
        self.host = host
        self.aborted: str | None = None
        self.accepted_keys: list[str] = []

    def connect(self) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def overdue(self, now: float) -> str | None:
        with CountingTransport.lock:
            CountingTransport.checks += 1
        return None

    def abort(self, why: str) -> None:
        self.aborted = why

    def close(self) -> None:
        pass


def test_hosts_ending_together_do_not_make_the_watchdog_scan_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 300
    # the watchdog's own tick never comes during the test: every scan it makes is one a host's end caused
    monkeypatch.setattr(runner, "WATCH_EVERY", 3600.0)
    hosts = [_host(i) for i in range(n)]
    inv = Inventory(path=Path("inventory.yaml"), ssh_config=None, hosts=hosts)
    CountingTransport.checks = 0
    together = threading.Barrier(n)

    def step(conn: CountingTransport) -> str:
        together.wait()  # every host running, then all end at once
        return conn.host.name

    with Fleet(inv, hosts, forks=n, transport=CountingTransport) as fleet:
        outs = fleet.run(step)
    assert [o.detail for o in outs] == [h.name for h in hosts]
    # before: each end woke the watchdog, which checked every host still running (~n^2/2 = 45,000)
    assert CountingTransport.checks <= n, CountingTransport.checks


def _tree(rng: random.Random, i: int) -> TreeIdentity:
    network = rng.random() < 0.5
    return TreeIdentity(real=rng.choice(["/opt/a/sglang", "/opt/b/sglang", "/srv/v/sglang"]),
                        dev=rng.randrange(3), ino=rng.randrange(4), records_dir="/opt/.fleetctl-tree-sglang",
                        source=rng.choice(["nfs:/x", "nfs:/y"]) if network else None,
                        mount=rng.choice(["/opt", "/srv", None]) if network else None, network=network,
                        boot_id=rng.choice(["b1", "b2", None]), machine_id="m", hostname=rng.choice(["x", "y"]),
                        id=rng.choice(["", "t1", "t2", None]))


class _Facts:
    def __init__(self, t: TreeIdentity) -> None:
        self.state = type("S", (), {"tree": t, "deploys": [], "state_dir": "/s"})()


def _linear_groups(order: list[str], facts: dict[str, _Facts]) -> list[list[str]]:
    """group_trees' grouping as it was: the first group whose tree is same_tree as the host's."""
    groups: list[tuple[TreeIdentity, list[str]]] = []
    for name in order:
        t = facts[name].state.tree
        g = next((g for g in groups if trees.same_tree(g[0], t)), None)
        if g is None:
            groups.append((t, [name]))
        else:
            g[1].append(name)
    return [members for _, members in groups]


def test_tree_groups_are_the_first_matching_group_as_before() -> None:
    for seed in range(40):
        rng = random.Random(seed)
        order = [f"h{i}" for i in range(60)]
        facts = {n: _Facts(_tree(rng, i)) for i, n in enumerate(order)}
        got = trees.group_trees(order, facts)  # type: ignore[arg-type]
        want = _linear_groups(order, facts)
        assert sorted(g.members for g in {id(g): g for g in got.values()}.values()) == sorted(want)
        for members in want:
            assert got[members[0]].owner == members[0]


def test_grouping_distinct_trees_is_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 2000
    calls = [0]
    key = trees._key

    def counting_key(t: TreeIdentity) -> tuple[object, ...]:
        calls[0] += 1
        return key(t)

    monkeypatch.setattr(trees, "_key", counting_key)
    order = [f"h{i:04d}" for i in range(n)]
    facts = {name: _Facts(TreeIdentity(real="/opt/v/sglang", dev=1, ino=i, records_dir="/r", boot_id=f"boot-{i}"))
             for i, name in enumerate(order)}
    groups = trees.group_trees(order, facts)  # type: ignore[arg-type]
    assert len({id(g) for g in groups.values()}) == n
    # before: every host's tree compared with every group so far (two _key calls each: ~n^2 = 4,000,000)
    assert calls[0] <= 2 * n, calls[0]
