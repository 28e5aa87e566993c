"""No test depends on timing (issue 30 item 8): the suite must pass on a loaded 2-core machine.

A test waits for what the code signals (tests/eventpipe.py) or, for a state nothing signals, polls it
through tests/waiting.py under a hang bound; it never sleeps to let something happen, and never asserts
how long something took. This scans every Python file in tests/ (with ast, so strings holding scripts
for a host are not code here) and fails on:

- a call of `time.sleep` (or `sleep` imported from time), outside the allow-list below;
- an `assert` comparing a duration: a subtraction of two clock readings (time.time / monotonic /
  perf_counter), or a name taken from one (`took`, `t0`, `elapsed`...), with `<`/`<=`/`>`/`>=`.
  CPU time (time.thread_time / process_time) is not on the list: it does not grow with the load.

The allow-list is explicit, each entry with why the sleep is not synchronisation; an entry no longer
needed fails too, so the list never outlives its reasons.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# (file, enclosing function): why that sleep is not a test waiting for something to happen
ALLOWED_SLEEPS: dict[tuple[str, str], str] = {
    ("waiting.py", "until"): "the one poll of a state nothing signals, under a hang bound",
    ("conftest.py", "no_sshd_left_behind"): "teardown: gives a test's sshd up to 60 s to exit, then kills it "
                                          "(escalation, never a test outcome)",
    ("test_hostile_bounds.py", "endless"): "the host's own work between its steps (workload): the per-host "
                                           "deadline is enforced between steps, so a run with none never ends",
    ("test_launch.py", "test_servers_started_by_hand_are_discovered_and_named_after_deploy_and_rollback"):
        "clock resolution: a file changed in the same second as a process started is not called newer; "
        "a loaded machine only lets more time pass",
    ("test_containers.py", "test_a_server_that_is_the_containers_main_process_is_restarted_by_restarting_it"):
        "clock resolution (1 s), as above",
    ("test_containers.py", "_main_process_rolling"): "clock resolution (1 s), as above",
    ("test_verify_logs.py", "test_redeploy_without_restart_says_restart_needed"):
        "clock ordering: the deploy's files are written after the server started (more load, more apart)",
    ("test_verify_logs.py", "test_a_launch_command_that_replays_an_old_log_cannot_pass"):
        "clock ordering: the replayed lines must be older than the new process by more than the clock slack",
    ("test_papercuts.py", "test_history_collapses_no_op_runs_and_names_the_playbook"):
        "distinct start times order the history (clock ordering, not synchronisation)",
    ("test_papercuts.py", "test_tables_off_a_terminal_fit_80_columns_and_json_keeps_everything"):
        "distinct start times order the history (clock ordering, not synchronisation)",
}

# (file, enclosing function): why that assert on a duration holds on any machine
ALLOWED_DURATION_ASSERTS: dict[tuple[str, str], str] = {
    ("test_facts_fleet.py", "test_an_authentication_timeout_is_retried_and_named"):
        "a lower bound (three attempts each waited out the bound): load only makes it larger",
}

CLOCKS = {"time", "monotonic", "perf_counter", "monotonic_ns", "perf_counter_ns", "time_ns"}
DURATION_NAMES = {"took", "elapsed", "duration"}  # (and any name assigned a clock reading or a difference of one)


def _is_clock(node: ast.AST) -> bool:
    """time.time() / time.monotonic() / time.perf_counter() (or the bare name imported from time)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "time":
        return f.attr in CLOCKS
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}


def _is_sleep(node: ast.Call, sleep_names: set[str]) -> bool:
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr == "sleep":
        return (isinstance(f.value, ast.Name) and f.value.id == "time") or (
            isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name)
            and f.value.func.id == "__import__")  # __import__("time").sleep(...)
    return isinstance(f, ast.Name) and f.id in sleep_names


def _measures_time(node: ast.AST, clock_vars: set[str]) -> bool:
    """An expression that is a duration: clock - x, or a name/attribute assigned one."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub) and (
                _is_clock(sub.left) or _is_clock(sub.right)):
            return True
        if isinstance(sub, ast.Name) and sub.id in clock_vars:
            return True
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and sub.slice.value in (
                "elapsed", "seconds", "took"):
            return True
    return False


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(name of the innermost enclosing def, node) for every node."""
    def walk(node: ast.AST, where: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            yield name, child
            yield from walk(child, name)
    yield from walk(tree, "<module>")


def findings(path: Path, source: str | None = None) -> tuple[list[str], set[tuple[str, str]]]:
    """The timing problems in one file, and the allow-list entries it used."""
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    sleep_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "time"
                   for a in n.names if a.name == "sleep"}
    # names assigned a clock reading or a duration (t0 = time.monotonic(); took = time.monotonic() - t0)
    clock_vars = {t.id for n in ast.walk(tree) if (isinstance(n, ast.Assign) and _measures_time(n.value, set()))
                  or (isinstance(n, ast.Assign) and _is_clock(n.value))
                  for t in n.targets if isinstance(t, ast.Name)}
    clock_vars |= DURATION_NAMES & {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    bad: list[str] = []
    used: set[tuple[str, str]] = set()
    for where, node in _functions(tree):
        at = f"{path.name}:{getattr(node, 'lineno', '?')} ({where})"
        if isinstance(node, ast.Call) and _is_sleep(node, sleep_names):
            key = (path.name, where)
            if key in ALLOWED_SLEEPS:
                used.add(key)
            else:
                bad.append(f"{at}: a sleep (wait for an event: tests/eventpipe.py, or a state: tests/waiting.py)")
        if isinstance(node, ast.Assert):
            for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                sides = [cmp.left, *cmp.comparators]
                if any(isinstance(x, ast.Constant) and x.value == 0 for x in sides):
                    continue  # (>= 0: a sanity check of a recorded number, not a window)
                if any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in cmp.ops) and any(
                        _measures_time(x, clock_vars) for x in sides):
                    key = (path.name, where)
                    if key in ALLOWED_DURATION_ASSERTS:
                        used.add(key)
                    else:
                        bad.append(f"{at}: an assert on elapsed time (assert the outcome the code signals)")
    return bad, used


def test_no_test_sleeps_or_asserts_a_duration() -> None:
    bad: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in sorted(TESTS.glob("*.py")):
        b, u = findings(path)
        bad += b
        used |= u
    assert not bad, "timing in tests/:\n" + "\n".join(bad)
    stale = sorted((set(ALLOWED_SLEEPS) | set(ALLOWED_DURATION_ASSERTS)) - used)
    assert not stale, f"allow-list entries with no sleep left (remove them): {stale}"


PLANTED = '''
import time
from time import sleep as nap

def test_planted():
    t0 = time.monotonic()
    time.sleep(0.3)
    nap(1)
    __import__("time").sleep(0.1)
    took = time.monotonic() - t0
    assert took < 20
    assert time.monotonic() - t0 < 5
    assert doc["elapsed"] >= 3.0

def test_clean():
    assert time.thread_time() < 0.5  # CPU time: not load-sensitive
    script = "import time; time.sleep(600)"  # a string for a host: not a call here
'''


def test_the_guard_fails_on_planted_timing() -> None:
    bad, _ = findings(TESTS / "test_planted.py", PLANTED)
    sleeps = [b for b in bad if "a sleep" in b]
    asserts = [b for b in bad if "elapsed time" in b]
    assert [b.split(":")[1].split()[0] for b in sleeps] == ["7", "8", "9"], bad
    assert [b.split(":")[1].split()[0] for b in asserts] == ["11", "12", "13"], bad
    assert all("(test_planted)" in b for b in bad), bad
