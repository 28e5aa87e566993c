"""The floors of fleetctl (issue 33.1): which package may import which, read from the source with `ast`.

Every import counts: at module level, inside functions, under `if TYPE_CHECKING:`. A module's home is
its first package under fleetctl/ (`fleetctl.plan.deploy` -> `plan`); the three top-level modules are
homes of their own. An arrow runs from the importing home to the imported one and may only run DOWN
the table (or stay on its floor); between homes there is no circle. docs/architecture.md shows the
same table.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# top floor first; homes on one floor are side by side (neither is above the other)
FLOORS: tuple[tuple[str, ...], ...] = (
    ("__main__", "cli"),  # the entry point: argv -> a command, errors -> one line and an exit code
    ("commands",),  # each command's options, and what it runs (the command table)
    ("ui", "ops", "sandbox"),  # what a person sees | applying plans to hosts | the local test fleet
    ("plan",),  # pure: facts + playbook in, a plan dataclass out
    ("model",),  # typed host facts and results, read through a transport
    ("transport", "patching", "containers"),  # reaching a host's agent | the strict diff engine and
    # playbook authoring | a host's container: its runtime's answers, a server that is its main process
    ("config",),  # inventory and playbook: validated, kept
    ("engines",),  # the Engine interface, its one implementation (SGLang), the real wheels
    ("protocol",),  # the agent protocol's names and answer types, checked once
    ("errors", "fleetctl"),  # the error types; the package's own version
)
# homes outside the floors: who alone may import them
APART: Mapping[str, frozenset[str]] = {
    # stdlib-only code sent to hosts: the agent builder's user (the session), the seal's source hash,
    # and the sandbox's simulator (which runs the agent's own probe to imitate a host, and finds the
    # model's config.json where the agent would, for the constructor log lines it prints)
    "remote": frozenset({"fleetctl.transport.session", "fleetctl.ops.seal", "fleetctl.sandbox.simulator",
                         "fleetctl.sandbox.startup_logs"}),
}
# arrows that still run against the table, each with why it is still there; the test fails when one is
# gone (take it off) or a new one appears. (importing module, imported module) -> reason
KNOWN: Mapping[tuple[str, str], str] = {}  # none left (issue 33.7)


def floor_of(home: str) -> int:
    for i, homes in enumerate(FLOORS):
        if home in homes:
            return i
    raise KeyError(home)


@dataclass(frozen=True)
class Arrow:
    src: str  # importing module
    dst: str  # imported module (or package)
    line: int

    @property
    def where(self) -> str:
        return f"{self.src}:{self.line} -> {self.dst}"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def arrows_of(module: str, source: str, is_package: bool, known: Iterable[str] = ()) -> list[Arrow]:
    """Every fleetctl import in `source`, wherever it stands (function bodies and TYPE_CHECKING too).
    `from pkg import name` points at `pkg.name` when that is a module in `known`, else at `pkg`."""
    known = set(known)
    pkg = module if is_package else module.rpartition(".")[0]
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            out += [Arrow(module, a.name, n.lineno) for a in n.names if a.name.split(".")[0] == "fleetctl"]
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
            else:
                target = n.module or ""
            if target.split(".")[0] != "fleetctl":
                continue
            for a in n.names:
                full = f"{target}.{a.name}"
                out.append(Arrow(module, full if full in known else target, n.lineno))
    return out


def all_arrows(root: Path) -> list[Arrow]:
    files = sorted(root.rglob("*.py"))
    known = {module_name(root, p) for p in files}
    out = []
    for p in files:
        out += arrows_of(module_name(root, p), p.read_text(encoding="utf-8"), p.name == "__init__.py", known)
    return out


def home(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def up_arrows(arrows: Iterable[Arrow], known: Mapping[tuple[str, str], str] = KNOWN) -> list[str]:
    """Arrows that run up a floor, or into a home apart from one not allowed to (`known` ones aside)."""
    bad = []
    for a in arrows:
        hs, hd = home(a.src), home(a.dst)
        if hs == hd or (a.src, a.dst) in known:
            continue
        if hd in APART:
            if a.src not in APART[hd]:
                bad.append(f"{a.where}: {hd}/ stands apart (imported only by {sorted(APART[hd])})")
        elif hs in APART:
            bad.append(f"{a.where}: {hs}/ stands apart and imports nothing of fleetctl")
        elif floor_of(hd) < floor_of(hs):
            bad.append(f"{a.where}: up from {hs} (floor {floor_of(hs)}) to {hd} (floor {floor_of(hd)})")
    return bad


def circles(arrows: Iterable[Arrow], known: Mapping[tuple[str, str], str] = KNOWN,
            node: Callable[[str], str] = home) -> list[list[str]]:
    """The strongly connected groups (more than one node) of the graph of homes (Tarjan); with
    `node=str`, of modules (a package is its __init__)."""
    graph: dict[str, set[str]] = {}
    for a in arrows:
        if (a.src, a.dst) in known:
            continue
        s, d = node(a.src), node(a.dst)
        if s != d:
            graph.setdefault(s, set()).add(d)
            graph.setdefault(d, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
