"""`explain --probe` against real SGLang releases (issue 13.3): an old one (0.5.4.post3), the origin
story's (0.5.9) and the newest (0.5.23), each the real wheel tree, imported by the cached CPU venv
(fleetctl/sandbox/cpu_venv.py: real torch CPU build, SGLang's pure-Python requirements, the labelled
GPU stand-in), through the agent's own `engine_probe` action. The first run on a fresh machine
builds the venv (minutes; then cached under ~/.cache/fleetctl).

Each probe is SGLang's own argument processing and worker selection; the answer is held to the
table (fleetctl.engines.sglang.resolve_worker) with the same comparison `explain --probe` makes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fleetctl.engines import wheels
from fleetctl.engines.sglang import resolve_worker
from fleetctl.engines.sglang.probe import compare, host_probe_source
from fleetctl.model.instances import flag_argv
from fleetctl.protocol import names, parse_reply
from fleetctl.remote import engine_probe

HW = {"count": 2, "name": "NVIDIA H200", "capability": [9, 0], "memory_mib": 143771}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
         "intermediate_size": 14336, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def cpu_python() -> str:
    from fleetctl.sandbox.cpu_venv import ensure_cpu_venv

    return str(ensure_cpu_venv())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps(LLAMA))
    return d


def _eagle3(model: Path, **extra: Any) -> dict[str, Any]:
    return {"--model-path": str(model), "--speculative-algorithm": "EAGLE3",
            "--speculative-draft-model-path": str(model), "--speculative-num-steps": 3,
            "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4, **extra}


def _probe(python: str, version: str, flags: dict[str, Any], env: dict[str, str], cwd: Path) -> Any:
    site = str(wheels.extracted(version))
    launch = {"interpreter": python, "options": [], "target_kind": "module", "target": "sglang.launch_server",
              "env": {"PYTHONPATH": site, "HF_HUB_OFFLINE": "1", **env}, "inherit": ["PATH", "HOME"],
              "command_env": {}, "unset": [], "clear": False, "cwd": str(cwd), "problem": None}
    raw = engine_probe.run_engine_probe(host_probe_source(), launch, flag_argv(flags), HW, timeout=900)
    # the answer is checked exactly as one from a host is
    return parse_reply("h01", names.ENGINE_PROBE, json.dumps({"ok": True, "result": raw}).encode()).result


# (version, extra flags, launch env, the worker SGLang itself selects, or None: refuses to start)
CASES = [
    ("0.5.4.post3", {}, {}, "EAGLEWorker"),
    ("0.5.9", {}, {}, "EAGLEWorker"),  # the origin story: env unset -> v1 worker
    ("0.5.9", {}, {"SGLANG_ENABLE_SPEC_V2": "1"}, "EAGLEWorkerV2"),
    ("0.5.9", {"--pp-size": 2}, {}, None),  # check_server_args refuses PP with speculative decoding
    ("0.5.23", {}, {}, "EAGLEWorkerV2"),
]


def test_the_hosts_own_sglang_answers_and_agrees_with_the_table(cpu_python: str, model_dir: Path,
                                                               tmp_path: Path) -> None:
    before = set(os.listdir(tmp_path))
    with ThreadPoolExecutor(3) as ex:
        answers = list(ex.map(lambda c: _probe(cpu_python, c[0], _eagle3(model_dir, **c[1]), c[2], tmp_path), CASES))
    problems = []
    for (version, extra, env, expect), ans in zip(CASES, answers, strict=True):
        what = f"{version} {extra or ''} {env or ''}"
        if ans.stage not in ("selected", "refused"):
            problems.append(f"{what}: the probe did not get an answer: {ans.stage}: {ans.error} at {ans.error_where}")
            continue
        assert ans.package_version == version and ans.standin and "torch.cuda: 2 x NVIDIA H200" in ans.answered[0]
        got = ans.worker_class if ans.stage == "selected" else None
        if got != expect:
            problems.append(f"{what}: SGLang selected {got} ({ans.error}), expected {expect}")
        verdict = compare(resolve_worker(version, _eagle3(model_dir, **extra), env), ans)
        if verdict.agrees is not True:
            problems.append(f"{what}: {verdict.line}")
    assert not problems, "\n".join(problems)
    assert set(os.listdir(tmp_path)) == before  # nothing written into the launch's cwd


def test_the_cpu_venv_is_small_and_labelled(cpu_python: str) -> None:
    venv = Path(cpu_python).parent.parent
    built = json.loads((venv / ".built").read_text())
    assert built["bytes"] < 3 << 30, built  # torch CPU + pure-Python packages; no CUDA build crept in
    site = next(venv.glob("lib/python*/site-packages"))
    assert not list(site.glob("nvidia_*")) and not list(site.glob("triton*")), "a CUDA package was installed"
    assert "STAND-IN" in (site / "fleetctl_gpu_standin.py").read_text()
    # exactly the lock's pins (installed with --no-deps: nothing resolved at build time)
    from fleetctl.sandbox.cpu_venv import lock_hash, requirements

    assert built["lock_sha256"] == lock_hash()
    listed = subprocess.run([cpu_python, "-I", "-c", "import importlib.metadata as m; print('\\n'.join(sorted("
                             "d.metadata['Name'].lower() + '==' + d.version for d in m.distributions())))"],
                            capture_output=True, text=True, timeout=120, check=True, cwd=venv).stdout.split()
    assert {x for x in listed if not x.startswith("pip==")} == {r.lower() for r in requirements()}


# --- end to end: `explain --probe` on sandbox hosts that opt into the CPU venv, over real sshd ----

@pytest.mark.fleet
def test_explain_probe_on_a_sandbox_mixing_the_origin_and_the_newest_release(
        cpu_python: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml
    from conftest import _down, require_sshd

    from fleetctl.cli import main
    from fleetctl.sandbox import lifecycle

    require_sshd()
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    d = tmp_path / "sb"
    request.addfinalizer(lambda: _down(d))
    sb = lifecycle.up(d, hosts=2, versions=["0.5.9", "0.5.23"], gpus=2, cpu_sglang=True)
    payload = Path(__file__).resolve().parent.parent / "playbooks" / "dynamic-spec-disable"
    doc = yaml.safe_load((payload / "playbook.yaml").read_text())
    for files in doc["versions"].values():
        for f in files["files"]:
            f["patch"] = str((payload / f["patch"]).resolve())
    # the launch env is what the probe runs under (HF offline: the model is a local config.json)
    doc["launch"] = {"command": "{python} -m sglang.launch_server", "port": 30000, "flags": _eagle3(model_dir),
                     "env": {"HF_HUB_OFFLINE": "1"}}
    pb = tmp_path / "playbook.yaml"
    pb.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    code = main(["explain", "-i", str(sb.inventory_path), str(pb), "--probe", "--json"])
    doc = json.loads(capsys.readouterr().out)
    by_host = {h["host"]: h for h in doc["hosts"]}
    lines = {h: [p["line"] for p in r.get("probe") or []] for h, r in by_host.items()}
    for host, version, cls in (("h01", "0.5.9", "EAGLEWorker"), ("h02", "0.5.23", "EAGLEWorkerV2")):
        (p,) = by_host[host]["probe"]
        assert p["probe"]["worker_class"] == cls and p["agrees"] is True, lines
        assert p["line"] == f"SGLang {version} agrees: {cls} in srt/speculative/{p['probe']['worker_file'].split('/')[-1]}"
    assert not any("disagree" in (by_host[h].get("refused") or "") for h in by_host)
    assert code in (0, 1)  # (a release the payload has no patch set for is refused; the probe agreed)


# --- deploy on hosts whose inventory says `probe: true`: the probe is a fact gathered before the plan ---

@pytest.mark.fleet
def test_deploy_with_inventory_probe_refuses_a_host_whose_own_sglang_disagrees(
        cpu_python: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 0.5.9 hosts; h02's SGLang is locally modified (SGLANG_ENABLE_SPEC_V2 defaults to on, in a
    file the playbook does not patch), so with the env unset it selects EAGLEWorkerV2 where the table
    says EAGLEWorker. With `probe: true` deploy --check and deploy refuse h02 (exit 1) with the line
    explain --probe prints, and change nothing there; h01's SGLang agrees and is deployed."""
    import yaml
    from conftest import _down, require_sshd

    from fleetctl.cli import main
    from fleetctl.sandbox import lifecycle

    require_sshd()
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    d = tmp_path / "sb"
    request.addfinalizer(lambda: _down(d))
    sb = lifecycle.up(d, hosts=2, versions=["0.5.9"], gpus=2, cpu_sglang=True)
    environ = sb.hosts["h02"].sglang_dir / "srt" / "environ.py"
    src = environ.read_text()
    assert "SGLANG_ENABLE_SPEC_V2 = EnvBool(False)" in src
    environ.write_text(src.replace("SGLANG_ENABLE_SPEC_V2 = EnvBool(False)", "SGLANG_ENABLE_SPEC_V2 = EnvBool(True)"))
    inv = yaml.safe_load(sb.inventory_path.read_text())
    inv["defaults"]["probe"] = True
    inv_path = d / "inventory-probe.yaml"  # (next to the sandbox's key files, which it names relatively)
    inv_path.write_text(yaml.safe_dump(inv))
    payload = Path(__file__).resolve().parent.parent / "playbooks" / "dynamic-spec-disable"
    doc = yaml.safe_load((payload / "playbook.yaml").read_text())
    doc["versions"] = {"0.5.9": doc["versions"]["0.5.9"]}
    for f in doc["versions"]["0.5.9"]["files"]:
        f["patch"] = str((payload / f["patch"]).resolve())
    doc["launch"] = {"command": "{python} -m sglang.launch_server", "port": 30000, "flags": _eagle3(model_dir),
                     "env": {"HF_HUB_OFFLINE": "1"}}
    pb = tmp_path / "playbook.yaml"
    pb.write_text(yaml.safe_dump(doc))
    before = {h: (sb.hosts[h].sglang_dir / "srt" / "server_args.py").read_bytes() for h in ("h01", "h02")}

    def run(*args: str) -> tuple[int, dict[str, Any]]:
        capsys.readouterr()
        code = main(["deploy", "-i", str(inv_path), str(pb), "--json", *args])
        return code, json.loads(capsys.readouterr().out)

    code, out = run("--check")
    plan = {h["host"]: h for h in out["plan"]["hosts"]}
    assert code == 1 and plan["h01"]["status"] == "change", plan
    assert re.search(r"; probe port-\d+: SGLang 0\.5\.9 agrees: EAGLEWorker in srt/speculative/eagle_worker\.py$",
                     plan["h01"]["coverage"]["reason"]), plan["h01"]["coverage"]
    assert plan["h02"]["status"] == "refused", plan
    assert plan["h02"]["reason"] == ("fleetctl's table and this host's SGLang disagree: table: EAGLEWorker in "
                                     "srt/speculative/eagle_worker.py; SGLang 0.5.9: EAGLEWorkerV2 in "
                                     "srt/speculative/eagle_worker_v2.py"), plan["h02"]["reason"]
    assert (sb.hosts["h02"].sglang_dir / "srt" / "server_args.py").read_bytes() == before["h02"]

    code, out = run()
    res = {h["host"]: h for h in out["hosts"]}
    assert code == 1 and res["h01"]["status"] == "changed" and res["h02"]["status"] == "refused", res
    assert res["h02"]["message"] == plan["h02"]["reason"]
    assert (sb.hosts["h02"].sglang_dir / "srt" / "server_args.py").read_bytes() == before["h02"]
    assert (sb.hosts["h01"].sglang_dir / "srt" / "server_args.py").read_bytes() != before["h01"]
