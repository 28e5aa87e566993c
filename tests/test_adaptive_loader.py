"""An adaptive-speculation config file named by the launch's flags is judged as the release's own
loader judges it (issue 30.5): `adaptive.loader_candidates` against each 0.5.13-0.5.23 wheel's
`resolve_candidate_steps_from_config` (compiled from the release's file and run on the same bytes),
and routing (what explain says) refusing the launch the server would refuse, where before the file
was "not read" and the launch predicted to start."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fleetctl.engines import wheels
from fleetctl.engines.sglang import adaptive, routing
from fleetctl.engines.sglang import releases as R

RELEASES = [v for v in R.KNOWN_VERSIONS if adaptive.release_key(v) >= adaptive.release_key("0.5.13")]
ADAPTIVE_FILE = "srt/speculative/adaptive_spec_params.py"
CONFIGS: list[bytes] = [
    b'{"1": {"candidate_steps": [1, 3, 7]}}',
    b'{"1": {"candidate_steps": [1, 3]}, "17": {"candidate_steps": [0]}}',  # a steps=0 slot
    b'{"1": {"candidate_steps": [2, 4]}, "note": "no BS key here"}',
    b'{"1": {"candidate_steps": []}}',
    b'{"1": {"candidate_steps": [1, "3"]}}',
    b'{"1": {"candidate_steps": [true, 3]}}',  # a bool is an int to the loader
    b'{"1": [1, 3]}',
    b'{"default": {"candidate_steps": [1]}}',
    b"[1, 3, 7]",
    b'{"1": {"candidate_steps": [1, 3, 7]',  # truncated JSON
    b'{"8": {"candidate_steps": [5]}, "1": {"candidate_steps": [1, 2]}}',
]


def release_loader(version: str):
    """The release's own resolve_candidate_steps_from_config, compiled from its file (with the
    module-level names it uses); the rest of the module (its imports of the runtime) is not run."""
    src = wheels.pristine_bytes(version, ADAPTIVE_FILE).decode()
    tree = ast.parse(src)
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in (
        "_load_adaptive_config", "resolve_candidate_steps_from_config")) or (
        isinstance(n, (ast.Assign, ast.AnnAssign)) and "DEFAULT_ADAPTIVE_CONFIG" in ast.unparse(n).split("=")[0])]
    assert len([n for n in keep if isinstance(n, ast.FunctionDef)]) == 2, f"{version}: loader not found"
    ns: dict = {"json": json}
    exec(compile(ast.Module(body=keep, type_ignores=[]), f"{version}/{ADAPTIVE_FILE}", "exec"), ns)
    return ns["resolve_candidate_steps_from_config"]


@pytest.mark.parametrize("version", RELEASES)
def test_loader_candidates_match_the_release(version: str, tmp_path: Path) -> None:
    load = release_loader(version)
    for i, data in enumerate(CONFIGS):
        path = tmp_path / f"cfg{i}.json"
        path.write_bytes(data)
        try:
            want: object = load(cfg_path=str(path))
        except Exception as e:  # (what the server's start-up would show)
            want = (type(e).__name__, str(e))
        try:
            got: object = adaptive.loader_candidates(version, data)
        except adaptive.LoaderError as e:
            kind, _, msg = str(e).partition(": ")
            got = (kind.rsplit(".", 1)[-1], msg)
        assert got == want, f"{version} {data!r}"


def adaptive_flags(steps: int | None = 3) -> dict:
    flags = {"--model-path": "m", "--speculative-algorithm": "EAGLE3", "--speculative-eagle-topk": 1,
             "--speculative-adaptive": True, "--speculative-adaptive-config": "/etc/adaptive.json"}
    if steps is not None:
        flags.update({"--speculative-num-steps": steps, "--speculative-num-draft-tokens": steps + 1})
    return flags


@pytest.mark.parametrize("version", RELEASES)
def test_routing_reads_the_config_the_flags_name(version: str) -> None:
    """Before: 'candidate steps come from --speculative-adaptive-config (not read)' and a launch that
    the server refuses (steps 3 not a candidate of [1, 2]) was predicted to start."""
    env = {R.SPEC_V2_ENV: "1"} if version.startswith("0.5.13") else {}
    unread = routing.resolve_worker(version, adaptive_flags(), env, model_arch="LlamaForCausalLM")
    assert unread.startup_error is None and "not read" in unread.reason
    files = {"/etc/adaptive.json": b'{"1": {"candidate_steps": [1, 2]}}'}
    miss = routing.resolve_worker(version, adaptive_flags(), env, model_arch="LlamaForCausalLM", files=files)
    assert miss.startup_error and "--speculative-num-steps=3 is not in the adaptive config candidate_steps [1, 2]" \
        in miss.startup_error, miss.reason
    ok = routing.resolve_worker(version, adaptive_flags(2), env, model_arch="LlamaForCausalLM", files=files)
    assert ok.startup_error is None and "not read" not in ok.reason and ok.worker_class
    zero = routing.resolve_worker(version, adaptive_flags(1), env, model_arch="LlamaForCausalLM",
                                  files={"/etc/adaptive.json": b'{"1": {"candidate_steps": [1]}, "9": {"candidate_steps": [0]}}'})
    assert (zero.startup_error is not None) == (adaptive.config_format(version) == "per_bs_positive"), zero.reason
    gone = routing.resolve_worker(version, adaptive_flags(), env, model_arch="LlamaForCausalLM",
                                  files={"/etc/adaptive.json": "No such file or directory"})
    assert gone.startup_error and "/etc/adaptive.json" in gone.startup_error


# ---------------------------------------------------------------- explain on a sandbox host

SCHED = Path(__file__).resolve().parent.parent / "playbooks" / "scheduler-log-line"


@pytest.mark.fleet
@pytest.mark.usefixtures("ledger_dir")
def test_explain_reads_the_adaptive_config_on_the_host(tmp_path: Path, fresh_sandbox, capsys) -> None:
    """explain reads the file --speculative-adaptive-config names on the host and refuses the launch
    the release's loader refuses; a file the host does not have is a start-up failure too."""
    import yaml

    from fleetctl.cli import main

    sb = fresh_sandbox(hosts=1, versions=("0.5.14",), gpus=1)
    cfg = tmp_path / "host-adaptive.json"
    doc = yaml.safe_load((SCHED / "playbook.yaml").read_text())
    for files in doc["versions"].values():
        for f in files["files"]:
            f["patch"] = str(SCHED / f["patch"])
    doc["launch"]["flags"] = adaptive_flags(3) | {"--speculative-adaptive-config": str(cfg)}
    (tmp_path / "pb").mkdir()
    (tmp_path / "pb" / "playbook.yaml").write_text(yaml.safe_dump(doc))

    def explain() -> tuple[int, dict]:
        code = main(["explain", "-i", str(sb.inventory_path), str(tmp_path / "pb"), "--json"])
        return code, json.loads(capsys.readouterr().out)["hosts"][0]

    cfg.write_text('{"1": {"candidate_steps": [1, 2]}}')
    code, h = explain()
    assert code == 1 and "--speculative-num-steps=3 is not in the adaptive config candidate_steps [1, 2]" \
        in (h.get("refused") or ""), h
    cfg.write_text('{"1": {"candidate_steps": [1, 3]}, "33": {"candidate_steps": [0]}}')
    code, h = explain()
    assert code == 0 and not h.get("refused") and "not read" not in json.dumps(h), h
    assert f"adaptive config {cfg} (read," in json.dumps(h) and "candidate steps [0, 1, 3]" in json.dumps(h), h
    cfg.unlink()
    code, h = explain()
    assert code == 1 and str(cfg) in (h.get("refused") or "") and "cannot open" in h["refused"], h
