"""The simulator replays what the server_args.py on disk itself checks (the payload's patched
validation included), and starts on every release layout (version.py / _version.py). The refusals
asserted here come from the real release files patched with the real playbook patches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from test_launch import cli, make_inventory

from fleetctl.cli import main
from fleetctl.config.playbook import load_playbook
from fleetctl.engines import wheels
from fleetctl.engines.sglang import resolve_worker
from fleetctl.engines.sglang.releases import KNOWN_VERSIONS
from fleetctl.patching.engine import apply_patch
from fleetctl.sandbox.lifecycle import Sandbox
from fleetctl.sandbox.server_args_checks import replayable_checks, run_checks

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "playbooks" / "dynamic-spec-disable"
FLAGS = {"--model-path": "m", "--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3,
         "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4,
         "--speculative-disable-batch-threshold": 16}


def _patched(version: str) -> str:
    pb = load_playbook(PAYLOAD)
    spec = next(f for f in pb.files_for(version) or [] if f.path == "srt/server_args.py")
    orig = (wheels.package_dir(version) / spec.path).read_bytes()
    return apply_patch(orig, spec.patch_text, name=str(spec.patch_path)).output.decode()


# The payload's own check on these releases calls the release's adaptive_unsupported_reason, which there
# needs SGLang's config views (not self-contained): the replay skips the check rather than guess it.
NOT_REPLAYED = {v for v in load_playbook(PAYLOAD).supported() if KNOWN_VERSIONS.index(v) >= KNOWN_VERSIONS.index("0.5.15")}
# EAGLEWorkerV2 is the default there (covered); SGLANG_ENABLE_SPEC_V2=0 selects EAGLEWorker (covered too)
V1_BY_ENV = {"0.5.11", "0.5.12", "0.5.12.post1"}


@pytest.mark.parametrize("version", load_playbook(PAYLOAD).supported())
def test_the_patched_checks_are_replayed_from_the_file_on_disk(version: str) -> None:
    pkg = wheels.package_dir(version)
    src = _patched(version)
    env = {"SGLANG_ENABLE_SPEC_V2": "0"} if version in V1_BY_ENV else {}
    ok = dict(resolve_worker(version, FLAGS, env).resolved_args)
    if version in V1_BY_ENV:  # and the default launch (EAGLEWorkerV2, the overlap scheduler) passes too
        default = dict(resolve_worker(version, FLAGS, {}).resolved_args)
        assert default["disable_overlap_schedule"] is False and run_checks(src, default, pkg) is None
    dp = dict(resolve_worker(version, {**FLAGS, "--enable-dp-attention": True, "--dp-size": 2, "--tp-size": 2},
                              env).resolved_args)
    if version in NOT_REPLAYED:
        assert "check_speculative_disable_batch_threshold" not in [f.name for f in replayable_checks(src, ok, pkg)]
        assert run_checks(src, dp, pkg) is None
        return
    assert [f.name for f in replayable_checks(src, ok, pkg)] == ["check_speculative_disable_batch_threshold"]
    if version in ("0.5.13", "0.5.13.post1"):  # no worker implements it there: refused outright
        assert "upgrade to 0.5.14" in (run_checks(src, ok, pkg) or "")
        return
    assert run_checks(src, ok, pkg) is None
    refused = run_checks(src, dp, pkg) or ""
    assert refused.startswith("ValueError: --speculative-disable-batch-threshold") and "dp" in refused, refused
    pristine = (pkg / "srt" / "server_args.py").read_text()
    assert run_checks(pristine, dp, pkg) is None  # the release's own checks need more than a replay has


def test_a_check_that_needs_anything_else_is_skipped_not_guessed() -> None:
    src = ("import os\nclass ServerArgs:\n    x: int = 1\n"
           "    def check_server_args(self):\n        self.a()\n        self.b()\n        self.c()\n"
           "    def a(self):\n        if os.environ: raise ValueError('needs os')\n"
           "    def b(self):\n        if self.not_a_field: raise ValueError('unknown field')\n"
           "    def c(self):\n        if self.x > 0 and self.tp_size > 1: raise ValueError('tp')\n")
    assert [f.name for f in replayable_checks(src, {"tp_size": 2})] == ["c"]
    assert run_checks(src, {"tp_size": 2}) == "ValueError: tp"
    assert run_checks(src, {"tp_size": 1}) is None


@pytest.mark.fleet
def test_sandbox_servers_refuse_what_the_patched_server_args_refuses_and_old_layouts_start(
        fresh_sandbox: Callable[..., Sandbox], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    sb = fresh_sandbox(hosts=2, versions=("0.5.5.post3", "0.5.14"), gpus=1)
    inv = make_inventory(sb, tmp_path / "inv.yaml")
    try:
        assert cli(capsys, "deploy", "-i", inv, PAYLOAD)[0] == 0
        # 0.5.5.post3 keeps its version in version.py: its sandbox server starts and proves the patch
        code, doc = cli(capsys, "launch", "-i", inv, PAYLOAD, "--timeout", "300")
        assert code == 0, doc
        code, doc = cli(capsys, "verify-logs", "-i", inv, PAYLOAD)
        assert code == 0, doc
        # topk 2 on 0.5.14: the patched server_args refuses it (through the release's own adaptive reasons)
        inv2 = make_inventory(sb, tmp_path / "inv2.yaml", flags={"h02": {"--speculative-eagle-topk": 2,
                                                                       "--speculative-num-draft-tokens": 8}})
        code, doc = cli(capsys, "launch", "--replace", "-i", inv2, PAYLOAD, "--limit", "h02", "--timeout", "300")
        assert code == 1
        # launch replays the patched checks itself (f1d445a) and refuses before starting the server
        # that would crash: the same replay the simulator runs at its start-up (server_args_replay)
        h = doc["hosts"][0]
        assert h["status"] == "refused", h
        assert ("the playbook's patched srt/server_args.py refuses this launch: ValueError: "
                "--speculative-disable-batch-threshold cannot run in this setup: "
                "speculative_eagle_topk=2 (only topk=1 is supported)") in str(doc), doc
    finally:
        main(["stop", "-i", str(inv)])
