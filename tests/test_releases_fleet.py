"""A sandbox fleet mixing the origin release (0.5.9), 0.5.14 and the newest release (0.5.23):
`facts` reads every host's release, `explain` names each host's worker from fleetctl's table
(0.5.23 is no longer an "unknown version") and refuses what that release refuses."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.sandbox.lifecycle import Sandbox

# in-process hosts (tests/fakehost.py): facts and explain read what each release's files say;
# the sshd smoke of both commands is in test_facts_fleet / test_explain_truth
ROOT = Path(__file__).parent.parent
PAYLOAD = ROOT / "playbooks" / "dynamic-spec-disable"
VERSIONS = ["0.5.9", "0.5.14", "0.5.23"]


@pytest.fixture(scope="module")
def fake_mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    import fakehost

    d = tmp_path_factory.mktemp("releases")
    with fakehost.sandbox(d / "sb", hosts=3, versions=VERSIONS, gpus=1) as sb:  # taken down also on failure
        yield sb


@pytest.fixture
def mixed(fake_mixed: Sandbox) -> Iterator[Sandbox]:
    import fakehost

    with fakehost.installed(fake_mixed.fake):  # type: ignore[attr-defined]
        yield fake_mixed


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(list(args))
    return code, json.loads(capsys.readouterr().out)


def playbook_with(tmp_path: Path, extra_flags: str = "", env: str = "{}") -> str:
    """The payload playbook with extra launch flags / env (a copy: patch paths stay relative)."""
    d = tmp_path / "pb"
    shutil.copytree(PAYLOAD, d)
    text = (d / "playbook.yaml").read_text()
    text = text.replace("    --speculative-disable-batch-threshold: 16\n",
                        f"    --speculative-disable-batch-threshold: 16\n{extra_flags}")
    text = re.sub(r"(?m)^  env: \{\}$", f"  env: {env}", text)
    (d / "playbook.yaml").write_text(text)
    return str(d)


def test_facts_on_a_mixed_fleet(mixed: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run(capsys, "facts", "-i", str(mixed.inventory_path), "--json")
    assert code == 0
    hosts = {h["host"]: h["facts"] for h in doc["hosts"]}
    assert [hosts[n]["sglang"]["version"] for n in ("h01", "h02", "h03")] == VERSIONS
    for name, sh in mixed.hosts.items():
        f = hosts[name]
        assert f["torch"]["satisfied"] is True  # each release's own torch pin (0.5.23: torch 2.14.1)
        files = f["files"]
        pkg = wheels.package_dir(sh.version or "")
        assert files["srt/server_args.py"]["sha256"] == wheels.sha256_bytes((pkg / "srt/server_args.py").read_bytes())
        assert ("srt/speculative/eagle_worker.py" in files) == (sh.version == "0.5.9")  # v1 gone from 0.5.13


def test_explain_names_every_hosts_worker(mixed: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run(capsys, "explain", "-i", str(mixed.inventory_path), str(PAYLOAD), "--json")
    h = {r["host"]: r for r in doc["hosts"]}
    assert code == 0  # the payload covers all three releases (0.5.23 on EAGLEWorkerV2)
    assert (h["h01"]["worker_class"], h["h01"]["covered"], h["h01"]["refused"]) == ("EAGLEWorker", True, None)
    assert (h["h02"]["worker_class"], h["h02"]["covered"], h["h02"]["refused"]) == ("EAGLEWorkerV2", True, None)
    new = h["h03"]
    assert new["version"] == "0.5.23" and "unknown version" not in new["reason"]
    assert (new["worker_class"], new["worker_file"]) == ("EAGLEWorkerV2", "srt/speculative/eagle_worker_v2.py")
    assert new["disable_overlap_schedule"] is False
    assert (new["covered"], new["refused"]) == (True, None)


def test_explain_env_var_removed_and_ambiguous_flag(mixed: Sandbox, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--cuda-graph-max-bs (the docs' EAGLE-3 example) is a flag on 0.5.9, an alias on 0.5.14 and an
    ambiguous abbreviation on 0.5.23; SGLANG_ENABLE_SPEC_V2=1 picks v2 on 0.5.9 and is ignored after."""
    pb = playbook_with(tmp_path, "    --cuda-graph-max-bs: 32\n", "{SGLANG_ENABLE_SPEC_V2: '1'}")
    code, doc = run(capsys, "explain", "-i", str(mixed.inventory_path), pb, "--json")
    h = {r["host"]: r for r in doc["hosts"]}
    assert code == 1
    assert h["h01"]["worker_class"] == "EAGLEWorkerV2"  # 0.5.9 with the env var on: v2, unsupported there
    assert "EAGLEWorkerV2" in h["h01"]["refused"]
    assert h["h02"]["worker_class"] == "EAGLEWorkerV2" and h["h02"]["refused"] is None
    assert "ignored: removed in this release" in h["h02"]["reason"]
    new = h["h03"]
    assert new["worker_class"] is None
    assert "refuses to start: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, " \
           "--cuda-graph-max-bs-prefill" in new["reason"]


def test_explain_pp_with_speculation_refused(mixed: Sandbox, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    pb = playbook_with(tmp_path, "    --pp-size: 2\n")
    code, doc = run(capsys, "explain", "-i", str(mixed.inventory_path), pb, "--json")
    assert code == 1
    for r in doc["hosts"]:
        assert r["worker_class"] is None, r  # no worker is named: the server never starts
        assert "the server refuses to start: AssertionError: Pipeline parallelism" in r["reason"], r
        assert r["refused"], r


COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def model_playbook(tmp_path: Path, model: str, env: str = "{}", algorithm: str = "EAGLE") -> str:
    """The payload playbook launching `model` with `--speculative-algorithm algorithm`."""
    d = Path(playbook_with(tmp_path, env=env))
    text = (d / "playbook.yaml").read_text()
    text = text.replace("--model-path: meta-llama/Llama-3.1-8B-Instruct", f"--model-path: {model}")
    text = text.replace("--speculative-algorithm: EAGLE3", f"--speculative-algorithm: {algorithm}")
    (d / "playbook.yaml").write_text(text)
    return str(d)


def hf_cache_entry(hub: Path, repo_id: str, arch: str) -> None:
    """A hub cache entry as huggingface_hub makes it: blob, snapshot symlink, refs/main."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "0ddba11").write_text(json.dumps({"architectures": [arch], "model_type": "t"}))
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "config.json").symlink_to("../../blobs/0ddba11")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)


def test_explain_reads_a_local_model_dir_on_each_host(mixed: Sandbox, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--speculative-algorithm EAGLE on a MiMo-V2-Flash target: every one of these releases turns on
    multi-layer EAGLE for it (0.5.9 also forces spec v2 on), read from the host's config.json."""
    model = tmp_path / "models" / "mimo"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["MiMoV2FlashForCausalLM"]}))
    code, doc = run(capsys, "explain", "-i", str(mixed.inventory_path), model_playbook(tmp_path, str(model)), "--json")
    h = {r["host"]: r for r in doc["hosts"]}
    assert code == 1  # multi-layer workers are not patched by the payload
    for r in h.values():
        assert r["model_architecture"] == "MiMoV2FlashForCausalLM", r
        assert r["worker_class"] == "MultiLayerEagleWorkerV2", r
        assert "not certain" not in r["reason"] and "MiMoV2FlashForCausalLM turns on multi-layer EAGLE" in r["reason"]
    assert "the playbook patches it: no" in h["h01"]["refused"]


def test_explain_reads_the_hf_cache_of_the_launch_env(mixed: Sandbox, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A hub id resolved in the HF cache the launch's HF_HOME names (snapshot symlinked into blobs/);
    the same id in a cache the launch does not use is not read."""
    hf = tmp_path / "hf"
    hf_cache_entry(hf / "hub", "acme/llama-test", "LlamaForCausalLM")
    hf_cache_entry(tmp_path / "unused" / "hub", "acme/llama-test", "MiMoV2FlashForCausalLM")
    pb = model_playbook(tmp_path, "acme/llama-test", env=f"{{HF_HOME: '{hf}'}}")
    code, doc = run(capsys, "explain", "-i", str(mixed.inventory_path), pb, "--json", "-l", "h01,h02")
    h = {r["host"]: r for r in doc["hosts"]}
    assert code == 0
    assert (h["h01"]["worker_class"], h["h01"]["covered"], h["h01"]["refused"]) == ("EAGLEWorker", True, None)
    assert (h["h02"]["worker_class"], h["h02"]["covered"], h["h02"]["refused"]) == ("EAGLEWorkerV2", True, None)
    for r in h.values():
        assert r["model_architecture"] == "LlamaForCausalLM" and "not certain" not in r["reason"], r
    code, doc = run(capsys, "facts", "-i", str(mixed.inventory_path), "--json", "-l", "h01")
    assert code == 0  # facts without a playbook: the default launch names no model
    assert doc["hosts"][0]["facts"]["model_config"] is None


def test_unreadable_model_config_warns_and_strict_refuses(mixed: Sandbox, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    pb = model_playbook(tmp_path, "acme/not-cached", env=f"{{HF_HUB_CACHE: '{empty}'}}")
    code, doc = run(capsys, "explain", "-i", str(mixed.inventory_path), pb, "--json", "-l", "h01,h02")
    h = {r["host"]: r for r in doc["hosts"]}
    assert code == 0  # a warning, not a refusal
    for r in h.values():
        assert r["reason"].startswith("not certain: model config not readable, model-specific routing not "
                                      "ruled out: "), r
        assert r["model_architecture"] is None
        assert any("HF cache has no" in n and str(empty) in n for n in r["notes"]), r["notes"]
    code, doc = run(capsys, "deploy", "-i", str(mixed.inventory_path), pb, "--check", "--json", "-l", "h01")
    assert code == 0
    cov = doc["plan"]["hosts"][0]["coverage"]
    assert cov["refused"] is None and cov["uncertain"].startswith("not certain: model config not readable")
    code, doc = run(capsys, "deploy", "-i", str(mixed.inventory_path), pb, "--check", "--json", "-l", "h01",
                    "--strict")
    assert code == 1
    row = doc["plan"]["hosts"][0]
    assert row["status"] == "refused" and "--strict refuses" in row["reason"] and "HF cache has no" in row["reason"]


def test_unreadable_model_config_warning_is_shown(mixed: Sandbox, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The human plan says it too: a warning line under the host (not a refusal), and --strict refuses."""
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    pb = model_playbook(tmp_path, "acme/not-cached", env=f"{{HF_HUB_CACHE: '{empty}'}}")
    assert main(["deploy", "-i", str(mixed.inventory_path), pb, "--check", "-l", "h01"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "warning: not certain: model config not readable, model-specific routing not ruled out" in text
    assert "--strict refuses such hosts" in text
    assert main(["deploy", "-i", str(mixed.inventory_path), pb, "--check", "-l", "h01", "--strict"]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "covered, refused" in text and "(--strict refuses an answer that is not certain)" in text
