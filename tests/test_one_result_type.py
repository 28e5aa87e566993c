"""One result type (issue 33.4): a host's status words are spelled in fleetctl/model/result.py only.

An ast scan of fleetctl/ops/, plan/, commands/, ui/ and model/ fails on a `Literal[...]` holding a
host status word (a module's own status type), on a dict row built by hand with a status word
(`{"status": "failed", ...}`) and on a dict shaped like a host's result (`{"host": ..., "status": ...}`,
whatever the values): a per-host outcome, a plan's decision for a host included, is a `HostResult`
there, its status typed `Status`, its own fields a typed detail (a plan's own fields, a `Decided`; explain's
`Explained`, history's `RecordedDetail`), and its --json row `HostResult.row()`. The allow-list names
each exception and why; a stale entry fails too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from fleetctl.model.result import OK_STATES, STATES, HostResult, host_row

ROOT = Path(__file__).resolve().parent.parent / "fleetctl"
SCANNED = ("ops", "plan", "commands", "ui", "model")
WORDS = frozenset({"ok", "failed", "unreachable", "skipped", "changed", "unchanged", "refused"})

# (file relative to fleetctl/, the Literal's name, "dict" or "host-row") -> why it is not a host's status
ALLOWED: dict[tuple[str, str], str] = {
    ("model/result.py", "Status"): "THE status words",
    ("model/result.py", "host-row"): "HostResult.head: the one place a result's host and status meet in a dict",
    ("ops/launch.py", "host-row"): "InstanceLaunch.to_json: one server instance's row (its InstanceStatus), "
                                   "inside a host's Launched",
    ("ops/ledger.py", "host-row"): "the ledger's stored host rows, read back as HostResult by model/recorded.py",
    ("ops/launch.py", "InstanceStatus"): "one server instance's outcome (ready, timeout, ...), inside a host's Launched",
    ("ops/gpu_check.py", "PhaseStatus"): "one throwaway server of a gpu-check, inside a host's Checked",
}


def _name_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    """The name a Literal is bound to (`X = Literal[...]`, `x: Literal[...]`), else '?'."""
    p = parents.get(node)
    while p is not None and not isinstance(p, (ast.Assign, ast.AnnAssign, ast.arg, ast.FunctionDef)):
        p = parents.get(p)
    if isinstance(p, ast.Assign) and isinstance(p.targets[0], ast.Name):
        return p.targets[0].id
    if isinstance(p, ast.AnnAssign) and isinstance(p.target, ast.Name):
        return p.target.id
    if isinstance(p, ast.arg):
        return p.arg
    return "?"


def spelled(source: str) -> list[tuple[str, int, str]]:
    """(name, "dict" or "host-row", line, words) of each status spelled, and each dict shaped like a
    host's result."""
    tree = ast.parse(source)
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "Literal":
            words = {c.value for c in ast.walk(n.slice) if isinstance(c, ast.Constant)} & WORDS
            if words:
                found.append((_name_of(n, parents), n.lineno, ", ".join(sorted(words))))
        elif isinstance(n, ast.Dict):
            keys = {k.value for k in n.keys if isinstance(k, ast.Constant)}
            if {"host", "status"} <= keys:
                found.append(("host-row", n.lineno, "host, status"))
            for k, v in zip(n.keys, n.values, strict=True):
                if (isinstance(k, ast.Constant) and k.value == "status" and isinstance(v, ast.Constant)
                        and v.value in WORDS):
                    found.append(("dict", n.lineno, v.value))
    return found


def test_no_status_words_of_their_own_in_ops_and_plan() -> None:
    seen: set[tuple[str, str]] = set()
    bad = []
    for sub in SCANNED:
        for path in sorted((ROOT / sub).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, lineno, words in spelled(path.read_text()):
                if (rel, name) in ALLOWED:
                    seen.add((rel, name))
                else:
                    bad.append(f"fleetctl/{rel}:{lineno}: {name} spells host status words ({words}): "
                               "use HostResult and Status from fleetctl/model/result.py")
    assert not bad, "\n".join(bad)
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"allow-list entries no longer needed: {stale}"


def test_the_scan_finds_a_planted_status_type_and_row() -> None:
    planted = (
        "from typing import Literal\n"
        "MyStatus = Literal['ok', 'failed']\n"
        "def f(x: Literal['running', 'unreachable']) -> dict:\n"
        "    return {'host': 'h', 'status': 'skipped'}\n"
        "Fine = Literal['pristine', 'drifted']\n"
    )
    assert sorted((n, w) for n, _, w in spelled(planted)) == [
        ("MyStatus", "failed, ok"), ("dict", "skipped"), ("host-row", "host, status"), ("x", "unreachable")]


def test_the_scan_finds_a_planted_dict_shaped_host_result() -> None:
    """A new per-host result made as a dict (explain's rows were, before Explained), its status taken
    from elsewhere (no word to see), fails the scan, here planted in a copy of explain's command."""
    planted = (
        "def explain_rows(fleet, gathered):\n"
        "    rows = []\n"
        "    for h in fleet.hosts:\n"
        "        o = gathered.outcomes[h.name]\n"
        "        rows.append({'host': h.name, 'status': o.status, 'reason': o.message, 'covered': None})\n"
        "    return rows\n"
    )
    assert [(n, w) for n, _, w in spelled(planted)] == [("host-row", "host, status")]
    real = (ROOT / "commands" / "deploys_impl.py").read_text()
    assert not [x for x in spelled(real)], "deploys_impl.py is clean before the plant"
    at = real.index("def explain(")
    got = spelled(real[:at] + planted + "\n\n" + real[at:])
    assert [(n, w) for n, _, w in got] == [("host-row", "host, status")], got


def test_status_words_are_spelled_once() -> None:
    assert len(STATES) == len(set(STATES)) and WORDS <= set(STATES) and OK_STATES <= set(STATES)
    # a row's ok follows the status unless the caller says otherwise
    assert host_row({"host": "h", "status": "noop"})["ok"] is True
    assert host_row({"host": "h", "status": "refused"})["ok"] is False
    r = HostResult("h", "unreachable", "no route", None, reference="host-unreachable").row()
    assert (r["ok"], r["state"], r["reference"]) == (False, "unreachable", "host-unreachable")


def own_result_classes(source: str) -> list[str]:
    """Classes that declare a host's result fields of their own (`host` and `status` or `message`)
    instead of being a HostResult (a plan: `Decided`)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ClassDef):
            names = {s.target.id for s in n.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            if "host" in names and names & {"status", "message", "reason"}:
                found.append(n.name)
    return found


def test_plans_are_host_results() -> None:
    """Deploy's, rollback's, launch's and gpu-check's plans are HostResults (host, status, message,
    reference spelled once, in model/result.py); no class in ops/ or plan/ declares a host and a status
    beside them. Planted: a plan with its own host and status fails."""
    from fleetctl.model.result import Decided
    from fleetctl.ops.gpu_check import CheckPlan
    from fleetctl.ops.launch import LaunchPlan
    from fleetctl.ops.rollback import RollbackPlan
    from fleetctl.plan.deploy import HostPlan

    for cls in (HostPlan, RollbackPlan, LaunchPlan, CheckPlan):
        assert issubclass(cls, Decided) and issubclass(cls, HostResult), cls
    # InstanceLaunch: one server instance's outcome (its InstanceStatus), inside a host's Launched
    bad = [f"{p.relative_to(ROOT)}: {c}" for sub in ("ops", "plan") for p in sorted((ROOT / sub).rglob("*.py"))
           for c in own_result_classes(p.read_text()) if c != "InstanceLaunch"]
    assert not bad, bad
    assert own_result_classes("class P:\n    host: str\n    status: str = 'noop'\n    files: list = []\n") == ["P"]
    # a plan's row: host, ok, state, message first, its own fields after; not timed
    hp = HostPlan("h01", "refused", "h01: drifted", version="0.5.9")
    row = hp.row()
    assert (row["host"], row["ok"], row["state"], row["message"], row["reason"], row["version"]) == (
        "h01", False, "refused", "h01: drifted", "h01: drifted", "0.5.9")
    assert "elapsed" not in row and LaunchPlan("h02").status == "start" and CheckPlan("h02").status == "run"
