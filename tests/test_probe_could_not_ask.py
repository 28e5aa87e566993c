"""`explain --probe` tells "could not ask" from "disagree" (issue 30.5): a flag the installed release
does not know yet because the playbook's patch is not deployed, a model config the host cannot read,
a probe interpreter without numpy; none of them is a disagreement with fleetctl's table."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import pytest

from fleetctl.engines.sglang import probe, routing
from fleetctl.protocol.answers import EngineProbeAnswer

FLAGS = {"--model-path": "m", "--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3,
         "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4,
         "--speculative-disable-batch-threshold": 16}


def argparse_error(argv: list[str]) -> str:
    """What the host probe reports for an argv its release's parser does not take (stdlib argparse's
    own message, as host_probe.py passes it on: 'argparse: <message>')."""
    parser = argparse.ArgumentParser(prog="launch_server")
    for known in ("--model-path", "--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
                  "--speculative-num-draft-tokens"):
        parser.add_argument(known)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        parser.parse_args(argv)
    return "argparse: " + err.getvalue().strip().splitlines()[-1].split(": error: ", 1)[1]


def test_a_flag_the_patch_adds_is_could_not_ask_not_disagree() -> None:
    table = routing.resolve_worker("0.5.9", FLAGS, {})
    assert "--speculative-disable-batch-threshold" in table.unknown_flags and table.startup_error is None
    argv = [w for k, v in FLAGS.items() for w in (k, str(v))]
    ans = EngineProbeAnswer(stage="refused", package_version="0.5.9", error=argparse_error(argv))
    v = probe.compare(table, ans)
    assert v.agrees is None and v.line.startswith(probe.COULD_NOT_ASK), v.line
    assert "does not know --speculative-disable-batch-threshold yet" in v.line and "deploy" in v.line
    # a flag no patch of this playbook adds, that the release does not have either: still a disagreement
    # only when the table expected a start: an unknown *upstream* flag is the table's own refusal
    other = EngineProbeAnswer(stage="refused", package_version="0.5.9", error="ValueError: something else")
    assert probe.compare(table, other).agrees is False


def test_model_config_unreadable_and_missing_numpy_are_could_not_ask() -> None:
    table = routing.resolve_worker("0.5.9", {k: v for k, v in FLAGS.items() if "threshold" not in k}, {})
    hub = EngineProbeAnswer(stage="refused", package_version="0.5.9",
                            error="OSError: We couldn't connect to 'https://huggingface.co' to load this file",
                            error_where="/x/site-packages/transformers/utils/hub.py:470")
    missing = EngineProbeAnswer(stage="refused", package_version="0.5.9",
                                error="OSError: m is not a local folder and is not a valid model identifier")
    numpy = EngineProbeAnswer(stage="import_failed", package_version="0.5.9",
                              error="ModuleNotFoundError: No module named 'numpy'")
    for ans in (hub, missing, numpy):
        v = probe.compare(table, ans)
        assert v.agrees is None and v.line.startswith(probe.COULD_NOT_ASK) and probe.DISAGREE not in v.line
    assert "--cpu-sglang" in probe.compare(table, numpy).line


def test_an_import_the_replay_fails_is_could_not_ask() -> None:
    """Seen on the H200 (SGLang 0.5.12, EAGLE3, v1 worker): explain --probe said the server refuses to start
    with "No module named 'cuda.tile'" and REFUSED the host, while the same launch started and served.
    An import the probe's start-up replay fails is no verdict on the real start-up."""
    table = routing.resolve_worker("0.5.12", FLAGS, {"SGLANG_ENABLE_SPEC_V2": "0"})
    assert table.startup_error is None
    for err in ("ModuleNotFoundError: No module named 'cuda.tile'", "ImportError: cannot import name 'x' from 'y'"):
        ans = EngineProbeAnswer(stage="refused", package_version="0.5.12", error=err,
                                error_where="/site/flashinfer/norm/__init__.py:12")
        v = probe.compare(table, ans)
        assert v.agrees is None and v.line.startswith(probe.COULD_NOT_ASK) and probe.DISAGREE not in v.line, v.line
        assert err in v.line and "fleetctl launch" in v.line
    # any other start-up error the replay meets is still SGLang's answer (a disagreement here)
    other = EngineProbeAnswer(stage="refused", package_version="0.5.12", error="ValueError: topk must be 1")
    assert probe.compare(table, other).agrees is False


@pytest.mark.fleet
@pytest.mark.usefixtures("ledger_dir")
def test_probe_on_a_host_without_numpy_says_could_not_ask(fresh_sandbox, capsys) -> None:
    """A sandbox host (the release's real tree, no numpy): the probe's own import fails, and explain
    says it could not ask, with the --cpu-sglang hint, never 'disagree'."""
    from fleetctl.cli import main

    sb = fresh_sandbox(hosts=1, versions=("0.5.9",), gpus=1)
    payload = Path(__file__).resolve().parent.parent / "playbooks" / "dynamic-spec-disable"
    code = main(["explain", "-i", str(sb.inventory_path), str(payload), "--probe"])
    out = capsys.readouterr().out
    assert code == 1 and probe.COULD_NOT_ASK in out and "--cpu-sglang" in out, out
    assert probe.DISAGREE not in out


def test_probe_overlay_imports_the_intended_files(tmp_path: Path) -> None:
    """Before a deploy the probe asks with the playbook's files: host_probe's import finder serves
    the intended bytes at the installed file's path (in the probe's process only: nothing written,
    no bytecode), so a flag the patch adds is the host's SGLang's own, not 'unknown'."""
    import ast
    import base64
    import json
    import subprocess
    import sys

    src = (Path(probe.__file__).parent / "host_probe.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "install_overlay")
    site = tmp_path / "site"
    args_py = site / "sglang" / "srt" / "server_args.py"
    args_py.parent.mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    args_py.write_text('FLAGS = ["--model-path"]\n')
    patched = 'FLAGS = ["--model-path", "--speculative-disable-batch-threshold"]\n'
    overlay = {"srt/server_args.py": base64.b64encode(patched.encode()).decode()}
    code = ("import sys\n" + ast.unparse(fn) + "\n"
            f"print(install_overlay({overlay!r}, 'sglang'), file=sys.stderr)\n"
            "import sglang.srt.server_args as m\n"
            "import json; print(json.dumps([m.FLAGS, m.__file__]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, timeout=60,
                         env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    flags, where = json.loads(out.stdout)
    assert "--speculative-disable-batch-threshold" in flags and Path(where) == args_py
    assert args_py.read_text() == 'FLAGS = ["--model-path"]\n' and not list(site.rglob("*.pyc"))


@pytest.mark.slow
@pytest.mark.fleet
@pytest.mark.usefixtures("ledger_dir")
def test_probe_before_deploy_asks_with_the_intended_files(fresh_sandbox, tmp_path_factory, capsys) -> None:
    """A --cpu-sglang host running SGLang 0.5.9's real code, the payload NOT deployed: the probe asks
    with the payload's files, so its flag is known and the host's SGLang agrees with the table (was:
    'unrecognized arguments: --speculative-disable-batch-threshold', a disagreement)."""
    from fleetctl.cli import main
    from fleetctl.sandbox import lifecycle

    d = tmp_path_factory.mktemp("cpu-probe")
    try:
        sb = lifecycle.up(d / "sb", hosts=1, versions=["0.5.9"], gpus=1, cpu_sglang=True)
        import json

        import yaml

        payload = Path(__file__).resolve().parent.parent / "playbooks" / "dynamic-spec-disable"
        model = d / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "intermediate_size": 14336, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}))
        doc = yaml.safe_load((payload / "playbook.yaml").read_text())
        doc["versions"] = {"0.5.9": doc["versions"]["0.5.9"]}
        for f in doc["versions"]["0.5.9"]["files"]:
            f["patch"] = str((payload / f["patch"]).resolve())
        doc["launch"]["flags"].update({"--model-path": str(model), "--speculative-draft-model-path": str(model)})
        doc["launch"]["env"] = {"HF_HUB_OFFLINE": "1"}  # (the model is a local config.json)
        assert "--speculative-disable-batch-threshold" in doc["launch"]["flags"]  # the flag the patch adds
        (d / "pb").mkdir()
        (d / "pb" / "playbook.yaml").write_text(yaml.safe_dump(doc))
        code = main(["explain", "-i", str(sb.inventory_path), str(d / "pb"), "--probe"])
        out = capsys.readouterr().out
        assert code == 0 and "SGLang 0.5.9 agrees: EAGLEWorker" in out and "as deploy writes them" in out, out
    finally:
        lifecycle.down(d / "sb", missing_ok=True)
