"""Issue 17: the controller's fixed cost per command. Each test asserts behaviour (what is or is
not imported, what a cache hit returns), never timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / "playbooks" / "dynamic-spec-disable" / "playbook.yaml"

_INTENDED = """
import json, sys
from fleetctl.config.playbook import load_playbook
from fleetctl.plan.intended import intended_for
got = intended_for(load_playbook(sys.argv[1]), "0.5.9")
print(json.dumps({"patching": "fleetctl.patching.engine" in sys.modules,
                  "files": {k: v.sha_intended for k, v in sorted(got.items())}}))
"""


def _intended(tmp_path: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", _INTENDED, str(PLAYBOOK)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def test_intended_cache_hit_imports_no_patch_engine(tmp_path: Path) -> None:
    """A re-deploy reads the intended bytes from the content-keyed cache: the key hashes the patch
    engine's source, read from its file, so the hit does not import the engine (it used to, only to
    find that file). The bytes are the same as when they were patched."""
    first = _intended(tmp_path)  # patches (or hits a cache an earlier run left)
    second = _intended(tmp_path)
    assert second["patching"] is False
    assert second["files"] == first["files"] and len(second["files"]) == 3


def test_intended_cache_key_hashes_the_engine_python_imports() -> None:
    import fleetctl.patching.engine as engine
    from fleetctl.plan import intended

    assert intended._ENGINE_SRC == Path(engine.__file__).resolve()


def test_bench_compiles_fleetctl_before_timing() -> None:
    """The bench times an installed fleetctl: its modules' bytecode exists before the first timed
    command, also when PYTHONDONTWRITEBYTECODE kept the editable checkout from ever writing it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fleetctl_bench", REPO / "bench" / "bench.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.compile_fleetctl() == "compiled before timing"
    for mod in ("plan/intended", "cli", "config/playbook", "transport/ssh"):
        src = REPO / "fleetctl" / f"{mod}.py"
        pyc = Path(importlib.util.cache_from_source(str(src)))
        assert pyc.is_file() and pyc.stat().st_mtime >= src.stat().st_mtime - 1, pyc
