"""Shared fixtures: sandbox fleets of real OpenSSH servers on 127.0.0.1.

Every sandbox a fixture starts is taken down by a finalizer registered BEFORE it is started, so its
sshd processes (and anything their sessions left running) are stopped even when `up` or a test fails.

Sandboxes live in pytest's tmp dirs (kept for post-mortems like any tmp_path). Building one is
dominated by creating the SGLang files (~2,000-3,200 per host); on a busy disk set
FLEETCTL_TEST_SANDBOX_ROOT=/dev/shm to build them on tmpfs instead (removed at teardown there).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from machine import NON_ROOT_PREFIX

# pytest-xdist gives its workers COLUMNS (its controller's width); the suite's commands run as they do
# from a pipe, without it (a test that wants a width sets its own)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

# The suite keeps its bytecode (tests/__pycache__ with pytest's assert-rewritten modules, and
# fleetctl's; both gitignored) even where PYTHONDONTWRITEBYTECODE is set, as in the team's shells:
# without it every pytest start rewrites and compiles ~90 test modules again (~4 of its ~5 s of
# collection on 2 cores). Processes the tests start keep the environment's setting.
sys.dont_write_bytecode = False

if TYPE_CHECKING:
    from fakehost import FakeHosts

    from fleetctl.sandbox.lifecycle import Sandbox

SSHD = Path("/usr/sbin/sshd")


def require_sshd() -> None:
    """Skip (with the reason) when this machine cannot run a sandbox fleet."""
    if not SSHD.exists():
        pytest.skip(f"{SSHD} is missing: sandbox tests need the OpenSSH server (apt-get install openssh-server)")
    if shutil.which("ssh") is None:
        pytest.skip("the OpenSSH client 'ssh' is missing: sandbox tests need it (apt-get install openssh-client)")


ROOT_ENV = "FLEETCTL_TEST_SANDBOX_ROOT"


def _new_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    root = os.environ.get(ROOT_ENV)
    if root:
        return Path(tempfile.mkdtemp(prefix=f"fleetctl-{name}-", dir=root))
    return tmp_path_factory.mktemp(name)


def _down(d: Path) -> None:
    from fleetctl.sandbox import lifecycle

    root = os.environ.get(ROOT_ENV)
    purge = bool(root) and d.parent == Path(root)
    report = lifecycle.down(d, missing_ok=True)
    if report.survivors:
        raise RuntimeError(f"sandbox {d}: processes outlived SIGKILL: {report.survivors}")
    if purge:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Sandbox:
    """One sandbox for the session: h01 (0.5.9), h02 (0.5.14), h03 (0.5.9), 2 idle GPUs each, + jump.

    Tests must leave it as they found it (restore GPU states, restart hosts they stop); tests that
    break hosts use `fresh_sandbox`.
    """
    require_sshd()
    from fleetctl.sandbox import lifecycle

    d = _new_dir(tmp_path_factory, "sandbox")
    request.addfinalizer(lambda: _down(d))
    return lifecycle.up(d, hosts=3, versions=["0.5.9", "0.5.14"])


@pytest.fixture
def fresh_sandbox(tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Callable[..., Sandbox]:
    """A factory of private sandboxes, all taken down when the test ends:

        sb = fresh_sandbox(hosts=1, versions=("0.5.14",), gpus=1, busy_gpus=("h01",))
    """
    require_sshd()
    from fleetctl.sandbox import lifecycle

    made: list[Path] = []

    def finalize() -> None:
        errors = []
        for d in made:
            try:
                _down(d)
            except Exception as e:  # keep stopping the others
                errors.append(e)
        if errors:
            raise errors[0]

    request.addfinalizer(finalize)

    def make(hosts: int = 1, versions: Iterable[str] = ("0.5.9",), gpus: int = 2,
             busy_gpus: Iterable[str] = (), bare_shell: bool = False, link_trees: bool = False,
             host_python: str = "") -> Sandbox:
        d = _new_dir(tmp_path_factory, "fresh-sandbox")
        made.append(d)
        return lifecycle.up(d, hosts=hosts, versions=list(versions), gpus=gpus, busy_gpus=busy_gpus,
                            bare_shell=bare_shell, link_trees=link_trees, host_python=host_python)

    return make


@pytest.fixture
def fake_hosts(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHosts]:
    """In-process hosts for this test (tests/fakehost.py): every Fleet a command builds with its
    default transport reaches them instead of SSH."""
    from fakehost import installed

    with installed() as hosts:
        yield hosts


@pytest.fixture
def fake_sandbox(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
                 fake_hosts: FakeHosts) -> Callable[..., Sandbox]:
    """`fresh_sandbox` without sshd: the same hosts (files, python, stand-ins, inventory), reached
    in-process (`fake_hosts`, tests/fakehost.py); `sb.fake.down.add(name)` makes a host unreachable."""
    from contextlib import ExitStack

    from fakehost import sandbox

    stack = ExitStack()
    request.addfinalizer(stack.close)

    def make(hosts: int = 1, versions: Iterable[str] = ("0.5.9",), gpus: int = 2,
             busy_gpus: Iterable[str] = (), bare_shell: bool = False) -> Sandbox:
        d = _new_dir(tmp_path_factory, "fake-sandbox")
        if os.environ.get(ROOT_ENV):
            stack.callback(shutil.rmtree, d, ignore_errors=True)
        return stack.enter_context(sandbox(d, fake_hosts, hosts=hosts, versions=list(versions), gpus=gpus,
                                           busy_gpus=busy_gpus, bare_shell=bare_shell))

    return make


# the shared fixtures that start sshd: every test using one (directly or through another fixture)
# carries the `fleet` marker, added here before `-m` selects; a module's own sshd fixture marks its
# tests itself, and _sshd_only_under_the_fleet_marker fails a test that starts one unmarked
SSHD_FIXTURES = frozenset({"sandbox", "fresh_sandbox"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    fleet = pytest.mark.fleet
    for item in items:
        if SSHD_FIXTURES.intersection(getattr(item, "fixturenames", ())) and item.get_closest_marker("fleet") is None:
            item.add_marker(fleet)


_CURRENT: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _CURRENT.append(item)
    try:
        return (yield)
    finally:
        _CURRENT.pop()


@pytest.fixture(scope="session", autouse=True)
def _sshd_only_under_the_fleet_marker() -> Iterator[None]:
    """Every test that starts an sshd carries the `fleet` marker (so `-m "not fleet"` starts none):
    starting one from a test without it fails that test."""
    from fleetctl.sandbox import sshd

    start = sshd.start

    def guarded(*a: object, **kw: object) -> int:
        item = _CURRENT[-1] if _CURRENT else None
        if item is not None and item.get_closest_marker("fleet") is None:
            pytest.fail(f"{item.nodeid} starts an sshd without the `fleet` marker: mark it "
                        "(pytest.mark.fleet), or use the in-process hosts (fake_sandbox)", pytrace=False)
        return start(*a, **kw)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sshd, "start", guarded)
        yield


@pytest.fixture(scope="session", autouse=True)
def _no_real_controller_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test writes the real user's controller state (ledger, run log, retry files, inventory
    cache under ~/.local/state/fleetctl): every test, and every fleetctl it starts as a process,
    gets this session's own state dir unless it sets its own (ledger_dir, monkeypatch.setenv)."""
    d = tmp_path_factory.mktemp("controller-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEETCTL_STATE_DIR", str(d / "fleetctl"))
        mp.setenv("XDG_STATE_HOME", str(d / "xdg"))  # for a test that unsets FLEETCTL_STATE_DIR
        yield


@pytest.fixture(autouse=True)
def _consoles_made_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's `out`/`err` consoles are made on first use and fix their width and wrapping then:
    one made while a test had COLUMNS set would wrap the prose of every later test in the worker
    (a test's result depended on which file ran before it). Each test makes its own."""
    common = sys.modules.get("fleetctl.commands.common")  # not imported here: some tests watch imports
    if common is not None:
        for c in (common.out, common.err):
            monkeypatch.setattr(c, "_console", None)


@pytest.fixture
def ledger_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private local ledger (FLEETCTL_STATE_DIR) per test; the fleet test modules use it for every
    test (`pytest.mark.usefixtures("ledger_dir")`), so no test writes the user's real history."""
    d = tmp_path / "ledger"
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(d))
    return d


# where this session's tests build sandboxes: pytest's base temp dir (this session's own), the
# FLEETCTL_TEST_SANDBOX_ROOT override, and the world-readable dirs of tests/test_non_root.py (named
# for this process: another session, or another xdist worker, has its own)
OWN_SANDBOX_PREFIXES = (f"/tmp/{NON_ROOT_PREFIX}",)


def _sshd_listeners() -> dict[int, str]:
    """pid -> config file (its -f argument) of every OpenSSH listener (sshd -D ...) on this machine."""
    from fleetctl.sandbox import procs

    out = {}
    for pid in procs.all_pids():
        words = procs.cmdline(pid).split()
        if words and (words[0] == "sshd:" or os.path.basename(words[0]) == "sshd") and "-D" in words \
                and "-f" in words[:-1]:
            out[pid] = words[words.index("-f") + 1]
    return out


@pytest.fixture(scope="session", autouse=True)
def no_sshd_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every sshd a test starts is stopped by the time the session ends (the fixtures' finalizers run
    before this one's). A listener started during the session for a sandbox in one of its own dirs
    that outlives it is stopped here, by its pid, and reported as an error."""
    import signal
    import time

    before = set(_sshd_listeners())
    roots = [str(tmp_path_factory.getbasetemp()) + "/", *OWN_SANDBOX_PREFIXES]
    if os.environ.get(ROOT_ENV):
        roots.append(os.environ[ROOT_ENV].rstrip("/") + "/")

    def ours() -> list[tuple[int, str]]:
        return sorted((pid, cfg) for pid, cfg in _sshd_listeners().items()
                      if pid not in before and cfg.startswith(tuple(roots)))

    yield
    deadline = time.monotonic() + 60  # a hang bound: sshd may be slow to exit on a loaded machine
    while (left := ours()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        raise RuntimeError(f"{len(left)} sshd started by this test session outlived it (now stopped): "
                           + "; ".join(f"pid {pid} (-f {cfg})" for pid, cfg in left[:4]))
