"""Issue 30.1/30.3: the new user's path. A playbook made with `fleetctl patch new` that patches only
eagle_worker_v2.py for 0.5.9, with no `covers:` written, launched with SGLANG_ENABLE_SPEC_V2 unset:
the server runs EAGLEWorker from eagle_worker.py. Coverage is derived from the patch, so
`patch check`, `explain`, `deploy`, `launch` and `status` refuse or flag it and `verify-logs` says
why the marker is missing, each naming both files and the reason."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_ports

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.remote import servers as srv

V = "0.5.9"
V2 = "srt/speculative/eagle_worker_v2.py"
V1 = "srt/speculative/eagle_worker.py"
MARKER = "My feature enabled"
SPEC = {"--model-path": "meta-llama/Llama-3.1-8B-Instruct",
        "--speculative-draft-model-path": "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B",
        "--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1,
        "--speculative-num-draft-tokens": 4}


def _edited_worker(version: str, rel: str, cls: str, line: str) -> bytes:
    """The release's file with one log line added at the top of `cls.__init__`'s body."""
    src = wheels.pristine_bytes(version, rel).decode()
    lines = src.splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"class {cls}"))
    at = next(i for i in range(start, len(lines)) if "self.server_args = server_args" in lines[i])
    indent = re.match(r"\s*", lines[at]).group(0)
    lines.insert(at + 1, f"{indent}{line}\n")
    return "".join(lines).encode()


def new_user_playbook(d: Path, capsys: pytest.CaptureFixture[str], *, edited: dict[str, bytes],
                      flags: dict[str, Any] | None = None, markers: list[str] | None = None,
                      covers: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Path:
    """A playbook as a new user makes it: `fleetctl patch new` per edited file, pasted entries."""
    d.mkdir(parents=True, exist_ok=True)
    files = []
    for rel, data in edited.items():
        mine = d / "edited" / Path(rel).name
        mine.parent.mkdir(exist_ok=True)
        mine.write_bytes(data)
        diff = d / "patches" / V / (Path(rel).name + ".diff")
        diff.parent.mkdir(parents=True, exist_ok=True)
        assert main(["patch", "new", str(mine), "--sglang", V, "--file", rel, "-o", str(diff)]) == 0
        capsys.readouterr()
        files.append({"path": rel, "patch": f"patches/{V}/{diff.name}",
                      "sha256": wheels.sha256_bytes(wheels.pristine_bytes(V, rel))})
    doc: dict[str, Any] = {"name": "my-feature", "versions": {V: {"files": files}},
                           "launch": {"flags": dict(SPEC if flags is None else flags), "env": dict(env or {})},
                           "verify": {"markers": [MARKER] if markers is None else markers}}
    if covers is not None:
        doc["covers"] = covers
    (d / "playbook.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, Any, str]:
    capsys.readouterr()
    code = main([*map(str, args)])
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.fixture
def origin_pb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    return new_user_playbook(tmp_path / "pb", capsys, edited={
        V2: _edited_worker(V, V2, "EAGLEWorkerV2", f'logger.info("{MARKER}")')})


# ----------------------------------------------------------------------------- offline: patch check


def test_patch_check_refuses_the_origin_mistake_without_covers(origin_pb: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "patch", "check", origin_pb)
    assert code == 1
    flat = " ".join(err.split())
    assert (f"{V} with SGLANG_ENABLE_SPEC_V2 unset -> disable_overlap_schedule=True -> EAGLEWorker in {V1}; "
            "the playbook patches it: no; your patch changes only eagle_worker_v2.py") in flat
    # the refusal names the fixes that work, each as the release's own routing decides
    assert ("fix: set SGLANG_ENABLE_SPEC_V2=1 in the playbook's launch.env (then EAGLEWorkerV2 in "
            "srt/speculative/eagle_worker_v2.py runs) or patch srt/speculative/eagle_worker.py too") in flat
    code, out, _ = run(capsys, "patch", "check", origin_pb, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False
    (p,) = doc["problems"]
    assert p["worker_file"] == V1 and p["families"][0]["patched"] == [V2]


def test_patch_check_passes_when_the_launch_env_selects_the_patched_worker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pb = new_user_playbook(tmp_path / "pb", capsys, env={"SGLANG_ENABLE_SPEC_V2": "1"}, edited={
        V2: _edited_worker(V, V2, "EAGLEWorkerV2", f'logger.info("{MARKER}")')})
    code, out, err = run(capsys, "patch", "check", pb, "--json")
    assert code == 0, err
    assert json.loads(out)["problems"] == []


def test_covers_worker_false_turns_the_derived_check_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pb = new_user_playbook(tmp_path / "pb", capsys, covers={"worker": False}, edited={
        V2: _edited_worker(V, V2, "EAGLEWorkerV2", f'logger.info("{MARKER}")')})
    code, out, err = run(capsys, "patch", "check", pb, "--json")
    assert code == 0, err
    assert json.loads(out)["problems"] == []


def test_a_playbook_patching_no_family_member_hears_nothing_of_coverage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetctl.config.playbook import load_playbook
    from fleetctl.plan.patched_worker import coverage

    rel = "srt/managers/scheduler.py"
    src = wheels.pristine_bytes(V, rel).decode().replace("import logging\n", "import logging\n# mine\n", 1)
    pb_dir = new_user_playbook(tmp_path / "pb", capsys, edited={rel: src.encode()}, markers=[])
    pb = load_playbook(pb_dir)
    cov = coverage(V, SPEC, {}, pb)
    assert cov.covered is None and cov.refused is None and cov.families == []
    code, out, err = run(capsys, "patch", "check", pb_dir)
    assert code == 0, err
    assert "covered" not in (out + err).lower() and "worker" not in (out + err).lower()
    # ...but it is told what a playbook without a marker does and does not prove
    assert "no verify.markers" in err and "not that the patched code ran" in err


def test_a_marker_no_added_line_prints_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pb = new_user_playbook(tmp_path / "pb", capsys, env={"SGLANG_ENABLE_SPEC_V2": "1"},
                           markers=["Some other text"],
                           edited={V2: _edited_worker(V, V2, "EAGLEWorkerV2", f'logger.info("{MARKER}")')})
    code, out, _ = run(capsys, "patch", "check", pb, "--json")
    doc = json.loads(out)
    assert code == 1
    (p,) = doc["problems"]
    assert p["kind"] == "marker-not-in-patch" and "'Some other text'" in p["message"]


def test_a_marker_in_an_fstring_is_found() -> None:
    from fleetctl.patching.markers import marker_in_patch

    patch = (b"--- a/x.py\n+++ b/x.py\n@@ -1,1 +1,2 @@\n a = 1\n"
             b"+logger.info(f\"Dynamic speculation disable enabled (threshold={t})\")\n")
    assert marker_in_patch("Dynamic speculation disable enabled", patch)
    assert marker_in_patch("Dynamic speculation disable enabled (threshold=16)", patch)
    assert not marker_in_patch("Something else", patch)


# ----------------------------------------------------------------------------- on a sandbox


def make_inventory(sb: Any, path: Path, hosts: list[str]) -> Path:
    doc = yaml.safe_load(sb.inventory_path.read_text())
    base = sb.inventory_path.parent
    doc["ssh_config"] = str(base / doc["ssh_config"])
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(base / doc["defaults"][k])
    for name, port in zip(list(doc["hosts"]), free_ports(len(doc["hosts"])), strict=True):
        doc["hosts"][name]["flags"] = {"--port": port}
    doc["hosts"] = {n: doc["hosts"][n] for n in hosts}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def sb(sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The session sandbox, left as found: servers stopped (by pid), files pristine, no deploys."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    try:
        yield sandbox
    finally:
        for h in sandbox.hosts.values():
            for name in srv.list_instances(str(h.state_dir)):
                rec = srv.current_record(str(h.state_dir), name)
                if rec and srv.record_alive(rec):
                    srv.stop_record(rec, 5.0)
            shutil.rmtree(h.state_dir / "servers", ignore_errors=True)
            for sub in ("srt/speculative", "srt"):
                for f in (wheels.package_dir(h.version) / sub).iterdir():
                    dst = h.sglang_dir / sub / f.name
                    if f.is_file() and (not dst.exists() or dst.read_bytes() != f.read_bytes()):
                        dst.write_bytes(f.read_bytes())
            shutil.rmtree(h.state_dir / "deploys", ignore_errors=True)
            (h.state_dir / "lock").unlink(missing_ok=True)


def jcli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, Any]:
    capsys.readouterr()
    code = main([*map(str, args), "--json"])
    o = capsys.readouterr().out
    return code, json.loads(o) if o.strip() else None


def _both_files(text: str) -> None:
    assert "EAGLEWorker in srt/speculative/eagle_worker.py" in text, text
    assert "your patch changes only eagle_worker_v2.py" in text, text
    assert "SGLANG_ENABLE_SPEC_V2 unset" in text, text


@pytest.mark.fleet
def test_new_user_path_on_a_sandbox(sb: Any, origin_pb: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", ["h01"])  # h01: 0.5.9
    code, doc = jcli(capsys, "explain", "-i", inv, origin_pb)
    assert code == 1
    (h,) = doc["hosts"]
    assert h["state"] == "refused"
    _both_files(h["message"] if h.get("message") else json.dumps(h))
    code, doc = jcli(capsys, "deploy", "-i", inv, origin_pb)
    assert code == 1
    _both_files(json.dumps(doc))
    assert (sb.hosts["h01"].sglang_dir / V2).read_bytes() == wheels.pristine_bytes(V, V2)  # nothing changed
    code, doc = jcli(capsys, "deploy", "-i", inv, origin_pb, "--allow-uncovered")
    assert code == 0, json.dumps(doc)[:2000]
    code, doc = jcli(capsys, "status", "-i", inv, origin_pb)
    _both_files(json.dumps(doc))
    code, doc = jcli(capsys, "launch", "-i", inv, origin_pb, "--timeout", "300")
    assert code == 1
    _both_files(json.dumps(doc))
    code, doc = jcli(capsys, "launch", "-i", inv, origin_pb, "--allow-uncovered", "--timeout", "300")
    assert code == 0, json.dumps(doc)[:2000]
    code, doc = jcli(capsys, "verify-logs", "-i", inv, origin_pb)
    assert code == 1
    iv = doc["hosts"][0]["instances"][0]
    why = " ".join(iv["explanation"])
    assert "why: this launch does not run what the playbook patches" in why
    _both_files(why)


@pytest.mark.fleet
def test_model_family_reads_target_and_draft_configs_on_the_host(sb: Any, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The model implementation is derived from config.json as read on the host (target and draft),
    mapped through 0.5.9's own model registry; an unreadable draft config is said, not guessed."""
    target, draft = tmp_path / "models" / "qwen", tmp_path / "models" / "draft"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    inv = make_inventory(sb, tmp_path / "inv.yaml", ["h01"])
    flags = {"--model-path": str(target)}
    src = wheels.pristine_bytes(V, "srt/models/llama.py").decode()
    first = next(ln for ln in src.splitlines(keepends=True) if ln.startswith(("import ", "from ")))
    pb = new_user_playbook(tmp_path / "pb", capsys, flags=flags, markers=[],
                           edited={"srt/models/llama.py": src.replace(first, first + "# mine\n", 1).encode()})
    code, doc = jcli(capsys, "explain", "-i", inv, pb)
    (h,) = doc["hosts"]
    assert code == 1 and h["state"] == "refused", json.dumps(h)
    text = json.dumps(h)
    assert "names Qwen2ForCausalLM" in text and "srt/models/qwen2.py" in text and "only llama.py" in text
    # EAGLE3 with a draft whose config.json is not on the host: the draft's model is not known, said so
    e3 = "srt/models/llama_eagle3.py"
    src = wheels.pristine_bytes(V, e3).decode()
    first = next(ln for ln in src.splitlines(keepends=True) if ln.startswith(("import ", "from ")))
    spec = {**flags, "--speculative-algorithm": "EAGLE3", "--speculative-draft-model-path": str(draft),
            "--speculative-num-steps": 3, "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4}
    pb2 = new_user_playbook(tmp_path / "pb2", capsys, flags=spec, markers=[],
                            edited={e3: src.replace(first, first + "# mine\n", 1).encode()})
    code, doc = jcli(capsys, "explain", "-i", inv, pb2)
    (h,) = doc["hosts"]
    assert "the draft's config.json" in json.dumps(h) and str(draft) in json.dumps(h), json.dumps(h)
    draft.mkdir(parents=True)
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    code, doc = jcli(capsys, "explain", "-i", inv, pb2)
    (h,) = doc["hosts"]
    fam = [f for f in h["families"] if f["family"] == "model"]
    assert fam and fam[0]["covered"] is True and e3 in fam[0]["runs"], json.dumps(h)


@pytest.mark.fleet
def test_verify_logs_says_what_a_playbook_without_a_marker_proves(sb: Any, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rel = "srt/managers/scheduler.py"
    src = wheels.pristine_bytes(V, rel).decode().replace("import logging\n", "import logging\n# mine\n", 1)
    pb = new_user_playbook(tmp_path / "pb", capsys, edited={rel: src.encode()}, markers=[])
    inv = make_inventory(sb, tmp_path / "inv.yaml", ["h01"])
    code, doc = jcli(capsys, "deploy", "-i", inv, pb)
    assert code == 0, json.dumps(doc)[:2000]
    assert all(not (h.get("coverage") or {}).get("families") for h in doc.get("plan", {}).get("hosts", []))
    code, doc = jcli(capsys, "launch", "-i", inv, pb, "--timeout", "300")
    assert code == 0, json.dumps(doc)[:2000]
    code, doc = jcli(capsys, "verify-logs", "-i", inv, pb)
    iv = doc["hosts"][0]["instances"][0]
    assert any(e.startswith("no verify.markers: this proves the server started") for e in iv["explanation"]), iv


@pytest.mark.fleet
def test_verify_logs_explains_a_model_the_patch_does_not_change(sb: Any, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """verify-logs reads the target's config.json on the host to say why the marker is missing."""
    target = tmp_path / "models" / "qwen"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    rel = "srt/models/llama.py"
    src = wheels.pristine_bytes(V, rel).decode()
    first = next(ln for ln in src.splitlines(keepends=True) if ln.startswith(("import ", "from ")))
    pb = new_user_playbook(tmp_path / "pb", capsys, flags={"--model-path": str(target)}, markers=["llama patched"],
                           edited={rel: src.replace(first, first + '_MARK = "llama patched"\n', 1).encode()})
    inv = make_inventory(sb, tmp_path / "inv.yaml", ["h01"])
    code, doc = jcli(capsys, "deploy", "-i", inv, pb)
    assert code == 1 and "srt/models/qwen2.py" in json.dumps(doc)
    assert jcli(capsys, "deploy", "-i", inv, pb, "--allow-uncovered")[0] == 0
    code, doc = jcli(capsys, "launch", "-i", inv, pb, "--allow-uncovered", "--timeout", "300")
    assert code == 0, json.dumps(doc)[:2000]
    code, doc = jcli(capsys, "verify-logs", "-i", inv, pb)
    iv = doc["hosts"][0]["instances"][0]
    why = " ".join(iv["explanation"])
    assert code == 1 and "why: this launch does not run what the playbook patches" in why, iv
    assert "names Qwen2ForCausalLM" in why and "srt/models/qwen2.py" in why and "only llama.py" in why


def test_the_new_users_fixed_playbook_passes_verify_logs_on_the_sandbox(
        fake_sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The user follows the fix the refusal names (SGLANG_ENABLE_SPEC_V2=1 in launch.env) with a marker
    logged as users write them (an f-string with the rank): the sandbox's simulator logs the line of
    the worker that runs, so verify-logs passes (it failed: the simulator logged only the payload's
    own marker, and the why asked "was the feature's flag given?"). A print() marker is on lines that
    name no rank: verify-logs says so instead of "missing"."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    sb = fake_sandbox(hosts=1, versions=(V,))
    inv = make_inventory(sb, tmp_path / "inv.yaml", ["h01"])
    text = "Accept-rate probe enabled on rank"
    pb = new_user_playbook(tmp_path / "pb", capsys, env={"SGLANG_ENABLE_SPEC_V2": "1"}, markers=[text], edited={
        V2: _edited_worker(V, V2, "EAGLEWorkerV2", f'logger.info(f"{text} {{tp_rank}}")')})
    assert jcli(capsys, "deploy", "-i", inv, pb)[0] == 0
    code, doc = jcli(capsys, "launch", "-i", inv, pb, "--timeout", "300")
    assert code == 0, json.dumps(doc)[:2000]
    code, doc = jcli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 0, json.dumps(doc)[:3000]
    assert all(all(r["markers"].values()) for r in doc["hosts"][0]["instances"][0]["ranks"])
    printed = "My feature printed"
    pb2 = new_user_playbook(tmp_path / "pb2", capsys, env={"SGLANG_ENABLE_SPEC_V2": "1"}, markers=[printed],
                            edited={V2: _edited_worker(V, V2, "EAGLEWorkerV2", f'print("{printed}", flush=True)')})
    assert jcli(capsys, "deploy", "-i", inv, pb2, "--force")[0] == 0
    assert jcli(capsys, "launch", "-i", inv, pb2, "--replace", "--timeout", "300")[0] == 0
    code, doc = jcli(capsys, "verify-logs", "-i", inv, pb2)
    why = " ".join(doc["hosts"][0]["instances"][0]["explanation"])
    assert code == 1 and "on lines that name no rank (a print()" in why and "per_rank: false" in why, why


TRITON = "srt/layers/attention/triton_backend.py"


def _triton_pb(d: Path, capsys: pytest.CaptureFixture[str], flags: dict[str, Any]) -> Path:
    src = wheels.pristine_bytes(V, TRITON).decode()
    anchor = "        self.skip_prefill = skip_prefill\n"
    assert src.count(anchor) == 1
    return new_user_playbook(d, capsys, flags=flags, markers=["Triton tuned"], edited={
        TRITON: src.replace(anchor, '        print("Triton tuned", flush=True)\n' + anchor).encode()})


def test_a_phase_that_certainly_runs_the_patched_backend_covers_it(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--decode-attention-backend triton with no --attention-backend: decode runs the patched triton
    backend whatever prefill SGLang picks, so the launch runs what the playbook patches (it was "not
    certain", as if no phase were known; an explicit unpatched prefill backend was already covered)."""
    from fleetctl.config.playbook import load_playbook
    from fleetctl.plan.patched_worker import coverage

    flags = {"--model-path": "m", "--decode-attention-backend": "triton"}
    pb = load_playbook(_triton_pb(tmp_path / "pb", capsys, flags))
    cov = coverage(V, flags, {}, pb)
    (fam,) = [f for f in cov.families if f["family"] == "attention_backend"]
    assert fam["covered"] is True and cov.covered is True and not cov.refused, fam
    assert coverage(V, {"--model-path": "m"}, {}, pb).covered is None  # no phase known: not certain


def test_offline_uncertainty_does_not_say_the_launch_names_no_model(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """patch check cannot read config.json: it said "(the launch names no --model-path)" of a launch that
    names one, and "fleetctl explain reads it there" of a backend no command can know before start."""
    from fleetctl.config.playbook import load_playbook
    from fleetctl.plan.patched_worker import coverage

    pb = load_playbook(new_user_playbook(tmp_path / "pb", capsys, env={"SGLANG_ENABLE_SPEC_V2": "1"}, edited={
        V2: _edited_worker(V, V2, "EAGLEWorkerV2", f'logger.info("{MARKER}")')}))
    cov = coverage("0.5.9", {**SPEC, "--speculative-algorithm": "EAGLE"}, {"SGLANG_ENABLE_SPEC_V2": "1"}, pb)
    if cov.uncertain:  # (0.5.9 models multi-layer EAGLE per architecture: not certain without the config)
        assert "names no --model-path" not in cov.uncertain and "offline" in cov.uncertain, cov.uncertain
    code, _, err = run(capsys, "patch", "check", _triton_pb(tmp_path / "pb2", capsys, {"--model-path": "m"}))
    assert code == 0 and "explain reads it there" not in err and "decided on each host" in err, err


def test_explain_and_deploy_say_not_certain_once_not_ok_or_not_covered(
        fake_sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A backend SGLang picks at startup: explain said "[ok]" and then the same text again as a note;
    deploy --check said "NOT covered" of a host it does not know to be uncovered."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    sb = fake_sandbox(hosts=1, versions=(V,))
    inv = make_inventory(sb, tmp_path / "inv.yaml", ["h01"])
    pb = _triton_pb(tmp_path / "pb", capsys, {"--model-path": "m"})
    code, out, err = run(capsys, "explain", "-i", inv, pb)
    flat = " ".join((out + err).split())
    assert code == 0 and "[not certain]" in flat and "[ok]" not in flat and "note:" not in flat, flat
    assert flat.count("picks the attention backend at startup") == 1, flat
    code, out, err = run(capsys, "deploy", "--check", "-i", inv, pb)
    flat = " ".join((out + err).split())
    assert code == 0 and "what the launch runs: not certain: attention backend: no --attention-backend" in flat, flat
    assert "NOT covered" not in flat and flat.count("picks the attention backend at startup") == 1, flat


def test_a_playbook_without_workers_hears_nothing_of_them_on_a_release_it_lacks(
        fake_sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A model-file playbook for 0.5.9 explained on a 0.5.14 host: only the refusal (no patch set). It
    printed the speculative routing first ("with SGLANG_ENABLE_SPEC_V2 unset and no
    --speculative-algorithm -> no speculative worker"), noise for a playbook that patches no worker."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    sb = fake_sandbox(hosts=1, versions=("0.5.14",))
    inv = make_inventory(sb, tmp_path / "inv.yaml", ["h01"])
    src = wheels.pristine_bytes(V, "srt/models/qwen2.py").decode()
    first = next(ln for ln in src.splitlines(keepends=True) if ln.startswith(("import ", "from ")))
    pb = new_user_playbook(tmp_path / "pb", capsys, flags={"--model-path": "m"}, markers=[],
                           edited={"srt/models/qwen2.py": src.replace(first, first + "# mine\n", 1).encode()})
    code, out, err = run(capsys, "explain", "-i", inv, pb)
    flat = " ".join((out + err).split())
    assert code == 1 and "SGLang 0.5.14 has no patch set" in flat, flat
    assert "SGLANG_ENABLE_SPEC_V2" not in flat and "speculative" not in flat, flat
