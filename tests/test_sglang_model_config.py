"""The target model's config.json, read on the host by the agent under the launch's environment
(fleetctl/remote/hostfacts.py `read_model_config`), validated again on arrival (model_config.from_answer).
Local runs of the agent's own functions on real files: a local model dir, and the HF hub cache layout
(refs/<revision> -> snapshots/<commit>/config.json, a symlink into blobs/ as the hub makes it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetctl.engines.sglang import model_config as mc
from fleetctl.protocol.answers import ModelConfigInfo
from fleetctl.remote import hostfacts as rfacts

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_repo(cache: Path, repo_id: str, config: dict | bytes, revision: str = "main") -> Path:
    """An HF hub cache entry as huggingface_hub lays it out: the file in blobs/, the snapshot's
    config.json a relative symlink to it, refs/<revision> holding the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    data = config if isinstance(config, bytes) else json.dumps(config).encode()
    (repo / "blobs" / "b1ob").write_bytes(data)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/b1ob")
    (repo / "refs" / revision).write_text(COMMIT)
    return repo


def launch(env: dict[str, str], cwd: str | None = None) -> dict:
    return {"clear": False, "inherit": [], "env": env, "cwd": cwd}


def test_local_model_dir(tmp_path: Path) -> None:
    d = tmp_path / "models" / "mimo"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo"}))
    got = rfacts.read_model_config({"path": str(d)}, launch({"HOME": str(tmp_path)}))
    assert got == {"path": str(d / "config.json"), "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo"}
    # a relative --model-path is taken from the launch's working directory
    rel = rfacts.read_model_config({"path": "models/mimo"}, launch({"HOME": "/nonexistent"}, cwd=str(tmp_path)))
    assert rel["architectures"] == ["MiMoV2FlashForCausalLM"]


def test_hub_cache_under_the_launch_environment(tmp_path: Path) -> None:
    hf_home = tmp_path / "hf"
    hub_repo(hf_home / "hub", "org/Mimo-Test", {"architectures": ["MiMoV2FlashForCausalLM"]})
    model = {"path": "org/Mimo-Test"}
    got = rfacts.read_model_config(model, launch({"HF_HOME": str(hf_home), "HOME": "/nonexistent"}))
    assert got["architectures"] == ["MiMoV2FlashForCausalLM"]
    assert got["path"] == str(hf_home / "hub" / "models--org--Mimo-Test" / "snapshots" / COMMIT / "config.json")
    # HF_HUB_CACHE wins over HF_HOME: the same id is then looked up there (and is not found)
    other = tmp_path / "other"
    other.mkdir()
    miss = rfacts.read_model_config(model, launch({"HF_HOME": str(hf_home), "HF_HUB_CACHE": str(other)}))
    assert "architectures" not in miss and "HF cache has no" in miss["error"] and str(other) in miss["error"]
    # default: ~/.cache/huggingface/hub of the launch's HOME
    home = tmp_path / "home"
    hub_repo(home / ".cache" / "huggingface" / "hub", "org/Llama", {"architectures": ["LlamaForCausalLM"]})
    assert rfacts.read_model_config({"path": "org/Llama"}, launch({"HOME": str(home)}))["architectures"] == \
        ["LlamaForCausalLM"]
    # a named revision is resolved through refs/<revision>; a commit hash directly
    hub_repo(tmp_path / "c2", "org/Rev", {"architectures": ["Step3p5ForCausalLM"]}, revision="v1")
    env = {"HF_HUB_CACHE": str(tmp_path / "c2")}
    assert rfacts.read_model_config({"path": "org/Rev", "revision": "v1"}, launch(env))["architectures"] == \
        ["Step3p5ForCausalLM"]
    assert rfacts.read_model_config({"path": "org/Rev", "revision": COMMIT}, launch(env))["architectures"] == \
        ["Step3p5ForCausalLM"]
    assert "error" in rfacts.read_model_config({"path": "org/Rev"}, launch(env))  # no refs/main


@pytest.mark.parametrize("env", [
    {}, {"HOME": "/h"}, {"HF_HOME": "/x"}, {"HF_HOME": "~/hf"}, {"HF_HUB_CACHE": "~"}, {"XDG_CACHE_HOME": "/xdg"},
    {"HUGGINGFACE_HUB_CACHE": "/old", "HF_HOME": "/x"}, {"HF_HUB_CACHE": "/a", "HUGGINGFACE_HUB_CACHE": "/b"},
    {"HF_HUB_CACHE": "", "HF_HOME": "/y"},
])
def test_agent_and_controller_agree_on_the_hub_cache(env: dict[str, str]) -> None:
    """The agent (Python 3.8, stdlib only) mirrors model_config.hub_cache_dir: held to it here."""
    assert rfacts.hub_cache_dir(env, "/home/u") == mc.hub_cache_dir(env, "/home/u")


def test_hostile_config_files(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    cfg = d / "config.json"
    lau = launch({})

    def read(data: bytes) -> dict:
        cfg.unlink(missing_ok=True)
        cfg.write_bytes(data)
        return rfacts.read_model_config({"path": str(d)}, lau)

    assert "not JSON" in read(b"\xff\xfe{")["error"]
    assert "architectures" in read(b"[1, 2]")["error"]
    assert "architectures" in read(json.dumps({"architectures": ["[red]Mimo[/red]"]}).encode())["error"]
    assert "architectures" in read(json.dumps({"architectures": "LlamaForCausalLM"}).encode())["error"]
    assert "larger than" in read(b" " * (rfacts.MODEL_CONFIG_MAX + 1))["error"]
    deep = read(b"[" * 100000 + b"]" * 100000)
    assert "error" in deep
    ok = read(json.dumps({"architectures": ["A_1"] * 50, "model_type": "x" * 500}).encode())
    assert ok["architectures"] == ["A_1"] * 8 and ok["model_type"] is None  # bounded
    # a FIFO in place of config.json: refused without blocking (no reader/writer ever comes)
    cfg.unlink()
    os.mkfifo(cfg)
    assert "not a regular file" in rfacts.read_model_config({"path": str(d)}, lau)["error"]
    cfg.unlink()
    cfg.symlink_to("/dev/zero")
    assert "not a regular file" in rfacts.read_model_config({"path": str(d)}, lau)["error"]
    # a hub id that tries to leave the cache is not looked up
    assert "neither a directory nor a hub model id" in \
        rfacts.read_model_config({"path": "a/../../nope"}, launch({"HF_HUB_CACHE": str(tmp_path)}))["error"]


def test_controller_validates_what_the_agent_sent() -> None:
    good = mc.from_answer(ModelConfigInfo(path="/m/config.json", architectures=["LlamaForCausalLM"]))
    assert good == mc.ModelConfig("LlamaForCausalLM", "/m/config.json", None) and good.readable
    bad = mc.from_answer(ModelConfigInfo(path="/m/config.json", architectures=["[bold]x y"]))
    assert bad is not None and bad.arch is None and "architectures" in (bad.error or "")
    err = mc.from_answer(ModelConfigInfo(error="e" * 5000))
    assert err is not None and err.arch is None and len(err.error or "") <= 300
    assert mc.from_answer(None) is None


def test_launch_model_from_flags_and_command() -> None:
    assert mc.launch_model({"--model-path": "org/a"}) == {"path": "org/a"}
    assert mc.launch_model({"--model": "/m", "--revision": "v2"}) == {"path": "/m", "revision": "v2"}
    # the command's own words, then fleetctl's flags (appended after them: argparse keeps the last)
    assert mc.launch_model({}, ["python", "-m", "sglang.launch_server", "--model-path=/a"]) == {"path": "/a"}
    assert mc.launch_model({"--model-path": "/b"}, ["x", "--model-path", "/a"]) == {"path": "/b"}
    assert mc.launch_model({"--tp-size": 2}) is None
