"""Bytecode: the code import would load, not only the source (issue 14 item 2). Local parts run the
probe, the agent's bytecode removal and the simulator against real CPython pycs in a temp tree."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.remote import files as rfiles
from fleetctl.remote import locate as rlocate
from fleetctl.remote import probe
from fleetctl.sandbox import simulator

MARKER = "Dynamic speculation disable enabled"
PATCHED = f'class W:\n    def __init__(self):\n        print("{MARKER} (worker=W)")\n'
PRISTINE = 'class W:\n    def __init__(self):\n        print("plain")\n'


def _pyc(src: Path, mode: py_compile.PycInvalidationMode, source: str | None = None) -> Path:
    """Compile `source` (default: the file's own text) into src's __pycache__ pyc, as `mode`."""
    cfile = Path(importlib.util.cache_from_source(str(src)))
    if source is None:
        py_compile.compile(str(src), cfile=str(cfile), invalidation_mode=mode, doraise=True)
        return cfile
    keep = src.read_text()
    st = src.stat()
    src.write_text(source)
    py_compile.compile(str(src), cfile=str(cfile), invalidation_mode=mode, doraise=True)
    src.write_text(keep)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # a later edit, as a deploy is
    return cfile


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    d = tmp_path / "sglang" / "srt" / "speculative"
    d.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    f = d / "eagle_worker.py"
    f.write_text(PATCHED)
    return f


def test_unchecked_hash_pyc_of_other_source_is_what_import_runs(worker: Path) -> None:
    cfile = _pyc(worker, py_compile.PycInvalidationMode.UNCHECKED_HASH, PRISTINE)
    v = probe.import_view(str(worker))
    assert v["loader"] == "source" and v["pyc"] == str(cfile)
    assert v["pyc_kind"] == "unchecked-hash" and v["pyc_used"] and v["stale"]
    # the code that runs has no marker although the source does
    assert probe.code_marker(probe.loaded_code(str(worker), v), "W", MARKER)["marker"] is False
    code = compile(worker.read_text(), str(worker), "exec")
    assert probe.code_marker(code, "W", MARKER) == {"class": True, "init": True, "marker": True}
    # the simulator, through CPython's import machinery, runs the pyc too (it read the source before)
    assert simulator.worker_code(worker.parents[2], "srt/speculative/eagle_worker.py") is not None
    got = simulator.worker_code(worker.parents[2], "srt/speculative/eagle_worker.py")
    assert probe.code_marker(got, "W", MARKER)["marker"] is False


def test_checked_hash_and_timestamp_pycs_are_checked(worker: Path) -> None:
    _pyc(worker, py_compile.PycInvalidationMode.CHECKED_HASH, PRISTINE)
    v = probe.import_view(str(worker))
    assert v["pyc_kind"] == "checked-hash" and not v["pyc_used"] and not v["stale"]
    _pyc(worker, py_compile.PycInvalidationMode.CHECKED_HASH)
    v = probe.import_view(str(worker))
    assert v["pyc_used"] and not v["stale"]
    _pyc(worker, py_compile.PycInvalidationMode.TIMESTAMP, PRISTINE)
    v = probe.import_view(str(worker))
    assert v["pyc_kind"] == "timestamp" and not v["pyc_used"]
    _pyc(worker, py_compile.PycInvalidationMode.TIMESTAMP)
    assert probe.import_view(str(worker))["pyc_used"]
    got = simulator.worker_code(worker.parents[2], "srt/speculative/eagle_worker.py")
    assert probe.code_marker(got, "W", MARKER)["marker"] is True


def test_check_hash_based_pycs_always_runs_the_source(worker: Path) -> None:
    _pyc(worker, py_compile.PycInvalidationMode.UNCHECKED_HASH, PRISTINE)
    code = (f"import sys, json; sys.path.insert(0, {str(Path(probe.__file__).parent)!r}); import probe; "
            f"print(json.dumps(probe.import_view({str(worker)!r})))")
    out = subprocess.run([sys.executable, "--check-hash-based-pycs", "always", "-c", code], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert '"pyc_used": false' in out and '"stale": false' in out


def test_sourceless_and_extension_are_reported(worker: Path) -> None:
    from fleetctl.model.facts import bytecode_problem
    from fleetctl.protocol.answers import ImportView
    from fleetctl.protocol.schema import parse

    ext = worker.with_name("eagle_worker" + importlib.machinery.EXTENSION_SUFFIXES[0])
    ext.write_bytes(b"\x7fELF")
    v = probe.import_view(str(worker))
    assert v["loader"] == "extension"
    assert "compiled extension" in (bytecode_problem("w.py", parse(ImportView, v)) or "")
    ext.unlink()
    py_compile.compile(str(worker), cfile=str(worker.with_suffix(".pyc")), doraise=True)
    worker.unlink()
    v = probe.import_view(str(worker))
    assert v["loader"] == "sourceless" and "sourceless" in (bytecode_problem("w.py", parse(ImportView, v)) or "")


def test_replace_file_drops_every_cached_pyc_incl_opt_levels_and_prefix(worker: Path, tmp_path: Path) -> None:
    pyc_dir = worker.parent / "__pycache__"
    _pyc(worker, py_compile.PycInvalidationMode.UNCHECKED_HASH, PRISTINE)
    tag = sys.implementation.cache_tag
    extra = [pyc_dir / f"eagle_worker.{tag}.opt-1.pyc", pyc_dir / "eagle_worker.cpython-38.opt-2.pyc"]
    for p in extra:
        p.write_bytes(b"x" * 16)
    keep = pyc_dir / f"eagle_worker_v2.{tag}.pyc"  # another module: untouched
    keep.write_bytes(b"x" * 16)
    prefix = tmp_path / "pyc-prefix"
    in_prefix = prefix / str(worker.parent).lstrip("/") / f"eagle_worker.{tag}.pyc"
    in_prefix.parent.mkdir(parents=True)
    in_prefix.write_bytes(b"x" * 16)
    st = worker.stat()
    pyc: dict = {"prefixes": [str(prefix)], "removed": []}
    rfiles.replace_file(str(worker), PRISTINE.encode(), 0o644, st.st_uid, st.st_gid, None, pyc=pyc)
    assert sorted(os.listdir(pyc_dir)) == [keep.name]
    assert not in_prefix.exists()
    assert any("(unchecked-hash)" in r for r in pyc["removed"]) and len(pyc["removed"]) == 4


def test_probe_runs_under_the_launch_interpreter_env_and_cwd(worker: Path, tmp_path: Path) -> None:
    site = worker.parents[3]
    launch = {"interpreter": sys.executable, "options": ["-X", f"pycache_prefix={tmp_path / 'pp'}"],
              "target_kind": "module", "target": "sglang.launch_server", "env": {"PYTHONPATH": str(site)},
              "inherit": ["PATH", "HOME"], "command_env": {}, "unset": [], "clear": False, "cwd": None}
    got = rlocate.run_probe(launch, ["srt/speculative/eagle_worker.py"], package="sglang")
    assert got["package_dir"] == str(worker.parents[2])
    assert got["pycache_prefix"] == str(tmp_path / "pp")
    assert got["files"]["srt/speculative/eagle_worker.py"]["loader"] == "source"
    bad = rlocate.run_probe({**launch, "interpreter": str(tmp_path / "no-such-python")})
    assert "cannot run here" in bad["error"]
