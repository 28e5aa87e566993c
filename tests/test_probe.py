"""`explain --probe` (issue 13.3): the host's own SGLang asked which worker a launch selects.

Fast tests: the hardware answers built from nvidia-smi facts, the verdict against fleetctl's table,
and the agent's bounds on a host whose SGLang hangs and forks (time, process group, temp files).
The real releases run in tests/test_probe_releases.py (the cached CPU venv).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from fleetctl.engines.sglang import resolve_worker
from fleetctl.engines.sglang.probe import DISAGREE, capability, compare, hardware, host_probe_source
from fleetctl.errors import ProbeInputError
from fleetctl.protocol.answers import EngineProbeAnswer
from fleetctl.protocol.gpus import Gpu
from fleetctl.remote import agent_source, engine_probe


def _gpu(i: int, name: str = "NVIDIA H200", mem: int | None = 143771) -> Gpu:
    return Gpu(index=i, uuid=f"GPU-{i}", name=name, memory_total_mib=mem, memory_used_mib=0, memory_free_mib=mem)


def test_hardware_answers_come_from_the_facts_of_the_launchs_gpus() -> None:
    gpus = [_gpu(0), _gpu(1, mem=140000), _gpu(2)]
    assert hardware(gpus, (0, 2)) == {"count": 2, "name": "NVIDIA H200", "capability": [9, 0], "memory_mib": 143771}
    assert hardware(gpus, ())["count"] == 3 and hardware(gpus, ())["memory_mib"] == 140000
    assert capability("NVIDIA A100-SXM4-80GB") == (8, 0) and capability("NVIDIA A10") == (8, 6)
    assert capability("NVIDIA B200") == (10, 0) and capability("NVIDIA L40S") == (8, 9)


@pytest.mark.parametrize(("gpus", "use", "why"), [
    (None, (), "no GPUs in the host's nvidia-smi facts"),
    ([_gpu(0)], (3,), "the launch uses GPUs 3"),
    ([_gpu(0, name="Mystery GPU 9000")], (), "compute capability not known"),
    ([_gpu(0), _gpu(1, name="NVIDIA A100")], (), "compute capability not known"),
    ([_gpu(0, mem=None)], (), "no memory.total"),
])
def test_hardware_is_never_guessed(gpus: list[Gpu] | None, use: tuple[int, ...], why: str) -> None:
    with pytest.raises(ProbeInputError, match=why):
        hardware(gpus, use)


EAGLE3 = {"--model-path": "m", "--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3,
          "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4}


def _answer(**kw: Any) -> EngineProbeAnswer:
    return EngineProbeAnswer(**{"stage": "selected", "package_version": "0.5.9", **kw})


def test_verdicts_against_the_table() -> None:
    table = resolve_worker("0.5.9", EAGLE3, {})  # the origin story: env unset -> EAGLEWorker
    assert table.worker_class == "EAGLEWorker"
    same = compare(table, _answer(worker_class="EAGLEWorker", worker_file="srt/speculative/eagle_worker.py"))
    assert same.agrees is True and "agrees" in same.line
    other = compare(table, _answer(worker_class="EAGLEWorkerV2", worker_file="srt/speculative/eagle_worker_v2.py"))
    assert other.agrees is False and other.line.startswith(DISAGREE) and "EAGLEWorkerV2" in other.line
    refused = compare(table, _answer(stage="refused", error="AssertionError: x"))
    assert refused.agrees is False and "refuses to start: AssertionError: x" in refused.line
    pp = resolve_worker("0.5.9", {**EAGLE3, "--pp-size": 2}, {})
    assert pp.startup_error and compare(pp, _answer(stage="refused", error="AssertionError: y")).agrees is True
    newer = compare(resolve_worker("0.6.0", EAGLE3, {}), _answer(package_version="0.6.0", worker_class="W",
                                                                 worker_file="srt/speculative/w.py"))
    assert newer.agrees is None and "newer than fleetctl's table" in newer.line and "W in" in newer.line
    failed = compare(table, _answer(stage="import_failed", error="ModuleNotFoundError: No module named 'torch'"))
    assert failed.agrees is None and "could not be asked" in failed.line


# --- the agent's bounds, on a host whose SGLang hangs -------------------------------------------

HANGING_SERVER_ARGS = """\
import os, subprocess, sys, time
out = os.environ["PROBE_TEST_OUT"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(out, "w") as fh:
    fh.write("%d %d %r %r %r" % (os.getpid(), child.pid, os.environ.get("CUDA_VISIBLE_DEVICES"),
                                 os.environ.get("PYTHONDONTWRITEBYTECODE"), os.environ.get("TMPDIR")))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_a_hanging_sglang_is_killed_with_its_children_and_leaves_no_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("__version__ = '0.5.9'\n")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "server_args.py").write_text(HANGING_SERVER_ARGS)
    out = tmp_path / "pids"
    tmp_root = tmp_path / "tmp"
    tmp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_root))
    launch = {"interpreter": sys.executable, "options": [], "target_kind": "module", "target": "x",
              "env": {"PYTHONPATH": str(site), "PROBE_TEST_OUT": str(out), "CUDA_VISIBLE_DEVICES": "0,1"},
              "inherit": ["PATH"], "command_env": {}, "unset": [], "clear": False, "cwd": str(tmp_path), "problem": None}
    hw = {"count": 2, "name": "NVIDIA H200", "capability": [9, 0], "memory_mib": 143771}
    try:
        res = engine_probe.run_engine_probe(host_probe_source(), launch, ["--model-path", "m"], hw, timeout=20)
        pid, child, cvd, nobc, tmpdir = out.read_text().split(" ", 4)
    finally:  # never leave the test's own processes behind, whatever failed
        if out.exists():
            for p in out.read_text().split()[:2]:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
    assert res["stage"] == "probe_failed" and res["timed_out"] and "did not answer within 20s" in res["error"]
    assert not _alive(int(pid)) and not _alive(int(child)), "the probe or a process it started survived"
    assert cvd == "''" and nobc == "'1'", (cvd, nobc)  # no GPU visible, no bytecode written
    assert tmpdir.strip("'").startswith(str(tmp_root)) and list(tmp_root.iterdir()) == []


def test_the_probe_action_ships_with_the_agent_and_both_keep_python_38_grammar() -> None:
    import ast

    from fleetctl.remote import actions_of, part_text

    # an on-demand part of the agent (the servers part), sent the first time a request needs it
    assert "engine_probe" in actions_of("servers") and b"action_engine_probe" in part_text("servers")
    assert b"action_engine_probe" not in agent_source()
    for path in (Path(engine_probe.__file__).parent.parent / "engines" / "sglang" / "host_probe.py", Path(engine_probe.__file__)):
        text = path.read_text()
        ast.parse(text, feature_version=(3, 8))
        assert "\nfrom __future__" not in text  # run as -c / appended to the agent: no future imports
    standin = Path(engine_probe.__file__).parent.parent / "sandbox" / "gpu_standin" / "fleetctl_gpu_standin.py"
    ast.parse(standin.read_text(), feature_version=(3, 8))


def test_inventory_probe_key_host_over_group_over_defaults(tmp_path: Path) -> None:
    """`probe: true` makes deploy's coverage check ask the host's own SGLang (tests/test_probe_releases.py
    runs it); a host entry overrides its groups, a group overrides `defaults:`."""
    from fleetctl.config.inventory import load_inventory
    from fleetctl.errors import InputError

    inv = tmp_path / "inventory.yaml"
    inv.write_text("defaults: {address: 127.0.0.1, probe: true}\n"
                   "groups: {canary: {probe: false}}\n"
                   "hosts:\n  a: {}\n  b: {groups: [canary]}\n  c: {groups: [canary], probe: true}\n"
                   "  d: {probe: false}\n")
    assert {h.name: h.probe for h in load_inventory(inv).hosts} == {"a": True, "b": False, "c": True, "d": False}
    inv.write_text("hosts:\n  a: {address: 127.0.0.1}\n")
    assert load_inventory(inv).hosts[0].probe is False  # off unless asked for
    inv.write_text("hosts:\n  a: {address: 127.0.0.1, probe: sometimes}\n")
    with pytest.raises(InputError, match="probe"):
        load_inventory(inv)


# --- the CPU venv's lock (fleetctl/sandbox/cpu_venv.lock) -------------------------------------------

def test_the_cpu_venv_lock_pins_exact_versions_and_no_cuda_package() -> None:
    from fleetctl.sandbox import cpu_venv

    reqs = cpu_venv.requirements()
    names = [r.split("==")[0].lower() for r in reqs]
    assert len(names) == len(set(names)) and all("==" in r for r in reqs)
    assert "torch==2.13.0+cpu" in reqs
    assert not [n for n in names if n.startswith(("nvidia", "triton", "cuda"))], names
    assert "scipy" not in names and "jedi" not in names  # not imported by the probe: left out
    assert "ipython" in names  # sglang/utils.py imports IPython.display


def test_a_cpu_venv_built_by_another_lock_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetctl.errors import FleetctlError
    from fleetctl.sandbox import cpu_venv

    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    old, new = tmp_path / "old.lock", tmp_path / "new.lock"
    old.write_text("# old\nnumpy==2.4.5\n")
    new.write_text("# new\nnumpy==2.4.6\n")
    assert cpu_venv.requirements(new) == ["numpy==2.4.6"]
    assert cpu_venv.venv_dir(old) != cpu_venv.venv_dir(new)
    assert cpu_venv.venv_dir(new).parent == tmp_path / "cache"
    built = cpu_venv.venv_dir(old)
    built.mkdir(parents=True)
    (built / ".built").write_text("{}\n")
    assert cpu_venv.ensure_cpu_venv(lock=old) == built / "bin" / "python"  # cached: no build
    # the new lock's dir is not the old one's: ensure would build it (here: refuse a bad pin first)
    new.write_text("numpy>=2\n")
    with pytest.raises(FleetctlError, match=r"new.lock:1: 'numpy>=2' is not an exact pin"):
        cpu_venv.ensure_cpu_venv(lock=new)
    assert not cpu_venv.venv_dir(new).exists()
