"""gpu-check: the tiny model's files (checked here without torch: the weights are plain bf16 bytes),
the three servers' flags, and the command on the sandbox fleet, where the SGLang server SIMULATOR
stands in for SGLang and a labelled test stand-in answers the torch preflight. Nothing here is
evidence about SGLang or a GPU: the orchestration, the refusals, the cleanup and the output are."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsoncli import cli
from test_launch import FULL, make_inventory

from fleetctl.engines.sglang import gpu_check, tiny_models
from fleetctl.engines.sglang import releases as R

STANDIN_TORCH = '''"""TEST STAND-IN for torch (tests/test_gpu_check.py): no tensor code. It answers gpu-check's
preflight as a CUDA build of torch on one GPU would; the server it checks is the simulator."""
__version__ = "0.0.0+fleetctl.test-standin"


class cuda:
    is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: 1)
    get_device_name = staticmethod(lambda i=0: "test stand-in (no GPU)")
'''


# ----------------------------------------------------------------------------- the tiny model (no torch)


def _load(path: Path) -> dict[str, tuple[list[int], bytes]]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    meta = head.pop("__metadata__")
    assert meta == {"format": "pt"} and (8 + n) % 8 == 0
    out = {}
    for k, v in head.items():
        b, e = v["data_offsets"]
        assert v["dtype"] == "BF16"
        out[k] = (v["shape"], raw[8 + n + b:8 + n + e])
    assert max(e for _, (b, e) in ((k, v["data_offsets"]) for k, v in head.items())) == len(raw) - 8 - n
    return out


def _row(t: tuple[list[int], bytes], r: int) -> list[float]:
    shape, data = t
    cols = shape[1]
    chunk = data[2 * cols * r:2 * cols * (r + 1)]
    return [struct.unpack("<f", b"\0\0" + chunk[2 * i:2 * i + 2])[0] for i in range(cols)]


def _argmax_row(t: tuple[list[int], bytes], h: list[float], rows: range) -> int:
    return max(rows, key=lambda r: sum(a * b for a, b in zip(_row(t, r), h, strict=True)))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    tiny_models.make(str(d), 1234)
    return d


def test_tokenizer_round_trips_every_byte(made: Path) -> None:
    tok = json.loads((made / "target" / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert len(vocab) == tiny_models.N_TOK and sorted(vocab.values()) == list(range(tiny_models.N_TOK))
    assert tok["model"]["merges"] == [] and tok["pre_tokenizer"]["type"] == "ByteLevel"
    chars = tiny_models.byte_chars()
    assert len(set(chars.values())) == 256
    text = "request 3: the quick brown fox — ünïcode"
    ids = [vocab[chars[b]] for b in text.encode()]
    inv = {v: k for k, v in vocab.items()}
    back = {c: b for b, c in chars.items()}
    assert bytes(back[inv[i]] for i in ids).decode() == text
    for name in ("target", "draft"):
        cfg = json.loads((made / name / "config.json").read_text())
        assert cfg["vocab_size"] == tiny_models.VOCAB >= tiny_models.N_TOK and cfg["torch_dtype"] == "bfloat16"
    assert json.loads((made / "draft" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]


def test_target_is_a_bigram_model_and_the_draft_guesses_its_first_token(made: Path) -> None:
    t = _load(made / "target" / "model.safetensors")
    d = _load(made / "draft" / "model.safetensors")
    for k, (_shape, data) in t.items():  # the residual stream is the token's embedding in every layer
        if "o_proj" in k or "down_proj" in k:
            assert not any(data), k
    for k in ("model.norm.weight", "model.layers.0.input_layernorm.weight"):
        assert set(_row(([1, t[k][0][0]], t[k][1]), 0)) == {1.0}
    perm = tiny_models.permutation(1235)
    tokens = range(len(tiny_models.SPECIALS), tiny_models.N_TOK)
    for tok in (4, 77, 200, 259):
        e = _row(t["model.embed_tokens.weight"], tok)
        assert _argmax_row(t["lm_head.weight"], e, tokens) == perm[tok]
        # the draft: fc averages the three captured states (each e), lm_head row perm(perm(t)) = e
        fc = d["fc.weight"]
        g = [sum(a * b for a, b in zip(_row(fc, r), e + e + e, strict=True)) for r in range(tiny_models.HIDDEN)]
        assert _argmax_row(d["lm_head.weight"], g, tokens) == perm[perm[tok]]


def test_phases_from_the_playbook_flags() -> None:
    flags = {"--model-path": "meta/x", "--speculative-draft-model-path": "y", "--speculative-algorithm": "EAGLE",
             "--speculative-num-steps": 5, "--speculative-disable-batch-threshold": 8, "--tp-size": 8,
             "--attention-backend": "triton", R.PORT_FLAG: 30000}
    patch = {"--speculative-disable-batch-threshold"}
    on, off, dyn = gpu_check.phases(flags, {"A": "1"}, patch, {"target": "/w/t", "draft": "/w/d"}, 4242, 3)
    assert [p.name for p in (on, off, dyn)] == ["spec-on", "spec-off", "dynamic"]
    for p in (on, off, dyn):
        assert p.flags["--model-path"] == "/w/t" and p.flags[R.PORT_FLAG] == 4242 and "--tp-size" not in p.flags
        assert p.flags["--attention-backend"] == "triton" and p.env["CUDA_VISIBLE_DEVICES"] == "3" and p.env["A"] == "1"
    assert not any(k.startswith("--speculative-") for k in off.flags)
    assert on.flags["--speculative-algorithm"] == "EAGLE3" and "--speculative-disable-batch-threshold" not in on.flags
    assert dyn.flags["--speculative-disable-batch-threshold"] == 8 and dyn.flags["--speculative-draft-model-path"] == "/w/d"
    assert any("--tp-size" in n for n in dyn.notes) and any("EAGLE3" in n for n in dyn.notes)
    assert gpu_check.threshold(flags, patch, ["speculative_disable_batch_threshold"]) == (
        "--speculative-disable-batch-threshold", 8)
    assert gpu_check.threshold({"--x": "a"}, {"--x"}, []) is None


# ----------------------------------------------------------------------------- the command on the sandbox




def _inventory(sb: Any, tmp_path: Path, torch: bool = True, env: dict[str, str] | None = None) -> Path:
    inv = make_inventory(sb, tmp_path / "inv.yaml")
    doc = yaml.safe_load(inv.read_text())
    if torch:
        (tmp_path / "standin" / "torch").mkdir(parents=True, exist_ok=True)
        (tmp_path / "standin" / "torch" / "__init__.py").write_text(STANDIN_TORCH)
    for h in doc["hosts"].values():
        h["env"] = {**h.get("env", {}), **({"PYTHONPATH": str(tmp_path / "standin")} if torch else {}), **(env or {})}
    inv.write_text(yaml.safe_dump(doc))
    return inv


def _gone(doc: dict[str, Any]) -> None:
    """Everything the check made is gone: its work dir, and every server pid it started."""
    for h in doc["hosts"]:
        c = h.get("cleanup") or {}
        if c:
            assert c["removed"] and not Path(c["dir"]).exists(), c
        for ph in h.get("phases") or []:
            if ph.get("pid"):
                assert not Path(f"/proc/{ph['pid']}").exists(), ph


@pytest.fixture(scope="module")
def fake_gpu_sb(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One sandbox host (0.5.14, 1 GPU) reached in-process (tests/fakehost.py), module-wide: for what the
    check decides, runs and cleans up (its servers, preflight and loads are real processes on the host;
    the agent session is the same as every command's, whose sshd path the fleet tests cover)."""
    import fakehost
    from conftest import _new_dir

    with fakehost.sandbox(_new_dir(tmp_path_factory, "gpucheck-fake"), hosts=1, versions=["0.5.14"], gpus=1) as sb:
        yield sb


@pytest.fixture
def fake_sb(fake_gpu_sb: Any) -> Any:
    import fakehost

    with fakehost.installed(fake_gpu_sb.fake):
        yield fake_gpu_sb


def test_refused_without_torch_and_before_deploy(fake_sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = cli(capsys, "gpu-check", FULL, "-i", _inventory(fake_sb, tmp_path, torch=False))
    assert code == 1 and doc["hosts"][0]["state"] == "refused"
    msg = doc["hosts"][0]["message"]
    assert "torch does not import with" in msg and "install the torch build" in msg and "\n" not in msg
    code, doc = cli(capsys, "gpu-check", FULL, "-i", _inventory(fake_sb, tmp_path), "--check")
    assert code == 1 and "the playbook is not deployed there; run 'fleetctl deploy" in doc["hosts"][0]["message"]


def test_check_then_run_passes_and_removes_everything(fake_sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    inv = _inventory(fake_sb, tmp_path)
    code, doc = cli(capsys, "deploy", FULL, "-i", inv)
    assert code == 0, doc
    before = set(os.listdir("/tmp"))
    code, doc = cli(capsys, "gpu-check", FULL, "-i", inv, "--check")
    assert code == 0 and doc["check"] and doc["hosts"][0]["state"] == "run", doc
    plan = doc["hosts"][0]
    assert plan["threshold"] == {"flag": "--speculative-disable-batch-threshold", "value": 16}
    assert plan["concurrency"] == [16, 32] and [p["name"] for p in plan["phases"]] == ["spec-on", "spec-off", "dynamic"]
    assert not {n for n in set(os.listdir("/tmp")) - before if n.startswith("fleetctl-gpucheck-")}  # made nothing
    code, doc = cli(capsys, "gpu-check", FULL, "-i", inv)
    h = doc["hosts"][0]
    assert code == 0 and h["state"] == "passed", json.dumps(h, indent=1)[:3000]
    dyn = {p["name"]: p for p in h["phases"]}["dynamic"]
    assert dyn["marker"] and "threshold=16" in dyn["marker"][0]
    assert h["outputs"]["identical"] and h["outputs"]["compared"] == 8 + 32
    assert {ld["concurrency"] for ld in dyn["loads"]} == {16, 32}
    _gone(doc)
    # the table: one row per server, the verdict and the cleanup said under it
    capsys.readouterr()
    from fleetctl.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["gpu-check", str(FULL), "-i", str(inv)]) == 0
    text = capsys.readouterr().out
    # the verdict line under the table names both loads (read with its wrapping undone: the table's
    # own header cells fold differently with the console's width)
    flat = " ".join(text.split())
    assert "C=16: dynamic" in flat and "C=32: dynamic" in flat and "tok/s" in flat, text
    assert "passed" in text and "cleanup: removed" in text, text


@pytest.mark.parametrize("knob,what", [("FLEETCTL_SIM_DIVERGE", "greedy outputs differ"),
                                       ("FLEETCTL_SIM_CRASH", "not ready")])
def test_failure_still_removes_everything(fake_sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          knob: str, what: str) -> None:
    inv = _inventory(fake_sb, tmp_path, env={knob: "startup" if knob == "FLEETCTL_SIM_CRASH" else "1"})
    code, doc = cli(capsys, "deploy", FULL, "-i", inv)
    assert code == 0, doc
    code, doc = cli(capsys, "gpu-check", FULL, "-i", inv)
    h = doc["hosts"][0]
    assert code == 1 and h["state"] == "failed" and what in h["message"], h["message"]
    _gone(doc)


def test_connection_local_runs_the_same_check(fake_sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An inventory host with `connection: local` (a GPU box with no sshd): the agent runs here, no SSH."""
    inv = _inventory(fake_sb, tmp_path)
    doc = yaml.safe_load(inv.read_text())
    for h in doc["hosts"].values():
        h["connection"] = "local"
    inv.write_text(yaml.safe_dump(doc))
    assert cli(capsys, "deploy", FULL, "-i", inv)[0] == 0
    code, doc = cli(capsys, "gpu-check", FULL, "-i", inv)
    assert code == 0 and doc["hosts"][0]["state"] == "passed", doc["hosts"][0]["message"]
    _gone(doc)


def test_the_throwaway_port_leaves_every_port_the_engine_names_in_range(tmp_path, monkeypatch):
    """SGLang 0.5.12-0.5.14 derive a gRPC port at --port + 10000 and refuse it above 65535 (seen on the
    H200: a kernel-chosen port of 58725 made every throwaway server exit at start): the agent picks a
    port whose every engine-named neighbour is free and in range."""
    import socket
    import tempfile

    from fleetctl.engines.sglang import gpu_check as kit
    from fleetctl.remote import gpucheck

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # the kernel's choice is forced high, as it was on the device
    real_socket = socket.socket

    class HighPort(real_socket):
        def getsockname(self):
            host, _ = super().getsockname()
            return host, 64000

    monkeypatch.setattr(socket, "socket", HighPort)
    got = gpucheck.action_gpucheck_prepare({"by": "test", "port_offsets": list(kit.PORT_OFFSETS)})
    monkeypatch.setattr(socket, "socket", real_socket)
    assert 10000 in kit.PORT_OFFSETS
    assert all(0 < got["port"] + k <= 65535 for k in kit.PORT_OFFSETS), got["port"]
    gpucheck.cleanup_dir(got["dir"])
