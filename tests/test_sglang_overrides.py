"""The model-specific ServerArgs overrides that touch speculative decoding (0.5.15+), held to the wheels.

Structure (every release): which registered overrides exist, for which architectures, whether they
touch speculative fields, and the exact errors the modelled ones raise. Behaviour: the release's own
override function is executed (its imports answered by stand-ins, as in test_sglang_rules) ahead of
the release's own speculative handlers, over architectures x flags, and compared with resolve_worker.
"""

from __future__ import annotations

import ast
import copy
import itertools
import types
from typing import Any

import pytest
from test_sglang_rules import VERSIONS, Wheel, _compare, _flags, _params, pkg, strings, tree

from fleetctl.engines import sglang
from fleetctl.engines.sglang import releases as R
from fleetctl.engines.sglang import routing

OVERRIDE_DIRS = ("srt/server_args.py", "srt/arg_groups")
# registered overrides that read speculative_* only to pick the target's attention backend / page size
# on SM100 (the worker class and every field resolve_worker reports are unaffected)
BACKEND_ONLY = {"_qwen3_5_hybrid_overrides", "_qwen4_exp_overrides"}
SPEC_WORDS = ("speculative", "multi_layer", "disable_overlap")


def _registered(version: str) -> list[tuple[str, set[str], ast.FunctionDef]]:
    """(file, registered architectures, function) of every registered model override in the wheel."""
    root = pkg(version)
    files = [root / "srt/server_args.py", *sorted((root / "srt/arg_groups").rglob("*.py"))]
    out = []
    for f in files:
        rel = str(f.relative_to(root))
        for fn in ast.walk(tree(version, rel)):
            if not isinstance(fn, ast.FunctionDef):
                continue
            decos = [d for d in fn.decorator_list if "_register_for" in ast.unparse(d)
                     or "register_model_override" in ast.unparse(d)]
            if decos:
                out.append((rel, {a for d in decos for a in strings(d)}, fn))
    return out


def _touches_spec(fn: ast.FunctionDef) -> bool:
    return any(w in ast.unparse(fn) for w in SPEC_WORDS)


@pytest.mark.parametrize("version", _params())
def test_every_speculative_override_is_in_the_table(version: str) -> None:
    """Each registered override reading speculative fields is either a multi-layer override, a
    backend-only one, or a MODEL_OVERRIDES row active in exactly this release for exactly its archs."""
    active = {o.name: o for o in R.model_overrides(version)}
    seen: set[str] = set()
    for file, archs, fn in _registered(version):
        if not _touches_spec(fn) or fn.name in BACKEND_ONLY:
            continue
        if archs & (set(R.RELEASES[version].multi_layer_archs) | set(R.RELEASES[version].multi_layer_arch_substrings)):
            continue
        rows = [o for o in R.MODEL_OVERRIDES if set(o.archs) & archs and o.stage == "override"]
        assert rows, f"{version}: {file}::{fn.name} ({sorted(archs)}) touches speculative fields, not in the table"
        row = rows[0]
        assert row.name in active, f"{version}: {row.name} override exists here; table says {row.since}..{row.until}"
        assert set(row.archs_in(version)) == archs, (row.name, sorted(archs))
        seen.add(row.name)
    assert seen == {n for n, o in active.items() if o.stage == "override"}, f"{version}: table rows without a speculative override in the wheel: " \
                                f"{sorted(set(active) - seen)}"


@pytest.mark.parametrize("version", _params())
def test_modelled_refusals_are_the_wheels_own_errors(version: str) -> None:
    """An exact override's refusals are every error its function raises, with SGLang's own text."""
    for row in R.model_overrides(version):
        if row.stage == "handler":
            file, _, name = row.where.partition("::")
            fns = [f for f in ast.walk(tree(version, file)) if isinstance(f, ast.FunctionDef) and f.name == name]
            assert fns and row.archs[0] in strings(fns[0]), (version, row.where)
        else:
            fns = [fn for _, archs, fn in _registered(version) if set(row.archs) & archs and _touches_spec(fn)]
        assert fns, row.name
        raised = {f"{ast.unparse(n.exc.func)}: {n.exc.args[0].value}" for fn in fns for n in ast.walk(fn)
                  if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and n.exc.args
                  and isinstance(n.exc.args[0], ast.Constant)}
        if row.exact:
            assert raised == {err for _, err in row.refuses}, (row.name, raised)
            assert not row.not_modelled
        else:
            assert row.not_modelled and {err for _, err in row.refuses} <= raised, (row.name, raised)


# --- behaviour: the release's own override, then its own speculative handlers --------------------

def _override_fn(wheel: Wheel, row: R.ModelOverride) -> Any:
    """The wheel's override function for `row`, runnable on the CPU: its module-level imports are
    answered with the harness's stand-ins (views are the args record; the DP-layout helper is the
    release's own, compiled by Wheel)."""
    version = wheel.version
    base = "srt/arg_groups/model_override_base.py"
    fn = next(fn for _, archs, fn in _registered(version) if set(row.archs) & archs and _touches_spec(fn))
    fn = copy.deepcopy(fn)
    fn.decorator_list = []
    helpers = [copy.deepcopy(f) for f in ast.walk(tree(version, base))
               if isinstance(f, ast.FunctionDef) and f.name == "is_attention_backend_not_set"]
    ns: dict[str, Any] = {"Any": Any, "resolving_view": lambda a: a, "resolved_view": lambda a: a,
                          "attn_dp_enabled_of": wheel.attn_dp_enabled_of}
    exec(compile(ast.Module(body=[*helpers, fn], type_ignores=[]), f"<{version} {row.name}>", "exec"), ns)
    return ns[fn.name]


IQUEST = next(o for o in R.MODEL_OVERRIDES if o.name == "IQuestQ1")
IQUEST_DRAFT = next(o for o in R.MODEL_OVERRIDES if o.name == "IQuestQ1 MTP draft")
IQUEST_VERSIONS = tuple(v for v in VERSIONS if IQUEST.archs_in(v))


def _iquest_cases(version: str) -> list[dict[str, Any]]:
    attn_dp = "attn_dp_size" in {f.dest for f in R.flags_for(version)}
    layouts = [{}, {"dp_size": 2}, {"dp_size": 2, "enable_dp_attention": True},
               *([{"attn_dp_size": 2}] if attn_dp else [])]
    cases = []
    for algo, params, ml, layout, pp, backend, cp, draft in itertools.product(
            ("EAGLE", "NEXTN", "nextn", "EAGLE3", "STANDALONE", None), ((3, 1, 4), (3, 4, 8), (None, None, None)),
            (False, True), layouts, (1, 2), (None, "fa3", "triton"), (1, 2), (None, "/models/iquest-mtp")):
        if draft and (backend or cp > 1 or pp > 1):
            continue
        fields = {"speculative_algorithm": algo, "enable_multi_layer_eagle": ml, "pp_size": pp,
                  "attention_backend": backend, "attn_cp_size": cp, "speculative_draft_model_path": draft,
                  **layout}
        if algo is not None:
            fields.update(zip(("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"),
                              params, strict=True))
        cases.append(fields)
    return cases


@pytest.mark.parametrize("version", _params(IQUEST_VERSIONS))
@pytest.mark.parametrize("arch", IQUEST.archs)
def test_iquest_q1_refusals_match_the_wheel(version: str, arch: str) -> None:
    """The wheel's own `_iquest_q1_overrides`, then (when it lets the launch through) its own handlers,
    against resolve_worker with the IQuestQ1 architecture: same refusal (SGLang's text), same worker."""
    wheel = Wheel(version)
    override = _override_fn(wheel, IQUEST)
    mismatches: list[str] = []
    refused = passed = uncertain = 0
    with wheel.loaded():
        for fields in _iquest_cases(version):
            args = _args(wheel, arch, fields)
            mine = sglang.resolve_worker(version, _flags(fields), {}, model_arch=arch)
            try:
                wheel.dp_layout(args)
                override(args, types.SimpleNamespace(architectures=[arch]))
            except ValueError as exc:
                refused += 1
                if mine.startup_error != f"ValueError: {exc}" or not mine.certain:
                    mismatches.append(f"{fields}: real=ValueError: {exc} mine={mine.startup_error!r}")
                continue
            passed += 1
            if any(mine.startup_error == err for _, err in IQUEST.refuses):
                mismatches.append(f"{fields}: real passes the override, mine={mine.startup_error!r}")
                continue
            if fields.get("attention_backend") or fields.get("attn_cp_size", 1) > 1:
                continue  # (the handlers below do not look at these)
            real = wheel.run({k: v for k, v in fields.items() if k != "attention_backend"}, None, arch)
            if not mine.certain:  # only where the draft checkpoint's own config decides
                uncertain += 1
                if not (IQUEST_DRAFT.applies(version, arch) and fields["speculative_draft_model_path"]
                        and mine.reason.startswith(routing.NOT_CERTAIN_OVERRIDE.format(
                            name=IQUEST_DRAFT.name, version=version))):
                    mismatches.append(f"{fields}: not certain: {mine.reason}")
                continue
            problems = _compare(real, mine)
            if problems:
                mismatches.append(f"{fields}: {'; '.join(problems)}")
    assert refused and passed  # both sides of the override are exercised
    assert bool(uncertain) == IQUEST_DRAFT.applies(version, arch)
    assert not mismatches, f"{len(mismatches)} mismatches, e.g.:\n" + "\n".join(mismatches[:8])


def _args(wheel: Wheel, arch: str, fields: dict[str, Any]) -> Any:
    from test_sglang_rules import _Args
    return _Args(wheel.defaults, arch, **fields)


def test_iquest_q1_examples() -> None:
    eagle = {"--speculative-algorithm": "EAGLE", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1}
    arch = "IQuestQ1ForCausalLM"
    ok = sglang.resolve_worker("0.5.23", eagle, {}, model_arch="IQuestQ1MTP")
    assert ok.certain and ok.startup_error is None and ok.worker_class == "EAGLEWorkerV2"
    no_draft = sglang.resolve_worker("0.5.23", eagle, {}, model_arch=arch)
    assert no_draft.startup_error == "ValueError: IQuest Q1 requires an independent draft model path."
    drafted = sglang.resolve_worker("0.5.23", {**eagle, "--speculative-draft-model-path": "/m/mtp"}, {},
                                    model_arch=arch)
    assert not drafted.certain and drafted.worker_class == "EAGLEWorkerV2"
    assert "IQuestQ1 MTP draft model override" in drafted.reason
    topk = sglang.resolve_worker("0.5.23", {**eagle, "--speculative-eagle-topk": 4}, {}, model_arch="IQuestQ1MTP")
    assert topk.startup_error == "ValueError: IQuestQ1 speculative decoding requires --speculative-eagle-topk 1."
    assert "the IQuestQ1 model override" in topk.reason and "refuses to start" in topk.reason
    pp = sglang.resolve_worker("0.5.21", {**eagle, "--pp-size": 2}, {}, model_arch=arch)
    assert pp.startup_error == "ValueError: IQuest Q1 does not support pipeline parallelism."
    # before 0.5.21 there is no such override: the launch starts
    assert sglang.resolve_worker("0.5.20", {**eagle, "--speculative-eagle-topk": 4}, {},
                                 model_arch=arch).startup_error is None


@pytest.mark.parametrize("name", ["KimiK3", "MiniMaxM3", "Nemotron-H"])
def test_unmodelled_overrides_are_not_certain(name: str) -> None:
    """Where the override's effect depends on what fleetctl does not know, explain says "not certain"
    for that architecture (and only where the override exists), naming the override."""
    row = next(o for o in R.MODEL_OVERRIDES if o.name == name)
    eagle = {"--speculative-algorithm": "EAGLE", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1}
    for version in VERSIONS:
        for arch in row.archs:
            res = sglang.resolve_worker(version, eagle, {}, model_arch=arch)
            if row.applies(version, arch):
                assert not res.certain, (version, arch)
                assert res.reason.startswith(routing.NOT_CERTAIN_OVERRIDE.format(name=name, version=version))
                assert res.worker_class is not None  # the answer, qualified
            elif not R.RELEASES[version].forces_multi_layer(arch):
                assert res.certain, (version, arch)
        # no speculative algorithm: nothing to be uncertain about
        assert sglang.resolve_worker(VERSIONS[-1], {}, {}, model_arch=row.archs[0]).certain


def test_blind_answer_is_not_certain_where_overrides_exist() -> None:
    """Without the model's architectures, any speculative launch on a release with a refusing or
    unmodelled override is "not certain"; before 0.5.17 EAGLE3 stays certain."""
    eagle3 = {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1}
    for version in VERSIONS:
        res = sglang.resolve_worker(version, eagle3, {})
        assert res.certain == (not R.model_overrides(version)), version
        if not res.certain:
            assert res.reason.startswith(routing.NOT_CERTAIN)
    assert R.model_overrides("0.5.16") == () and R.model_overrides("0.5.17")


# --- the unmodelled overrides: their effect depends on what the table does not know -----------------

PLATFORMS = {  # the GPU generation (which fleetctl's table does not know)
    "hopper": dict(is_sm100=False, device_sm=90, is_blackwell=False, is_sm90=True, device_capability=(9, 0)),
    "blackwell": dict(is_sm100=True, device_sm=100, is_blackwell=True, is_sm90=False, device_capability=(10, 0)),
}
CHECKPOINTS = {"plain": None, "nvfp4": {"quant_method": "minimax_m3_nvfp4"}}  # the checkpoint's quantization


def _module_fns(wheel: Wheel, row: R.ModelOverride, platform: dict[str, Any], envs: Any) -> dict[str, Any]:
    """The override's whole module (0.5.19+: one file per model) with its imports answered by stand-ins."""
    version = wheel.version
    fn_file = next(f for f, archs, _ in _registered(version) if set(row.archs) & archs)
    base = tree(version, "srt/arg_groups/model_override_base.py")
    mod = copy.deepcopy(tree(version, fn_file))
    mod.body = [n for n in mod.body if not isinstance(n, ast.ImportFrom | ast.Import)]
    for fn in ast.walk(mod):
        if isinstance(fn, ast.FunctionDef):
            fn.decorator_list = []
    helpers = [copy.deepcopy(f) for f in base.body if isinstance(f, ast.FunctionDef) and f.name in (
        "is_attention_backend_not_set", "_dspark_verify_on_decode_backend", "_is_mxfp4_pack_quantized")]
    helpers += [copy.deepcopy(f) for f in tree(version, "srt/utils/common.py").body
                if isinstance(f, ast.FunctionDef) and f.name == "get_quantization_config"]
    plat = types.SimpleNamespace(is_hip=False, is_npu=False, is_cuda=True, **platform)
    ns: dict[str, Any] = {
        "Any": Any, "Dict": dict, "logging": __import__("logging"), "inspect": __import__("inspect"),
        "resolving_view": lambda a: a, "resolved_view": lambda a: a, "get_platform": lambda: plat, "envs": envs,
        "attention_backends_of": lambda cfg: (cfg.prefill_attention_backend or cfg.attention_backend,
                                              cfg.decode_attention_backend or cfg.attention_backend),
        "model_config_of": lambda a: types.SimpleNamespace(quantization=None, hf_config=a.get_hf_config(),
                                                           hf_text_config=a.get_hf_config()),
    }
    code = compile(ast.Module(body=[*helpers, *mod.body], type_ignores=[]), f"<{version} {fn_file}>", "exec")
    exec(code, ns)
    return ns


UNMODELLED = [o for o in R.MODEL_OVERRIDES if not o.exact and o.stage == "override"]
_NEW_LAYOUT = tuple(v for v in VERSIONS if (R.KNOWN_VERSIONS.index(v) >= R.KNOWN_VERSIONS.index("0.5.19")))


@pytest.mark.parametrize("version", _params(_NEW_LAYOUT))
@pytest.mark.parametrize("row", UNMODELLED, ids=lambda o: o.name)
def test_unmodelled_override_depends_on_what_the_table_does_not_know(row: R.ModelOverride, version: str) -> None:
    """Run the release's own override for its architectures over GPU generations and checkpoint
    quantizations: for some speculative launch its speculative outcome (fields it sets, or a refusal)
    differs, which is why explain says "not certain" there rather than one confident answer."""
    archs = row.archs_in(version)
    if not archs:
        pytest.skip(f"{row.name} does not touch speculative fields in {version}")
    wheel = Wheel(version)
    differing: list[str] = []
    with wheel.loaded():
        import importlib
        envs = importlib.import_module("sglang.srt.environ").envs
        name = next(f.name for _, a, f in _registered(version) if set(row.archs) & a and _touches_spec(f))
        fns = {p: _module_fns(wheel, row, platform, envs)[name] for p, platform in PLATFORMS.items()}
        for arch, algo, topk, dcp in itertools.product(archs, ("EAGLE", "DSPARK"), (1, 4), (1, 2)):
            outcomes = set()
            for pname, (_, quant) in itertools.product(PLATFORMS, CHECKPOINTS.items()):
                fn = fns[pname]
                args = _args(wheel, arch, {"speculative_algorithm": algo, "speculative_eagle_topk": topk,
                                           "dcp_size": dcp, "moe_runner_backend": "auto", "attention_backend": None})
                hf = types.SimpleNamespace(architectures=[arch], quantization_config=quant, mlp_hidden_act="relu2")
                args.get_hf_config = lambda hf=hf: hf
                try:
                    got = fn(args, hf)
                    out = tuple(sorted((k, str(v)) for k, v in got.items() if "speculative" in k or "attention" in k))
                except Exception as exc:  # a refusal, or a kernel/package requirement
                    out = (type(exc).__name__, str(exc)[:80])
                outcomes.add(out)
            # differing in a speculative field or a refusal (not only the target's attention backend)
            if len(outcomes) > 1 and any("speculative" in str(o) or "Error" in str(o) for o in outcomes):
                differing.append(f"{arch} {algo} topk={topk} dcp={dcp}: {sorted(map(str, outcomes))}")
    assert differing, f"{row.name} on {version}: the outcome never depends on GPU/checkpoint: model it exactly"
