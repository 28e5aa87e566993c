"""The remote agent's transaction code, run locally on real files (the same code the hosts run)."""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from agentpipe import boot, completed
from faulthook import faulted

from fleetctl.engines import engine
from fleetctl.remote import agent_key, agent_source, serverfacts
from fleetctl.remote import files as rfiles
from fleetctl.remote import lock as rlock
from fleetctl.remote import records as rrecords
from fleetctl.remote import transaction as rtx
from fleetctl.remote.core import AgentError
from fleetctl.transport.session import HELLO
from fleetctl.transport.ssh import BOOTSTRAP


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    p = tmp_path / "site" / "sglang"
    (p / "srt" / "speculative").mkdir(parents=True)
    (p / "__init__.py").write_text("")
    (p / "srt" / "a.py").write_bytes(b"A = 1\n")
    (p / "srt" / "speculative" / "b.py").write_bytes("B = '\u2013 dash'\n".encode())
    os.chmod(p / "srt" / "a.py", 0o644)
    return p


def payload(tmp_path: Path, pkg: Path, new: dict[str, bytes], did: str = "d1") -> dict:
    files = []
    for rel, data in new.items():
        before = (pkg / rel).read_bytes()
        files.append({"path": rel, "sha_before": sha(before), "sha_after": sha(data),
                      "content": data})
    return {"state_dir": str(tmp_path / "state"), "deploy_id": did, "package_dir": str(pkg), "version": "0",
            "playbook": "t", "by": "test", "files": files, "verify_paths": list(new)}


def run_agent_subprocess(p: dict) -> subprocess.CompletedProcess[bytes]:
    """Run the agent exactly as a host does: python -c BOOTSTRAP with the source on stdin."""
    return completed([sys.executable, "-c", BOOTSTRAP], marshal.dumps(p, 4))


def test_deploy_then_rollback_byte_identical(tmp_path: Path, pkg: Path) -> None:
    orig_a = (pkg / "srt/a.py").read_bytes()
    orig_b = (pkg / "srt/speculative/b.py").read_bytes()
    res = rtx.action_deploy(payload(tmp_path, pkg, {"srt/a.py": b"A = 2\n", "srt/speculative/b.py": b"B = 3\n"}))
    assert res["deploy_id"] == "d1"
    assert res["final"] == {"srt/a.py": sha(b"A = 2\n"), "srt/speculative/b.py": sha(b"B = 3\n")}
    assert oct(os.stat(pkg / "srt/a.py").st_mode & 0o777) == oct(0o644)
    m = rrecords.load_manifest(str(tmp_path / "state"), "d1")
    assert m["state"] == "complete" and all(f["status"] == "applied" for f in m["files"])
    assert not list((pkg / "srt").glob(".*tmp"))
    out = rtx.action_rollback({"state_dir": str(tmp_path / "state"), "deploy_ids": ["d1"], "by": "t"})
    assert [f["action"] for f in out["rollbacks"][0]["files"]] == ["restored", "restored"]
    assert (pkg / "srt/a.py").read_bytes() == orig_a
    assert (pkg / "srt/speculative/b.py").read_bytes() == orig_b
    # idempotent
    again = rtx.action_rollback({"state_dir": str(tmp_path / "state"), "deploy_ids": ["d1"], "by": "t"})
    assert again["rollbacks"][0].get("skipped")


def test_second_file_failing_to_compile_restores_the_first(tmp_path: Path, pkg: Path) -> None:
    orig_a = (pkg / "srt/a.py").read_bytes()
    p = payload(tmp_path, pkg, {"srt/a.py": b"A = 2\n", "srt/speculative/b.py": b"def broken(:\n"})
    with pytest.raises(AgentError, match=r"does not compile.*restored to its original files"):
        rtx.action_deploy(p)
    assert (pkg / "srt/a.py").read_bytes() == orig_a
    assert rrecords.load_manifest(str(tmp_path / "state"), "d1")["state"] == "failed-restored"
    assert rlock.read_lock(str(tmp_path / "state")) is None
    leftovers = [x for x in pkg.rglob("*") if "tmp" in x.name]
    assert leftovers == []


def test_compile_check_runs_on_a_host_whose_python_grammar_was_not_validated(tmp_path: Path, pkg: Path) -> None:
    """The controller compiles the intended bytes once with its own Python and says which
    (`validated_by`, major.minor). A host with another Python compiles them itself and refuses bytes
    that do not compile there; a host with the same one skips that per-host CPU."""
    bad = {"srt/a.py": b"def broken(:\n"}
    with pytest.raises(AgentError, match=r"does not compile"):
        rtx.action_deploy({**payload(tmp_path, pkg, bad), "validated_by": "2.7"})
    assert (pkg / "srt/a.py").read_bytes() == b"A = 1\n"
    same = f"{sys.version_info[0]}.{sys.version_info[1]}"
    res = rtx.action_deploy({**payload(tmp_path, pkg, bad, did="d2"), "validated_by": same})
    assert res["deploy_id"] == "d2" and (pkg / "srt/a.py").read_bytes() == bad["srt/a.py"]


def test_changed_since_plan_refused_before_any_change(tmp_path: Path, pkg: Path) -> None:
    p = payload(tmp_path, pkg, {"srt/a.py": b"A = 2\n"})
    (pkg / "srt/a.py").write_bytes(b"A = 'edited'\n")
    with pytest.raises(AgentError, match="changed since the plan"):
        rtx.action_deploy(p)
    assert (pkg / "srt/a.py").read_bytes() == b"A = 'edited'\n"


def test_symlink_and_escape_refused(tmp_path: Path, pkg: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_bytes(b"X = 1\n")
    (pkg / "srt/link.py").symlink_to(outside)
    with pytest.raises(AgentError, match=r"outside the package dir|symlink"):
        rfiles.safe_target(str(pkg), "srt/link.py")
    with pytest.raises(AgentError, match="escapes"):
        rfiles.safe_target(str(pkg), "../outside.py")


def test_lock_held_by_live_process_refuses_and_stale_lock_is_reported(tmp_path: Path, pkg: Path) -> None:
    sd = str(tmp_path / "state")
    rlock.ensure_state_dir(sd)
    lock = Path(sd) / "lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "op": "deploy", "id": "dX", "by": "alice@ctl", "since": 0}))
    with pytest.raises(AgentError, match="locked: deploy dX by alice@ctl"):
        rtx.action_deploy(payload(tmp_path, pkg, {"srt/a.py": b"A = 2\n"}))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"pid": int(dead.stdout), "op": "deploy", "id": "dY", "by": "bob@ctl", "since": 0}))
    res = rtx.action_deploy(payload(tmp_path, pkg, {"srt/a.py": b"A = 2\n"}))
    assert any("stale lock of deploy dY by bob@ctl" in n for n in res["notes"])
    assert not lock.exists()


def test_killed_mid_deploy_is_detected_and_repaired(tmp_path: Path, pkg: Path) -> None:
    """The agent dies between two renames: the host is mixed, facts report it, the next run repairs it."""
    orig = {r: (pkg / r).read_bytes() for r in ("srt/a.py", "srt/speculative/b.py")}
    p = payload(tmp_path, pkg, {"srt/a.py": b"A = 2\n", "srt/speculative/b.py": b"B = 3\n"})
    p["action"] = "deploy"
    r = run_agent_subprocess(faulted(p, {"at": "applied", "n": 1, "how": "exit"}))
    assert r.returncode == 99
    assert (pkg / "srt/a.py").read_bytes() == b"A = 2\n"  # mixed on purpose
    assert (pkg / "srt/speculative/b.py").read_bytes() == orig["srt/speculative/b.py"]
    st = rrecords.state_facts({"state_dir": p["state_dir"]}, None)
    (m,) = st["deploys"]
    assert m["state"] == "applying" and st["lock"]["stale"]
    notes = rtx.recover_interrupted(p["state_dir"])
    assert notes and "repaired interrupted deploy d1" in notes[0]
    assert {r: (pkg / r).read_bytes() for r in orig} == orig


def test_agent_protocol_over_stdin(tmp_path: Path, pkg: Path) -> None:
    r = run_agent_subprocess({"action": "ping"})
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["result"]["pong"]
    r = run_agent_subprocess({"action": "nope"})
    doc = json.loads(r.stdout)
    assert not doc["ok"] and doc["kind"] == "bad_input"


def _tree(root: Path, version: str) -> Path:
    pkg = root / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    return pkg


def test_locate_installed_wheel_with_torch_requirement(tmp_path: Path) -> None:
    from fleetctl.remote.locate import locate_package

    site = tmp_path / "site-packages"
    pkg = _tree(site, "0.5.9")
    dist = site / "sglang-0.5.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n"
                                   "Requires-Dist: torch_memory_saver==0.0.9\nRequires-Dist: torch==2.9.1\n\nbody\n")
    res = locate_package(engine().agent_facts(), str(pkg))
    assert (res["version"], res["install"], res["torch_requires"]) == ("0.5.9", "wheel", ["torch==2.9.1"])


def test_locate_editable_install(tmp_path: Path) -> None:
    from fleetctl.remote.locate import locate_package

    site = tmp_path / "site-packages"
    pkg = _tree(site, "0.5.10.post1")
    dist = site / "sglang-0.5.10.post1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Name: sglang\nVersion: 0.5.10.post1\n")
    (dist / "direct_url.json").write_text(json.dumps({"url": "file:///src", "dir_info": {"editable": True}}))
    assert locate_package(engine().agent_facts(), str(pkg))["install"] == "editable"


def test_locate_git_checkout(tmp_path: Path) -> None:
    """The origin story's layout: /root/sglang/python/sglang inside a git checkout."""
    from fleetctl.remote.locate import locate_package

    repo = tmp_path / "sglang"
    (repo / ".git").mkdir(parents=True)
    pkg = _tree(repo / "python", "0.5.9")
    (repo / "python" / "pyproject.toml").write_text('dependencies = [\n  "torch==2.9.1",\n  "numpy",\n]\n')
    res = locate_package(engine().agent_facts(), str(pkg))
    assert res["install"] == "git checkout" and res["checkout"] == str(repo)
    assert res["torch_requires"] == ["torch==2.9.1"] and res["version"] == "0.5.9"


def test_torch_check_verdicts() -> None:
    from fleetctl.model.facts import check_torch

    assert check_torch("2.9.1+cu128", ["torch==2.9.1"]).satisfied is True
    assert check_torch("2.8.0", ["torch==2.9.1"]).satisfied is False
    assert check_torch(None, ["torch==2.9.1"]).satisfied is False
    assert check_torch("2.9.1", []).satisfied is None
    assert check_torch("2.9.1", ['torch>=2.5; extra == "dev"']).satisfied is None


def _torch_check_by_requirements(installed: str | None, requires: list[str]) -> tuple:
    """The reference: every line through packaging.requirements (what check_torch did before its
    fast path for plain lines)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    reqs = []
    for r in requires:
        try:
            req = Requirement(r)
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and not (req.marker is not None and "extra" in str(req.marker)):
            reqs.append(req)
    shown = [str(r.specifier) or "any" for r in reqs]
    if installed is None:
        return shown, (False if reqs else None)
    if not reqs:
        return shown, None
    try:
        v = Version(installed)
    except InvalidVersion:
        return shown, None
    return shown, all(r.specifier.contains(v, prereleases=True) for r in reqs)


TORCH_LINES = [
    "torch==2.9.1", "torch ==2.9.1", " torch>=2.5,<3 ", "torch>=2.5 , <3", "torch", "Torch==2.9.1", "TORCH>=2",
    "torch==2.9.*", "torch~=2.9.0", "torch!=2.9.0", "torch===2.9.1", "torch<=2.8", "torch>2.9.1rc1",
    "torch (>=2.5)", "torch[cuda]==2.9.1", 'torch==2.9.1; extra == "srt"', 'torch>=2.5; python_version >= "3.8"',
    'torch==2.8; sys_platform == "darwin"', "torch @ https://example.invalid/torch.whl", "torch 2.9.1",
    "torch==", "torch==2.9.1 junk", "torch.==1", "-torch==1", "torch_memory_saver==0.0.9", "torchvision",
    "torch==2.9.1;", "torch==2.9.1 ; extra=='x'", "torch>=2.5;python_version<'2'", "torch==abc", "",
]


def test_torch_check_fast_path_answers_as_packaging_requirements() -> None:
    """Plain `name specifier` lines are read without packaging.requirements: the verdict and the
    shown requirement are the same as parsing every line with it, line by line and mixed."""
    from fleetctl.model.facts import _check_torch

    versions = [None, "2.9.1", "2.9.1+cu128", "2.8.0", "2.11.0", "3.0.0", "2.9.1rc1", "not-a-version"]
    cases = [[line] for line in TORCH_LINES] + [TORCH_LINES, TORCH_LINES[::-1], ["torch==2.9.1", "torch>=2.10"]]
    for requires in cases:
        for v in versions:
            got = _check_torch(v, tuple(requires))
            assert (got.required, got.satisfied) == _torch_check_by_requirements(v, requires), (v, requires)


def test_a_plain_torch_line_is_checked_without_packaging_requirements() -> None:
    """What sglang's wheels state (`torch==2.9.1`) is read by packaging.specifiers alone: the
    requirement parser, its markers and what they import (subprocess, sysconfig, ~40 ms of CPU)
    stay out of a command that checks it."""
    import subprocess
    import sys

    code = ("import sys; from fleetctl.model.facts import check_torch; "
            "assert check_torch('2.9.1', ['torch==2.9.1']).satisfied is True; "
            "print(sorted(m for m in ('packaging.requirements', 'packaging.markers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "[]\n"


def test_bootstrap_caches_the_compiled_agent_privately(tmp_path: Path) -> None:
    """The host keeps the compiled agent in its state dir (0600 file, 0700 dir) and ignores a cache
    file anyone else could have written."""
    data = marshal.dumps({"action": "ping"}, 4)
    cache = tmp_path / "state" / "cache"
    argv = [sys.executable, "-c", BOOTSTRAP, str(cache), sys.executable, agent_key()]
    hellos = []
    for _ in range(2):
        hello, out, err, _rc = boot(argv, data)
        hellos.append(hello[len(HELLO):len(HELLO) + 1])
        assert json.loads(out)["ok"], err
    assert hellos == [b"N", b"C"]  # the second start asked for no code
    (f,) = list(cache.iterdir())
    assert f.name.startswith("agent-") and os.stat(f).st_mode & 0o777 == 0o600
    assert os.stat(cache).st_mode & 0o777 == 0o700
    f.write_bytes(b"garbage")
    os.chmod(f, 0o660)  # group-writable: not trusted, the code is asked for again
    hello, out, err, _rc = boot(argv, data)
    assert hello[len(HELLO):len(HELLO) + 1] == b"N" and json.loads(out)["ok"], err
    os.chmod(f, 0o600)
    f.write_bytes(b"garbage")  # ours but not a code object: asked for again, and rewritten
    hello, out, err, _rc = boot(argv, data)
    assert hello[len(HELLO):len(HELLO) + 1] == b"N" and json.loads(out)["ok"], err
    hello, out, err, _rc = boot(argv, data)
    assert hello[len(HELLO):len(HELLO) + 1] == b"C" and json.loads(out)["ok"], err
    os.chmod(cache, 0o777)  # a dir others can write: not trusted either
    hello, out, err, _rc = boot(argv, data)
    assert hello[len(HELLO):len(HELLO) + 1] == b"N" and json.loads(out)["ok"], err


def test_bootstrap_keeps_a_verified_cache_and_a_tampered_one_is_sent_again(tmp_path: Path) -> None:
    """The stripped, compressed source is what is sent; a host whose python compiles it to the
    controller's bytes (same magic, marshal format 2) keeps that compiled form, else the source, each
    named by its hash and run only if its bytes still hash to the key: a cache changed on the host
    (same owner, same mode) is not run, the code is sent again."""
    from fleetctl.remote import packed
    from fleetctl.transport.session import code_key, compiled_agent

    magic, code = compiled_agent()
    cache = tmp_path / "cache"
    data = marshal.dumps({"action": "ping"}, 4)
    for extra, name in (([magic, code_key(code)], f"agent-{code_key(code)}.{sys.implementation.cache_tag}"),
                        (["00000000", code_key(code)], f"agent-{agent_key()}.src"), ([], f"agent-{agent_key()}.src")):
        shutil.rmtree(cache, ignore_errors=True)
        argv = [sys.executable, "-c", BOOTSTRAP, str(cache), sys.executable, agent_key(), *extra]
        hello, out, err, _rc = boot(argv, data)
        assert hello[len(HELLO):len(HELLO) + 1] == b"N" and json.loads(out)["ok"], err
        (f,) = list(cache.iterdir())
        assert f.name == name and f.stat().st_mode & 0o777 == 0o600
        assert f.read_bytes() == (code if extra and extra[0] == magic else agent_source())
        hello, out, err, _rc = boot(argv, data, code=b"")
        assert hello[len(HELLO):len(HELLO) + 1] == b"C" and json.loads(out)["ok"], err
        # tampered: a planted agent that writes a file; its bytes do not hash to the key: not run
        planted = tmp_path / "planted"
        evil = compile(f"open({str(planted)!r}, 'w').write('ran')", "x", "exec")
        f.write_bytes(marshal.dumps((evil, evil, ""), 2) if f.name.endswith(sys.implementation.cache_tag)
                      else f"open({str(planted)!r}, 'w').write('ran')\0".encode())
        hello, out, err, _rc = boot(argv, data)
        assert hello[len(HELLO):len(HELLO) + 1] == b"N" and json.loads(out)["ok"], err
        assert not planted.exists()
        assert f.read_bytes() == (code if extra and extra[0] == magic else agent_source())  # rewritten
    # what goes on the wire: lzma of the stripped source (zlib where the host has no lzma)
    import lzma
    import zlib

    assert lzma.decompress(packed("L")) == zlib.decompress(packed("Z")) == agent_source()
    assert len(packed("L")) < 40_000 and b"\n    \"\"\"" not in agent_source()


def test_controller_keeps_its_compiled_agent_privately(tmp_path: Path) -> None:
    """The controller compiles the agent once per fleetctl version and interpreter (~57 ms of CPU),
    keeps it under the cache dir as the hosts keep theirs, and trusts only a regular 0600 file of
    its own in a dir nobody else can write, holding the two code objects; anything else is
    compiled again (and gives the same code)."""
    from fleetctl.transport import session

    env = {**os.environ, "FLEETCTL_CACHE_DIR": str(tmp_path / "cache")}
    count = ("import builtins, sys\n"
             "n = [0]; real = builtins.compile\n"
             "def counting(src, name, *a, **k):\n"
             "    n[0] += name in ('fleetctl-agent', 'fleetctl-probe')\n"
             "    return real(src, name, *a, **k)\n"
             "builtins.compile = counting\n"
             "from fleetctl.transport import session\n"
             "magic, data = session.compiled_agent()\n"
             "print(n[0], session.compiled_cache_file(), __import__('hashlib').sha256(data).hexdigest())\n")

    def run() -> tuple[int, Path, str]:
        out = subprocess.run([sys.executable, "-c", count], env=env, capture_output=True, text=True, check=True)
        n, f, digest = out.stdout.split()
        return int(n), Path(f), digest

    n, f, digest = run()
    assert n == 2 and f.is_file() and f.parent.parent == tmp_path / "cache"
    assert (f.stat().st_mode & 0o777, f.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert run() == (0, f, digest)  # the second command reads it, compiles nothing
    good = f.read_bytes()
    for spoil in (lambda: f.write_bytes(b"junk"), lambda: f.write_bytes(marshal.dumps(("a", "b"))),
                  lambda: f.chmod(0o644), lambda: f.parent.chmod(0o777)):
        spoil()
        assert session._read_compiled(f) is None
        n2, _, digest2 = run()
        assert n2 == 2 and digest2 == digest  # compiled again: the same code
        f.parent.chmod(0o700)
        f.chmod(0o600)
        f.write_bytes(good)
    link = f.with_name("link.marshal")
    link.symlink_to(f)
    assert session._read_compiled(link) is None and session._read_compiled(f) == good


@pytest.mark.parametrize("size", [10, 4095, 4096, 65536, 65537, 200_000])
def test_proc_files_are_read_whole(size: int) -> None:
    """The process scan reads /proc/PID/{cmdline,environ} with as few reads as it can (a short read
    is the end there): any length comes back whole, and `limit` still cuts."""

    args = ["x" * min(100_000, size - i) for i in range(0, size, 100_000)]  # (one argument: at most 128 KiB)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FLEETCTL_TEST_LONG": "y" * min(size, 100_000)}
    code = "import sys, time; sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        want = b"\0".join(a.encode() for a in [sys.executable, "-c", code, *args]) + b"\0"
        assert len(want) > size
        assert serverfacts._read_proc(proc.pid, "cmdline") == want
        assert b"FLEETCTL_TEST_LONG=" + b"y" * min(size, 100_000) + b"\0" in serverfacts._read_proc(proc.pid, "environ")
        assert serverfacts._read_proc(proc.pid, "cmdline", limit=7) == want[:7]
    finally:
        proc.kill()
        proc.wait()


def test_a_process_listening_on_many_ports_has_them_all_found() -> None:
    """/proc/PID/net/tcp answers a page of lines per read: read to its end, every port is found (the
    one-read shortcut is for cmdline and environ only)."""
    import socket


    socks = []
    try:
        for _ in range(120):  # ~150 bytes a line: several pages
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            socks.append(s)
        ports = {s.getsockname()[1] for s in socks}
        assert ports <= set(serverfacts._listening_ports(os.getpid()) or [])
    finally:
        for s in socks:
            s.close()


def test_an_on_demand_part_comes_with_its_first_request_and_its_cache_is_verified(tmp_path: Path) -> None:
    """The serverfacts part (the `servers` facts hook) is not in the first code sent; a request that needs it carries it (compressed,
    keyed by its hash) and the host keeps it; a later agent loads it from the cache by key alone,
    and a cache file changed there is not run: the answer asks for the part (kind need_part)."""
    from fleetctl.remote import part_key, part_packed
    from fleetctl.transport.session import code_key, compiled_agent, encode_request, part_code_key

    magic, code = compiled_agent()
    cache = tmp_path / "cache"
    argv = [sys.executable, "-c", BOOTSTRAP, str(cache), sys.executable, agent_key(), magic, code_key(code)]
    facts = {"gpus": False, "with": ["servers"], "state_dir": str(tmp_path / "state")}

    def session(*reqs: bytes) -> list[dict]:
        _hello, out, err, _rc = boot(argv, b"S" + b"".join(b"%010d" % len(r) + r for r in reqs))
        answers = []
        while out:
            n = int(out[:10])
            answers.append(json.loads(out[10:10 + n]))
            out = out[10 + n:]
        assert len(answers) == len(reqs), err
        return answers

    key, ck = part_key("serverfacts"), part_code_key("serverfacts")
    sent = [{"key": key, "code": ck, "blob": b"L" + part_packed("serverfacts", "L")}]
    only_key = [{"key": key, "code": ck, "blob": None}]
    a = session(encode_request("facts", facts), encode_request("facts", {**facts, "_load": sent}))
    assert "servers" not in a[0]["result"] and "servers" in a[1]["result"], a  # the hook came with the part
    (f,) = cache.glob("part-*")
    # (kept compiled under the source's key: the hello can say it is here from the key alone)
    assert f.name == f"part-{key}.{sys.implementation.cache_tag}" and f.stat().st_mode & 0o777 == 0o600
    hello = boot([*argv, key], b"")[0]
    assert hello.endswith(b"01") and boot([*argv, "0" * 32, key], b"")[0].endswith(b"02"), hello
    (b,) = session(encode_request("facts", {**facts, "_load": only_key}))
    assert b["ok"] and "servers" in b["result"], b
    planted = tmp_path / "planted"
    f.write_bytes(marshal.dumps(compile(f"open({str(planted)!r}, 'w').write('ran')", "x", "exec"), 2))
    (c,) = session(encode_request("facts", {**facts, "_load": only_key}))
    assert c == {"ok": False, "error": f"part {key} is not cached here", "kind": "need_part"} and not planted.exists()
    bad = [{"key": key, "code": ck, "blob": b"L" + part_packed("serverfacts", "L")[:-1] + b"!"}]
    (d,) = session(encode_request("ping", {"_load": bad}))
    assert not d["ok"] and not planted.exists(), d
