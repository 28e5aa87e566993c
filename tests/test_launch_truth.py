"""Locate SGLang exactly as the launch will, and bytecode (issue 14 items 1 and 2), on a sandbox host.

Each test bends one host the way operators have them and checks that facts/explain/deploy locate
the tree the server really imports, and that launch + verify-logs agree. One private 1-host
sandbox (0.5.9, 1 GPU) for the module; every test leaves it pristine.
"""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from test_launch import playbook_with, stop_all_local
from waiting import until

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.remote import servers as srv
from fleetctl.sandbox import lifecycle
from fleetctl.sandbox.lifecycle import Sandbox

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "playbooks" / "dynamic-spec-disable"
MARKER = "Dynamic speculation disable enabled"
WORKER = "srt/speculative/eagle_worker.py"
SIM = "-m fleetctl.sandbox.simulator"


# in-process hosts (tests/fakehost.py) for what the launch finds and proves; the launch's servers
# are real processes of the host's python (children of this process, in sessions of their own); what
# sshd's session hands the launch keeps a real sshd host (`ssb`)
@pytest.fixture(scope="module")
def fake_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    import fakehost

    with fakehost.sandbox(tmp_path_factory.mktemp("truth") / "sb", hosts=1, versions=["0.5.9"], gpus=1) as sb:
        yield sb


@pytest.fixture
def one(fake_one: Sandbox) -> Iterator[Sandbox]:
    import fakehost

    with fakehost.installed(fake_one.fake):  # type: ignore[attr-defined]
        yield fake_one


def _reset(sb: Sandbox) -> None:
    for h in sb.hosts.values():
        for sub in ("srt/speculative", "srt"):
            src = wheels.package_dir(h.version) / sub
            for f in src.iterdir():
                dst = h.sglang_dir / sub / f.name
                if f.is_file() and (not dst.exists() or dst.read_bytes() != f.read_bytes()):
                    dst.write_bytes(f.read_bytes())
            shutil.rmtree(h.sglang_dir / sub / "__pycache__", ignore_errors=True)
        shutil.rmtree(h.state_dir / "deploys", ignore_errors=True)
        (h.state_dir / "lock").unlink(missing_ok=True)


@pytest.fixture
def sb(one: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    try:
        yield one
    finally:
        stop_all_local(one)
        _reset(one)


@pytest.fixture
def ssb(fresh_sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    """`sb` on a real sshd host (the fleet marker comes with fresh_sandbox): for what sshd's session
    hands the launch."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    sb = fresh_sandbox(hosts=1, versions=("0.5.9",), gpus=1)
    try:
        yield sb
    finally:
        stop_all_local(sb)


def inventory(sb: Sandbox, path: Path, **host: Any) -> Path:
    doc = yaml.safe_load(sb.inventory_path.read_text())
    base = sb.inventory_path.parent
    doc["ssh_config"] = str(base / doc["ssh_config"])
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(base / doc["defaults"][k])
    h = doc["hosts"]["h01"]
    h["flags"] = {"--port": free_port()}
    for k, v in host.items():
        h[k] = {**h.get(k, {}), **v} if isinstance(v, dict) else v
    path.write_text(yaml.safe_dump(doc))
    return path


def playbook(tmp_path: Path, **launch: Any) -> Path:
    return playbook_with(tmp_path, launch)


def cli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, Any, str]:
    capsys.readouterr()
    code = main([*map(str, args), "--json"])
    cap = capsys.readouterr()
    return code, json.loads(cap.out) if cap.out.strip() else None, cap.err


def other_tree(tmp_path: Path, version: str = "0.5.9") -> Path:
    """A second, pristine SGLang tree (another checkout / venv): returns the dir holding `sglang/`."""
    site = tmp_path / "other-site"
    shutil.copytree(wheels.package_dir(version), site / "sglang")
    return site


def patched(pkg: Path) -> bool:
    return MARKER in (pkg / WORKER).read_text()


def deploy_launch_verify(capsys: pytest.CaptureFixture[str], inv: Path, pb: Path) -> dict[str, Any]:
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--timeout", "300")
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 0, (doc, err)
    return doc


# ----------------------------------------------------------------------------- item 1


def test_pythonpath_in_playbook_launch_env(sb: Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = other_tree(tmp_path)
    pb = playbook(tmp_path, env={"PYTHONPATH": str(site)})
    inv = inventory(sb, tmp_path / "inv.yaml")
    h = sb.hosts["h01"]
    code, doc, _ = cli(capsys, "deploy", "-i", inv, pb, "--check")
    assert code == 0 and doc["plan"]["hosts"][0]["package_dir"] == str(site / "sglang")
    deploy_launch_verify(capsys, inv, pb)
    assert patched(site / "sglang") and not patched(h.sglang_dir)  # the tree the server imports
    code, doc, _ = cli(capsys, "status", "-i", inv, pb)
    assert code == 0, doc


def test_pythonpath_in_the_hosts_login_environment(ssb: Sandbox, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """sshd hands the session PYTHONPATH (as a login profile would); the launch does not pass it on."""
    sb = ssb
    site = other_tree(tmp_path)
    h = sb.hosts["h01"]
    cfg = h.sshd_config.read_text()
    try:
        h.sshd_config.write_text(f"SetEnv PYTHONPATH={site}\n" + cfg)
        sb.stop_host("h01")
        sb.start_host("h01")
        inv = inventory(sb, tmp_path / "inv.yaml")
        code, doc, _ = cli(capsys, "facts", "-i", inv)
        sg = doc["hosts"][0]["facts"]["sglang"]
        assert code == 0 and sg["dir"] == str(h.sglang_dir)
        assert any("login environment sets PYTHONPATH" in n for n in sg["notes"])
        pb = playbook(tmp_path)
        deploy_launch_verify(capsys, inv, pb)
        assert patched(h.sglang_dir) and not patched(site / "sglang")
    finally:
        h.sshd_config.write_text(cfg)
        sb.stop_host("h01")
        sb.start_host("h01")


def test_sglang_dir_not_imported_by_the_launch_is_refused(sb: Sandbox, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    site = other_tree(tmp_path)
    inv = inventory(sb, tmp_path / "inv.yaml", sglang_dir=str(site / "sglang"))
    # without a playbook: facts fails the host (issue 30.5: was exit 0 with a note), naming both
    code, doc, _ = cli(capsys, "facts", "-i", inv)
    notes = " ".join(doc["hosts"][0]["facts"]["sglang"]["notes"])
    assert code == 1 and doc["hosts"][0]["state"] == "mismatch"
    assert str(site / "sglang") in notes and str(sb.hosts["h01"].sglang_dir) in notes
    # with the playbook's launch: refused, naming both
    code, doc, _ = cli(capsys, "explain", "-i", inv, playbook(tmp_path))
    msg = doc["hosts"][0]["reason"]
    assert code == 1 and str(site / "sglang") in msg and str(sb.hosts["h01"].sglang_dir) in msg
    code, doc, _ = cli(capsys, "deploy", "-i", inv, playbook(tmp_path))
    assert code == 1 and not patched(site / "sglang") and not patched(sb.hosts["h01"].sglang_dir)
    assert str(site / "sglang") in json.dumps(doc)
    # the right sglang_dir is accepted
    inv = inventory(sb, tmp_path / "inv2.yaml", sglang_dir=str(sb.hosts["h01"].sglang_dir))
    code, doc, _ = cli(capsys, "facts", "-i", inv)
    assert code == 0 and doc["hosts"][0]["facts"]["sglang"]["dir"] == str(sb.hosts["h01"].sglang_dir)


def test_launch_command_that_sets_env_itself(sb: Sandbox, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    inv = inventory(sb, tmp_path / "inv.yaml",
                    launch_command=f"env SGLANG_ENABLE_SPEC_V2=1 {{python}} {SIM}")
    code, doc, _ = cli(capsys, "explain", "-i", inv, playbook(tmp_path))
    row = doc["hosts"][0]
    assert row["worker_class"] == "EAGLEWorkerV2" and row["spec_v2_env"] == "1"
    assert code == 1 and "does not support EAGLEWorkerV2" in row["refused"]
    # `env -u` takes it away again: EAGLEWorker, covered
    inv = inventory(sb, tmp_path / "inv2.yaml", env={"SGLANG_ENABLE_SPEC_V2": "1"},
                    launch_command=f"env -u SGLANG_ENABLE_SPEC_V2 {{python}} {SIM}")
    code, doc, _ = cli(capsys, "explain", "-i", inv, playbook(tmp_path))
    assert code == 0 and doc["hosts"][0]["worker_class"] == "EAGLEWorker"


def test_launch_command_with_another_interpreter(sb: Sandbox, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The launch runs a second python (another venv) whose site-packages hold another tree."""
    site = other_tree(tmp_path)
    h = sb.hosts["h01"]
    # another venv of the same interpreter, whose site dirs hold the other tree
    alt = lifecycle.install_host_python(tmp_path / "alt-venv", sb.host_python, [site, sb.dir / lifecycle.HOSTLIB])
    inv = inventory(sb, tmp_path / "inv.yaml", launch_command=f"nohup {alt} {SIM}")
    pb = playbook(tmp_path)
    code, doc, _ = cli(capsys, "facts", "-i", inv)
    assert code == 0 and doc["hosts"][0]["facts"]["sglang"]["dir"] == str(site / "sglang")
    deploy_launch_verify(capsys, inv, pb)
    assert patched(site / "sglang") and not patched(h.sglang_dir)


def test_launch_command_whose_python_cannot_be_told_is_reported(sb: Sandbox, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    inv = inventory(sb, tmp_path / "inv.yaml", launch_command=f"sh -c '{{python}} {SIM}'")
    code, doc, _ = cli(capsys, "facts", "-i", inv)
    sg = doc["hosts"][0]["facts"]["sglang"]
    assert not sg["found"] and "cannot tell which python" in sg["error"]
    code, doc, _ = cli(capsys, "deploy", "-i", inv, playbook(tmp_path))
    assert code == 1 and not patched(sb.hosts["h01"].sglang_dir)
    assert "cannot tell which python" in json.dumps(doc)
    code, doc, _ = cli(capsys, "explain", "-i", inv, playbook(tmp_path))
    assert code == 1 and "cannot tell which python" in doc["hosts"][0]["refused"]


# ----------------------------------------------------------------------------- item 2 (bytecode)


def _host_pyc(sb: Sandbox, rel: str, mode: py_compile.PycInvalidationMode, prefix: Path | None = None) -> Path:
    """A pyc of the host file's CURRENT bytes, compiled by the host's interpreter (its cache tag)."""
    h = sb.hosts["h01"]
    src = h.sglang_dir / rel
    code = (f"import py_compile, importlib.util, sys; "
            f"py_compile.compile({str(src)!r}, cfile=importlib.util.cache_from_source({str(src)!r}), "
            f"invalidation_mode=py_compile.PycInvalidationMode.{mode.name}, doraise=True); "
            f"print(importlib.util.cache_from_source({str(src)!r}))")
    import subprocess

    argv = [str(h.python), *(["-X", f"pycache_prefix={prefix}"] if prefix else []), "-c", code]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    return Path(out)


def test_unchecked_hash_pyc_of_the_original_source(sb: Sandbox, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pyc = _host_pyc(sb, WORKER, py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert pyc.exists()
    inv = inventory(sb, tmp_path / "inv.yaml")
    pb = playbook(tmp_path)
    code, doc, _ = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0, doc
    assert not pyc.exists()  # removed inside the deploy's transaction
    notes = " ".join(n for r in doc["hosts"] for n in r.get("notes", []))
    assert "unchecked-hash" in notes and pyc.name in notes
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--timeout", "300")
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 0, (doc, err)
    # the server wrote bytecode of the PATCHED source meanwhile; rollback must not leave it runnable
    stop_all_local(sb)
    patched_pyc = _host_pyc(sb, WORKER, py_compile.PycInvalidationMode.UNCHECKED_HASH)
    code, doc, _ = cli(capsys, "rollback", "-i", inv)
    assert code == 0 and not patched_pyc.exists() and not patched(sb.hosts["h01"].sglang_dir)


def test_stale_pyc_makes_verify_logs_fail_and_say_why(sb: Sandbox, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A pyc of the pristine source put back after the deploy (e.g. by an image rebuild): the
    simulator runs it as CPython would, so verify-logs fails, explains it, and explain refuses."""
    inv = inventory(sb, tmp_path / "inv.yaml")
    pb = playbook(tmp_path)
    code, doc, _ = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0
    h = sb.hosts["h01"]
    src = h.sglang_dir / WORKER
    data = src.read_bytes()
    st = src.stat()
    src.write_bytes((wheels.package_dir("0.5.9") / WORKER).read_bytes())
    _host_pyc(sb, WORKER, py_compile.PycInvalidationMode.UNCHECKED_HASH)
    src.write_bytes(data)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, doc, _ = cli(capsys, "explain", "-i", inv, pb)
    assert "unchecked-hash" in (doc["hosts"][0]["bytecode"] or "")
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--timeout", "300")
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 1
    text = json.dumps(doc)
    assert "unchecked-hash" in text and "does NOT carry" in text
    loads = next(e for e in doc["hosts"][0]["instances"][0]["explanation"] if "the code import loads" in e)
    assert f"(from its __pycache__/{Path(WORKER).stem}.cpython-" in loads and str(h.sglang_dir) not in loads, loads
    # the files are already as intended, yet deploy is not a no-op: it removes the stale bytecode
    code, doc, _ = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0 and doc["plan"]["hosts"][0]["drop_bytecode"] == [WORKER]
    assert "stale cached bytecode" in json.dumps(doc["hosts"])
    # shown relative to the package dir (an absolute path was cut mid-word in the result table)
    note = next(n for r in doc["hosts"] for n in r.get("notes", []) if "stale cached bytecode" in n)
    assert str(h.sglang_dir) not in note and "srt/speculative/__pycache__/" in note, note
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--timeout", "300", "--replace")
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 0, (doc, err)


def test_pycache_prefix_of_the_launch(sb: Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "pycache-prefix"
    pyc = _host_pyc(sb, WORKER, py_compile.PycInvalidationMode.UNCHECKED_HASH, prefix)
    assert str(pyc).startswith(str(prefix)) and pyc.exists()
    pb = playbook(tmp_path, env={"PYTHONPYCACHEPREFIX": str(prefix)})
    inv = inventory(sb, tmp_path / "inv.yaml")
    deploy_launch_verify(capsys, inv, pb)
    # the deploy removed the unchecked pyc under the launch's prefix; the server's own import then
    # cached the patched source there as a plain timestamp pyc
    assert sys.implementation.cache_tag in pyc.name
    assert not pyc.exists() or int.from_bytes(pyc.read_bytes()[4:8], "little") == 0


def test_compiled_extension_in_place_of_the_worker_is_refused(sb: Sandbox, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An extension module beside the .py wins over it at import: patching the .py changes nothing."""
    import importlib.machinery

    h = sb.hosts["h01"]
    ext = (h.sglang_dir / WORKER).with_name("eagle_worker" + importlib.machinery.EXTENSION_SUFFIXES[0])
    ext.write_bytes(b"\x7fELF not really")
    try:
        inv = inventory(sb, tmp_path / "inv.yaml")
        pb = playbook(tmp_path)
        code, doc, _ = cli(capsys, "explain", "-i", inv, pb)
        assert code == 1 and "compiled extension" in doc["hosts"][0]["refused"]
        code, doc, _ = cli(capsys, "deploy", "-i", inv, pb)
        assert code == 1 and "compiled extension" in json.dumps(doc) and not patched(h.sglang_dir)
    finally:
        ext.unlink()


# ----------------------------------------------------------------------------- item 3 (liveness)


def _children(ppid: int, needle: str) -> list[int]:
    """Live child processes of `ppid` whose argv contains `needle` (read from /proc)."""
    out = []
    for n in os.listdir("/proc"):
        if not n.isdigit():
            continue
        try:
            stat = Path(f"/proc/{n}/stat").read_bytes()
            argv = Path(f"/proc/{n}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2:].split()
        if int(rest[1]) == ppid and rest[0] != b"Z" and needle in argv:
            out.append(int(n))
    return out


def test_wrapper_that_outlives_the_server_is_not_a_running_server(sb: Sandbox, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The launch's python is a shell wrapper without `exec` that stays after the server exits."""
    import signal

    h = sb.hosts["h01"]
    alt = tmp_path / "shim" / "bin" / "python3"
    alt.parent.mkdir(parents=True)
    alt.write_text(f'#!/bin/sh\n{h.python} "$@"\ncase "$*" in *fleetctl.sandbox.simulator*) '
                   'sleep 300 </dev/null >/dev/null 2>&1;; esac\n')
    alt.chmod(0o755)
    inv = inventory(sb, tmp_path / "inv.yaml", python=str(alt))
    pb = playbook(tmp_path)
    deploy_launch_verify(capsys, inv, pb)
    (name,) = srv.list_instances(str(h.state_dir))
    rec = srv.current_record(str(h.state_dir), name)
    (server,) = _children(rec["pid"], "fleetctl.sandbox.simulator")  # the python under the wrapper shell
    # identified at ready: that python, never the launch's exit-status supervisor (the same python here,
    # its argv carrying the simulator's) nor the wrapper
    assert rec["server_pid"] == server and server not in (rec["supervisor_pid"], rec["pid"])
    os.kill(server, signal.SIGKILL)  # the server dies; the wrapper shell lives on
    until(lambda: not os.path.exists(f"/proc/{server}"), f"the killed server {server} to be gone")
    assert srv.record_alive(rec)  # the wrapper
    code, doc, _ = cli(capsys, "status", "-i", inv)
    (row,) = doc["hosts"][0]["servers"]
    assert code == 1 and row["running"] is False and "launch wrapper" in " ".join(row["problems"])
    code, doc, _ = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 1 and "server not running" in json.dumps(doc)
    # a relaunch is not blocked by a stale "not running" view: --replace stops the wrapper first
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--timeout", "300", "--replace")
    assert code == 0, (doc, err)
    rec = srv.current_record(str(h.state_dir), name)
    assert rec["server_pid"] != rec["pid"] and rec["server_pid"] in _children(rec["pid"], "simulator")
