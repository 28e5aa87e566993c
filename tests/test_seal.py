"""Seals (fleetctl/ops/seal.py, fleetctl/remote/seal.py): a deploy whose host has not changed since
the last deploy sealed it is re-checked with one `stat` + `sha256sum` and no Python start; anything
that could change where the launch imports from, what the planned files hold, or what a deploy
would do makes it take the full path (the agent) again, which then finds what changed."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fleetctl.remote import seal as rseal
from tests.jsoncli import cli, ok

# what a seal covers and what breaks it is the ops' logic: those tests run on an in-process host
# (`fhost`, tests/fakehost.py); the check-then-agent gate, the check run ahead, the round trips, the
# login shell's rc files and scripts are transport: they keep a real sshd host (`host`, which carries
# the fleet marker through fresh_sandbox)
pytestmark = [pytest.mark.usefixtures("ledger_dir")]

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks" / "dynamic-spec-disable"
SEALED = "no Python started"


def _log_python_starts(h, log: Path) -> None:
    """Log each start of the host's python (a sitecustomize in its venv, written before the first
    deploy: it is part of what a seal covers; the python itself stays the interpreter, no wrapper)."""
    site = next(h.host_dir.glob("lib/python*/site-packages"))
    (site / "sitecustomize.py").write_text(f"with open({str(log)!r}, 'a') as f:\n    f.write('start\\n')\n")


class Host:
    def __init__(self, capsys, sb, tmp_path: Path) -> None:
        self.capsys, self.sb, self.h = capsys, sb, sb.hosts["h01"]
        self.log = tmp_path / "python-starts.log"
        _log_python_starts(self.h, self.log)

    def starts(self) -> int:
        n = len(self.log.read_text().split()) if self.log.exists() else 0
        self.log.write_text("")
        return n + self._agents()

    def _agents(self) -> int:
        """Python starts the log cannot see: on an in-process host the agent's session is the
        host's python start (its sitecustomize does not run in this process), one per session."""
        return 0

    def deploy(self, *extra: str, code: int = 0) -> tuple[dict, bool, int]:
        """(document, answered from the seal, python starts on the host)."""
        self.starts()
        got, doc = cli(self.capsys, "deploy", PLAYBOOK, "-i", self.sb.inventory_path, *extra)
        assert got == code, json.dumps(doc, indent=1)[:3000]
        row = doc["hosts"][0]
        sealed = SEALED in (row.get("message") or "")
        assert row.get("sealed", False) == sealed  # the JSON says it too
        return doc, sealed, self.starts()

    def sealed_noop(self) -> None:
        """A full-path deploy (which seals), then one answered from the seal."""
        self.deploy()
        doc, sealed, starts = self.deploy()
        assert sealed and starts == 0, doc["hosts"][0]
        assert doc["hosts"][0]["status"] == "unchanged"


def _record_starts(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The argv of every process the controller starts on a host (HostConnection._start_pipe)."""
    from fleetctl.transport.ssh import HostConnection

    started: list[list[str]] = []
    orig = HostConnection._start_pipe

    def counted(self: HostConnection, argv: list[str], limit: float) -> object:
        started.append(argv)
        return orig(self, argv, limit)

    monkeypatch.setattr(HostConnection, "_start_pipe", counted)
    return started


@pytest.fixture
def host(fresh_sandbox, capsys, tmp_path: Path) -> Host:
    sb = fresh_sandbox(hosts=1, versions=("0.5.14",), gpus=1, bare_shell=True)
    return Host(capsys, sb, tmp_path)


class FakeHost(Host):
    """`Host` on an in-process host: each agent session counts as one start of the host's python."""

    def __init__(self, capsys, sb, tmp_path: Path) -> None:
        super().__init__(capsys, sb, tmp_path)
        self._seen = 0

    def _agents(self) -> int:
        n = len(self.sb.fake.agents.get("h01", []))
        new, self._seen = n - self._seen, n
        return new


@pytest.fixture
def fhost(fake_sandbox, capsys, tmp_path: Path) -> Host:
    sb = fake_sandbox(hosts=1, versions=("0.5.14",), gpus=1, bare_shell=True)
    return FakeHost(capsys, sb, tmp_path)


def test_noop_after_deploy_starts_no_python_and_plans_from_the_sealed_facts(fhost: Host) -> None:
    doc, sealed, starts = fhost.deploy()
    assert doc["hosts"][0]["status"] == "changed" and not sealed and starts >= 1
    doc, sealed, starts = fhost.deploy()
    assert sealed and starts == 0 and doc["hosts"][0]["status"] == "unchanged"
    plan = doc["plan"]["hosts"][0]
    assert plan["status"] == "noop" and plan["version"] == "0.5.14"
    # the facts sealed under the deploy's lock describe the host after it: no lock held
    (sealed_doc,) = [json.loads(p.read_text()) for p in (Path(os.environ["FLEETCTL_STATE_DIR"]) / "seals").glob("*.json")]
    assert sealed_doc["facts"]["state"]["lock"] is None
    assert all(f["action"] == "none" for f in plan["files"])
    # deploy --check is answered from it too; --recheck asks the host's python again
    code, chk = cli(fhost.capsys, "deploy", PLAYBOOK, "-i", fhost.sb.inventory_path, "--check")
    assert code == 0 and chk["plan"]["hosts"][0]["status"] == "noop" and fhost.starts() == 0
    doc, sealed, starts = fhost.deploy("--recheck")
    assert not sealed and starts >= 1 and doc["hosts"][0]["status"] == "unchanged"


def test_a_changed_planned_file_is_seen(fhost: Host) -> None:
    fhost.sealed_noop()
    f = fhost.h.sglang_dir / "srt" / "server_args.py"
    data = f.read_bytes()
    f.write_bytes(data.replace(b"import", b"imporT", 1))  # same size, other bytes
    doc, sealed, starts = fhost.deploy(code=1)
    assert not sealed and starts >= 1
    assert doc["plan"]["hosts"][0]["status"] in ("refused", "drift", "failed"), doc["plan"]["hosts"][0]
    f.write_bytes(data)
    doc, sealed, _ = fhost.deploy()
    assert not sealed and doc["hosts"][0]["status"] == "unchanged"  # new ctime: asked again, then sealed
    assert fhost.deploy()[1]


def test_a_failed_check_goes_on_to_the_agent_in_the_same_exec(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the check's output is not the seal's, the same process execs the agent (one login
    shell per host, not two); where it is, that process ends and no python starts."""
    from fleetctl.transport.session import BOOTSTRAP

    host.sealed_noop()
    f = host.h.sglang_dir / "srt" / "server_args.py"
    f.write_bytes(f.read_bytes())  # the same bytes, a new ctime: the check differs, the facts do not
    started = _record_starts(monkeypatch)
    doc, sealed, starts = host.deploy()
    assert not sealed and starts == 1 and doc["hosts"][0]["status"] == "unchanged", doc["hosts"][0]
    assert len(started) == 1 and "sh" in started[0] and BOOTSTRAP in started[0], started
    started.clear()
    doc, sealed, starts = host.deploy()
    assert sealed and starts == 0 and len(started) == 1, (doc["hosts"][0], started)


def test_a_shadowing_package_in_the_launch_cwd_is_seen(fhost: Host) -> None:
    """The launch runs `-m` in its cwd (the login HOME here): a sglang package there is what it would
    import. Only a python start can say so; the seal check sees that cwd's entries changed."""
    fhost.sealed_noop()
    shadow = fhost.h.home / "sglang"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    try:
        doc, sealed, starts = fhost.deploy(code=1)
        assert not sealed and starts >= 1
        assert str(shadow) in json.dumps(doc)  # the full path names the package the launch would import
    finally:
        shutil.rmtree(shadow)


def test_a_new_pth_file_in_site_packages_is_seen(fhost: Host, tmp_path: Path) -> None:
    fhost.sealed_noop()
    other = tmp_path / "elsewhere"
    shutil.copytree(fhost.h.sglang_dir, other / "sglang", symlinks=True)
    pth = fhost.h.site_packages / "aaa-elsewhere.pth"
    pth.write_text(f"import sys; sys.path.insert(0, {str(other)!r})\n")  # shadows site-packages
    try:
        doc, sealed, starts = fhost.deploy(code=1)
        assert not sealed and starts >= 1 and str(other) in json.dumps(doc)
    finally:
        pth.unlink()


def test_stale_bytecode_lock_and_login_environment_are_seen(fhost: Host) -> None:
    fhost.sealed_noop()
    # a pyc that import would run instead of the patched source (unchecked-hash: never revalidated)
    cache = fhost.h.sglang_dir / "srt" / "__pycache__"
    pyc = cache / "server_args.{}.pyc".format(__import__("sys").implementation.cache_tag)
    other = fhost.h.home.parent / "other_source.py"
    other.write_text("x = 1\n")
    py_compile.compile(str(other), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    doc, sealed, _ = fhost.deploy()
    assert not sealed
    assert not pyc.exists()  # the full path found it and removed it
    fhost.sealed_noop()
    # another deploy holds the host lock
    lock = fhost.h.state_dir / "lock"
    from fleetctl.remote.lock import writer_identity

    me = writer_identity()  # this test process: alive while the deploy runs
    lock.write_text(json.dumps({"pid": me["pid"], "start": me["start"], "op": "deploy", "id": "d-other", "by": "x",
                                "since": time.time(), "host": me["hostname"], "writer": me}))
    try:
        doc, sealed, _ = fhost.deploy(code=1)
        assert not sealed and "locked" in json.dumps(doc)
    finally:
        lock.unlink(missing_ok=True)
    fhost.sealed_noop()
    # the login environment changes (an rc file appears in the bare HOME)
    (fhost.h.home / ".bashrc").write_text("export FLEETCTL_TEST_SEAL=1\n")
    doc, sealed, starts = fhost.deploy()
    assert not sealed and starts >= 1 and doc["hosts"][0]["status"] == "unchanged"


def test_another_interpreter_or_a_wrapper_is_seen(fhost: Host) -> None:
    fhost.sealed_noop()
    real = os.readlink(fhost.h.python)
    (fhost.h.python.parent / "python3").symlink_to(real)
    fhost.h.python.unlink()
    fhost.h.python.symlink_to("python3")  # the same interpreter, reached another way
    _doc, sealed, starts = fhost.deploy()
    assert not sealed and starts >= 1
    assert fhost.deploy()[1]
    # a wrapper script (a pyenv shim, a module system) chooses the interpreter from what it reads:
    # such a host is never sealed
    fhost.h.python.unlink()
    fhost.h.python.write_text(f'#!/bin/sh\nexec {fhost.h.python.parent / "python3"} "$@"\n')
    fhost.h.python.chmod(0o755)
    fhost.deploy()
    _doc, sealed, starts = fhost.deploy()
    assert not sealed and starts >= 1


def test_rollback_is_seen(fhost: Host) -> None:
    fhost.sealed_noop()
    ok(fhost.capsys, "rollback", "-i", fhost.sb.inventory_path)
    doc, sealed, _starts = fhost.deploy()
    assert not sealed and doc["hosts"][0]["status"] == "changed"


def _start_the_fake_agent(capsys, sb) -> None:
    """One command on in-process host h01 before its python starts are logged: tests/fakehost.py
    asks the host's python its sys.path once (a real start, standing in for the agent's, which the
    log would count); from then on the log counts only the starts the agent makes."""
    ok(capsys, "facts", "-i", sb.inventory_path)


def test_a_host_whose_launch_python_starts_apart_is_sealed_from_that_start(fake_sandbox, capsys,
                                                                           tmp_path: Path) -> None:
    """The launch's python asked in a process of its own (on an in-process host it always is: the
    agent's argv has no interpreter word, tests/fakehost.py; on a real host, where the login shell's
    rc files set what the agent's start did not), which says what it loaded at start; the seal
    covers that process's inputs."""
    sb = fake_sandbox(hosts=1, versions=("0.5.14",), gpus=1)
    h = sb.hosts["h01"]
    log = tmp_path / "starts.log"
    _start_the_fake_agent(capsys, sb)
    _log_python_starts(h, log)
    ok(capsys, "deploy", PLAYBOOK, "-i", sb.inventory_path)
    assert log.read_text().split(), "the launch's python was not asked in a process of its own"
    (next(h.host_dir.glob("lib/python*/site-packages")) / "sitecustomize.py").unlink()  # (seen: resealed)
    ok(capsys, "deploy", PLAYBOOK, "-i", sb.inventory_path)
    doc = ok(capsys, "deploy", PLAYBOOK, "-i", sb.inventory_path)
    assert SEALED in doc["hosts"][0]["message"], doc["hosts"][0]
    # a sitecustomize appearing in the launch's site-packages (it runs at every start): seen
    site = next(h.host_dir.glob("lib/python*/site-packages"))
    (site / "sitecustomize.py").write_text("pass\n")
    doc = ok(capsys, "deploy", PLAYBOOK, "-i", sb.inventory_path)
    assert SEALED not in doc["hosts"][0]["message"]
    doc = ok(capsys, "deploy", PLAYBOOK, "-i", sb.inventory_path)
    assert SEALED in doc["hosts"][0]["message"]
    # ... and then edited in place (its dir does not change, the file does): seen
    (site / "sitecustomize.py").write_text("pass  # edited\n")
    doc = ok(capsys, "deploy", PLAYBOOK, "-i", sb.inventory_path)
    assert SEALED not in doc["hosts"][0]["message"]


def test_a_changing_deploy_lends_its_resealed_facts_to_the_restart_check(fake_sandbox, capsys,
                                                                        tmp_path: Path) -> None:
    """A deploy that changes a host reads its facts again at its end (under the host lock, for the
    seal); the restart reminder's facts, read right after in the same request (then_facts), take the
    package, torch and host facts from that reading instead of asking the launch's python once more.
    Here the launch's python is asked in a process of its own (an in-process host: the agent's argv
    has no interpreter word), so each asking is a python start on the host; the agent's own start
    is its session (its sitecustomize does not run in this process: FakeHost._agents)."""
    sb = fake_sandbox(hosts=1, versions=("0.5.14",), gpus=1)
    h = sb.hosts["h01"]
    log = tmp_path / "starts.log"
    _start_the_fake_agent(capsys, sb)
    _log_python_starts(h, log)
    agents = len(sb.fake.agents["h01"])
    doc = ok(capsys, "deploy", PLAYBOOK, "-i", sb.inventory_path)
    assert doc["hosts"][0]["status"] == "changed"
    reminder = doc["restart_needed"]  # the servers were read (none run here), not left unchecked
    assert reminder["servers"] == 0 and reminder["unchecked"] == [], reminder
    # the agent; the launch's python for the facts, for its pycache prefix, for the seal's re-read
    assert len(sb.fake.agents["h01"]) - agents + len(log.read_text().split()) == 4, (sb.fake.agents, log.read_text())


def test_only_a_reading_that_located_the_package_alike_is_lent() -> None:
    """then_facts takes an earlier reading only where it would locate the package the same way."""
    from fleetctl.remote.hostfacts import _locates_alike

    launch = {"interpreter": "/usr/bin/python3", "env": {"PATH": "/bin"}}
    base = {"engine": {"package": "sglang"}, "launch": launch, "package_dir": None,
            "bytecode_files": ["a.py", "b.py"], "strict_package_dir": True}
    assert _locates_alike(dict(base, bytecode_files=["a.py"], strict_package_dir=False), base)
    assert _locates_alike(base, base)
    assert not _locates_alike(dict(base, bytecode_files=["a.py", "c.py"]), base)  # a file it did not see
    assert not _locates_alike(dict(base, launch=dict(launch, env={"PATH": "/usr/bin"})), base)
    assert not _locates_alike(dict(base, package_dir="/opt/sglang"), base)
    assert not _locates_alike(dict(base, engine={"package": "vllm"}), base)
    assert not _locates_alike(base, dict(base, strict_package_dir=False))  # a lenient reading for a strict one
    assert not _locates_alike(dict(base, launch=None), dict(base, launch=None))


def test_the_agent_writes_what_stat_and_sha256sum_print(tmp_path: Path) -> None:
    """The seal's text is made by the agent (Python) and checked by coreutils on the host: the two
    must agree to the byte for a file, a dir, a symlink, a missing path."""
    from fleetctl.ops.seal import STAT_FORMAT

    f = tmp_path / "a file.py"
    f.write_bytes(b"x = 1\n" * 1000)
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(f)
    paths = [str(f), str(tmp_path / "d"), str(tmp_path / "link"), str(tmp_path / "missing")]
    snap = rseal.snapshot(paths, [str(f), str(tmp_path / "missing")])
    st = subprocess.run(["stat", f"--printf={STAT_FORMAT}", "--", *paths], capture_output=True, text=True)
    sha = subprocess.run(["sha256sum", "--", str(f), str(tmp_path / "missing")], capture_output=True, text=True)
    assert snap["stat"] == st.stdout and snap["stat"].count("\n") == 3
    assert snap["sha"] == sha.stdout and snap["sha"].count("\n") == 1


def test_a_check_whose_stat_differs_hashes_nothing(tmp_path: Path) -> None:
    """The check carries the seal's stat text: where the host's stat output is that text, the
    output is byte for byte the plain check's (hashes included); where it differs, the script skips
    sha256sum (no hashes: the check failed already). Trailing newlines, quotes, spaces kept."""
    from fleetctl.ops.seal import END, check_script, parse_check

    d = tmp_path / "it's a dir"
    d.mkdir()
    f = d / "mod.py"
    f.write_bytes(b"x = 1\n")
    paths, files = [str(d), str(f), str(tmp_path / "missing")], [str(f)]
    sealed = rseal.snapshot(paths, files)
    assert sealed["stat"].endswith("\n") and sealed["sha"]

    def run(stat: str | None) -> tuple[str, str, str]:
        out = subprocess.run(["sh", "-c", check_script(paths, files, stat)], capture_output=True, check=True).stdout
        assert out.endswith(END)
        got = parse_check(out, frozenset())
        assert got is not None
        return got

    plain = run(None)
    assert plain[1:] == (sealed["stat"], sealed["sha"])
    assert run(sealed["stat"]) == plain  # unchanged: the same output, hashes included
    other = sealed["stat"].replace(" ", "  ", 1)
    assert run(other) == (plain[0], sealed["stat"], "")  # differs: the stat text as it is, no hashes
    assert run(sealed["stat"] + "\n") == (plain[0], sealed["stat"], "")  # one more newline is a difference
    f.write_bytes(b"x = 2\n")  # changed: the stat text differs, so no hashes either
    now = rseal.snapshot(paths, files)
    assert run(sealed["stat"]) == (plain[0], now["stat"], "") and now["stat"] != sealed["stat"]
    assert run(now["stat"]) == (plain[0], now["stat"], now["sha"])


def test_the_check_runs_ahead_while_the_playbook_loads(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy starts each host's seal check as soon as the host is connected (in the prefetch), and
    check() takes that output; where the stored seal is not this command's (another key), the
    process waiting at the gate becomes the host's agent: still one exec, one python start. With
    --recheck nothing runs ahead."""
    import threading

    from fleetctl.transport.session import BOOTSTRAP, AgentTransport
    from fleetctl.transport.ssh import HostConnection

    host.sealed_noop()
    reads: list[str] = []
    starts: list[list[str]] = []
    orig_read, orig_start = AgentTransport._gate_read, HostConnection._start_pipe

    def read(self: AgentTransport, *a: object, **k: object) -> object:
        reads.append(threading.current_thread().name)
        return orig_read(self, *a, **k)  # type: ignore[arg-type]

    def start(self: HostConnection, argv: list[str], limit: float) -> object:
        starts.append(argv)
        return orig_start(self, argv, limit)

    monkeypatch.setattr(AgentTransport, "_gate_read", read)
    monkeypatch.setattr(HostConnection, "_start_pipe", start)
    doc, sealed, py = host.deploy()
    assert sealed and py == 0 and reads == ["fleetctl-prefetch"] and len(starts) == 1, (reads, starts)

    # the stored seal made for another key: no check is asked for, the waiting process is the agent
    (f,) = (Path(os.environ["FLEETCTL_STATE_DIR"]) / "seals").glob("*.json")
    sealed_doc = json.loads(f.read_text())
    f.write_text(json.dumps({**sealed_doc, "key": "0" * 64}))
    reads.clear()
    starts.clear()
    doc, sealed, py = host.deploy()
    assert not sealed and py == 1 and doc["hosts"][0]["status"] == "unchanged", doc["hosts"][0]
    assert reads == ["fleetctl-prefetch"] and len(starts) == 1 and BOOTSTRAP in starts[0], (reads, starts)

    reads.clear()
    starts.clear()
    doc, sealed, py = host.deploy("--recheck")
    assert not sealed and py == 1 and reads == [] and len(starts) == 1, (reads, starts)


@pytest.mark.parametrize("extra", [{}, {"CDPATH": "/tmp"}])
def test_the_inventory_env_reaches_the_check_as_the_agent_gets_it(host: Host, monkeypatch: pytest.MonkeyPatch,
                                                                   extra: dict[str, str]) -> None:
    """The check's sh exports the inventory's env itself (no `env` exec in front of it), values
    quoted: the no-op is sealed only if the check saw byte for byte the environment the agent that
    made the seal got through `env`. A name the shell treats specially goes through `env` again."""
    import yaml

    inv = host.sb.inventory_path
    doc = yaml.safe_load(inv.read_text())
    env = doc["hosts"]["h01"].setdefault("env", {})
    env.update({"FLEETCTL_T1": "a b 'c' \"d\" $HOME `x` \\ ;|&", "FLEETCTL_T2": "line1\nline2\n", "FLEETCTL_T3": ""},
               **extra)
    inv.write_text(yaml.safe_dump(doc))
    starts = _record_starts(monkeypatch)
    host.sealed_noop()
    assert starts[-1][0] == ("env" if extra else "sh"), starts[-1][:3]


@pytest.mark.parametrize("name", ["FLEETCTL_T", "PATH", "IFS", "BASH_ENV", "PWD"])
def test_sh_argv_gives_sh_exactly_the_values(name: str) -> None:
    """sh_argv (transport/session.py) run by this machine's real `sh`: a value sh exports arrives
    byte for byte in the environment of what the script runs; a name the shell treats specially
    goes through `env`, as every name did before (what sh then makes of IFS or PWD is its own)."""
    from fleetctl.transport.session import sh_argv

    value = "a b 'c' \"d\" $HOME `x` \\ ;|& \n end"
    if name == "PATH":
        value = "/usr/bin:/bin:" + value
    argv = sh_argv({name: value, "FLEETCTL_OTHER": "1"}, 'exec env -0 "$@"', ["--"])
    assert (argv[0] == "env") == (name in ("IFS", "BASH_ENV", "PWD"))
    out = subprocess.run(argv, capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    got = dict(e.split(b"=", 1) for e in out.split(b"\0") if e)
    assert got[b"FLEETCTL_OTHER"] == b"1"
    if name not in ("IFS", "PWD"):
        assert got[name.encode()] == value.encode()


def test_a_login_script_that_prints_on_stdout_is_skipped(host: Host) -> None:
    """A ~/.bashrc that prints a banner on stdout before every command (text that changes each time:
    here the time in ns) neither breaks the agent's start (its hello comes after the banner) nor the
    seal check (what comes before its BEGIN mark is not the check's), so the no-op is still sealed;
    more than LOGIN_NOISE_MAX bytes before the hello is still refused, naming the cause."""
    from fleetctl.transport.session import LOGIN_NOISE_MAX

    rc = host.h.home / ".bashrc"
    rc.write_text('echo "Welcome to the GPU box, $(date +%s%N)"; printf "no newline at the end: "\n')
    r = host.sb.ssh("h01", "true")
    assert r.returncode == 0 and r.stdout.startswith("Welcome to the GPU box, "), (r.stdout, r.stderr)
    doc, sealed, starts = host.deploy()
    assert doc["hosts"][0]["status"] == "changed" and not sealed and starts >= 1, doc["hosts"][0]
    doc, sealed, starts = host.deploy()
    assert sealed and starts == 0 and doc["hosts"][0]["status"] == "unchanged", doc["hosts"][0]
    code, status = cli(host.capsys, "status", PLAYBOOK, "-i", host.sb.inventory_path)
    assert code == 0, status
    rc.write_text(f"head -c {LOGIN_NOISE_MAX + 100} /dev/zero | tr '\\0' x\n")
    code, doc = cli(host.capsys, "facts", "-i", host.sb.inventory_path)
    assert code == 1, doc
    text = json.dumps(doc)
    assert "the agent's start answered something that is not its hello: b'xxxx" in text, text[:2000]
    assert "does a login script print to stdout? (more than 64 KiB" in text, text[:2000]


@pytest.mark.parametrize("noise", [0, 1000, 64 << 10, (64 << 10) + 1, (64 << 10) + 100])
def test_the_noise_bound_holds_however_the_reads_fall(noise: int) -> None:
    """The bound on a login script's noise is on where the hello starts, not on what one read
    brought: here a real process writes the noise and the hello into a pipe wide enough to hold both
    and has exited before the first read, so the controller's second 64 KiB read brings the rest of
    the noise and the hello together (what a loaded machine does; the sshd test above passed one
    run in three beside busy loops). At most LOGIN_NOISE_MAX bytes: the hello; one more: refused."""
    import fcntl

    from fleetctl.config.hosts import Host as InvHost
    from fleetctl.transport.base import RemoteError
    from fleetctl.transport.local import ProcessPipe
    from fleetctl.transport.session import HELLO, HELLO_SIZE, LOGIN_NOISE_MAX, AgentTransport

    hello = HELLO + b"N" + b"a7" * 4 + b"00"
    assert len(hello) == HELLO_SIZE
    proc = subprocess.Popen(["sh", "-c", f"read go; head -c {noise} /dev/zero | tr '\\0' x; printf %s {hello.decode()}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        fcntl.fcntl(proc.stdout.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.wait() == 0  # everything is in the pipe before the controller reads
        t = AgentTransport(InvHost(
            name="h01", address="127.0.0.1", port=22, user=None, identity_file=None, known_hosts=None,
            python="python3", sglang_dir=None, state_dir="~/.fleetctl", env={}, secret_env_keys=frozenset(),
            flags={}, launch_command=None, gpus=(), groups=(), connect_timeout=10.0, command_timeout=60.0))
        pipe = ProcessPipe(proc)
        if noise <= LOGIN_NOISE_MAX:
            assert t._hello(pipe, time.monotonic() + 240) == hello
        else:
            with pytest.raises(RemoteError, match="not its hello: b'xxxx"):
                t._hello(pipe, time.monotonic() + 240)
    finally:
        proc.kill()
        proc.wait()


def test_a_login_script_that_ends_the_shell_is_named(host: Host) -> None:
    """A ~/.bashrc that exits before the command runs: the agent never says its hello. Said so, with
    the exit code and stderr's last line, on the first start and on the check of a sealed host."""
    host.sealed_noop()
    rc = host.h.home / ".bashrc"
    for script, code, said in (("echo 'no batch jobs here' >&2; exit 3", 3, "; its stderr ends: no batch jobs here"),
                               ("exit 0", 0, ", nothing on stderr")):
        rc.write_text(script + "\n")
        for argv in (("facts", "-i", host.sb.inventory_path), ("deploy", PLAYBOOK, "-i", host.sb.inventory_path)):
            got, doc = cli(host.capsys, *argv)
            assert got == 1, doc
            msg = doc["hosts"][0]["message"]
            assert msg.startswith(f"the agent never started: the remote command ended (exit code {code}) "
                                  f"before its hello{said}"), (argv, msg)
            assert "an `exit` in ~/.bashrc" in json.dumps(doc), doc["hosts"][0]
    rc.unlink()
    assert host.deploy()[0]["hosts"][0]["status"] == "unchanged"


def _tree(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every path under `root` as (mode, size, mtime, ctime): what any write would change (the
    sandbox's own sshd log aside: the test's sshd writes it, not fleetctl)."""
    out = {}
    for p in [root, *root.rglob("*")]:
        if p.name == "sshd.log":
            continue
        st = p.lstat()
        out[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def test_a_no_op_deploy_is_one_round_trip_and_writes_nothing(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: on a sealed host a no-op deploy makes exactly one round trip after the session opens
    (one remote command, the seal check; no agent request, no other command) and writes nothing on
    the host: every path of the host's tree (its home, state dir, agent cache, package) keeps its
    mode, size, mtime and ctime, and none appears or goes."""
    from fleetctl.transport.session import AgentTransport

    host.sealed_noop()
    started = _record_starts(monkeypatch)
    requests: list[str] = []
    commands: list[list[str]] = []
    orig_agent, orig_run = AgentTransport.agent, AgentTransport.run_command

    def agent(self: AgentTransport, action: str, *a: object, **k: object) -> object:
        requests.append(action)
        return orig_agent(self, action, *a, **k)  # type: ignore[arg-type]

    def run_command(self: AgentTransport, argv: list[str], *a: object, **k: object) -> object:
        commands.append(argv)
        return orig_run(self, argv, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(AgentTransport, "agent", agent)
    monkeypatch.setattr(AgentTransport, "run_command", run_command)
    before = _tree(host.h.host_dir)
    doc, sealed, starts = host.deploy()
    assert sealed and starts == 0 and doc["hosts"][0]["status"] == "unchanged", doc["hosts"][0]
    assert len(started) == 1 and requests == [] and commands == [], (started, requests, commands)
    after = _tree(host.h.host_dir)
    assert after == before, sorted(set(after.items()) ^ set(before.items()))[:10]


def _newest_ctime(root: Path) -> int:
    return max(p.lstat().st_ctime_ns for p in [root, *root.rglob("*")])


def test_an_unsealed_no_op_deploy_is_one_request_takes_no_lock_and_writes_nothing(
        fhost: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: a no-op deploy of a host with no seal to check (`--recheck` here; after a fleetctl
    upgrade or a playbook edit every seal is for another key) asks the agent once, its facts, and
    nothing more: no deploy request, no host lock taken, nothing written on the host. The facts
    answer that nothing a deploy looks at changed while they were read (every path's ctime older:
    the test waits until the deploy's writes are that old), and carry the seal of that reading, so
    the next no-op is answered from the seal."""
    from waiting import until

    from fleetctl.transport.session import AgentTransport

    doc, sealed, _ = fhost.deploy()
    assert doc["hosts"][0]["status"] == "changed" and not sealed
    newest = _newest_ctime(fhost.h.host_dir)
    until(lambda: time.time_ns() > newest + rseal.QUIET_NS + 10 ** 8, "the deploy's writes to be older than QUIET_NS")
    requests: list[str] = []
    orig_agent = AgentTransport.agent

    def agent(self: AgentTransport, action: str, *a: object, **k: object) -> object:
        requests.append(action)
        return orig_agent(self, action, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(AgentTransport, "agent", agent)
    before = _tree(fhost.h.host_dir)
    doc, sealed, starts = fhost.deploy("--recheck")
    assert not sealed and starts >= 1 and doc["hosts"][0]["status"] == "unchanged", doc["hosts"][0]
    assert requests == ["facts"], requests
    after = _tree(fhost.h.host_dir)
    assert after == before, sorted(set(after.items()) ^ set(before.items()))[:10]
    doc, sealed, starts = fhost.deploy()
    assert sealed and starts == 0 and doc["hosts"][0]["status"] == "unchanged", doc["hosts"][0]


def test_a_no_op_read_while_something_moved_takes_the_lock(fhost: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side: right after a deploy (its writes younger than QUIET_NS) the facts are not
    settled, and the no-op goes on to the deploy request, which re-checks under the host lock."""
    from fleetctl.transport.session import AgentTransport

    fhost.deploy()
    requests: list[str] = []
    orig_agent = AgentTransport.agent

    def agent(self: AgentTransport, action: str, *a: object, **k: object) -> object:
        requests.append(action)
        return orig_agent(self, action, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(AgentTransport, "agent", agent)
    (fhost.h.sglang_dir / "srt").touch()  # (a ctime now, whatever the machine's speed)
    doc, sealed, _ = fhost.deploy("--recheck")
    assert not sealed and doc["hosts"][0]["status"] == "unchanged", doc["hosts"][0]
    assert requests == ["facts", "deploy"], requests
