"""Hosts that run another Python than the controller's (a real GPU host's may be any CPython from 3.10,
what SGLang requires, and the agent supports 3.8 up): the whole loop on a sandbox host whose
interpreter is each other CPython found on this machine (PATH, pyenv), with an unchecked-hash pyc
of the pristine worker compiled by that interpreter waiting in __pycache__ (the bytecode that keeps
CPython on the old class after the source is patched). Sandbox hosts of one Python only otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.jsoncli import cli, ok
from tests.pythons import pythons, version

pytestmark = [pytest.mark.usefixtures("ledger_dir"), pytest.mark.fleet]

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks" / "dynamic-spec-disable"
WORKER = "srt/speculative/eagle_worker.py"  # what 0.5.9 runs with SGLANG_ENABLE_SPEC_V2 unset
MARKER = "Dynamic speculation disable enabled"


OTHERS = [p for p in pythons() if version(p) != sys.version_info[:2]]


@pytest.mark.parametrize("python", OTHERS, ids=[".".join(map(str, version(p))) for p in OTHERS])
def test_the_loop_on_a_host_running_another_python(python: str, fresh_sandbox, capsys) -> None:  # type: ignore[no-untyped-def]
    ver = version(python)
    sb = fresh_sandbox(hosts=1, versions=("0.5.9",), gpus=1, bare_shell=True, host_python=python)
    h = sb.hosts["h01"]
    inv = sb.inventory_path
    facts = ok(capsys, "facts", "-i", inv)["hosts"][0]["facts"]
    assert facts["python"]["version"].startswith(f"{ver[0]}.{ver[1]}."), facts["python"]
    # the pristine worker's bytecode, as that interpreter writes it and would load it without
    # looking at the source again
    src = h.sglang_dir / WORKER
    subprocess.run([python, "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True, "
                    "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)", str(src)], check=True)
    (pyc,) = (src.parent / "__pycache__").glob(f"eagle_worker.cpython-{ver[0]}{ver[1]}*.pyc")
    stale = pyc.read_bytes()
    doc = ok(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert doc["hosts"][0]["status"] == "changed", doc["hosts"][0]
    assert MARKER.encode() in src.read_bytes()
    assert not pyc.exists() or pyc.read_bytes() != stale  # the old class's bytecode is not what import loads
    doc = ok(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert doc["hosts"][0]["status"] == "unchanged" and doc["hosts"][0]["sealed"], doc["hosts"][0]
    if ver >= (3, 10):  # SGLang's own floor (the simulator runs fleetctl's code, 3.10+, too)
        doc = ok(capsys, "launch", PLAYBOOK, "-i", inv)
        assert doc["hosts"][0]["ok"], doc["hosts"][0]
        doc = ok(capsys, "verify-logs", PLAYBOOK, "-i", inv)
        assert doc["ok"], doc
        ok(capsys, "stop", "-i", inv)
    code, doc = cli(capsys, "rollback", "-i", inv)
    assert code == 0 and doc["hosts"][0]["status"] == "changed", doc
    assert MARKER.encode() not in src.read_bytes()
    doc = ok(capsys, "status", PLAYBOOK, "-i", inv)
    assert doc["ok"] and not doc["hosts"][0]["problems"], doc["hosts"][0]


def test_a_host_python_that_is_no_cpython_3_8_is_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from fleetctl.cli import main

    for bad in ("/nonexistent/python3", "/bin/sh", "python2.7-that-is-not-here"):
        assert main(["sandbox", "up", "-d", str(tmp_path / "sb"), "-n", "1", "--host-python", bad]) == 2
        err = capsys.readouterr().err
        assert f"--host-python '{bad}': not a CPython >= 3.8 that runs here" in err, err
        assert not (tmp_path / "sb" / "hosts").exists()  # refused before anything was built
