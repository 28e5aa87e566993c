"""Package trees reached by more than one inventory entry: which selected hosts share one, and where
such a tree's deploy records live (pure: from the hosts' facts; docs/user-guide.md "Shared trees").

Two entries for one machine (A/B servers on other GPUs) may import one tree; several machines may
mount one (NFS, a shared venv). A tree is deployed and rolled back once per command, by its first
host in inventory order (the owner); the others report that transaction as theirs. Identity:

  * a tree on a local filesystem is (boot id, st_dev, st_ino) of its package dir: the boot id is new
    at every boot and never equal on two machines, so two machines whose trees merely have equal
    inode numbers are never taken for one; two containers of one machine that see one tree are;
  * a tree on a network filesystem (nfs, cifs, ceph, fuse, ...) is (mount source, path inside the
    mount, st_ino): the same export seen from every client that mounts it;
  * the tree's id file (written into its records dir by its first shared deploy) overrides both: two
    trees with different ids (or one with an id, one without) are never one, and network trees with
    the same id and inode are one even when their mounts are spelled differently.

Records: when every member keeps its records in one state dir on one machine (and the tree is not on
a network filesystem), they stay there; else they live with the tree, where every host reaching it
reads them: beside it (<dir of the package>/.fleetctl-tree-<name>/), or inside it
(<package dir>/.fleetctl-tree/) when a host mounts the package dir itself (its parent is then not
shared). Once a tree has records there, every later deploy and rollback of it uses them.
"""

from __future__ import annotations

import posixpath
import threading
from dataclasses import dataclass, field

from fleetctl.config.hosts import Host
from fleetctl.model.facts import HostFacts
from fleetctl.protocol.answers import TreeIdentity


@dataclass
class TreeGroup:
    owner: str
    members: list[str]  # owner first, inventory order
    tree: TreeIdentity
    records_dir: str | None = None  # the tree's records dir when its records live beside it
    riders: list[str] = field(default_factory=list)  # members other than the owner

    @property
    def shared_records(self) -> bool:
        return self.records_dir is not None


def tree_of(facts: HostFacts | None) -> TreeIdentity | None:
    st = facts.state if facts is not None else None
    return st.tree if st is not None else None


def _key(t: TreeIdentity) -> tuple[object, ...]:
    if t.network:
        mount = (t.mount or "/").rstrip("/")
        inside = t.real[len(mount):] if t.real.startswith(mount) else t.real
        return ("net", t.source, inside, t.ino)
    return ("local", t.boot_id or f"{t.machine_id}/{t.hostname}", t.dev, t.ino)


def same_tree(a: TreeIdentity, b: TreeIdentity) -> bool:
    if bool(a.id) != bool(b.id) or (a.id and b.id and a.id != b.id):
        return False
    if _key(a) == _key(b):
        return True
    return bool(a.network and b.network and a.id and a.id == b.id and a.ino == b.ino)


TREE_DIR_INSIDE = ".fleetctl-tree"  # (remote/records.py TREE_DIR_INSIDE)


def _owner_view(tree: TreeIdentity, seen: str) -> str:
    """A records dir some member reported, as the owner reaches it (inside or beside its own path)."""
    if posixpath.basename(seen) == TREE_DIR_INSIDE:
        return posixpath.join(tree.real, TREE_DIR_INSIDE)
    return tree.records_dir if not tree.mount_root else posixpath.join(
        posixpath.dirname(tree.real), ".fleetctl-tree-" + posixpath.basename(tree.real))


def _state_place(facts: HostFacts) -> tuple[str | None, str | None]:
    st, t = facts.state, tree_of(facts)
    return (t.boot_id or t.hostname if t else None, st.state_dir if st else None)


def group_trees(order: list[str], facts: dict[str, HostFacts]) -> dict[str, TreeGroup]:
    """host -> its tree's group, for every host of `order` whose facts name its tree."""
    groups: list[TreeGroup] = []
    # the first group whose tree is same_tree as t, found through same_tree's two ways to be equal
    # (an index each) instead of comparing t with every group so far: N distinct trees were ~N^2/2
    # comparisons (tests/test_runner_scaling.py counts them)
    by_key: dict[tuple[object, ...], int] = {}  # (id, _key): ids equal (or both absent) and _key equal
    by_net: dict[tuple[object, ...], int] = {}  # (id, ino): both network, the same id, the same inode
    for name in order:
        t = tree_of(facts.get(name))
        if t is None:
            continue
        k = (t.id or "", _key(t))
        nk = (t.id, t.ino) if t.network and t.id else None
        found = [i for i in (by_key.get(k), by_net.get(nk) if nk is not None else None) if i is not None]
        if not found:
            by_key.setdefault(k, len(groups))
            if nk is not None:
                by_net.setdefault(nk, len(groups))
            groups.append(TreeGroup(name, [name], t))
        else:
            g = groups[min(found)]
            g.members.append(name)
            g.riders.append(name)
    out: dict[str, TreeGroup] = {}
    for g in groups:
        places = {_state_place(facts[m]) for m in g.members}
        here = [m.shared for x in g.members for m in (facts[x].state.deploys if facts[x].state else []) if m.shared]
        if here:  # records kept beside (or inside) the tree already: from the owner's view of them
            g.records_dir = _owner_view(g.tree, here[-1])
        elif len(places) > 1 or g.tree.network:
            # (a tree on a network filesystem is recorded with it even when one host is selected: the
            # hosts that mount it too read the record later.) Inside the package dir when any member
            # mounts that dir itself (its parent is not shared)
            inside = any(t.mount_root for x in g.members if (t := tree_of(facts[x])) is not None)
            g.records_dir = posixpath.join(g.tree.real, TREE_DIR_INSIDE) if inside else g.tree.records_dir
        for m in g.members:
            out[m] = g
    return out


_LANES: dict[tuple[object, ...], threading.Lock] = {}
_LANES_GUARD = threading.Lock()


def lane_key(host: Host, facts: HostFacts | None) -> tuple[object, ...]:
    """Which machine and state dir a host's transactions lock: as its facts say (the machine as the
    agent describes itself, the state dir expanded there), else as the inventory names them."""
    st = facts.state if facts is not None else None
    if st is not None and st.machine and st.state_dir:
        return ("machine", st.machine, st.state_dir)
    return ("inventory", host.address, host.port, host.user, host.state_dir)


def lane(key: tuple[object, ...]) -> threading.Lock:
    """One lock per machine and state dir (lane_key): inventory entries for one machine and one state
    dir (A/B servers, even through two sshd ports) take the host lock there one after the other,
    instead of one finding it held ("locked") when both start servers, deploy or roll back at once."""
    with _LANES_GUARD:
        return _LANES.setdefault(key, threading.Lock())
