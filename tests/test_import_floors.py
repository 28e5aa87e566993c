"""The house by floors (issue 33.1/7): every import in fleetctl/ runs down the floor table of
tests/import_floors.py (docs/architecture.md shows the same table), no circle joins two homes, the
top level holds only __main__, cli and errors, only ui/ imports rich, and an engine package imports
only the engine base, the protocol and errors."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import import_floors as F

import fleetctl

ROOT = Path(fleetctl.__file__).parent


@functools.cache
def _arrows() -> tuple[F.Arrow, ...]:
    return tuple(F.all_arrows(ROOT))


def test_every_home_has_a_floor_and_the_top_level_is_three_modules() -> None:
    homes = {p.name if p.is_dir() else p.stem for p in ROOT.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    homes.discard("__init__")
    placed = {h for floor in F.FLOORS for h in floor} | set(F.APART)
    assert homes <= placed, f"homes with no floor in tests/import_floors.py: {sorted(homes - placed)}"
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py", "__main__.py", "cli.py", "errors.py"]


def test_no_arrow_runs_up_a_floor() -> None:
    arrows = _arrows()
    assert F.up_arrows(arrows) == []
    seen = {(a.src, a.dst) for a in arrows}
    assert not set(F.KNOWN) - seen, f"known up-arrows that are gone (take them off KNOWN): {set(F.KNOWN) - seen}"


def test_no_circle_between_homes() -> None:
    assert F.circles(_arrows()) == []


def test_no_circle_between_modules() -> None:
    """Not between two modules of one home either, lazy and TYPE_CHECKING imports counted: an engine's
    module reading its releases does not go through the engine factory (engines/sglang/sources.py), the
    agent's core caches a part with atomic.py, not files.py, and safetext.py hands out no rich class."""
    assert F.circles(_arrows(), node=str) == []
    planted = [*_arrows(), F.Arrow("fleetctl.remote.atomic", "fleetctl.remote.core", 1)]  # core -> atomic already
    assert F.circles(planted, node=str) == [["fleetctl.remote.atomic", "fleetctl.remote.core"]]


def test_the_checker_sees_a_planted_up_arrow_and_circle() -> None:
    """fleetctl/ with one import planted inside a function body of plan/deploy.py (plan -> ops) fails both checks."""
    planted = (ROOT / "plan" / "deploy.py").read_text() + "\n\ndef _planted() -> None:\n    from fleetctl.ops import deploy\n"
    known = {a.src for a in _arrows()} | {a.dst for a in _arrows()}
    arrows = [a for a in _arrows() if a.src != "fleetctl.plan.deploy"]
    arrows += F.arrows_of("fleetctl.plan.deploy", planted, False, known)
    bad = F.up_arrows(arrows)
    last = len(planted.splitlines())
    assert bad == [f"fleetctl.plan.deploy:{last} -> fleetctl.ops.deploy: up from plan (floor 3) to ops (floor 2)"]
    assert any({"ops", "plan"} <= set(c) for c in F.circles(arrows))  # ops imports plan: now a circle


def test_the_walker_finds_every_kind_of_import() -> None:
    src = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\nimport fleetctl.ops.deploy\n"
           "from fleetctl.model import facts\nfrom . import sibling\nfrom ..config import hosts\n"
           "if TYPE_CHECKING:\n    from fleetctl.ui.render import x\n"
           "def f():\n    from fleetctl.engines import engine\n")
    got = [(a.dst, a.line) for a in F.arrows_of("fleetctl.plan.deploy", src, False,
                                                 {"fleetctl.model.facts", "fleetctl.plan.sibling"})]
    assert got == [("fleetctl.ops.deploy", 3), ("fleetctl.model.facts", 4), ("fleetctl.plan.sibling", 5),
                   ("fleetctl.config", 6), ("fleetctl.ui.render", 8), ("fleetctl.engines", 10)]


def _imports_of(path: Path) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            out.add(n.module)
    return out


def test_only_ui_imports_rich() -> None:
    found = {p.relative_to(ROOT).as_posix() for p in sorted(ROOT.rglob("*.py"))
             if p.relative_to(ROOT).parts[0] != "ui" and any(m.split(".")[0] == "rich" for m in _imports_of(p))}
    assert found == set()


def test_an_engine_imports_only_its_base_the_protocol_and_errors() -> None:
    """An engine package (engines/<name>/) may import itself, engines.base, engines.wheel_cache (its
    releases' pristine sources), the protocol's types and errors, never the factory nor engines.wheels
    (which binds the factory's engine); in engines/ outside an engine package only the factory
    (engines/__init__.py) names an engine package."""
    allowed = ("fleetctl.engines.base", "fleetctl.engines.wheel_cache", "fleetctl.protocol", "fleetctl.errors")
    bad = []
    for a in _arrows():
        parts = a.src.split(".")
        if parts[:2] != ["fleetctl", "engines"] or (a.src, a.dst) in F.KNOWN:
            continue
        own = ".".join(parts[:3])
        if len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("base", "wheels", "wheel_cache")):  # an engine
            ok = any(a.dst == m or a.dst.startswith(m + ".") for m in (*allowed, own))
        else:  # the base, the wheels, the factory
            ok = a.src == "fleetctl.engines" or not (a.dst.startswith("fleetctl.engines.") and
                                                     a.dst.split(".")[2] not in ("base", "wheels", "wheel_cache"))
        if not ok:
            bad.append(a.where)
    assert bad == []


MAX_FUNCTION_LINES = 100
LONG_LEFT: set[str] = set()  # none left (issue 33.7)


def long_functions(root: Path) -> dict[str, int]:
    """`file:function` -> lines, for every function (methods and nested ones too) over the limit,
    outside the sandbox (its simulator imitates a whole server)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith("sandbox/"):
            continue
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno is not None:
                size = n.end_lineno - n.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    out[f"{rel}:{n.name}"] = size
    return out


def test_no_function_is_over_100_lines(tmp_path: Path) -> None:
    found = long_functions(ROOT)
    assert set(found) - LONG_LEFT == set(), {k: v for k, v in found.items() if k not in LONG_LEFT}
    assert LONG_LEFT - set(found) == set(), "now short enough: take it off LONG_LEFT"
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * 100)
    assert long_functions(tmp_path) == {"m.py:f": 101}


def test_the_docs_show_the_same_floors() -> None:
    """docs/architecture.md's floor table names the same homes on the same floors, in order."""
    import re

    doc = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = doc.split("## The house by floors", 1)[1].split("```")[1]
    rows = [re.match(r"^(\d+|apart)\s+(\S+(?:(?:, | \| )\S+)*)\s{2,}", ln) for ln in table.splitlines()]
    shown = [(m.group(1), tuple(re.split(r", | \| ", m.group(2)))) for m in rows if m]
    assert shown == [*((str(i), tuple(h for h in f if h != "fleetctl")) for i, f in enumerate(F.FLOORS)),
                     *(("apart", (h,)) for h in F.APART)]


def test_plan_is_pure() -> None:
    """plan/ takes facts and a playbook and returns plan dataclasses: it imports no transport, and no
    signature there takes a transport, a fleet or a connection."""
    bad = [a.where for a in _arrows() if F.home(a.src) == "plan" and F.home(a.dst) == "transport"]
    for p in sorted((ROOT / "plan").glob("*.py")):
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs]
                text = " ".join(ast.unparse(a.annotation) for a in args if a.annotation)
                if any(w in text for w in ("Transport", "Fleet", "Connection")) or any(a.arg == "conn" for a in args):
                    bad.append(f"plan/{p.name}:{n.lineno}: {n.name}")
    assert bad == []
