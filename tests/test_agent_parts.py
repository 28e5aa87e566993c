"""The agent's parts (fleetctl/remote): one namespace on the host, ordinary modules locally. Each part
names what it takes from another in its local import block, takes no `_private` name, defines no
name another part defines (they would overwrite each other on the host) and, at module level, uses
only parts shipped before it. Production code reads no test fault keys: the fault points are the
test harness's one hook (fleetctl/remote/faults.py)."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

from fleetctl import remote

HERE = Path(remote.__file__).parent
SHIPPED = [*remote.CORE, *(n for names in remote.ON_DEMAND.values() for n in names)]
ALL = [*SHIPPED, *(n for names in remote.TEST_PARTS.values() for n in names)]


def _local_blocks(tree: ast.AST) -> list[ast.If]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.If) and remote._local_only(n)]


def _top_defs(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for s in tree.body:
        if isinstance(s, (ast.FunctionDef, ast.ClassDef)):
            out.add(s.name)
        elif isinstance(s, ast.Assign):
            out.update(t.id for t in s.targets if isinstance(t, ast.Name))
        elif isinstance(s, ast.Try):
            out.update(t.id for n in ast.walk(s) if isinstance(n, ast.Assign) for t in n.targets
                       if isinstance(t, ast.Name))
    return out


def parts() -> dict[str, ast.Module]:
    return {n: ast.parse((HERE / n).read_text(encoding="utf-8")) for n in ALL}


def test_each_part_names_what_it_takes_and_no_private_name_crosses() -> None:
    trees = parts()
    owner: dict[str, str] = {}
    for name, tree in trees.items():
        for d in _top_defs(tree):
            assert d not in owner, f"{d} is defined by {owner[d]} and {name}: one namespace on the host"
            owner[d] = name
    for name, tree in trees.items():
        imported: dict[str, str] = {}
        for block in _local_blocks(tree):
            for node in ast.walk(block):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fleetctl.remote"):
                    src = node.module.rsplit(".", 1)[1] + ".py"
                    for a in node.names:
                        assert a.name != "*", f"{name}: a star import names nothing"
                        assert not a.name.startswith("_"), f"{name} takes the private {a.name} from {src}"
                        assert owner.get(a.name) == src, f"{name} imports {a.name} from {src}, defined in {owner.get(a.name)}"
                        imported[a.name] = src
        mine = _top_defs(tree)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for u in sorted(used - mine - set(dir(builtins))):
            if u in owner:
                assert u in imported, f"{name} uses {u} of {owner[u]} without naming it in its import block"


def test_module_level_code_uses_only_earlier_parts() -> None:
    """On the host the parts run in shipping order: a part's module-level import block names only
    parts before it (CORE's order; an on-demand part any core part or one before it in its group)."""
    trees = parts()
    for i, name in enumerate(SHIPPED):
        earlier = {n[:-3] for n in SHIPPED[:i]}
        for s in trees[name].body:
            if isinstance(s, ast.If) and remote._local_only(s):
                for node in ast.walk(s):
                    if isinstance(node, ast.ImportFrom) and node.module:
                        src = node.module.rsplit(".", 1)[1]
                        assert src in earlier, f"{name} takes from {src}, shipped after it"


def test_shipped_text_keeps_no_local_block_nor_docstring() -> None:
    text = remote.agent_text().decode()
    assert "fleetctl.remote" not in text and "!= 'fleetctl_agent'" not in text
    assert "Agent part" not in text and "Imports the agent avoids" not in text
    for part in remote.ON_DEMAND:
        assert "fleetctl.remote" not in remote.part_text(part).decode()


def test_production_code_reads_no_fault_keys() -> None:
    """`_fault` appears in fleetctl/ only in the harness's hook (remote/faults.py): no request key of
    a test is read by code fleetctl runs, and faults.py is shipped by no production path."""
    root = HERE.parent
    hits = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py")) if p.name != "faults.py"
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "_fault" in line]
    assert hits == []
    assert "faults.py" not in SHIPPED
    assert not re.search(rb"\b_fault\b", remote.agent_source())


@pytest.mark.parametrize("planted", ["_private_name", "private_from_core"])
def test_the_crossing_check_fails_on_a_planted_crossing(planted: str, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """The check above can fail: a part that takes a private name, or uses another part's name
    without naming it, is reported."""
    for n in ALL:
        (tmp_path / n).write_text((HERE / n).read_text(encoding="utf-8"), encoding="utf-8")
    files = tmp_path / "files.py"
    text = files.read_text(encoding="utf-8")
    if planted == "_private_name":
        text = text.replace("from fleetctl.remote.core import ", "from fleetctl.remote.core import _exit_code, ", 1)
    else:
        text += "\n\ndef planted():\n    return jdumps({})\n"
    files.write_text(text, encoding="utf-8")
    monkeypatch.setattr(__import__(__name__), "HERE", tmp_path)
    with pytest.raises(AssertionError):
        test_each_part_names_what_it_takes_and_no_private_name_crosses()


def _on_demand_imports(part: str) -> set[str]:
    """The other on-demand parts whose files `part`'s files take names from (their local blocks)."""
    owner = {n: p for p, names in remote.ON_DEMAND.items() for n in names}
    out: set[str] = set()
    for name in remote.ON_DEMAND[part]:
        for block in _local_blocks(ast.parse((HERE / name).read_text(encoding="utf-8"))):
            for node in ast.walk(block):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fleetctl.remote."):
                    src = node.module.rsplit(".", 1)[1] + ".py"
                    if owner.get(src, part) != part:
                        out.add(owner[src])
    return out


def test_a_part_that_takes_from_another_on_demand_part_needs_it_and_is_sent_after_it() -> None:
    """On the host a part's functions find another part's names only if that part was loaded: every
    on-demand part a part takes from is in PART_NEEDS, earlier in ON_DEMAND, and comes along with it
    (parts_for), while a deploy's restart reminder (the `servers`/`discover` hooks) brings only the
    small serverfacts part."""
    from fleetctl.transport.session import parts_for

    order = list(remote.ON_DEMAND)
    for part in remote.ON_DEMAND:
        taken = _on_demand_imports(part)
        assert taken <= set(remote.PART_NEEDS.get(part, ())), (part, taken)
        assert all(order.index(n) < order.index(part) for n in taken), (part, taken)
    assert _on_demand_imports("servers") == {"serverfacts"}  # (the check above has something to check)
    assert parts_for("server_start", {}, set()) == ["serverfacts", "servers"]
    assert parts_for("server_start", {}, {"serverfacts"}) == ["servers"]
    reminder = {"then_facts": {"with": ["servers", "discover"]}}
    assert parts_for("deploy", reminder, set()) == ["serverfacts"]
    assert parts_for("facts", {"with": ["state"]}, set()) == []
