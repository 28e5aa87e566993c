"""Issue 30.2: families of alternative files beyond the speculative worker, read from each release's
own code (its wheel), checked against the launch's flags and the model configs read on the host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl.config.playbook import load_playbook
from fleetctl.engines import wheels
from fleetctl.engines.sglang import KNOWN_VERSIONS
from fleetctl.engines.sglang import families as F
from fleetctl.engines.sglang import family_tables as FT
from fleetctl.engines.sglang.model_config import ModelConfig
from fleetctl.patching import make_patch
from fleetctl.plan.patched_worker import coverage, patched_file

V = "0.5.9"
LLAMA = "srt/models/llama.py"
TRITON = "srt/layers/attention/triton_backend.py"
OUTLINES = "srt/constrained/outlines_backend.py"


def patch_of(version: str, rel: str, old: str, new: str) -> bytes:
    src = wheels.pristine_bytes(version, rel)
    assert old.encode() in src, rel
    return make_patch(src, src.replace(old.encode(), new.encode(), 1), rel)


def comment_patch(version: str, rel: str) -> bytes:
    """A one-line change near the top of `rel` (after its first import line)."""
    src = wheels.pristine_bytes(version, rel).decode()
    first = next(ln for ln in src.splitlines(keepends=True) if ln.startswith(("import ", "from ")))
    return patch_of(version, rel, first, first + "# mine\n")


def pytorch_sampling_patch(version: str) -> bytes:
    src = wheels.pristine_bytes(version, FT.SAMPLER).decode()
    i = src.index("def top_k_top_p_min_p_sampling_from_probs_torch")
    end_doc = src.index('"""', src.index('"""', i) + 3)
    j = src.index("\n", end_doc) + 1
    return patch_of(version, FT.SAMPLER, src[i:j], src[i:j] + "    _mine = 1\n")


@pytest.mark.parametrize("version", ["0.5.4.post3", "0.5.9", "0.5.14", "0.5.23"])
def test_tables_are_read_from_the_release(version: str) -> None:
    t = FT.derive(version, wheels.package_dir(version), {})
    assert not t.problems
    # the model registry: EntryClass of srt/models modules, and the draft renames of model_config.py
    assert t.models["LlamaForCausalLM"] == LLAMA and t.models["Qwen2ForCausalLM"] == "srt/models/qwen2.py"
    assert t.models["LlamaForCausalLMEagle3"] == "srt/models/llama_eagle3.py"
    assert LLAMA in t.model_imports["srt/models/llama_eagle3.py"]
    assert t.draft_renames["DeepseekV3ForCausalLM"] == "DeepseekV3ForCausalLMNextN"
    # the attention registry and the defaults ServerArgs can pick
    assert TRITON in t.attention["triton"] and "srt/layers/attention/flashinfer_backend.py" in t.attention["flashinfer"]
    assert {"fa3", "flashinfer", "triton"} <= set(t.attention_defaults)
    assert t.grammar["outlines"] == [OUTLINES] and t.grammar_defaults == ["xgrammar"]
    assert {n for b in t.sampling for n in b.names} >= {"flashinfer", "pytorch"}
    assert {"flashinfer", "pytorch"} <= set(t.sampling_defaults)
    assert t.spec_workers["NGRAMWorker"] == "srt/speculative/ngram_worker.py"
    # every file named is a real file of the release
    root = wheels.package_dir(version)
    for rel in [*t.models.values(), *t.spec_workers.values(), *t.attention_members(), *t.grammar_members()]:
        assert (root / rel).is_file(), rel


@pytest.mark.slow
@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_every_known_release_has_its_families(version: str) -> None:
    t = FT.table(version)
    assert not t.problems and t.models and t.attention and t.grammar and t.sampling
    assert t.attention_defaults and t.grammar_defaults and t.sampling_defaults


def test_model_family() -> None:
    p = {LLAMA: comment_patch(V, LLAMA)}
    (c,) = F.check(V, {"--model-path": "m"}, p, {}, model=F.ModelSeen("Qwen2ForCausalLM"))
    assert c.covered is False and "Qwen2ForCausalLM" in c.message and "srt/models/qwen2.py" in c.message
    assert "your patch changes only llama.py" in c.message
    # and the fix that works: patch what loads, or launch a model the patched file implements
    assert ("; fix: patch srt/models/qwen2.py too (fleetctl patch new), or launch a model whose config.json "
            "names LlamaForCausalLM or ") in c.message, c.message
    (c,) = F.check(V, {"--model-path": "m"}, p, {}, model=F.ModelSeen("LlamaForCausalLM"))
    assert c.covered is True
    # a model built on llama's classes runs llama.py's code too
    (c,) = F.check(V, {"--model-path": "m"}, p, {}, model=F.ModelSeen("MistralForCausalLM"))
    assert c.covered is True
    (c,) = F.check(V, {"--model-path": "m"}, p, {}, model=F.ModelSeen(None, "/m/config.json: No such file"))
    assert c.covered is None and "/m/config.json: No such file" in c.message
    # the draft: EAGLE3 draft config read on the host, mapped through the registry
    eagle = {"--model-path": "m", "--speculative-algorithm": "EAGLE3", "--speculative-draft-model-path": "d"}
    q = {"srt/models/llama_eagle3.py": comment_patch(V, "srt/models/llama_eagle3.py")}
    (c,) = F.check(V, eagle, q, {}, model=F.ModelSeen("Qwen2ForCausalLM"), draft=F.ModelSeen("LlamaForCausalLMEagle3"))
    assert c.covered is True and "the draft's config.json names LlamaForCausalLMEagle3" in c.message
    (c,) = F.check(V, eagle, q, {}, model=F.ModelSeen("Qwen2ForCausalLM"), draft=None)
    assert c.covered is None and "the draft's config.json" in c.message


def test_attention_family() -> None:
    p = {TRITON: comment_patch(V, TRITON)}
    (c,) = F.check(V, {"--attention-backend": "flashinfer"}, p, {})
    assert c.covered is False and "flashinfer_backend.py" in c.message and "only triton_backend.py" in c.message
    assert c.message.endswith("; fix: pass --attention-backend triton, or patch srt/layers/attention/flashinfer_"
                              "backend.py, srt/layers/attention/flashinfer_mla_backend.py too (whichever the "
                              "model runs)"), c.message
    (c,) = F.check(V, {"--attention-backend": "triton"}, p, {})
    assert c.covered is True
    (c,) = F.check(V, {}, p, {})  # the default is picked at startup from the GPU and model
    assert c.covered is None and "pass --attention-backend triton" in c.message
    (c,) = F.check(V, {"--prefill-attention-backend": "triton", "--decode-attention-backend": "flashinfer"}, p, {})
    assert c.covered is True and "--prefill-attention-backend triton" in c.message
    (c,) = F.check(V, {"--attention-backend": "flashinfer", "--decode-attention-backend": "triton"}, p, {})
    assert c.covered is True and "--decode-attention-backend triton" in c.message
    # the draft worker's own backend runs the patched module too
    (c,) = F.check(V, {"--attention-backend": "flashinfer", "--speculative-algorithm": "EAGLE3",
                       "--speculative-draft-attention-backend": "triton"}, p, {})
    assert c.covered is True and "--speculative-draft-attention-backend triton" in c.message
    wave = {"srt/layers/attention/wave_backend.py": comment_patch(V, "srt/layers/attention/wave_backend.py")}
    (c,) = F.check(V, {}, wave, {})  # never a default: certain
    assert c.covered is False and "none of which runs wave_backend.py" in c.message
    assert "; fix: pass --attention-backend wave, or patch " in c.message, c.message


FA3 = "srt/layers/attention/flashattention_backend.py"
MUSA_FA3 = "srt/hardware_backend/musa/attention/__init__.py"


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_a_backend_lists_the_file_a_cuda_host_runs_not_another_platforms(version: str) -> None:
    """fa3's factory imports MUSA's backend under `if not _is_musa: ... else:`, dsv4's NPU's and HIP's
    under `if _is_npu: ... elif _is_hip: ... else:`. The family listed them as files the backend runs
    ("with --attention-backend fa3 the attention backend runs one of .../musa/attention/__init__.py,
    .../flashattention_backend.py"), and a patch of the MUSA file alone counted as covering fa3 on a
    CUDA host. Now each platform branch is read as a CUDA host takes it; another platform's files are
    kept apart (still members: a patch of one is checked and told what runs instead)."""
    t = FT.derive(version, wheels.package_dir(version), {})
    assert t.attention["fa3"] == [FA3] and t.attention_elsewhere["fa3"] == [MUSA_FA3]
    assert not [m for k, mods in t.attention.items() if k != "ascend"  # (NPU's own backend: not a branch)
                for m in mods if "hip" in m or "musa" in m or "/npu/" in m]
    assert {"srt/hardware_backend/npu/attention/ascend_dsv4_backend.py",
            "srt/layers/attention/deepseek_v4_backend_hip_radix.py"} == set(t.attention_elsewhere["dsv4"])
    assert MUSA_FA3 in t.attention_members()
    # the user-visible answer: the CUDA host runs flashattention_backend.py, not the MUSA file
    musa = {MUSA_FA3: comment_patch(version, MUSA_FA3)}
    (c,) = F.check(version, {"--attention-backend": "fa3"}, musa, {})
    assert c.covered is False and c.runs == [FA3], c
    assert f"the attention backend runs {FA3}" in c.message and "only __init__.py" in c.message, c.message
    p = {TRITON: comment_patch(version, TRITON)}
    (c,) = F.check(version, {"--attention-backend": "fa3"}, p, {})
    assert "musa" not in c.message and "one of" not in c.message, c.message


def test_platform_tests_are_read_as_a_cuda_host_answers_them() -> None:
    import ast

    def on(src: str) -> bool | None:
        return FT.on_cuda(ast.parse(src, mode="eval").body)

    assert [on(x) for x in ("_is_musa", "not _is_musa", "is_hip()", "_is_npu or _is_hip", "is_cuda()",
                            "not is_npu() and not _is_xpu", "_is_cuda and x", "_is_hip and x", "_is_cuda or x",
                            "x", "is_hip(arg)")] == [False, True, False, False, True, True, None, False, True,
                                                     None, None]


def test_grammar_and_sampling_families() -> None:
    g = {OUTLINES: comment_patch(V, OUTLINES)}
    (c,) = F.check(V, {}, g, {})
    assert c.covered is False and "xgrammar" in c.message
    (c,) = F.check(V, {"--grammar-backend": "outlines"}, g, {})
    assert c.covered is True
    s = {FT.SAMPLER: patched_file(V, FT.SAMPLER, pytorch_sampling_patch(V))}
    (c,) = F.check(V, {"--sampling-backend": "flashinfer"}, s, {})
    assert c.covered is False and "sampler.py (pytorch)" in c.message
    (c,) = F.check(V, {"--sampling-backend": "pytorch"}, s, {})
    assert c.covered is True
    (c,) = F.check(V, {}, s, {})
    assert c.covered is None and "pass --sampling-backend pytorch" in c.message
    # a change outside every backend branch of the sampler is in no family member: not checked
    plain = {FT.SAMPLER: patched_file(V, FT.SAMPLER, comment_patch(V, FT.SAMPLER))}
    assert F.check(V, {"--sampling-backend": "flashinfer"}, plain, {}) == []


def test_ngram_worker_is_derived(tmp_path: Path) -> None:
    rel = "srt/speculative/ngram_worker.py"
    assert F.other_spec_worker(V, "NGRAM") == [("NGRAMWorker", rel)]
    pb = _playbook(tmp_path, {rel: comment_patch(V, rel)}, {"--speculative-algorithm": "NGRAM"})
    cov = coverage(V, {"--speculative-algorithm": "NGRAM"}, {}, pb)
    assert cov.covered is True and cov.worker_file == rel and not cov.refused
    cov = coverage(V, {"--speculative-algorithm": "EAGLE3"}, {}, pb)
    assert cov.covered is False and "EAGLEWorker in srt/speculative/eagle_worker.py" in (cov.refused or "")
    assert "your patch changes only ngram_worker.py" in (cov.refused or "")
    cov = coverage(V, {}, {}, pb)  # no speculative decoding at all: the patched worker never runs
    assert cov.covered is False and "never runs" in (cov.refused or "")


def _playbook(tmp_path: Path, files: dict[str, bytes], flags: dict[str, Any], covers: dict | None = None) -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    entries = []
    for rel, patch in files.items():
        pp = tmp_path / (Path(rel).name + ".diff")
        pp.write_bytes(patch)
        entries.append({"path": rel, "patch": pp.name, "sha256": wheels.sha256_bytes(wheels.pristine_bytes(V, rel))})
    doc: dict[str, Any] = {"name": "t", "versions": {V: {"files": entries}}, "launch": {"flags": flags},
                           "verify": {"markers": []}}
    if covers is not None:
        doc["covers"] = covers
    (tmp_path / "playbook.yaml").write_text(yaml.safe_dump(doc))
    return load_playbook(tmp_path)


def test_coverage_combines_families_and_covers_narrows_or_widens(tmp_path: Path) -> None:
    flags = {"--model-path": "m", "--attention-backend": "flashinfer"}
    pb = _playbook(tmp_path, {TRITON: comment_patch(V, TRITON)}, flags)
    cov = coverage(V, flags, {}, pb)
    assert cov.covered is False and cov.refused and "attention backend:" in cov.refused
    assert [f["family"] for f in cov.families] == ["attention_backend"]
    assert json.dumps(cov.to_json())
    off = _playbook(tmp_path / "off", {TRITON: comment_patch(V, TRITON)}, flags,
                    covers={"families": {"attention_backend": False}})
    assert coverage(V, flags, {}, off).refused is None and coverage(V, flags, {}, off).families == []
    # widened: the grammar backend checked although the patch changes no member of it -> refused
    wide = _playbook(tmp_path / "wide", {TRITON: comment_patch(V, TRITON)}, {**flags, "--attention-backend": "triton"},
                     covers={"families": {"grammar_backend": True}})
    cov = coverage(V, {**flags, "--attention-backend": "triton"}, {}, wide)
    assert cov.covered is False and "grammar backend" in (cov.refused or "")
    # the model family, with the config as read on a host
    m = _playbook(tmp_path / "m", {LLAMA: comment_patch(V, LLAMA)}, {"--model-path": "m"})
    cov = coverage(V, {"--model-path": "m"}, {}, m, model=ModelConfig("Qwen2ForCausalLM", "/m/config.json", None))
    assert cov.covered is False and "srt/models/qwen2.py" in (cov.refused or "")
    cov = coverage(V, {"--model-path": "m"}, {}, m, model=ModelConfig(None, "/m/config.json", "no such file"))
    assert cov.refused is None and cov.uncertain and "no such file" in cov.uncertain


def test_a_family_name_covers_does_not_know_is_refused(tmp_path: Path) -> None:
    from fleetctl.errors import InputError

    with pytest.raises(InputError, match=r"covers\.families: attention is not a family"):
        _playbook(tmp_path, {TRITON: comment_patch(V, TRITON)}, {}, covers={"families": {"attention": True}})
