"""Playbooks declare what they cover and where their markers are logged (issue 12.2): the core knows
nothing of dynamic-spec-disable. Proved with a second playbook, scheduler-log-line, that patches
the scheduler with its own marker: deployed, launched and verified on a sandbox fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from jsoncli import cli, ok

from fleetctl.cli import main
from fleetctl.config.playbook import load_playbook
from fleetctl.engines import wheels
from fleetctl.engines.sglang import worker_files
from fleetctl.errors import InputError
from fleetctl.ops.launch import hash_set
from fleetctl.ops.verify import REPORT_ARGS
from fleetctl.patching.engine import apply_patch
from fleetctl.plan.patched_worker import coverage
from fleetctl.sandbox.startup_logs import logged_messages

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "playbooks" / "dynamic-spec-disable"
SCHED = ROOT / "playbooks" / "scheduler-log-line"
SCHED_FILE = "srt/managers/scheduler.py"
SCHED_MARKER = "Scheduler log line example: patched scheduler initialized"
SPEC_FLAGS = {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1,
              "--speculative-num-draft-tokens": 4}


def test_core_defaults_name_no_playbook() -> None:
    from fleetctl.config.playbook import Covers, VerifySpec

    assert VerifySpec().markers == []
    # nothing declared: coverage is derived from the patch (covers.worker None), no family forced
    assert Covers().worker is None and Covers().families == {} and Covers().markers == []
    assert Covers().report_args == []
    assert "speculative_disable_batch_threshold" not in REPORT_ARGS


def test_payload_declares_todays_behaviour() -> None:
    pb = load_playbook(FULL)
    assert pb.covers.worker is True
    site = pb.marker_site("Dynamic speculation disable enabled")
    assert (site.where, site.function, site.per_rank) == ("worker", "__init__", True)
    assert pb.covers.report_args == ["speculative_disable_batch_threshold"]
    # every worker file is still hashed at launch, as before
    assert set(worker_files("0.5.9").values()) <= set(hash_set(pb, "0.5.9"))


def test_scheduler_playbook_covers_its_file_not_the_worker() -> None:
    pb = load_playbook(SCHED)
    assert hash_set(pb, "0.5.9") == [SCHED_FILE]  # no EAGLE file: it declares none
    # 0.5.9 + EAGLE3 with SGLANG_ENABLE_SPEC_V2 unset runs EAGLEWorker, which this playbook does not
    # patch: not a refusal, since it never claimed to cover the worker
    cov = coverage("0.5.9", SPEC_FLAGS, {}, pb)
    assert cov.worker_class == "EAGLEWorker" and cov.refused is None and cov.covered is True
    assert f"the playbook patches {SCHED_FILE}: yes" in cov.reason
    # the payload, which does claim the worker, is still refused when only eagle_worker_v2 is patched
    wrong = load_playbook(ROOT / "playbooks" / "origin-wrong-file")
    assert coverage("0.5.9", {**SPEC_FLAGS, "--speculative-disable-batch-threshold": 16}, {}, wrong).refused


def test_covers_files_must_be_patched_by_every_version(tmp_path: Path) -> None:
    doc = yaml.safe_load((SCHED / "playbook.yaml").read_text())
    for spec in doc["versions"].values():
        for f in spec["files"]:
            f["patch"] = str(SCHED / f["patch"])
    doc["covers"]["files"].append("srt/managers/tokenizer_manager.py")
    p = tmp_path / "playbook.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"covers.files names srt/managers/tokenizer_manager.py"):
        load_playbook(p)
    doc["covers"]["files"].pop()
    doc["covers"]["markers"][0]["text"] = "not a verify marker"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"is not one of verify.markers"):
        load_playbook(p)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.14", "0.5.23"])
def test_simulator_reads_the_patched_schedulers_own_log_call(version: str) -> None:
    pristine = wheels.pristine_bytes(version, SCHED_FILE)
    assert logged_messages(compile(pristine, SCHED_FILE, "exec"), "Scheduler", "__init__") == []
    pb = load_playbook(SCHED)
    patched = apply_patch(pristine, pb.files_for(version)[0].patch_text, name=SCHED_FILE).output
    code = compile(patched, SCHED_FILE, "exec")
    assert logged_messages(code, "Scheduler", "__init__") == [("info", SCHED_MARKER)]
    assert logged_messages(code, "Scheduler", "init_model_config") == []


# ----------------------------------------------------------------------------- on the sandbox




def by_host(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["host"]: i for h in doc["hosts"] for i in h["instances"]}


@pytest.mark.usefixtures("ledger_dir")
def test_scheduler_playbook_deploy_launch_verify_rollback(fake_sandbox: Any,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    sb = fake_sandbox(hosts=2, versions=("0.5.9", "0.5.14"), gpus=2)
    inv = str(sb.inventory_path)
    try:
        # pristine scheduler: the marker is missing on every rank, and verify-logs says where it looked
        ok(capsys, "launch", "-i", inv, SCHED, "--timeout", "300")
        code, doc = cli(capsys, "verify-logs", "-i", inv, SCHED)
        assert code == 1
        for iv in by_host(doc).values():
            assert [r["rank"] for r in iv["ranks"]] == ["TP0", "TP1"] and not any(r["ok"] for r in iv["ranks"])
            assert f"{SCHED_FILE} on disk does NOT carry {SCHED_MARKER!r} in Scheduler.__init__" in \
                "\n".join(iv["explanation"])
        ok(capsys, "stop", "-i", inv)
        dep = ok(capsys, "deploy", "-i", inv, SCHED)
        assert {h["host"]: h["status"] for h in dep["hosts"]} == {"h01": "changed", "h02": "changed"}
        ok(capsys, "launch", "-i", inv, SCHED, "--timeout", "300")
        doc = ok(capsys, "verify-logs", "-i", inv, SCHED)
        for iv in by_host(doc).values():
            assert iv["ok"] and [r["markers"] for r in iv["ranks"]] == [{SCHED_MARKER: True}] * 2
            assert "speculative_disable_batch_threshold" not in iv["args"]
        ok(capsys, "stop", "-i", inv)
        ok(capsys, "rollback", "-i", inv)
        for h in sb.hosts.values():
            assert (h.sglang_dir / SCHED_FILE).read_bytes() == wheels.pristine_bytes(h.version or "", SCHED_FILE)
    finally:
        main(["stop", "-i", inv])


def test_coverage_names_the_unmodelled_override_not_an_unreadable_config() -> None:
    """A model config that WAS read, whose architecture has an override fleetctl does not model
    exactly, is uncertain because of that override: the warning says so (not "not readable")."""
    from fleetctl.config.playbook import load_playbook
    from fleetctl.engines.sglang.model_config import ModelConfig

    pb = load_playbook(Path(__file__).resolve().parent.parent / "playbooks" / "dynamic-spec-disable")
    flags = {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1}
    read = coverage("0.5.23", flags, {}, pb, model=ModelConfig("NemotronHForCausalLM", "/m/config.json", None))
    assert read.uncertain and "Nemotron-H model override" in read.uncertain and "not readable" not in read.uncertain
    unread = coverage("0.5.23", flags, {}, pb, model=ModelConfig(None, "/m/config.json", "no config.json"))
    assert unread.uncertain and "not readable" in unread.uncertain and "no config.json" in unread.uncertain
    plain = coverage("0.5.23", flags, {}, pb, model=ModelConfig("LlamaForCausalLM", "/m/config.json", None))
    assert plain.uncertain is None
