"""The payload playbook playbooks/dynamic-spec-disable, held to the real SGLang release files.

No GPU and no SGLang install: every check runs on the pristine files of the real wheels and on the
patched text. Patched SGLang modules cannot be imported here (torch, CUDA kernels), so single
functions and statements are lifted out of the patched files with `ast` and run on their own.
"""

from __future__ import annotations
import __future__

import argparse
import ast
import builtins
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types
from functools import cache
from pathlib import Path
from typing import Optional

import pytest

from fleetctl.config.playbook import PatchFile, Playbook, load_playbook
from fleetctl.engines import wheels
from fleetctl.engines.sglang import routing
from fleetctl.engines.sglang.releases import KNOWN_VERSIONS
from fleetctl.patching import apply_patch, parse_patch
from fleetctl.plan.patched_worker import coverage

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "playbooks" / "dynamic-spec-disable"
WRONG_FILE = ROOT / "playbooks" / "origin-wrong-file"
DATA = Path(__file__).parent / "data" / "payload"

# Every release fleetctl knows (0.5.4.post3 - 0.5.23, .post releases included) has an entry.
VERSIONS = KNOWN_VERSIONS
# The releases whose patches were written by hand; the others were made from them with
# `fleetctl patch port` and reviewed. The opt-in CPU probe (tests/data/payload/cpu_probe.py) knows these.
HAND_WRITTEN = ("0.5.5.post3", "0.5.9", "0.5.10.post1", "0.5.14")
MARKER = "Dynamic speculation disable enabled"
FLAG = "--speculative-disable-batch-threshold"
FIELD = "speculative_disable_batch_threshold"
SERVER_ARGS = "srt/server_args.py"
SPEC_FIELDS = "srt/arg_groups/fields/spec.py"  # 0.5.20+: where the release declares its speculative flags
V1, V2 = "srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py"
WORKER_CLASS = {V1: "EAGLEWorker", V2: "EAGLEWorkerV2"}


def _order(v: str) -> int:
    return KNOWN_VERSIONS.index(v)


def _has_steps0_state(version: str) -> bool:
    """The release's EAGLEWorkerV2 can build a steps=0 runtime state (upstream's adaptive machinery)."""
    path = wheels.package_dir(version) / V2
    cls = next(n for n in ast.parse(path.read_bytes()).body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2")
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    return {"_build_trivial_verify_input", "build_adaptive_runtime_state", "apply_runtime_state"} <= names


# EAGLEWorkerV2 releases without a steps=0 runtime state whose skipped step is the patch's own (issue 35:
# their default worker): a one-node verify input run through upstream's verify as a DECODE batch on
# DECODE graphs captured for it, the draft extend deferred as on 0.5.14 (not measured on a GPU yet)
V2_OWN_SKIP_RELEASES = ("0.5.11", "0.5.12", "0.5.12.post1")


def _supported(version: str) -> set[str]:
    """Where the feature is implemented: EAGLEWorkerV2 where it has the steps=0 machinery (0.5.14+),
    else EAGLEWorker while it exists (through 0.5.12.post1; with EAGLEWorkerV2, the default worker,
    on 0.5.11-0.5.12.post1), else nowhere (0.5.13, 0.5.13.post1)."""
    if _has_steps0_state(version):
        return {"EAGLEWorkerV2"}
    workers = {"EAGLEWorker"} if (wheels.package_dir(version) / V1).is_file() else set()
    return workers | ({"EAGLEWorkerV2"} if version in V2_OWN_SKIP_RELEASES else set())


# Every other EAGLE-family worker of a release is listed as unsupported.
SUPPORTED = {v: _supported(v) for v in VERSIONS}
V1_RELEASES = tuple(v for v in VERSIONS if "EAGLEWorker" in SUPPORTED[v])
V2_RELEASES = tuple(v for v in VERSIONS if SUPPORTED[v] == {"EAGLEWorkerV2"})
# EAGLEWorker releases whose skipped steps replay DECODE-shaped CUDA graphs of the target (issue 35)
DECODE_GRAPH_RELEASES = ("0.5.11", "0.5.12", "0.5.12.post1")
# EAGLEWorkerV2 releases whose skipped steps run the target as a plain DECODE batch on DECODE graphs
# captured for the batch sizes above the threshold (issue 35; measured on an H200 with 0.5.14)
V2_DECODE_RELEASES = ("0.5.14", "0.5.15", "0.5.15.post1")
NONE_RELEASES = tuple(v for v in VERSIONS if not SUPPORTED[v])


@cache
def playbook() -> Playbook:
    return load_playbook(PLAYBOOK)


def patch_files() -> list[tuple[str, PatchFile]]:
    return [(v, pf) for v in VERSIONS for pf in playbook().files_for(v) or []]


FILES = patch_files()
FILE_IDS = [f"{v}:{pf.path}" for v, pf in FILES]


@cache
def patched(version: str, rel: str) -> bytes:
    pf = next(f for f in playbook().files_for(version) or [] if f.path == rel)
    return apply_patch(wheels.pristine_bytes(version, rel), pf.patch_text, name=pf.path).output


@cache
def patched_tree(version: str, rel: str) -> ast.Module:
    return ast.parse(patched(version, rel), filename=f"{version}/{rel}")


# ---------------------------------------------------------------- AST helpers


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    hits = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert len(hits) == 1, f"class {name}: {len(hits)} definitions"
    return hits[0]


def find_def(scope: ast.Module | ast.ClassDef, name: str) -> ast.FunctionDef:
    hits = [n for n in scope.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(hits) == 1, f"def {name}: {len(hits)} definitions"
    return hits[0]


def strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls of `name(...)` or `anything.name(...)` inside `node`."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                out.append(n)
    return out


def logs_marker_in_init(cls: ast.ClassDef) -> bool:
    """The class's own __init__ logs the marker with logger.info (every rank, not rank 0 only)."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return False
    for call in calls(init, "info"):
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "logger":
            if any(MARKER in s for s in strings(call)):
                return True
    return False


def load_function(tree: ast.Module, name: str, namespace: dict | None = None, filename: str = "<patched>"):
    """Run just one module-level def of a patched file and return the function."""
    node = find_def(tree, name)
    ns = dict(namespace or {})
    # annotations stay unevaluated, as under the files' own `from __future__ import annotations`
    code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    return ns[name]


# ---------------------------------------------------------------- the playbook itself


def test_release_groups():
    """What the payload does where (docs/worker-paths.md §2.7): EAGLEWorker through 0.5.12.post1, nothing
    on 0.5.13/0.5.13.post1 (no steps=0 state yet, no EAGLEWorker any more), EAGLEWorkerV2 from 0.5.14."""
    assert V1_RELEASES == VERSIONS[: _order("0.5.12.post1") + 1]
    assert tuple(v for v in VERSIONS if SUPPORTED[v] == {"EAGLEWorker", "EAGLEWorkerV2"}) == V2_OWN_SKIP_RELEASES
    assert NONE_RELEASES == ("0.5.13", "0.5.13.post1")
    assert V2_RELEASES == VERSIONS[_order("0.5.14"):]


def test_playbook_covers_every_release_and_every_eagle_worker_file():
    pb = playbook()
    assert pb.name == "dynamic-spec-disable"
    assert sorted(pb.supported()) == sorted(VERSIONS)
    for v in VERSIONS:
        paths = [f.path for f in pb.files_for(v)]
        present = [rel for rel in (V1, V2) if (wheels.package_dir(v) / rel).is_file()]
        assert present, v
        args = [SERVER_ARGS, SPEC_FIELDS] if _order(v) >= _order("0.5.20") else [SERVER_ARGS]
        assert sorted(paths) == sorted([*args, *present]), v
        for f in pb.files_for(v):
            assert f.patch_path == PLAYBOOK / "patches" / v / (Path(f.path).name + ".diff")
    assert [rel for rel in (V1, V2) if (wheels.package_dir("0.5.14") / rel).is_file()] == [V2]


def test_every_eagle_worker_class_is_supported_or_listed_unsupported():
    pb = playbook()
    for v in VERSIONS:
        classes = set(routing.worker_files(v))
        unsupported = set(pb.unsupported_workers.get(v, {}))
        assert SUPPORTED[v] <= classes
        assert unsupported == classes - SUPPORTED[v], v
        for cls, why in pb.unsupported_workers[v].items():
            assert why.strip().endswith(".") and why.count(". ") == 0, f"{v} {cls}: one sentence"
        why_v2 = pb.unsupported_workers[v].get("EAGLEWorkerV2", "")
        if v in V1_RELEASES and v not in V2_OWN_SKIP_RELEASES:
            assert "SGLANG_ENABLE_SPEC_V2 unset" in why_v2, v  # how to get the worker that has it
        if v in NONE_RELEASES:
            assert "0.5.14" in why_v2, v


def test_launch_and_verify_sections():
    pb = playbook()
    flags = pb.launch.flags
    assert flags["--speculative-algorithm"] == "EAGLE3"
    assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
            flags["--speculative-num-draft-tokens"]) == (3, 1, 4)
    assert flags[FLAG] == 16
    assert flags["--model-path"] and flags["--speculative-draft-model-path"]
    assert pb.launch.port == 30000
    assert "SGLANG_ENABLE_SPEC_V2" not in pb.launch.env
    assert pb.verify.markers == [MARKER]


@pytest.mark.parametrize(("version", "pf"), FILES, ids=FILE_IDS)
def test_sha256_is_the_pristine_file(version, pf):
    assert wheels.sha256_bytes(wheels.pristine_bytes(version, pf.path)) == pf.sha256


@pytest.mark.parametrize(("version", "pf"), FILES, ids=FILE_IDS)
def test_patch_applies_exactly_and_git_agrees(version, pf, tmp_path):
    (fp,) = parse_patch(pf.patch_text, name=str(pf.patch_path))
    assert (fp.old_path, fp.new_path) == (f"a/{pf.path}", f"b/{pf.path}")
    pristine = wheels.pristine_bytes(version, pf.path)
    res = apply_patch(pristine, pf.patch_text, name=pf.path)
    assert res.offsets == [], "every hunk lands on the line it names"
    assert res.output != pristine
    # cross-check with git apply on a copy of the file at its package-relative path
    target = tmp_path / pf.path
    target.parent.mkdir(parents=True)
    target.write_bytes(pristine)
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, HOME=str(tmp_path),
               GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    git = ["git", "-c", "core.autocrlf=false", "apply", "-p1", "-v", str(pf.patch_path)]
    proc = subprocess.run(git, cwd=tmp_path, capture_output=True, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"offset" not in proc.stderr
    assert target.read_bytes() == res.output


@pytest.mark.parametrize(("version", "pf"), FILES, ids=FILE_IDS)
def test_patched_file_compiles(version, pf):
    compile(patched(version, pf.path), f"{version}/{pf.path}", "exec")


RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


def undefined_names(source: bytes, tmp: Path) -> list[str]:
    """ruff's F821 (undefined name) findings in `source`, by name."""
    tmp.write_bytes(source)
    proc = subprocess.run([RUFF, "check", "--isolated", "--no-cache", "--select", "F821",
                           "--output-format", "json", str(tmp)], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return sorted(d["message"] for d in json.loads(proc.stdout or "[]"))


@pytest.mark.parametrize(("version", "pf"), FILES, ids=FILE_IDS)
def test_patch_adds_no_undefined_name(version, pf, tmp_path):
    """A clean three-way merge can still call what the release does not have (a helper removed, an
    import gone): the patched file has exactly the undefined names of the pristine one."""
    assert RUFF, "ruff (a test dependency) is needed"
    before = undefined_names(wheels.pristine_bytes(version, pf.path), tmp_path / "pristine.py")
    assert undefined_names(patched(version, pf.path), tmp_path / "patched.py") == before


def test_undefined_name_check_can_fail(tmp_path):
    src = patched("0.5.9", V1).replace(b"require_mlp_sync,\n", b"", 1)
    assert "Undefined name `require_mlp_sync`" in undefined_names(src, tmp_path / "x.py")


# ---------------------------------------------------------------- workers


@pytest.mark.parametrize(("version", "pf"), [f for f in FILES if f[1].path in WORKER_CLASS],
                         ids=[i for (_, pf), i in zip(FILES, FILE_IDS, strict=True) if pf.path in WORKER_CLASS])
def test_marker_only_in_supported_worker_init(version, pf):
    tree = patched_tree(version, pf.path)
    cls = find_class(tree, WORKER_CLASS[pf.path])
    init = find_def(cls, "__init__")
    if cls.name in SUPPORTED[version]:
        assert logs_marker_in_init(cls)
        assert not calls(init, "log_info_on_rank0") or not any(
            MARKER in s for c in calls(init, "log_info_on_rank0") for s in strings(c))
    else:
        assert cls.name in playbook().unsupported_workers[version]
        assert not any(MARKER in s for s in strings(tree)), "no marker on a path without the feature"
        first = init.body[0]
        assert isinstance(first, ast.If) and FIELD in ast.unparse(first.test)
        assert isinstance(first.body[0], ast.Raise) and any(FLAG in s for s in strings(first.body[0]))
    # the marker is never logged by the pristine file
    assert MARKER.encode() not in wheels.pristine_bytes(version, pf.path)


def test_marker_check_can_fail():
    """The AST check above refuses a marker outside __init__ and a rank-0-only marker."""
    for name in ("marker_outside_init.py", "marker_rank0_only.py"):
        tree = ast.parse((DATA / name).read_text())
        assert not logs_marker_in_init(find_class(tree, "EAGLEWorker")), name
    assert logs_marker_in_init(find_class(ast.parse((DATA / "marker_ok.py").read_text()), "EAGLEWorker"))


def decision_functions() -> list[tuple[str, str]]:
    return [(v, rel) for v in VERSIONS for rel in (V1, V2)
            if any(f.path == rel for f in playbook().files_for(v))
            and WORKER_CLASS[rel] in SUPPORTED[v]]


@pytest.mark.parametrize(("version", "rel"), decision_functions(), ids=lambda x: str(x))
def test_decision_function_edges(version, rel):
    should = load_function(patched_tree(version, rel), "_dsd_should_speculate", {"Optional": Optional})
    for bs in (0, 1, 16, 17, 10**6):
        assert should(bs, None) is True, "threshold unset: always speculate"
    assert should(16, 16) is True  # == N: speculate
    assert should(17, 16) is False  # N + 1: skip
    assert should(1, 16) is True
    assert should(1, 1) is True and should(2, 1) is False
    assert should(0, 1) is True  # an idle batch never skips


def test_decision_function_is_pure_and_identical_everywhere():
    nodes = [find_def(patched_tree(v, rel), "_dsd_should_speculate") for v, rel in decision_functions()]
    assert len(nodes) == len(V1_RELEASES) + len(V2_OWN_SKIP_RELEASES) + len(V2_RELEASES)
    dumps = {ast.dump(n) for n in nodes}
    assert len(dumps) == 1
    body = nodes[0]
    assert not [n for n in ast.walk(body) if isinstance(n, ast.Call | ast.Attribute | ast.Global | ast.Nonlocal)]
    assert [a.arg for a in body.args.args] == ["batch_size", "threshold"]


@cache
def pristine_class(version: str, rel: str, name: str) -> ast.ClassDef:
    return find_class(ast.parse(wheels.pristine_bytes(version, rel)), name)


def class_fields(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """(all annotated fields, those without a default) of a dataclass-like class."""
    anns = [n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return {n.target.id for n in anns}, {n.target.id for n in anns if n.value is None}


def class_attributes(cls: ast.ClassDef) -> set[str]:
    """Fields, methods and every `self.X = ...` of a class."""
    names = class_fields(cls)[0] | {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    names |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id == "self"}
    return names


def attributes_of(node: ast.AST, var: str) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == var}


@pytest.mark.parametrize("version", V1_RELEASES)
def test_v1_worker_skip_path(version):
    """EAGLEWorker: a skipped step replaces draft() only; verify runs a plain target decode for the
    one-node input, and the draft extend after decode runs on both paths."""
    cls = find_class(patched_tree(version, V1), "EAGLEWorker")
    assert any(isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "_dsd_threshold"
               and ast.unparse(n.value) == "None" for n in cls.body), "class default for subclasses"

    fbg = find_def(cls, "forward_batch_generation")
    (decision,) = [n for n in ast.walk(fbg) if isinstance(n, ast.If) and calls(n.test, "_dsd_should_speculate")]
    assert calls(decision.body[-1], "draft") and calls(decision.orelse[-1], "_dsd_skip_draft")
    if version in DECODE_GRAPH_RELEASES:  # each switch is noted (a rate-limited log line)
        assert calls(decision.body[0], "_dsd_note_switch") and calls(decision.orelse[0], "_dsd_note_switch")
    assert not calls(decision, "forward_draft_extend_after_decode")
    assert len(calls(fbg, "forward_draft_extend_after_decode")) == 1

    skip = find_def(cls, "_dsd_skip_draft")
    (vi,) = calls(skip, "EagleVerifyInput")
    kw = {k.arg: ast.unparse(k.value) for k in vi.keywords}
    assert (kw["spec_steps"], kw["topk"], kw["draft_token_num"]) == ("0", "1", "1")
    assert calls(skip, "cumulate_output_tokens"), "penalties still see the last token"

    verify = find_def(cls, "verify")
    (branch,) = [n for n in ast.walk(verify) if isinstance(n, ast.If) and "spec_steps == 0" in ast.unparse(n.test)]
    assert calls(branch.body[0], "_dsd_forward_target_decode")
    assert calls(branch.orelse[0], "forward_batch_generation")

    fwd = ast.unparse(find_def(cls, "_dsd_forward_target_decode"))
    assert "ForwardMode.DECODE" in fwd and "is_verify=True" in fwd
    if version in DECODE_GRAPH_RELEASES:
        # the skipped step replays the DECODE graphs captured for it (FULL hidden states: their mode)
        assert "CaptureHiddenMode.FULL" in fwd and "graph_runner = self._dsd_decode_graph_runner" in fwd
        assert "graph_runner = verify_graphs" in ast.unparse(find_def(cls, "_dsd_forward_target_decode").body[-1])
        graphs = ast.unparse(find_def(cls, "_dsd_init_decode_graphs"))
        assert "CudaGraphRunner(_DsdDecodeRunnerView(" in graphs and "bs > threshold" in graphs
        view = find_class(patched_tree(version, V1), "_DsdDecodeRunnerView")
        assert "SpeculativeAlgorithm.NONE" in ast.unparse(view)
    else:
        assert "CaptureHiddenMode.LAST" in fwd

    init = ast.unparse(find_def(cls, "__init__"))
    assert "require_mlp_sync(server_args)" in init and "mambaish_config" in init


@pytest.mark.parametrize("version", V1_RELEASES)
def test_v1_skip_matches_the_release(version):
    """What a clean merge cannot see: the skip uses this release's own names. The per-step bookkeeping
    that _draft_preprocess_decode does before allocating (SWA eviction: none before 0.5.7, the
    SWAChunkCache loop on 0.5.7, maybe_evict_swa + decode_batch_idx from 0.5.8) and its penalty
    accumulation are repeated as written; EagleVerifyInput gets this release's fields (retrieve_* from
    0.5.11); every attribute read from the batch, the draft input and the verify input exists."""
    cls = find_class(patched_tree(version, V1), "EAGLEWorker")
    skip = find_def(cls, "_dsd_skip_draft")
    pre = find_def(pristine_class(version, V1, "EAGLEWorker"), "_draft_preprocess_decode")
    first = next(i for i, s in enumerate(pre.body) if "num_seqs = batch.batch_size()" in ast.unparse(s))
    body = [s for s in skip.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    assert [ast.unparse(s) for s in body[:first]] == [ast.unparse(s) for s in pre.body[:first]]
    (want,) = calls(pre, "cumulate_output_tokens")
    (got,) = calls(skip, "cumulate_output_tokens")
    assert ast.unparse(got) == ast.unparse(want)

    info = "srt/speculative/eagle_info.py"
    fields, required = class_fields(pristine_class(version, info, "EagleVerifyInput"))
    (vi,) = calls(skip, "EagleVerifyInput")
    given = {k.arg for k in vi.keywords}
    assert required <= given <= fields, (sorted(given - fields), sorted(required - given))
    draft_fields = class_attributes(pristine_class(version, info, "EagleDraftInput"))
    assert attributes_of(skip, "spec_info") <= draft_fields
    batch_attrs = class_attributes(pristine_class(version, "srt/managers/schedule_batch.py", "ScheduleBatch"))
    for fn in (skip, find_def(cls, "_dsd_forward_target_decode")):
        assert attributes_of(fn, "batch") <= batch_attrs, sorted(attributes_of(fn, "batch") - batch_attrs)
    req_attrs = class_attributes(pristine_class(version, "srt/managers/schedule_batch.py", "Req"))
    assert attributes_of(skip, "req") <= req_attrs


def test_v1_skip_check_can_fail():
    """0.5.9's skip on 0.5.7 (what the clean merge gave) calls maybe_evict_swa, which 0.5.7 lacks."""
    skip = find_def(find_class(patched_tree("0.5.9", V1), "EAGLEWorker"), "_dsd_skip_draft")
    batch_attrs = class_attributes(pristine_class("0.5.7", "srt/managers/schedule_batch.py", "ScheduleBatch"))
    assert "maybe_evict_swa" in attributes_of(skip, "batch") - batch_attrs
    fields, _ = class_fields(pristine_class("0.5.12", "srt/speculative/eagle_info.py", "EagleVerifyInput"))
    (vi,) = calls(skip, "EagleVerifyInput")
    assert "retrive_index" in {k.arg for k in vi.keywords} - fields


@pytest.mark.parametrize("version", V2_RELEASES)
def test_v2_worker_reuses_the_steps0_runtime_state(version):
    tree = patched_tree(version, V2)
    cls = find_class(tree, "EAGLEWorkerV2")
    fbg = find_def(cls, "forward_batch_generation")
    (switch,) = calls(fbg, "apply_runtime_state")
    assert "_dsd_states" in ast.unparse(switch)
    # each switch is noted (a rate-limited log line), in the same step, before the state is applied
    (noted,) = calls(fbg, "_dsd_note_switch")
    assert noted.lineno < switch.lineno and ast.unparse(noted.args[1]) == "speculate"
    assert calls(fbg, "_dsd_should_speculate")
    assert calls(find_def(cls, "init_cuda_graphs"), "_dsd_init_runtime_states")
    states = find_def(cls, "_dsd_init_runtime_states")
    (build,) = calls(states, "build_adaptive_runtime_state")
    assert [ast.unparse(a) for a in build.args] == ["0", "1"]
    init = ast.unparse(find_def(cls, "__init__"))
    assert "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND" in init
    # the pristine file has the machinery the patch relies on
    pcls = pristine_class(version, V2, "EAGLEWorkerV2")
    for name in ("build_adaptive_runtime_state", "apply_runtime_state", "_build_trivial_verify_input"):
        find_def(pcls, name)
    # the regular state names every field of this release's SpecRuntimeState
    fields, required = class_fields(pristine_class(version, "srt/speculative/adaptive_runtime_state.py",
                                                   "SpecRuntimeState"))
    (regular,) = calls(states, "SpecRuntimeState")
    assert required <= {k.arg for k in regular.keywords} <= fields
    # CUDA graphs for the steps=0 state: the same settings upstream gives its own adaptive states
    (init_states,) = calls(find_def(pcls, "init_cuda_graphs"), "init_states")
    (graph_bs,) = [k.value for k in init_states.keywords if k.arg == "cuda_graph_bs"]
    assert isinstance(graph_bs, ast.IfExp)
    mine = re.sub(r"\bsa\.", "self.server_args.", ast.unparse(states))  # 0.5.14-0.5.15.post1: sa = self.server_args
    assert ast.unparse(graph_bs.test) in mine and ast.unparse(graph_bs.orelse) in mine

    # the steps=0 state is built under the same contexts upstream builds its adaptive states in (the
    # draft TP context's signature changes in 0.5.21, 0.5.22 and 0.5.23), and reads only draft-worker
    # attributes upstream reads too
    (theirs,) = [n for n in ast.walk(find_def(pcls, "init_cuda_graphs")) if isinstance(n, ast.With)]
    (ours,) = [n for n in ast.walk(states) if isinstance(n, ast.With)]
    ours_items = [ast.unparse(i.context_expr) for i in ours.items]
    if version in V2_DECODE_RELEASES:  # and, last, ours: the decode graph sizes narrowed to those it serves
        assert ours_items.pop() == "self._dsd_served_batch_sizes()"
    assert ours_items == [ast.unparse(i.context_expr).replace("self._draft_worker.", "dw.") for i in theirs.items]
    upstream_reads = {n.attr for n in ast.walk(pcls) if isinstance(n, ast.Attribute)
                      and ast.unparse(n.value) == "self._draft_worker"}
    assert attributes_of(states, "dw") <= upstream_reads
    # and calls upstream's methods with the signatures this release has
    build_def, apply_def = find_def(pcls, "build_adaptive_runtime_state"), find_def(pcls, "apply_runtime_state")
    assert [a.arg for a in build_def.args.args][:3] == ["self", "speculative_num_steps", "speculative_num_draft_tokens"]
    assert "cuda_graph_bs" in [a.arg for a in build_def.args.args]
    assert [a.arg for a in apply_def.args.args] == ["self", "state"]


def _module_tree(version: str, module: str) -> ast.Module | None:
    """The pristine release's module `sglang.a.b` (a.py or a/b/__init__.py), parsed; None if absent."""
    rel = module.split(".", 1)[1].replace(".", "/") if "." in module else ""
    base = wheels.package_dir(version)
    for path in (base / f"{rel}.py", base / rel / "__init__.py"):
        if path.is_file():
            return ast.parse(path.read_bytes())
    return None


def _defined(scope: ast.Module | ast.ClassDef) -> set[str]:
    """Names a module or class body binds: defs, classes, assignments, fields, imports."""
    out: set[str] = set()
    for n in scope.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Assign):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return out


def _params(fn: ast.FunctionDef) -> set[str]:
    a = fn.args
    return {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}


def _class_in(version: str, module: str, name: str) -> ast.ClassDef:
    tree = _module_tree(version, module)
    assert tree is not None, f"{version}: no module {module}"
    return find_class(tree, name)


def decode_skip_gaps(version: str, cls: ast.ClassDef) -> list[str]:
    """What the V2 DECODE skip (`_dsd_prepare_decode`, `_dsd_decode_graph_runner`) takes from the
    release that the release lacks: each name it imports, each keyword it passes, each method and
    field it reads on the release's classes. Empty when every piece is the release's own."""
    gaps = []
    prep, graphs = find_def(cls, "_dsd_prepare_decode"), find_def(cls, "_dsd_decode_graph_runner")
    for imp in [n for n in ast.walk(prep) if isinstance(n, ast.ImportFrom)]:
        tree = _module_tree(version, imp.module or "")
        for a in imp.names:
            if tree is None or a.name not in _defined(tree):
                gaps.append(f"{imp.module}.{a.name}")
    # the cache-location helper from the module ours imports it from (the release's own, checked above)
    (locs,) = [n.module for n in ast.walk(prep) if isinstance(n, ast.ImportFrom)
               and "assign_extend_cache_locs_func" in {a.name for a in n.names}]
    cache_locs = _module_tree(version, locs or "")
    (assign,) = calls(prep, "assign_extend_cache_locs_func")
    if cache_locs is not None and "assign_extend_cache_locs_func" in _defined(cache_locs):
        want = {k.arg for k in assign.keywords} - _params(find_def(cache_locs, "assign_extend_cache_locs_func"))
        gaps += [f"assign_extend_cache_locs_func({k}=)" for k in sorted(want)]
    runner = _class_in(version, "sglang.srt.model_executor.runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner")
    (made,) = calls(graphs, "DecodeCudaGraphRunner")
    gaps += [f"DecodeCudaGraphRunner({k}=)" for k in sorted({k.arg for k in made.keywords}
                                                            - _params(find_def(runner, "__init__")))]
    gaps += [f"DecodeCudaGraphRunner.{m}" for m in ("can_run_graph", "load_batch") if m not in _defined(runner)]
    fbi = "sglang.srt.model_executor.forward_batch_info"
    fb = _class_in(version, fbi, "ForwardBatch")
    gaps += [f"ForwardBatch.{m}" for m in ("init_new", "mark_forward_metadata_ready") if m not in _defined(fb)]
    gaps += [f"ForwardMode.{m}" for m in ("DECODE", "TARGET_VERIFY") if m not in _defined(_class_in(version, fbi, "ForwardMode"))]
    gaps += ["CaptureHiddenMode.FULL"] * ("FULL" not in _defined(_class_in(version, fbi, "CaptureHiddenMode")))
    sb = _defined(_class_in(version, "sglang.srt.managers.schedule_batch", "ScheduleBatch"))
    touched = {n.attr for n in ast.walk(prep) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "batch"}
    gaps += [f"ScheduleBatch.{a}" for a in sorted(touched - sb - {"forward_mode"}) if not a.startswith("_")]
    cfg = _module_tree(version, "sglang.srt.model_executor.cuda_graph_config")
    if cfg is None or "bs" not in _defined(find_class(cfg, "PhaseConfig")) \
            or "decode" not in _defined(find_class(cfg, "CudaGraphConfig")):
        gaps.append("CudaGraphConfig.decode.bs")
    sa = _class_in(version, "sglang.srt.server_args", "ServerArgs")
    gaps += ["ServerArgs.enable_return_hidden_states"] * ("enable_return_hidden_states" not in _defined(sa))
    pcls = pristine_class(version, V2, "EAGLEWorkerV2")
    if "_override_worker_state" not in _defined(pcls):
        gaps.append("EAGLEWorkerV2._override_worker_state")
    gaps += [f"eagle_prepare_for_verify {what}" for what in _one_node_prep(version) - _prep_steps(prep)]
    return gaps


def _prep_steps(fn: ast.FunctionDef) -> set[str]:
    """What a verify preparation does to the step: each batch/verify_input field it sets, each helper
    it calls by name."""
    out = {f"sets {ast.unparse(t)}" for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets
           if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("batch", "verify_input")}
    return out | {f"calls {n.func.id}" for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _one_node_prep(version: str) -> set[str]:
    """The release's own verify preparation (eagle_utils.eagle_prepare_for_verify), the steps the skipped
    step must take too so that its DECODE forward writes what the one-node verify would (0.5.15 adds
    the DSV4 cache-location view); less the out-of-bounds probe, a debug check of the input ids."""
    tree = _module_tree(version, "sglang.srt.speculative.eagle_utils")
    assert tree is not None, version
    return _prep_steps(find_def(tree, "eagle_prepare_for_verify")) - {"calls maybe_detect_oob"}


@pytest.mark.parametrize("version", V2_DECODE_RELEASES)
def test_v2_skipped_step_decodes_with_the_release_s_own_pieces(version):
    """On a skipped step the V2 worker prepares a plain DECODE batch (same KV slot and input token
    as the one-node verify) and replays DECODE graphs captured for it; every piece it takes from
    the release is the release's own, and the rest of verify runs as upstream wrote it."""
    cls = find_class(patched_tree(version, V2), "EAGLEWorkerV2")
    assert decode_skip_gaps(version, cls) == []
    fbg = ast.unparse(find_def(cls, "forward_batch_generation"))
    assert "self._dsd_skipping = not speculate and (not _is_npu)" in fbg
    verify = find_def(cls, "verify")
    (choice,) = [n for n in ast.walk(verify) if isinstance(n, ast.If) and ast.unparse(n.test) == "self._dsd_skipping"]
    assert calls(choice.body[0], "_dsd_prepare_decode") and calls(choice.orelse[0], "eagle_prepare_for_verify")
    (fill,) = calls(verify, "update_verify_buffers_to_fill_after_draft")
    guard = [n for n in ast.walk(verify) if isinstance(n, ast.If) and fill in list(ast.walk(n))]
    assert ast.unparse(guard[-1].test) == "not self._dsd_skipping"
    prep = ast.unparse(find_def(cls, "_dsd_prepare_decode"))
    assert "batch.forward_mode = ForwardMode.DECODE" in prep and "batch.forward_mode = ForwardMode.TARGET_VERIFY" in prep
    assert "CaptureHiddenMode.FULL" in prep and "end_offset=batch.seq_lens + 1" in prep
    graphs = ast.unparse(find_def(cls, "_dsd_decode_graph_runner"))
    assert "runner.spec_algorithm = SpeculativeAlgorithm.NONE" in graphs
    states = ast.unparse(find_def(cls, "_dsd_init_runtime_states"))
    assert "skipping.target_graph_runner = self._dsd_decode_graph_runner(" in states


def test_decode_skip_gaps_sees_what_a_release_lacks():
    """The check above can fail: a planted import, keyword and method the release does not have."""
    cls = find_class(patched_tree("0.5.14", V2), "EAGLEWorkerV2")
    src = ast.unparse(cls).replace("prepare_mamba_track_for_verify", "prepare_mamba_track_for_verifyX")
    src = src.replace("draft_token_num=1,", "draft_token_num=1, stride=1,").replace("can_run_graph", "can_run_graphX")
    src = src.replace("speculative_num_draft_tokens=1)", "speculative_num_draft_tokens=1, mode=0)")
    planted = find_class(ast.parse(src), "EAGLEWorkerV2")
    assert decode_skip_gaps("0.5.14", planted) == [
        "sglang.srt.speculative.spec_utils.prepare_mamba_track_for_verifyX",
        "assign_extend_cache_locs_func(stride=)", "DecodeCudaGraphRunner(mode=)",
        "eagle_prepare_for_verify calls prepare_mamba_track_for_verify"]
    # a step the release's one-node verify takes and the skipped step leaves out (0.5.15's DSV4 view)
    cls = find_class(patched_tree("0.5.15", V2), "EAGLEWorkerV2")
    src = ast.unparse(cls).replace("batch.out_cache_loc_dsv4 = maybe_build_dsv4_verify_bundle(batch, 1)", "pass")
    assert sorted(decode_skip_gaps("0.5.15", find_class(ast.parse(src), "EAGLEWorkerV2"))) == [
        "eagle_prepare_for_verify calls maybe_build_dsv4_verify_bundle",
        "eagle_prepare_for_verify sets batch.out_cache_loc_dsv4"]


def deferred_extend_gaps(version: str, cls: ast.ClassDef) -> list[str]:
    """What the deferred draft extend of skipped steps (`_dsd_defer_draft_extend`, `_dsd_catch_up`,
    `_dsd_catch_up_before_draft`) takes from the release that the release lacks: the keywords of the
    draft-extend input it builds, the draft worker's prepare_for_draft_extend and its arity, every
    module-level name it uses, the fields it reads or sets on the release's classes, and the fallback
    to upstream's per-step draft extend under DP attention (a catch-up is a forward the other DP ranks
    would not run) and where the release's draft extend also seeds the DSA indexer (0.5.15). Empty
    when every piece is the release's own."""
    gaps = []
    defer, catch, before = (find_def(cls, n) for n in
                            ("_dsd_defer_draft_extend", "_dsd_catch_up", "_dsd_catch_up_before_draft"))
    ext_fields = class_fields(_class_in(version, "sglang.srt.speculative.eagle_info", "EagleDraftExtendInput"))[0]
    (made,) = calls(catch, "EagleDraftExtendInput")
    gaps += [f"EagleDraftExtendInput({k}=)" for k in sorted({k.arg for k in made.keywords} - ext_fields)]
    base = _class_in(version, "sglang.srt.speculative.base_spec_worker", "EagleDraftWorkerBase")
    if "prepare_for_draft_extend" not in _defined(base):
        gaps.append("EagleDraftWorkerBase.prepare_for_draft_extend")
    else:
        (call,) = calls(catch, "prepare_for_draft_extend")
        want = len(find_def(base, "prepare_for_draft_extend").args.args) - 1
        if len(call.args) != want:
            gaps.append(f"prepare_for_draft_extend: {len(call.args)} arguments, the release takes {want}")
    module = ast.parse(wheels.pristine_bytes(version, V2))
    used = {n.id for fn in (defer, catch, before) for n in ast.walk(fn) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)} - {"self", "batch", "batch_output", "dw", "copy"}
    local = {n.id for fn in (defer, catch, before) for n in ast.walk(fn) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Store)} | set(dir(builtins))
    local |= {a for fn in (defer, catch, before) for a in _params(fn)}
    mine = {n.targets[0].id for n in patched_tree(version, V2).body
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id.startswith("_DSD")}
    gaps += [f"module name {n}" for n in sorted(used - local - mine - _defined(module))]
    pcls = pristine_class(version, V2, "EAGLEWorkerV2")
    gaps += [f"EAGLEWorkerV2.{m}" for m in ("_stub_skipped_draft_extend",) if m not in _defined(pcls)]
    draft_input = class_fields(_class_in(version, "sglang.srt.speculative.eagle_info", "EagleDraftInput"))[0]
    gaps += [f"EagleDraftInput.{a}" for a in sorted(attributes_of(before, "spec") - draft_input)]
    sb = _defined(_class_in(version, "sglang.srt.managers.schedule_batch", "ScheduleBatch"))
    touched = attributes_of(catch, "catch_up") | attributes_of(catch, "batch") | attributes_of(defer, "batch")
    gaps += [f"ScheduleBatch.{a}" for a in sorted(touched - sb)]
    sa = _defined(_class_in(version, "sglang.srt.server_args", "ServerArgs"))
    gaps += [f"ServerArgs.{a}" for a in sorted({n.attr for fn in (defer, catch) for n in ast.walk(fn)
                                                if isinstance(n, ast.Attribute)
                                                and ast.unparse(n.value) == "self.server_args"} - sa)]
    if "self.server_args.enable_dp_attention" not in ast.unparse(defer):
        gaps.append("no per-step draft extend under DP attention")
    upstream_extend = find_def(pristine_class(version, V2, "EagleDraftWorker"), "_draft_extend_for_decode")
    seeds = "seed_dsa_topk_from_draft_extend" in ast.unparse(upstream_extend)
    if seeds and "seed_dsa_topk_from_draft_extend" not in ast.unparse(defer):
        gaps.append("no per-step draft extend where it seeds the DSA indexer top-k")
    return gaps


@pytest.mark.parametrize("version", V2_DECODE_RELEASES)
def test_v2_skipped_step_defers_its_draft_extend(version):
    """A skipped step keeps the token and target hidden state of its position instead of running the
    draft extend; the kept positions are draft-extended together every few skipped steps and before
    the next drafting step (so the draft's KV has no holes when speculation resumes: measured on the
    H200 as unchanged acceptance); a prefill clears what a reused request row kept; every piece taken
    from the release is the release's own."""
    cls = find_class(patched_tree(version, V2), "EAGLEWorkerV2")
    assert deferred_extend_gaps(version, cls) == []
    fbg = find_def(cls, "forward_batch_generation")
    (defer,) = calls(fbg, "_dsd_defer_draft_extend")
    (stock,) = [n for n in ast.walk(fbg) if isinstance(n, ast.If) and ast.unparse(n.test) == "self._dsd_skipping"]
    assert defer in list(ast.walk(stock.body[0])) and calls(stock.orelse[0], "_draft_extend_for_decode")
    (before,) = calls(fbg, "_dsd_catch_up_before_draft")
    (draft,) = [c for c in calls(fbg, "draft") if ast.unparse(c.func) == "self.draft_worker.draft"]
    assert before.lineno < draft.lineno
    (reset,) = [n for n in ast.walk(fbg) if isinstance(n, ast.Assign) and "_dsd_pend_n" in ast.unparse(n.targets[0])]
    (prefill,) = calls(fbg, "_draft_extend_for_prefill")
    assert reset.lineno < prefill.lineno and ast.unparse(reset.value) == "0"
    # the positions kept end after the step's own (after a skipped step) or before this one (resuming)
    offsets = {ast.unparse(c.keywords[0].value) for fn in ("_dsd_defer_draft_extend", "_dsd_catch_up_before_draft")
               for c in calls(find_def(cls, fn), "_dsd_catch_up")}
    assert offsets == {"1", "0"}
    # padded extend tokens write the KV pool's padding slot and come after every kept token of their request
    catch = ast.unparse(find_def(cls, "_dsd_catch_up"))
    assert "torch.where(valid, slots, torch.zeros_like(slots))" in catch
    assert "valid = cols.unsqueeze(0) < n.unsqueeze(1)" in catch


def test_deferred_extend_gaps_sees_what_a_release_lacks():
    """The check above can fail: a planted keyword, a missing argument, an unknown name, a field the
    release's batch lacks, and a dropped fallback (DP attention, a DSA-seeding draft)."""
    cls = find_class(patched_tree("0.5.14", V2), "EAGLEWorkerV2")
    src = ast.unparse(cls).replace("num_tokens_per_req=m,", "num_tokens_per_req=m, stride=m,")
    src = src.replace("dw.draft_runner, None)", "dw.draft_runner)").replace("fast_topk(", "fast_topkX(")
    src = src.replace("catch_up.seq_lens_sum = None", "catch_up.seq_lens_total = None")
    src = src.replace("self.server_args.enable_dp_attention", "False")
    assert deferred_extend_gaps("0.5.14", find_class(ast.parse(src), "EAGLEWorkerV2")) == [
        "EagleDraftExtendInput(stride=)", "prepare_for_draft_extend: 5 arguments, the release takes 6",
        "module name fast_topkX", "ScheduleBatch.seq_lens_total", "no per-step draft extend under DP attention"]
    cls = find_class(patched_tree("0.5.15", V2), "EAGLEWorkerV2")
    src = ast.unparse(cls).replace("self._draft_worker.seed_dsa_topk_from_draft_extend", "False")
    assert deferred_extend_gaps("0.5.15", find_class(ast.parse(src), "EAGLEWorkerV2")) == [
        "no per-step draft extend where it seeds the DSA indexer top-k"]


def own_skip_gaps(version: str, cls: ast.ClassDef, module: ast.Module) -> list[str]:
    """What EAGLEWorkerV2's own skipped step on 0.5.11-0.5.12.post1 (`_dsd_skipped_step`,
    `_dsd_prepare_decode`, `_dsd_init_decode_graphs`, the deferred draft extend) takes from the release
    that the release lacks: the fields of the verify input it builds and of the draft input it reads
    and fills, the cache-location helper's parameters, the release's own draft-extend preparation
    and its arity, the fields of ModelWorkerBatch / Req / ServerArgs it reads or sets, the graph
    runner's and model runner's members it uses, every module-level name, and where the release's
    scheduler reads a result's token stride from. Empty when every piece is the release's own."""
    gaps = []
    fn = {n: find_def(cls, n) for n in ("_dsd_skipped_step", "_dsd_prepare_decode", "_dsd_init_decode_graphs",
                                        "_dsd_defer_draft_extend", "_dsd_catch_up", "_dsd_catch_up_before_draft",
                                        "_dsd_skip_state")}
    info = "sglang.srt.speculative.eagle_info"
    vfields, vrequired = class_fields(_class_in(version, info, "EagleVerifyInput"))
    (vi,) = calls(fn["_dsd_skipped_step"], "EagleVerifyInput")
    given = {k.arg for k in vi.keywords}
    gaps += [f"EagleVerifyInput({k}=)" for k in sorted(given - vfields)]
    gaps += [f"EagleVerifyInput needs {k}=" for k in sorted(vrequired - given)]
    draft_fields = class_fields(_class_in(version, info, "EagleDraftInput"))[0]
    used = (attributes_of(fn["_dsd_skipped_step"], "draft_input") | attributes_of(fn["_dsd_skipped_step"], "next_draft_input")
            | attributes_of(fn["_dsd_defer_draft_extend"], "next_draft_input")
            | attributes_of(fn["_dsd_catch_up"], "extend_input") - {"prepare_for_extend_to_fill_draft_kvcache"}
            | attributes_of(fn["_dsd_catch_up_before_draft"], "spec"))
    (ei,) = calls(fn["_dsd_catch_up"], "EagleDraftInput")
    used |= {k.arg for k in ei.keywords}
    gaps += [f"EagleDraftInput.{a}" for a in sorted(used - draft_fields)]
    v2info = _module_tree(version, "sglang.srt.speculative.eagle_info_v2")
    (assign,) = calls(fn["_dsd_prepare_decode"], "assign_extend_cache_locs_func")
    gaps += [f"assign_extend_cache_locs_func({k}=)" for k in sorted({k.arg for k in assign.keywords}
                                                                    - _params(find_def(v2info, "assign_extend_cache_locs_func")))]
    mixin = find_class(v2info, "EagleDraftInputV2Mixin")
    if "prepare_for_extend_to_fill_draft_kvcache" not in _defined(mixin):
        gaps.append("EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache")
    else:
        (call,) = calls(fn["_dsd_catch_up"], "prepare_for_extend_to_fill_draft_kvcache")
        want = len(find_def(mixin, "prepare_for_extend_to_fill_draft_kvcache").args.args) - 1
        if len(call.args) != want:
            gaps.append(f"prepare_for_extend_to_fill_draft_kvcache: {len(call.args)} arguments, the release takes {want}")
    mwb = class_fields(_class_in(version, "sglang.srt.managers.schedule_batch", "ModelWorkerBatch"))[0]
    touched = set().union(*(attributes_of(f, "batch") for f in fn.values())) | attributes_of(fn["_dsd_catch_up"], "catch_up")
    gaps += [f"ModelWorkerBatch.{a}" for a in sorted(touched - mwb)]
    req = class_attributes(_class_in(version, "sglang.srt.managers.schedule_batch", "Req"))
    gaps += [f"Req.{a}" for a in sorted(set().union(*(attributes_of(f, "req") for f in fn.values())) - req)]
    sa = _defined(_class_in(version, "sglang.srt.server_args", "ServerArgs"))
    read = attributes_of(fn["_dsd_init_decode_graphs"], "sa") | attributes_of(fn["_dsd_init_decode_graphs"], "args")
    read |= {n.attr for f in fn.values() for n in ast.walk(f) if isinstance(n, ast.Attribute)
             and ast.unparse(n.value) == "self.server_args"}
    gaps += [f"ServerArgs.{a}" for a in sorted(read - sa)]
    runner = _defined(_class_in(version, "sglang.srt.model_executor.cuda_graph_runner", "CudaGraphRunner"))
    runner |= class_attributes(_class_in(version, "sglang.srt.model_executor.cuda_graph_runner", "CudaGraphRunner"))
    gaps += [f"CudaGraphRunner.{m}" for m in ("can_run", "replay_prepare", "capture_bs") if m not in runner]
    mr = class_attributes(_class_in(version, "sglang.srt.model_executor.model_runner", "ModelRunner"))
    wanted = attributes_of(fn["_dsd_init_decode_graphs"], "target_runner") | attributes_of(fn["_dsd_prepare_decode"], "target_runner")
    wanted |= attributes_of(fn["_dsd_skip_state"], "runner") | {"mambaish_config"}
    gaps += [f"ModelRunner.{m}" for m in sorted(wanted - mr)]
    names = {n.id for f in fn.values() for n in ast.walk(f) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    local = {n.id for f in fn.values() for n in ast.walk(f) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    local |= {a for f in fn.values() for a in _params(f)} | set(dir(builtins)) | {"self"}
    gaps += [f"module name {n}" for n in sorted(names - local - _defined(module))]
    # the scheduler reads each request's tokens at a stride: from the result (0.5.12+), or from this
    # worker's attribute when it processes the result (0.5.11), where the skipped step pads to it
    mixin_out = _module_tree(version, "sglang.srt.managers.scheduler_output_processor_mixin")
    stride = [ast.unparse(n.value) for n in ast.walk(mixin_out) if isinstance(n, ast.Assign)
              and ast.unparse(n.targets[0]) == "stride"]
    skipped = ast.unparse(fn["_dsd_skipped_step"])
    if stride == ["result.speculative_num_draft_tokens"]:
        result = class_fields(_class_in(version, "sglang.srt.managers.utils", "GenerationBatchResult"))[0]
        verify = ast.unparse(find_def(cls, "verify"))
        if "speculative_num_draft_tokens" not in result or \
                "speculative_num_draft_tokens=self.speculative_num_draft_tokens" not in verify:
            gaps.append("the result does not carry the skipped step's stride")
    elif stride == ["self.draft_worker.speculative_num_draft_tokens"]:
        if "strided[::stride] = batch_output.next_token_ids" not in skipped:
            gaps.append("the skipped step's tokens are not at the worker's stride")
    else:
        gaps.append(f"the scheduler's stride is {stride}")
    return gaps


@pytest.mark.parametrize("version", V2_OWN_SKIP_RELEASES)
def test_v2_own_skipped_step(version):
    """EAGLEWorkerV2 of 0.5.11-0.5.12.post1 (their default worker, no steps=0 state): a decode step
    over the threshold returns the patch's own skipped step before drafting (each switch noted); it
    builds a one-node verify input rooted at the previous bonus token and runs upstream's verify on it
    with one draft token per request and the target's DECODE graphs (captured for the batch sizes
    above the threshold, FULL hidden states, the graph runner put back after), the target forward
    being a plain DECODE batch prepared on the forward stream; its draft extend is deferred as on
    0.5.14 (every few skipped steps and before drafting resumes; a prefill clears a reused row); every
    piece taken from the release is the release's own."""
    tree = patched_tree(version, V2)
    cls = find_class(tree, "EAGLEWorkerV2")
    assert own_skip_gaps(version, cls, tree) == []
    fbg = find_def(cls, "forward_batch_generation")
    (decision,) = [n for n in ast.walk(fbg) if isinstance(n, ast.If) and calls(n.test, "_dsd_should_speculate")] or [
        n for n in ast.walk(fbg) if isinstance(n, ast.If) and ast.unparse(n.test) == "not speculate"]
    (noted,) = calls(fbg, "_dsd_note_switch")
    (skip,) = calls(fbg, "_dsd_skipped_step")
    (before,) = calls(fbg, "_dsd_catch_up_before_draft")
    (draft,) = [c for c in calls(fbg, "draft") if ast.unparse(c.func) == "self.draft_worker.draft"]
    assert noted.lineno < skip.lineno < before.lineno < draft.lineno
    assert isinstance(decision.body[0], ast.Return) and decision.body[0].value is skip
    (reset,) = [n for n in ast.walk(fbg) if isinstance(n, ast.Assign) and "_dsd_pend_n[" in ast.unparse(n.targets[0])]
    (prefill,) = calls(fbg, "_draft_extend_for_prefill")
    assert reset.lineno < prefill.lineno and ast.unparse(reset.value) == "0"
    assert calls(find_def(cls, "__init__"), "_dsd_init_decode_graphs")
    init = ast.unparse(find_def(cls, "__init__"))
    assert "require_mlp_sync(server_args)" in init and "mambaish_config" in init
    assert any(isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "_dsd_threshold"
               and ast.unparse(n.value) == "None" for n in cls.body), "class default for subclasses"

    step = find_def(cls, "_dsd_skipped_step")
    (vi,) = calls(step, "EagleVerifyInput")
    kw = {k.arg: ast.unparse(k.value) for k in vi.keywords}
    assert (kw["spec_steps"], kw["topk"], kw["draft_token_num"]) == ("0", "1", "1")
    assert kw["capture_hidden_mode"] == "CaptureHiddenMode.FULL"
    (verify_call,) = calls(step, "verify")
    (with_state,) = [n for n in ast.walk(step) if isinstance(n, ast.With) and "_dsd_skip_state" in ast.unparse(n.items[0])]
    assert verify_call in list(ast.walk(with_state))
    assert not calls(step, "_draft_extend_for_decode") and calls(step, "_dsd_defer_draft_extend")
    state = ast.unparse(find_def(cls, "_dsd_skip_state"))
    assert "self.speculative_num_steps, self.speculative_num_draft_tokens = (0, 1)" in state
    assert "runner.graph_runner = self._dsd_graph_runner" in state and "finally:" in state

    verify = find_def(cls, "verify")
    (choice,) = [n for n in verify.body if isinstance(n, ast.If) and ast.unparse(n.test) == "self._dsd_skipping"]
    assert calls(choice.body[0], "_dsd_prepare_decode") and calls(choice.orelse[0], "prepare_for_v2_verify")
    (fill,) = calls(verify, "update_verify_buffers_to_fill_after_draft")
    guard = [n for n in ast.walk(verify) if isinstance(n, ast.If) and fill in list(ast.walk(n))]
    assert ast.unparse(guard[-1].test) == "self.plan_stream and (not self._dsd_skipping)"
    prep = ast.unparse(find_def(cls, "_dsd_prepare_decode"))
    assert "batch.forward_mode = ForwardMode.DECODE" in prep and "batch.forward_mode = ForwardMode.TARGET_VERIFY" in prep
    assert "CaptureHiddenMode.FULL" in prep and "end_offset=batch.seq_lens + 1" in prep
    assert "graph_runner.replay_prepare(forward_batch)" in prep and "init_forward_metadata(forward_batch)" in prep
    graphs = ast.unparse(find_def(cls, "_dsd_init_decode_graphs"))
    assert "CudaGraphRunner(_DsdDecodeRunnerView(" in graphs and "bs > threshold" in graphs
    assert "args.enable_return_hidden_states = True" in graphs
    assert "SpeculativeAlgorithm.NONE" in ast.unparse(find_class(tree, "_DsdDecodeRunnerView"))

    # the deferred draft extend: the kept positions end after the step's own (in a skipped step) or
    # before this one (resuming); pads write the KV pool's padding slot and come after every kept token
    offsets = {ast.unparse(c.keywords[0].value) for f in ("_dsd_defer_draft_extend", "_dsd_catch_up_before_draft")
               for c in calls(find_def(cls, f), "_dsd_catch_up")}
    assert offsets == {"1", "0"}
    catch = ast.unparse(find_def(cls, "_dsd_catch_up"))
    assert "torch.where(valid, slots, torch.zeros_like(slots))" in catch
    assert "valid = cols.unsqueeze(0) < n.unsqueeze(1)" in catch
    # the host-side count (the catch-up's extend lengths) moves with the device-side one, everywhere
    for name in ("_dsd_defer_draft_extend", "_dsd_catch_up"):
        body = ast.unparse(find_def(cls, name))
        assert "self._dsd_pend_n[rows]" in body and "self._dsd_pend_n_cpu[req.req_pool_idx]" in body, name
    assert "self._dsd_pend_n_cpu[req.req_pool_idx] = 0" in ast.unparse(fbg)


def test_own_skip_gaps_sees_what_a_release_lacks():
    """The check above can fail: 0.5.12's skipped step on 0.5.11 (what a clean merge would give) reads
    bonus_tokens and the result's stride, which 0.5.11 lacks; planted keywords and names are seen."""
    cls = find_class(patched_tree("0.5.12", V2), "EAGLEWorkerV2")
    gaps = own_skip_gaps("0.5.11", cls, ast.parse(wheels.pristine_bytes("0.5.11", V2)))
    assert "EagleDraftInput.bonus_tokens" in gaps and "EagleDraftInput.num_correct_drafts" in gaps
    assert "the skipped step's tokens are not at the worker's stride" in gaps
    assert "module name CudaGraphRunner" in gaps and "module name log_info_on_rank0" in gaps
    src = ast.unparse(cls).replace("draft_token_num=1, device=", "draft_token_num=1, stride=1, device=")
    src = src.replace("retrieve_cum_len=None,", "retrive_cum_len=None,").replace("fast_topk(", "fast_topkX(")
    src = src.replace("catch_up.seq_lens_sum = ", "catch_up.seq_lens_total = ")
    planted = own_skip_gaps("0.5.12", find_class(ast.parse(src), "EAGLEWorkerV2"), patched_tree("0.5.12", V2))
    assert planted == ["EagleVerifyInput(retrive_cum_len=)", "EagleVerifyInput needs retrieve_cum_len=",
                       "assign_extend_cache_locs_func(stride=)", "ModelWorkerBatch.seq_lens_total",
                       "module name fast_topkX"], planted


def test_own_skip_is_one_file_on_0_5_12_and_post1_and_carried_to_0_5_11():
    """0.5.12.post1's eagle_worker_v2.py (and what its skipped step reads: eagle_info(_v2), the graph
    runner, the scheduler's result processing) is byte-identical to 0.5.12's, so is the patch; 0.5.11's
    patch adds the same methods, differing only where the release does."""
    for rel in (V2, "srt/speculative/eagle_info.py", "srt/speculative/eagle_info_v2.py",
                "srt/model_executor/cuda_graph_runner.py", "srt/managers/scheduler_output_processor_mixin.py"):
        assert wheels.pristine_bytes("0.5.12", rel) == wheels.pristine_bytes("0.5.12.post1", rel), rel
    pb = playbook()
    patch = {v: next(f for f in pb.files_for(v) if f.path == V2).patch_text for v in V2_OWN_SKIP_RELEASES}
    assert patch["0.5.12"] == patch["0.5.12.post1"]
    mine = {v: {n.name for n in find_class(patched_tree(v, V2), "EAGLEWorkerV2").body
                if isinstance(n, ast.FunctionDef) and n.name.startswith("_dsd")} for v in V2_OWN_SKIP_RELEASES}
    assert mine["0.5.11"] == mine["0.5.12"] and len(mine["0.5.12"]) == 8
    for name in ("_dsd_prepare_decode", "_dsd_catch_up_before_draft", "_dsd_note_switch", "_dsd_skip_state",
                 "_dsd_init_decode_graphs"):
        same = {ast.dump(find_def(find_class(patched_tree(v, V2), "EAGLEWorkerV2"), name)) for v in V2_OWN_SKIP_RELEASES}
        assert len(same) == 1, name


# ---------------------------------------------------------------- server_args


def server_args_tree(version: str) -> ast.Module:
    return patched_tree(version, SERVER_ARGS)


def field_file(version: str) -> str:
    """Where the flag's field and argparse type live: server_args.py, or (0.5.20+) the spec namespace."""
    return SPEC_FIELDS if _order(version) >= _order("0.5.20") else SERVER_ARGS


def threshold_type(version: str):
    return load_function(patched_tree(version, field_file(version)), "speculative_disable_batch_threshold_type",
                         {"argparse": argparse})


def field_node(version: str) -> ast.AnnAssign:
    cls = find_class(patched_tree(version, field_file(version)),
                     "Spec" if field_file(version) == SPEC_FIELDS else "ServerArgs")
    hits = [n for n in cls.body if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == FIELD]
    assert len(hits) == 1
    return hits[0]


def declares_flags_from_fields(version: str) -> bool:
    return _order(version) >= _order("0.5.14")


@cache
def load_arg_utils(version: str):
    """SGLang's own dataclass-to-argparse helper (stdlib only through 0.5.19), from the pristine wheel."""
    path = wheels.package_dir(version) / "srt" / "arg_groups" / "arg_utils.py"
    spec = importlib.util.spec_from_file_location(f"_sglang_arg_utils_{version.replace('.', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def arg_utils_release(version: str) -> str:
    """0.5.20+ build Arg on msgspec, which is not installed here: their fields go through 0.5.19's helper,
    after checking that the release's own helper derives argparse's type from Arg.type_parser the same way."""
    if _order(version) <= _order("0.5.19"):
        return version
    own = (wheels.package_dir(version) / "srt" / "arg_groups" / "arg_utils.py").read_text()
    assert own.count("type_func = arg_meta.type_parser or _infer_type_func(") == 2
    return "0.5.19"


def build_parser(version: str) -> argparse.ArgumentParser:
    """A parser holding exactly the patched registration of the flag, run as written in the file."""
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    type_fn = threshold_type(version)
    node = field_node(version)
    if declares_flags_from_fields(version):
        au = load_arg_utils(arg_utils_release(version))
        ns = {"A": au.A, "Arg": au.Arg, "NS": getattr(au, "NS", None), "Optional": Optional,
              "dataclasses": dataclasses, "speculative_disable_batch_threshold_type": type_fn}
        src = f"@dataclasses.dataclass\nclass Mini:\n    {ast.unparse(node)}\n"
        exec(compile(src, f"<{version} ServerArgs field>", "exec", dont_inherit=True), ns)
        au.add_cli_args_from_dataclass(parser, ns["Mini"])
        return parser
    add_cli = find_def(find_class(server_args_tree(version), "ServerArgs"), "add_cli_args")
    regs = [c for c in calls(add_cli, "add_argument") if c.args and isinstance(c.args[0], ast.Constant)
            and c.args[0].value == FLAG]
    assert len(regs) == 1
    ns = {"parser": parser, "speculative_disable_batch_threshold_type": type_fn,
          "ServerArgs": types.SimpleNamespace(**{FIELD: ast.literal_eval(node.value)})}
    exec(compile(ast.Expression(regs[0]), f"<{version} add_cli_args>", "eval"), ns)
    return parser


@pytest.mark.parametrize("version", VERSIONS)
def test_server_args_field_defaults_to_off(version):
    node = field_node(version)
    assert ast.literal_eval(node.value) is None
    ann = ast.unparse(node.annotation)
    assert ann.startswith("A[Optional[int], Arg(" if declares_flags_from_fields(version) else "Optional[int]")
    if version == "0.5.19":  # that release files every field under a namespace
        assert ann.endswith("NS('spec')]")
    # a field (so it is in the server_args=... startup dump), declared once
    assert patched(version, field_file(version)).count(f"    {FIELD}:".encode()) == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_parser_accepts_and_rejects(version, capsys):
    parser = build_parser(version)
    assert getattr(parser.parse_args([FLAG, "8"]), FIELD) == 8
    assert getattr(parser.parse_args([f"{FLAG}=1"]), FIELD) == 1
    assert getattr(parser.parse_args([]), FIELD) is None
    for bad in ("0", "-1", "abc", "2.5"):
        with pytest.raises(SystemExit) as e:
            parser.parse_args([f"{FLAG}={bad}"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {FLAG}: must be an integer >= 1" in err, err
        assert repr(bad) in err


def fake_args(version: str, **over):
    base = dict(speculative_disable_batch_threshold=16, speculative_algorithm="EAGLE3",
                enable_dp_attention=False, disable_overlap_schedule=True, enable_multi_layer_eagle=False,
                speculative_eagle_topk=1, speculative_adaptive=False, enable_two_batch_overlap=False,
                enable_pdmux=False, pp_size=1)
    if version in V2_RELEASES:
        base["disable_overlap_schedule"] = False  # the overlap path is supported there
    base.update(over)
    return types.SimpleNamespace(**base)


class _Algorithm:
    """Stand-in for SpeculativeAlgorithm.from_string(...) (0.5.23): no platform-specific worker."""

    @classmethod
    def from_string(cls, name):
        return cls()

    def get_platform_worker_cls(self):
        return None


@pytest.fixture
def adaptive_module(monkeypatch):
    """Install the release's real `adaptive_unsupported_reason` where the patch imports it. Its view
    helpers are the identity here (the stand-in args are already final values)."""
    def install(version: str) -> None:
        ns = {"resolving_view": lambda a: a, "resolved_view": lambda a: a, "SpeculativeAlgorithm": _Algorithm,
              "attn_dp_enabled_of": lambda a: a.enable_dp_attention}
        fn = load_function(ast.parse(wheels.pristine_bytes(version, "srt/speculative/adaptive_spec_params.py")),
                           "adaptive_unsupported_reason", ns)
        names = ["sglang", "sglang.srt", "sglang.srt.speculative", "sglang.srt.speculative.adaptive_spec_params",
                 "sglang.srt.arg_groups", "sglang.srt.arg_groups.overrides"]
        for name in names:
            mod = types.ModuleType(name)
            mod.__path__ = []
            monkeypatch.setitem(sys.modules, name, mod)
        sys.modules["sglang.srt.speculative.adaptive_spec_params"].adaptive_unsupported_reason = fn
        sys.modules["sglang.srt.arg_groups.overrides"].resolved_view = ns["resolved_view"]  # 0.5.15-0.5.18
    return install


@pytest.mark.parametrize("version", VERSIONS)
def test_server_args_validation(version, adaptive_module):
    if version in V2_RELEASES:
        adaptive_module(version)
    cls = find_class(server_args_tree(version), "ServerArgs")
    check = load_function(cls, "check_speculative_disable_batch_threshold")
    csa = find_def(cls, "check_server_args")
    assert ast.unparse(csa.body[0]) == "self.check_speculative_disable_batch_threshold()"

    check(fake_args(version, speculative_disable_batch_threshold=None, speculative_algorithm="NGRAM"))

    def refused(match: str, **over):
        with pytest.raises(ValueError, match=match):
            check(fake_args(version, **over))

    for bad in (0, -1, True, 2.0):
        refused(r"must be an integer >= 1", speculative_disable_batch_threshold=bad)
    if version in NONE_RELEASES:
        refused("not supported by this SGLang version.*upgrade to 0.5.14")
        refused("not supported by this SGLang version", disable_overlap_schedule=True)
        return
    check(fake_args(version))
    check(fake_args(version, speculative_algorithm="EAGLE"))
    refused("STANDALONE", speculative_algorithm="STANDALONE")
    refused("NGRAM", speculative_algorithm="NGRAM")
    refused("dp_attention|dp-attention|attention DP", enable_dp_attention=True)
    if _order(version) >= _order("0.5.7"):  # multi-layer EAGLE exists from 0.5.7
        refused("multi.layer.eagle", enable_multi_layer_eagle=True)
    if _order(version) >= _order("0.5.11"):  # --speculative-adaptive exists from 0.5.11
        refused("speculative-adaptive", speculative_adaptive=True)
    if version in V2_RELEASES:
        check(fake_args(version, disable_overlap_schedule=True))  # synchronous v2: same worker
        refused("topk", speculative_eagle_topk=4)
        refused("two_batch_overlap", enable_two_batch_overlap=True)
        if _order(version) >= _order("0.5.21"):  # PP + EAGLE allowed by SGLang from 0.5.21
            refused("pipeline parallelism", pp_size=2)
    elif version in V2_OWN_SKIP_RELEASES:  # both workers: EAGLEWorkerV2 (overlap, the default) and EAGLEWorker
        check(fake_args(version, disable_overlap_schedule=False))
        check(fake_args(version, speculative_eagle_topk=4))  # EAGLEWorker handles trees too
        refused("two-batch-overlap.*SGLANG_ENABLE_SPEC_V2=0", disable_overlap_schedule=False,
                enable_two_batch_overlap=True)
        check(fake_args(version, enable_two_batch_overlap=True))  # EAGLEWorker: as on the releases before
    else:
        refused("SGLANG_ENABLE_SPEC_V2", disable_overlap_schedule=False)
        check(fake_args(version, speculative_eagle_topk=4))  # EAGLEWorker handles trees too


def release_fields(version: str) -> set[str]:
    """Every ServerArgs field of the patched release (0.5.20+: of every namespace class it composes)."""
    if field_file(version) == SERVER_ARGS:
        return class_fields(find_class(server_args_tree(version), "ServerArgs"))[0]
    names: set[str] = set()
    for path in (wheels.package_dir(version) / "srt" / "arg_groups" / "fields").glob("*.py"):
        rel = f"srt/arg_groups/fields/{path.name}"
        tree = patched_tree(version, rel) if rel == SPEC_FIELDS else ast.parse(path.read_bytes())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            names |= class_fields(cls)[0]
    return names


@pytest.mark.parametrize("version", VERSIONS)
def test_server_args_check_reads_only_fields_of_the_release(version):
    check = find_def(find_class(server_args_tree(version), "ServerArgs"), "check_speculative_disable_batch_threshold")
    fields = release_fields(version)
    assert FIELD in fields
    assert attributes_of(check, "self") <= fields, sorted(attributes_of(check, "self") - fields)


# ---------------------------------------------------------------- coverage (with fleetctl's routing)


ENV = "SGLANG_ENABLE_SPEC_V2"


@pytest.mark.parametrize("version", VERSIONS)
def test_default_launch_is_covered(version):
    """fleetctl's routing (what explain and deploy use) with the playbook's own launch: covered on the
    worker each release runs by default where that worker supports the feature; otherwise refused with
    the playbook's reason, which says how to get a worker that does."""
    pb = playbook()
    cov = coverage(version, pb.launch.flags, {}, pb)
    if version in NONE_RELEASES:
        assert cov.worker_class == "EAGLEWorkerV2"
        assert cov.refused and "upgrade to 0.5.14" in cov.refused
        return
    if version in V2_OWN_SKIP_RELEASES:
        # EAGLEWorkerV2 is the default there (no SGLANG_ENABLE_SPEC_V2 needed), and EAGLEWorker with =0
        assert cov.worker_class == "EAGLEWorkerV2" and cov.covered and cov.refused is None
        v1 = coverage(version, pb.launch.flags, {ENV: "0"}, pb)
        assert v1.worker_class == "EAGLEWorker" and v1.covered and v1.refused is None
        return
    assert cov.worker_class in SUPPORTED[version]
    assert cov.covered and cov.refused is None
    if version in V1_RELEASES:
        v2 = coverage(version, pb.launch.flags, {ENV: "1"}, pb)
        assert v2.worker_class == "EAGLEWorkerV2" and v2.refused and "does not support" in v2.refused


def test_origin_wrong_file_playbook_is_refused():
    wrong, right = load_playbook(WRONG_FILE), playbook()
    assert sorted(wrong.supported()) == ["0.5.5.post3", "0.5.9"]
    for v in wrong.supported():
        assert sorted(f.path for f in wrong.files_for(v)) == [SERVER_ARGS, V2]
        for f in wrong.files_for(v):
            same = next(g for g in right.files_for(v) if g.path == f.path)
            assert (f.patch_path, f.sha256) == (same.patch_path, same.sha256)
            apply_patch(wheels.pristine_bytes(v, f.path), f.patch_text, name=f.path)
        cov = coverage(v, wrong.launch.flags, dict(wrong.launch.env), wrong)
        assert cov.worker_class == "EAGLEWorker" and cov.covered is False
        assert cov.refused and "eagle_worker.py" in cov.refused


# ---------------------------------------------------------------- opt-in: the real modules on CPU

SGLANG_PYTHON = os.environ.get("FLEETCTL_SGLANG_PYTHON")


def _run_probe(script: str, version: str, tmp_path: Path) -> dict:
    """`script` (tests/data/payload) run by SGLANG_PYTHON on a copy of `version`'s tree with the
    playbook's patches applied; its answer, the last line of its output, as JSON."""
    pkg = tmp_path / "site" / "sglang"
    shutil.copytree(wheels.package_dir(version), pkg, copy_function=shutil.copyfile)
    for pf in playbook().files_for(version):
        (pkg / pf.path).write_bytes(patched(version, pf.path))
    proc = subprocess.run([SGLANG_PYTHON, str(DATA / script), str(pkg.parent), version],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not SGLANG_PYTHON, reason="opt-in: FLEETCTL_SGLANG_PYTHON names an interpreter with "
                    "SGLang's import-time dependencies (torch, transformers, xgrammar); see docs/worker-paths.md")
@pytest.mark.parametrize("version", HAND_WRITTEN)
def test_real_sglang_modules_on_cpu(version, tmp_path):
    """The patched tree's own modules: real argparse parser and dump, real validation, and (v1) one
    skipped decode step through the real verify bookkeeping; see tests/data/payload/cpu_probe.py."""
    out = _run_probe("cpu_probe.py", version, tmp_path)
    assert (out["parsed_8"], out["parsed_default"]) == (8, None)
    assert all(f"argument {FLAG}: must be an integer >= 1" in err for err in out["rejected"].values())
    assert out["repr_has_field"] is True
    checks = out["checks"]
    assert checks["ok"] == "ok" and ">= 1" in checks["zero"]
    assert checks["standalone"].startswith("ValueError") and checks["dp"].startswith("ValueError")
    if version == "0.5.14":
        assert checks["overlap"] == "ok"
        states = out["v2_states"]
        assert states["build_calls"] == [[0, 1, [24, 32]]]
        assert states["regular"] == [3, 4, "t_attn", "t_graph", "d_graph"]
        assert states["pick"] == {"0": False, "1": False, "16": False, "17": True, "64": True}
        return
    assert "SGLANG_ENABLE_SPEC_V2" in checks["overlap"]
    assert out["graph_can_run"] == {"LAST": False, "FULL": True}
    assert out["verify_input"] == {"spec_steps": 0, "topk": 1, "draft_token_num": 1}
    assert out["evicted_swa"] == (0 if version == "0.5.5.post3" else 1)
    assert out["target_forward"] == {
        "mode": "DECODE", "spec_info_none": True, "seq_lens": [11, 21, 31], "seq_lens_sum": 63,
        "input_ids": [7, 8, 9], "out_cache_loc": [500, 501, 502], "capture": "LAST", "is_verify": True}
    after = out["after"]
    assert after["output_ids"] == [[1, 11], [1, 12], [1, 13]]
    assert after["verified_id"] == [11, 12, 13] and after["accept_length_per_req_cpu"] == [0, 0, 0]
    assert after["seq_lens"] == [11, 21, 31] and after["forward_mode"] == "DECODE"
    assert after["draft_input_type"] == "EagleDraftInput" and after["draft_input_accept_length"] == [0, 0, 0]
    assert after["draft_input_hidden_rows"] == 3 and after["logits_rows"] == 3
    assert after["req_to_token_new_slots"] == [500, 501, 502]


@pytest.mark.skipif(not SGLANG_PYTHON, reason="opt-in: FLEETCTL_SGLANG_PYTHON names an interpreter with "
                    "SGLang's import-time dependencies (fleetctl's CPU venv: fleetctl/sandbox/cpu_venv.py)")
@pytest.mark.parametrize("version", V2_OWN_SKIP_RELEASES)
def test_v2_own_skip_on_the_real_module(version, tmp_path):
    """EAGLEWorkerV2 of 0.5.11-0.5.12.post1 imported as SGLang imports it, three skipped steps and one
    drafting step through the real forward_batch_generation / verify / draft-extend preparation with
    the models faked (tests/data/payload/cpu_probe_v2.py): pool rows 2, 0, 3 at lengths 10, 20, 30,
    bonus tokens 7, 8, 9; the target's next token is its input + 1, the draft's guess input + 2, its
    hidden state the token; the window is 2 skipped steps."""
    out = _run_probe("cpu_probe_v2.py", version, tmp_path)
    decode = [e for e in out["init_new"] if e["mode"] == "DECODE"]
    extend = [e for e in out["init_new"] if e["mode"] == "DRAFT_EXTEND_V2"]
    # each skipped step: the target alone, a DECODE batch on the DECODE graphs (prepared by them)
    assert [e["input_ids"] for e in decode] == [[7, 8, 9], [8, 9, 10], [9, 10, 11]]
    assert [e["positions"] for e in decode] == [[10, 20, 30], [11, 21, 31], [12, 22, 32]]
    assert [e["seq_lens"] for e in decode] == [[11, 21, 31], [12, 22, 32], [13, 23, 33]]
    assert decode[0]["out_cache_loc"] == [1000 + 2 * 64 + 10, 1000 + 0 * 64 + 20, 1000 + 3 * 64 + 30]
    assert all(e["capture"] == "FULL" and e["spec_info_none"] and e["runner"] == "target" for e in decode)
    assert [t["graph_runner"] for t in out["target"]] == ["decode-graphs"] * 3
    assert all(t["mode"] == "DECODE" and t["skip_attn_backend_init"] for t in out["target"])
    assert out["attn_init"].count(["decode-graphs", "DECODE"]) == 3
    stride = 4 if version == "0.5.11" else 1  # 0.5.11's scheduler reads the worker's stride
    for i, r in enumerate(out["results"]):
        assert r["accept_lens"] == [1, 1, 1] and r["restored"] == [3, 4, "verify-graphs", False]
        assert [r["next_token_ids"][k * stride] for k in range(3)] == [8 + i, 9 + i, 10 + i]
        assert len(r["next_token_ids"]) == 3 * stride and r["result_stride"] in (None, 1)
        assert r["bonus"] == [8 + i, 9 + i, 10 + i] and r["new_seq_lens"] == [11 + i, 21 + i, 31 + i]
        assert r["window"] == 2
    # the event the scheduler waits for before preparing the next step: recorded once the step's inputs
    # are prepared, before its target forward (the host prepares the next step while the target runs),
    # on the step that catches up after the catch-up's draft forward (it reads the request pool)
    assert [r["verify_done_at"] for r in out["results"]] == [[0, 0], [2, 1], [2, 1]]
    # the future map keeps the last draft input until a catch-up (after the 2nd step) fills it
    r1, r2, r3 = out["results"]
    assert r1["future_topk_index"] == r3["future_topk_index"] == [[5]] * 3
    assert (r1["pend_n"], r1["pend_n_cpu"], r1["since"]) == ([1, 0, 1, 1], [1, 0, 1, 1], 1)
    assert (r2["pend_n"], r2["pend_n_cpu"], r2["since"]) == ([0] * 4, [0] * 4, 0)
    assert r2["future_topk_index"] == [[11], [12], [13]] and r2["future_hidden_first_col"] == [9.0, 10.0, 11.0]
    # the catch-up: two kept positions a request, in order, at their own KV slots, with their target hidden states
    assert extend[0]["input_ids"] == [8, 9, 9, 10, 10, 11] and extend[0]["extend_prefix_lens"] == [10, 20, 30]
    assert extend[0]["extend_seq_lens"] == [2, 2, 2] and extend[0]["hidden_rows"] == 6
    assert extend[0]["out_cache_loc"] == [1138, 1139, 1020, 1021, 1222, 1223]
    assert extend[0]["hidden_first_col"] == [0.0, 100.0, 1.0, 101.0, 2.0, 102.0]
    # the drafting step (2 running: rows 2 and 0) catches up the 3rd step's position first, then drafts
    # from what that catch-up left; row 3 (not running any more) keeps its count until a prefill reuses it
    assert extend[1]["input_ids"] == [10, 11] and extend[1]["extend_prefix_lens"] == [12, 22]
    assert extend[1]["out_cache_loc"] == [1140, 1022] and extend[1]["hidden_first_col"] == [200.0, 201.0]
    assert out["drafted"] == [{"topk_index": [[12], [13]], "hidden_first_col": [10.0, 11.0]}]
    assert (out["pend_n_end"], out["pend_n_cpu_end"], out["since_end"]) == ([0, 0, 0, 1], [0, 0, 0, 1], 0)
    assert [d["mode"] for d in out["draft"]] == ["DRAFT_EXTEND_V2"] * 2


def test_intended_bytes_cache_is_used_and_checked(tmp_path, monkeypatch):
    """The patched + compiled intended bytes are kept in the cache dir: a later run takes them from
    there (no patching, no compile), and a cache entry whose bytes do not match its recorded sha256
    is ignored and rebuilt."""
    from fleetctl.plan import intended

    wheels_dir = wheels.cache_dir()
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path))
    (tmp_path / "wheels").symlink_to(wheels_dir / "wheels")
    (tmp_path / "trees").symlink_to(wheels_dir / "trees")
    pb = load_playbook(PLAYBOOK)
    version = "0.5.9"
    intended._apply.cache_clear()
    first = intended.intended_for(pb, version)
    assert first is not None
    entries = sorted((tmp_path / "intended").glob("*.bytes"))
    assert len(entries) == len(first)

    intended._apply.cache_clear()
    calls = []
    monkeypatch.setattr("fleetctl.patching.engine.apply_patch", lambda *a, **k: calls.append(a))
    again = intended.intended_for(pb, version)
    assert calls == [] and {k: v.data for k, v in again.items()} == {k: v.data for k, v in first.items()}

    entries[0].write_bytes(b"tampered\n")
    intended._apply.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path))
    rebuilt = intended.intended_for(pb, version)
    assert {k: v.data for k, v in rebuilt.items()} == {k: v.data for k, v in first.items()}
    assert b"tampered" not in entries[0].read_bytes()
    intended._apply.cache_clear()


@pytest.mark.parametrize(("version", "rel"), [(v, V1) for v in DECODE_GRAPH_RELEASES]
                         + [(v, V2) for v in V2_OWN_SKIP_RELEASES + V2_RELEASES], ids=lambda x: str(x))
def test_switch_lines_are_rate_limited(version, rel):
    """The shipped _dsd_note_switch (both workers' on 0.5.11-0.5.12.post1, EAGLEWorkerV2's from
    0.5.14), run with a clock the test moves: a line when speculation goes off or on, none while it
    stays, at most one per interval; the state that changed meanwhile is logged at the next step
    after the interval, with the switches it stands for."""
    tree = patched_tree(version, rel)
    cls = find_class(tree, WORKER_CLASS[rel])
    interval = next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                    and ast.unparse(n.targets[0]) == "_DSD_SWITCH_LOG_INTERVAL_S")
    now = [1000.0]
    said: list[str] = []
    ns = {"time": type("T", (), {"monotonic": staticmethod(lambda: now[0])}),
          "logger": type("L", (), {"info": staticmethod(said.append)}),
          "_DSD_SWITCH_LOG_INTERVAL_S": interval}
    note = load_function(ast.Module(body=[find_def(cls, "_dsd_note_switch")], type_ignores=[]), "_dsd_note_switch", ns)
    w = type("W", (), {})()
    w._dsd_threshold, w._dsd_logged_on, w._dsd_logged_at, w._dsd_switches, w._dsd_last_on = 4, True, 0.0, 0, True
    note(w, 3, True)
    assert said == []  # on at start: nothing to say
    note(w, 33, False)
    assert said == ["Dynamic speculation disable: speculation off: 33 running > 4"]
    note(w, 40, False)
    now[0] += 1
    note(w, 2, True)  # a switch inside the interval: not logged yet
    note(w, 9, False)
    note(w, 1, True)
    assert len(said) == 1
    now[0] += interval
    note(w, 1, True)  # the interval is over and the state differs from the last line's
    assert said[-1] == "Dynamic speculation disable: speculation on: 1 running <= 4 (3 switches since the last line)"
    now[0] += interval
    note(w, 2, True)
    assert len(said) == 2  # no switch, no line
    note(w, 5, False)
    assert said[-1] == "Dynamic speculation disable: speculation off: 5 running > 4"
