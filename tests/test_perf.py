"""Issue 17: the bare-login-shell sandbox variant, and the host-side start costs fleetctl cut
(each test asserts behaviour, never timing)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

# (the tests that start sshd use the sandbox fixtures, which give them the `fleet` marker:
# tests/conftest.py; the probe writer's and the start rules' tests start none)


def test_bare_shell_sandbox_gives_each_host_its_own_empty_home(fresh_sandbox) -> None:
    from fleetctl.sandbox import lifecycle

    sb = fresh_sandbox(hosts=2, versions=("0.5.9", "0.5.14"), gpus=1, bare_shell=True)
    for h in sb.hosts.values():
        assert h.bare_shell and h.home == h.host_dir / "home"
        assert h.home.is_dir() and not list(h.home.iterdir())  # no .bashrc, .profile, ...
        r = sb.ssh(h.name, 'printf "%s|%s" "$HOME" "$(cd && pwd)"')
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"{h.home}|{h.home}"
    # the login shell reads rc files from that HOME: one placed there runs, so none ran before
    h01 = sb.hosts["h01"]
    (h01.home / ".bashrc").write_text("export FLEETCTL_TEST_RC=ran\n")
    assert sb.ssh("h01", 'printf %s "${FLEETCTL_TEST_RC:-none}"').stdout == "ran"
    assert sb.ssh("h02", 'printf %s "${FLEETCTL_TEST_RC:-none}"').stdout == "none"
    # recorded, and kept when a host's sshd is started again
    assert lifecycle.load(sb.dir).hosts["h02"].bare_shell
    sb.stop_host("h02")
    sb.start_host("h02")
    assert sb.ssh("h02", 'printf %s "$HOME"').stdout == str(sb.hosts["h02"].home)


def test_default_sandbox_keeps_the_account_home(sandbox) -> None:
    h = next(iter(sandbox.hosts.values()))
    assert not h.bare_shell and h.home is None
    r = sandbox.ssh(h.name, 'printf %s "$HOME"')
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(r.stdout) == os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)


def test_bare_shell_hosts_work_for_fleetctl(fresh_sandbox, tmp_path: Path) -> None:
    """A bare host behaves like a real one: facts, deploy and rollback of the playbook succeed."""
    import json
    import subprocess
    import sys

    sb = fresh_sandbox(hosts=1, versions=("0.5.14",), gpus=1, bare_shell=True)
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(tmp_path / "ledger"), "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)

    def run(*args: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "fleetctl", *args, "-i", str(sb.inventory_path), "--json"],
                           capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return json.loads(p.stdout)

    pb = str(repo / "playbooks" / "dynamic-spec-disable")
    assert run("deploy", pb)["ok"]
    assert run("rollback")["ok"]


JSON_CASES = [
    None, True, False, 0, -7, 2**70, 1.5, -0.0, 1e300, float("nan"), float("inf"), float("-inf"),
    "", "plain/path.py", 'quote " and \\ backslash', "ctl \x00\x01\x1f\x7f \n\r\t\b\f", "é ü 中文 \U0001F600",
    "surrogate \udcff from a path", [], {}, [1, [2, [3, {}]]], (1, "a"),
    {"k": {"nested": [None, True, 1.25, "x"]}, 3: "int key", 2.5: "float key", True: "bool key", None: "null"},
]


@pytest.mark.parametrize("obj", JSON_CASES, ids=range(len(JSON_CASES)))
def test_probe_dumps_reads_back_as_json_dumps(obj) -> None:
    """The probe writes its answer with its own small JSON writer (no json import): the agent's
    json.loads must read exactly what json.dumps would have given."""
    import json
    import math

    from fleetctl.remote import probe

    got = json.loads(probe.dumps(obj))
    want = json.loads(json.dumps(obj))
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == want and type(got) is type(want)
    assert probe.dumps(obj) == json.dumps(obj) or (isinstance(obj, float) and math.isnan(obj))


def test_probe_dumps_refuses_what_json_refuses() -> None:
    from fleetctl.remote import probe

    with pytest.raises(TypeError):
        probe.dumps({"x": object()})
    with pytest.raises(TypeError):
        probe.dumps({(1, 2): "tuple key"})


def test_probe_imports_no_json(sandbox) -> None:
    """The probe (one Python start per host per locate) answers without importing json/re/enum,
    under a sandbox host's own python; the agent reads the answer as before."""
    import subprocess

    from fleetctl.remote import locate as rlocate
    from fleetctl.remote.locate import PROBE_SOURCE

    h = next(iter(sandbox.hosts.values()))
    import marshal

    req = marshal.dumps({"path0": None, "files": ["srt/server_args.py"], "checks": [], "package": "sglang"}, 2)
    p = subprocess.run([str(h.python), "-X", "importtime", "-c", PROBE_SOURCE], input=req, capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {ln.split("|")[-1].strip() for ln in p.stderr.decode().splitlines() if "import time:" in ln}
    assert "json" not in imported and "re" not in imported, sorted(imported)
    import json

    ans = json.loads(p.stdout)
    assert ans["package_dir"] == str(h.sglang_dir)
    assert ans["files"]["srt/server_args.py"]["loader"] == "source"
    # and through the agent's own call, with a launch like the inventory's
    got = rlocate.run_probe({"interpreter": str(h.python), "options": [], "env": {}, "inherit": ["PATH", "HOME"],
                           "target_kind": "module", "target": "sglang.launch_server"}, ["srt/server_args.py"],
                           package="sglang")
    assert got["package_dir"] == str(h.sglang_dir), got


def test_same_start_rules() -> None:
    """The probe runs inside the agent only when the launch's python would start exactly as the
    agent's did; anything that could differ sends it to its own process as before."""
    from fleetctl.remote.locate import same_start

    start = {"PATH": "/usr/bin", "HOME": "/home/u", "SSH_CONNECTION": "1 2 3 4", "SHLVL": "1",
             "FLEETCTL_SANDBOX_HOST": "h01"}
    env = {"PATH": "/usr/bin", "HOME": "/home/u"}
    launch = {"interpreter": "/opt/py/bin/python", "options": []}
    ok = dict(start_env=start, start_cwd="/", agent_python="/opt/py/bin/python")
    assert same_start(launch, env, "/", "/", **ok)
    assert not same_start({**launch, "interpreter": "python3"}, env, "/", "/", **ok)  # another word
    assert not same_start({**launch, "options": ["-I"]}, env, "/", "/", **ok)
    assert not same_start({**launch, "clear": True}, env, "/", "/", **ok)
    # another cwd: only with sys.path[0] set and absolute PYTHONPATH entries (site makes them absolute)
    assert same_start(launch, env, "/tmp", "/tmp", **ok)
    assert not same_start(launch, env, "/tmp", None, **ok)
    assert not same_start(launch, {**env, "PYTHONPATH": "lib"}, "/tmp", "/tmp",
                          **{**ok, "start_env": {**start, "PYTHONPATH": "lib"}})
    assert same_start(launch, {**env, "PYTHONPATH": "/lib"}, "/tmp", "/tmp",
                      **{**ok, "start_env": {**start, "PYTHONPATH": "/lib"}})
    assert not same_start(launch, {**env, "PYTHONPATH": "/x"}, "/", "/", **ok)  # the launch sets more
    assert not same_start(launch, {**env, "PATH": "/bin"}, "/", "/", **ok)  # or other values
    # the agent's session has a variable the launch does not get, beyond the session-only ones
    for extra in ("PYTHONPATH", "PYENV_VERSION", "CONDA_PREFIX", "LD_PRELOAD"):
        assert not same_start(launch, env, "/", "/", **{**ok, "start_env": {**start, extra: "1"}}), extra
    assert not same_start(launch, env, "/", "/", **{**ok, "agent_python": ""})  # not told (old controller)


def _count_pythons(sb, home_rc: str | None, tmp_path: Path) -> tuple[list[str], dict]:
    """Run `fleetctl facts` on h01 with its python wrapped to log what each start runs (the probe: by a
    statement of its source, which ships without docstrings)."""
    import json
    import subprocess
    import sys

    h = sb.hosts["h01"]
    if home_rc is not None:
        (h.home / ".bashrc").write_text(home_rc)
    log = tmp_path / f"starts-{home_rc is not None}.log"
    real = h.python.with_name("python.real")
    if not real.exists():
        h.python.rename(real)
    h.python.write_text(f"""#!/bin/sh
case "$*" in *fleetctl_agent*) w=agent ;; *"STARTUP_FILES = sorted"*) w=probe ;; *) w=other ;; esac
echo "$w" >> {log}
exec {real} "$@"
""")
    h.python.chmod(0o755)
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(tmp_path / "ledger"), "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)
    p = subprocess.run([sys.executable, "-m", "fleetctl", "facts", "-i", str(sb.inventory_path), "--json"],
                       capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    facts = json.loads(p.stdout)["hosts"][0]["facts"]
    assert facts["sglang"]["dir"] == str(h.sglang_dir)
    return log.read_text().split(), {k: facts[k] for k in ("sglang", "launch_python", "bytecode", "files")}


def test_probe_runs_in_the_agent_on_a_bare_host_only(fresh_sandbox, tmp_path: Path) -> None:
    sb = fresh_sandbox(hosts=1, versions=("0.5.14",), gpus=1, bare_shell=True)
    # a bare login: the launch's python would start as the agent's: one Python start, sglang found
    starts, here = _count_pythons(sb, None, tmp_path)
    assert starts == ["agent"]
    # the probe's code came compiled with the agent's (the host's python has the controller's
    # bytecode magic): one cache file holding both, private to its owner, nothing compiled there
    cache = Path(sb.hosts["h01"].state_dir) / "cache"
    (cached,) = list(cache.glob("agent-*"))
    assert (cached.stat().st_mode & 0o777) == 0o600 and not list(cache.glob("probe-*"))
    import marshal

    # (since 'agent shipped small': the probe's source rides along, for a host of another magic)
    agent_code, probe_code, probe_text = marshal.loads(cached.read_bytes())
    assert [agent_code.co_filename, probe_code.co_filename] == ["fleetctl-agent", "fleetctl-probe"]
    assert isinstance(probe_text, str) and probe_text
    # a login rc that sets what the launch does not inherit (a pyenv shim would read it): asked
    starts, asked = _count_pythons(sb, "export PYENV_VERSION=system\n", tmp_path)
    assert starts == ["agent", "probe"]
    assert here == asked  # the same answer either way


def test_mkstemp_is_exclusive_private_and_never_follows_a_link(tmp_path: Path) -> None:
    import stat

    from fleetctl.remote.atomic import mkstemp

    fd, p = mkstemp(str(tmp_path), ".lock-")
    os.close(fd)
    assert Path(p).parent == tmp_path and Path(p).name.startswith(".lock-")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    names = {mkstemp(str(tmp_path), ".tmp-")[1] for _ in range(50)}
    assert len(names) == 50
    # a planted name is never opened through: O_EXCL refuses it, a new name is drawn
    target = tmp_path / "victim"
    target.write_text("keep")
    real = os.urandom

    calls = iter([b"\x00" * 6, b"\x01" * 6])
    os.symlink(target, tmp_path / (".tmp-" + "00" * 6))
    try:
        os.urandom = lambda n: next(calls)  # type: ignore[assignment]
        fd, p = mkstemp(str(tmp_path), ".tmp-")
    finally:
        os.urandom = real  # type: ignore[assignment]
    os.close(fd)
    assert p.endswith("01" * 6) and target.read_text() == "keep"


HEAVY_IMPORTS = {"json", "re", "enum", "signal", "subprocess", "_hashlib", "hashlib", "tempfile", "shutil", "random",
                 "base64"}


def test_agent_imports_nothing_heavy_on_common_commands(fresh_sandbox, tmp_path: Path) -> None:
    """On a bare host facts, deploy (a change, then a no-op), status and rollback are each one
    Python start whose imports are what it needs: no probe process (same_start), and none of json,
    re, enum, signal, subprocess, tempfile, shutil (issue 17: each is ms of CPU per host per
    command). OpenSSL's _hashlib only where it is cheaper: a deploy carrying at least
    core.OPENSSL_CONTENT bytes of files to write (this playbook's: ~0.34 MB, hashed about twice)."""
    import json
    import subprocess
    import sys

    sb = fresh_sandbox(hosts=1, versions=("0.5.9",), gpus=1, bare_shell=True)
    h = sb.hosts["h01"]
    log = tmp_path / "imports.log"
    real = h.python.with_name("python.real")
    h.python.rename(real)
    h.python.write_text(f'#!/bin/sh\necho "START $2" | head -c 40 >> {log}; echo >> {log}\n'
                        f'exec {real} -X importtime "$@" 2>> {log}\n')
    h.python.chmod(0o755)
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(tmp_path / "ledger"), "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)
    pb = str(repo / "playbooks" / "dynamic-spec-disable")
    seen = {}
    for name, args in (("facts", ["facts"]), ("deploy", ["deploy", pb]), ("no-op deploy", ["deploy", pb]),
                       ("status", ["status"]), ("rollback", ["rollback"])):
        log.write_text("")
        p = subprocess.run([sys.executable, "-m", "fleetctl", *args, "-i", str(sb.inventory_path), "--json"],
                           capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        doc = json.loads(p.stdout)
        if name in ("deploy", "rollback"):  # these really changed the host
            assert doc["summary"]["states"] == {"changed": 1}, doc["summary"]
        text = log.read_text()
        assert text.count("START") == 1, text[:2000]  # one Python start on the host
        imported = {ln.split("|")[-1].strip() for ln in text.splitlines() if "import time:" in ln}
        assert "marshal" in imported or "posixpath" in imported, sorted(imported)  # the log is real
        seen[name] = sorted(imported & HEAVY_IMPORTS)
    # a deploy that writes files hashes them 3-4 times (~1.3 MB here): OpenSSL's sha256 (_hashlib
    # alone, not hashlib.py) is cheaper than the builtin there; nothing else loads it
    assert seen == {**{k: [] for k in seen}, "deploy": ["_hashlib"]}, seen


def test_metadata_reads_the_header_only_with_the_same_answer(tmp_path: Path) -> None:
    from fleetctl.engines import wheels
    from fleetctl.remote.locate import read_metadata

    def full(d: Path) -> tuple[dict, list]:  # the whole-file parse it replaces
        head = (d / "METADATA").read_text(errors="replace").split("\n\n", 1)[0]
        fields: dict = {}
        req = []
        for line in head.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                req.append(v.strip()) if k == "Requires-Dist" else fields.setdefault(k, v.strip())
        return fields, req

    real = next(wheels.extracted("0.5.14").glob("sglang-*.dist-info"))
    assert read_metadata(str(real)) == full(real) and read_metadata(str(real))[1]
    # a header longer than one read, the blank line right at a read boundary, no body, no blank line
    for text in ["Name: x\n" + "Requires-Dist: torch==2.1\n" * 3000 + "\nbody\n" * 5000,
                 "A: " + "a" * (16384 - 5) + "\n\nB: no",
                 "Name: y\nVersion: 1\n", "Name: z\n\n"]:
        d = tmp_path / str(len(text))
        d.mkdir()
        (d / "METADATA").write_text(text)
        assert read_metadata(str(d)) == full(d)
