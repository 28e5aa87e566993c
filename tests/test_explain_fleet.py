"""explain and the coverage check on a sandbox with 0.5.5.post3, 0.5.9 and 0.5.14 hosts:
the origin story's mistake is caught before anything changes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.sandbox.lifecycle import Sandbox

# in-process hosts (tests/fakehost.py): explain reads what each release's files say; the sshd smoke
# of explain is test_explain_truth
ROOT = Path(__file__).parent.parent
PAYLOAD = str(ROOT / "playbooks" / "dynamic-spec-disable")
WRONG = str(ROOT / "playbooks" / "origin-wrong-file")


@pytest.fixture(scope="module")
def fake_three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    import fakehost

    d = tmp_path_factory.mktemp("explain")
    with fakehost.sandbox(d / "sb", hosts=3, versions=["0.5.5.post3", "0.5.9", "0.5.14"], gpus=1) as sb:
        yield sb


@pytest.fixture
def three(fake_three: Sandbox) -> Iterator[Sandbox]:
    import fakehost

    with fakehost.installed(fake_three.fake):  # type: ignore[attr-defined]
        yield fake_three


def with_spec_v2(sb: Sandbox, value: str) -> Path:
    """The sandbox inventory with SGLANG_ENABLE_SPEC_V2 in the launch environment of every host."""
    inv = sb.inventory_path.parent / f"inventory-specv2-{value}.yaml"
    text = sb.inventory_path.read_text()
    inv.write_text(re.sub(r"env: \{PATH: ('[^']*')\}", rf"env: {{PATH: \1, SGLANG_ENABLE_SPEC_V2: '{value}'}}", text))
    return inv


def explain(capsys: pytest.CaptureFixture[str], inv: Path, playbook: str) -> tuple[int, dict[str, dict]]:
    code = main(["explain", "-i", str(inv), playbook, "--json"])
    doc = json.loads(capsys.readouterr().out)
    return code, {h["host"]: h for h in doc["hosts"]}


def test_payload_env_unset(three: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    code, h = explain(capsys, three.inventory_path, PAYLOAD)
    assert code == 0
    for name in ("h01", "h02"):  # 0.5.5.post3, 0.5.9: the origin story's path
        assert h[name]["worker_class"] == "EAGLEWorker"
        assert h[name]["worker_file"] == "srt/speculative/eagle_worker.py"
        assert h[name]["disable_overlap_schedule"] is True and h[name]["covered"] is True
        assert "SGLANG_ENABLE_SPEC_V2 unset -> disable_overlap_schedule=True -> EAGLEWorker" in h[name]["reason"]
    assert h["h03"]["worker_class"] == "EAGLEWorkerV2"  # 0.5.14: only v2 exists
    assert h["h03"]["worker_file"] == "srt/speculative/eagle_worker_v2.py" and h["h03"]["covered"] is True


def test_payload_env_set(three: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    code, h = explain(capsys, with_spec_v2(three, "1"), PAYLOAD)
    for name in ("h01", "h02"):
        assert h[name]["worker_class"] == "EAGLEWorkerV2" and h[name]["disable_overlap_schedule"] is False
        # the payload cannot serve the overlap worker on these releases: refused, with its reason
        assert h[name]["refused"] and "does not support EAGLEWorkerV2" in h[name]["refused"]
    assert h["h03"]["worker_class"] == "EAGLEWorkerV2" and not h["h03"]["refused"]
    assert code == 1


def test_controller_environment_is_not_the_launch_environment(three: Sandbox, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")
    code, h = explain(capsys, three.inventory_path, PAYLOAD)
    assert code == 0 and h["h02"]["worker_class"] == "EAGLEWorker"


def test_origin_wrong_file_refused_without_env(three: Sandbox, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    code, h = explain(capsys, three.inventory_path, WRONG)
    assert code == 1
    assert h["h01"]["covered"] is False and h["h01"]["worker_class"] == "EAGLEWorker"
    assert "the playbook patches it: no" in h["h01"]["refused"]
    # deploy refuses, before changing anything, with the same sentence; exit 1
    code = main(["deploy", "-i", str(three.inventory_path), "--limit", "h01,h02", WRONG])
    out = capsys.readouterr().out
    assert code == 1
    assert "0.5.5.post3 with SGLANG_ENABLE_SPEC_V2 unset -> disable_overlap_schedule=True -> EAGLEWorker in " \
           "srt/speculative/eagle_worker.py; the playbook patches it: no" in out
    for name in ("h01", "h02"):
        sh = three.hosts[name]
        for rel in ("srt/server_args.py", "srt/speculative/eagle_worker_v2.py"):
            assert (sh.sglang_dir / rel).read_bytes() == wheels.pristine_bytes(sh.version, rel)


def test_origin_wrong_file_covered_with_env_topk1(three: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    inv = with_spec_v2(three, "1")
    code, h = explain(capsys, inv, WRONG)
    assert h["h01"]["worker_class"] == "EAGLEWorkerV2" and h["h01"]["covered"] is True
    # covered, but the server_args.py it patches (the payload's) refuses its flag with the overlap
    # worker on this release: the real server would not start, and explain says so (issue 30.5)
    assert "patched srt/server_args.py refuses this launch" in h["h01"]["refused"]
    assert "unset SGLANG_ENABLE_SPEC_V2" in h["h01"]["refused"]
    code = main(["deploy", "--check", "-i", str(inv), "--limit", "h01", WRONG])
    capsys.readouterr()
    assert code == 0


def test_unknown_version_never_guessed(three: Sandbox) -> None:
    from fleetctl.engines.sglang import resolve_worker

    r = resolve_worker("0.6.99", {"--speculative-algorithm": "EAGLE3"}, {})
    assert not r.known and r.worker_class is None


def test_explain_names_adaptive_availability() -> None:
    from fleetctl.engines.sglang import resolve_worker

    assert not resolve_worker("0.5.10.post1", {"--speculative-algorithm": "EAGLE3"}, {}).adaptive_available
    assert resolve_worker("0.5.11", {"--speculative-algorithm": "EAGLE3"}, {}).adaptive_available
