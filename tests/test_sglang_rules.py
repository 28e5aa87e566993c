"""fleetctl.engines.sglang's rules table held to the real SGLang wheels.

Two kinds of checks, for every release fleetctl knows:
  * structure, by AST over the wheel's sources: worker files/classes, the worker factory's branches,
    the env var's default and readers, flags and defaults, message texts, auto params, model overrides;
  * behaviour: the wheel's own ServerArgs handlers, env parser and worker factory are executed (the
    rest of SGLang stubbed out) over a scenario matrix and compared with `resolve_worker`.

Wheels come from the local cache (fleetctl.engines.wheels); a release not cached yet is downloaded from
PyPI on first use, and its tests carry the `needs_download` mark.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import json
import logging
import os
import re
import sys
import types
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fleetctl.engines import sglang, wheels
from fleetctl.engines.sglang import releases as R

DATA = Path(__file__).parent / "data" / "sglang"
VERSIONS = R.KNOWN_VERSIONS


def _cached(version: str) -> bool:
    return (wheels.cache_dir() / "trees" / version / ".complete").exists() or any(
        (wheels.cache_dir() / "wheels").glob(f"sglang-{version}-*.whl"))


def _params(versions: tuple[str, ...] = VERSIONS) -> list[Any]:
    return [pytest.param(v, id=v, marks=() if _cached(v) else pytest.mark.needs_download) for v in versions]


def _vkey(v: str) -> tuple[int, ...]:
    main, _, post = v.partition(".post")
    return (*map(int, main.split(".")), int(post or 0))


@cache
def pkg(version: str) -> Path:
    return wheels.package_dir(version)


@cache
def tree(version: str, rel: str) -> ast.Module:
    return ast.parse((pkg(version) / rel).read_text())


def functions(module: ast.Module, name: str) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == name]


def function(version: str, rel: str, name: str) -> ast.FunctionDef:
    found = functions(tree(version, rel), name)
    assert found, f"{version}: no {name}() in {rel}"
    return found[0]


def strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def server_args_class(version: str) -> ast.ClassDef:
    mod = tree(version, "srt/server_args.py")
    return next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")


def field_statements(version: str) -> list[ast.stmt]:
    """The ServerArgs field declarations: the class body, and from 0.5.20 the namespace classes in
    srt/arg_groups/fields/*.py that ServerArgs composes."""
    body = list(server_args_class(version).body)
    fields_dir = pkg(version) / "srt" / "arg_groups" / "fields"
    if fields_dir.is_dir():
        for f in sorted(fields_dir.glob("*.py")):
            mod = tree(version, str(f.relative_to(pkg(version))))
            body += [s for c in mod.body if isinstance(c, ast.ClassDef) for s in c.body]
    return body


def field_defaults(version: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stmt in field_statements(version):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            try:
                out[stmt.target.id] = ast.literal_eval(stmt.value) if stmt.value is not None else None
            except ValueError:
                out[stmt.target.id] = _const_expr(stmt.value)
    return out


def _const_expr(node: ast.expr | None) -> Any:
    try:
        return eval(compile(ast.Expression(node), "<default>", "eval"), {})  # e.g. 10 * 1000 * 1000
    except Exception:
        return None


# --- the release list ------------------------------------------------------------------------

def test_known_versions_are_every_pypi_release_in_range() -> None:
    published = [v.strip() for v in (DATA / "pypi_versions.txt").read_text().split() if v.strip()]
    lo, hi = _vkey("0.5.4.post3"), _vkey("0.5.23")
    in_range = sorted((v for v in published if lo <= _vkey(v) <= hi), key=_vkey)
    assert list(VERSIONS) == in_range
    assert sorted(VERSIONS, key=_vkey) == list(VERSIONS)


def test_unknown_versions_are_refused() -> None:
    for v in ("0.5.4.post2", "0.5.24", "0.5.23.post1", "0.6.0", "latest", ""):
        assert not sglang.is_known(v)
        res = sglang.resolve_worker(v, {"--speculative-algorithm": "EAGLE3"}, {})
        assert not res.known and res.worker_class is None and res.disable_overlap_schedule is None
        assert "unknown version" in res.reason
        with pytest.raises(KeyError):
            sglang.worker_files(v)


# --- worker files and the factory ------------------------------------------------------------

SPEC_WORKER_FILES = ("eagle_worker.py", "eagle_worker_v2.py", "multi_layer_eagle_worker.py",
                     "multi_layer_eagle_worker_v2.py", "standalone_worker.py", "standalone_worker_v2.py")


@pytest.mark.parametrize("version", _params())
def test_worker_files_match_wheel(version: str) -> None:
    table = sglang.worker_files(version)
    present = {f"{R.SPEC_DIR}/{f}" for f in SPEC_WORKER_FILES if (pkg(version) / R.SPEC_DIR / f).exists()}
    assert set(table.values()) == present
    for cls, rel in table.items():
        classes = {n.name for n in tree(version, rel).body if isinstance(n, ast.ClassDef)}
        assert cls in classes, f"{version}: {cls} not defined in {rel}"
    routed = {c for pair in R.RELEASES[version].rules.routes.values() for c in pair}
    assert routed <= set(table), "a route names a worker the wheel does not ship"


def _imports_by_condition(func: ast.FunctionDef) -> list[tuple[tuple[str, ...], str, str]]:
    """(conditions, module, name) for each `from m import X` in func; conditions are the source of
    the enclosing if-tests, prefixed "not " for else branches and for code after an if that returns."""
    out: list[tuple[tuple[str, ...], str, str]] = []

    def visit(body: list[ast.stmt], conds: tuple[str, ...]) -> None:
        conds = tuple(conds)
        for stmt in body:
            if isinstance(stmt, ast.ImportFrom):
                out.extend((conds, stmt.module or "", a.name) for a in stmt.names)
            elif isinstance(stmt, ast.If):
                test = ast.unparse(stmt.test)
                visit(stmt.body, (*conds, test))
                visit(stmt.orelse, (*conds, f"not {test}"))
                if stmt.body and isinstance(stmt.body[-1], (ast.Return, ast.Raise)) and not stmt.orelse:
                    conds = (*conds, f"not {test}")
            elif isinstance(stmt, (ast.With, ast.For, ast.Try)):
                visit(stmt.body, conds)

    visit(func.body, ())
    return out


def _family_of(conds: tuple[str, ...]) -> tuple[str | None, bool | None]:
    """Worker family and overlap polarity an import is guarded by (None: not constrained)."""
    family, overlap = None, None
    for c in conds:
        neg = c.startswith("not ")
        text = c[4:] if neg else c
        if "enable_multi_layer_eagle" in text and not neg:
            family = R.MULTI_LAYER
        elif "is_eagle()" in text and not neg and family is None:
            family = R.EAGLE
        elif "is_standalone()" in text and not neg:
            family = R.STANDALONE
        if text.strip() in ("enable_overlap", "self.enable_overlap"):
            overlap = not neg
    return family, overlap


def _routes_from_wheel(version: str) -> dict[str, tuple[str, str]]:
    rel = R.RELEASES[version]
    spec_info = tree(version, "srt/speculative/spec_info.py")
    found: dict[tuple[str, bool], str] = {}

    def record(family: str, overlap: bool | None, module: str, name: str) -> None:
        assert module == "sglang." + rel.worker_files[name].removesuffix(".py").replace("/", "."), (module, name)
        for o in ((True, False) if overlap is None else (overlap,)):
            assert found.setdefault((family, o), name) == name
    if rel.rules.decider.endswith("create_worker"):
        for conds, module, name in _imports_by_condition(functions(spec_info, "create_worker")[0]):
            family, overlap = _family_of(conds)
            if family is not None:
                record(family, overlap, module, name)
    else:
        # pre-0.5.8: a registry of factories; the scheduler passes enable_overlap to EAGLE-family ones
        factories = {}
        for call in ast.walk(spec_info):
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "register_speculative_algorithm":
                algo = call.args[0].value
                kw = {k.arg: k.value for k in call.keywords}
                factories[algo] = ast.unparse(kw["worker_cls"])
                if algo == "EAGLE":
                    assert "NEXTN" in strings(kw["aliases"])
        assert factories["EAGLE"] == factories["EAGLE3"] == "_create_eagle_worker"
        for fam, factory in ((R.EAGLE, factories["EAGLE"]), (R.STANDALONE, factories["STANDALONE"])):
            for conds, module, name in _imports_by_condition(functions(spec_info, factory)[0]):
                record(fam, _family_of(conds)[1], module, name)
        if R.MULTI_LAYER in rel.rules.routes:  # 0.5.7: the scheduler picks multi-layer workers itself
            sched = tree(version, "srt/managers/scheduler.py")
            for func in ast.walk(sched):
                if isinstance(func, ast.FunctionDef) and "MultiLayerEagleWorker" in ast.unparse(func):
                    for conds, module, name in _imports_by_condition(func):
                        if name.startswith("MultiLayerEagleWorker"):
                            assert any("enable_multi_layer_eagle" in c for c in conds)
                            assert not any("is_eagle" in c or "spec_algorithm" in c for c in conds), \
                                "0.5.7's multi-layer branch became algorithm-specific"
                            record(R.MULTI_LAYER, _family_of(conds)[1], module, name)
    return {fam: (found[(fam, True)], found[(fam, False)]) for fam in {f for f, _ in found}}


@pytest.mark.parametrize("version", _params())
def test_worker_routes_match_factory(version: str) -> None:
    assert _routes_from_wheel(version) == dict(R.RELEASES[version].rules.routes)


@pytest.mark.parametrize("version", _params())
def test_scheduler_derives_overlap_from_disable_overlap_schedule(version: str) -> None:
    sched = tree(version, "srt/managers/scheduler.py")
    assigns = [ast.unparse(n.value) for n in ast.walk(sched)
               if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "self.enable_overlap"]
    # from 0.5.19 the scheduler reads the resolved `schedule` config bag, not server_args
    assert any(a.startswith(("not server_args.disable_overlap_schedule", "not get_schedule().disable_overlap_schedule"))
               for a in assigns), assigns
    src = ast.unparse(sched)
    if R.RELEASES[version].rules.decider.endswith("create_worker"):  # 0.5.17/0.5.18 pass draft_server_args
        assert "create_worker(self.server_args)" in src or "create_worker(draft_server_args)" in src
    else:
        assert "create_draft_worker(" in src


# --- the env var -----------------------------------------------------------------------------

def _env_default(version: str) -> tuple[bool, Any]:
    for node in ast.walk(tree(version, "srt/environ.py")):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == R.SPEC_V2_ENV:
            assert isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "EnvBool"
            return True, ast.literal_eval(node.value.args[0])
    return False, None


@pytest.mark.parametrize("version", _params())
def test_spec_v2_env_default_and_readers(version: str) -> None:
    rules = R.RELEASES[version].rules
    exists, default = _env_default(version)
    assert exists == (rules.spec_v2_default is not None)
    if exists:
        assert default is rules.spec_v2_default
        bool_parse = function(version, "srt/environ.py", "parse")
        assert any(set(R.ENV_TRUE) <= strings(f) and set(R.ENV_FALSE) <= strings(f)
                   for f in functions(tree(version, "srt/environ.py"), "parse")), bool_parse
    handler_file, handler = rules.handler.split("::")
    func = function(version, handler_file, handler.split(".")[-1])
    reads_env = f"envs.{R.SPEC_V2_ENV}.get()" in ast.unparse(func)
    assert reads_env == (rules.policy != "v2_only")
    if rules.policy == "v2_only":  # gone: read only to warn about its removal (0.5.14-0.5.20), then not at all
        top = function(version, handler_file, "handle_speculative_decoding")
        assert (f"os.getenv('{R.SPEC_V2_ENV}')" in ast.unparse(top)) == ("env_removed" in rules.messages)
        assert (R.SPEC_V2_ENV in "".join(strings(tree(version, handler_file)))) == ("env_removed" in rules.messages)


@pytest.mark.parametrize("version", _params())
def test_overlap_messages_are_sglangs(version: str) -> None:
    rules = R.RELEASES[version].rules
    handler_file, handler = rules.handler.split("::")
    texts = strings(tree(version, handler_file))
    for key, msg in rules.messages.items():
        pattern = msg.replace("{reason}", "%s")
        assert pattern in texts, f"{version}: {key} message not in {handler_file}: {msg!r}"
    common = strings(function(version, handler_file, handler.split(".")[-1]))
    assert R.MAX_RUNNING_WARNING in common
    assert R.DRAFT_TOKENS_WARNING in strings(tree(version, handler_file))
    assert R.PP_WARNING in strings(pp_handler(version))


def pp_handler(version: str) -> ast.FunctionDef:
    """Where pp_size > 1 turns the overlap schedule off: a ServerArgs method, from 0.5.15 a post-process pass."""
    moved = "srt/arg_groups/overrides.py"
    if (pkg(version) / moved).exists() and functions(tree(version, moved), "_pipeline_parallel_overlap_disable"):
        return function(version, moved, "_pipeline_parallel_overlap_disable")
    return function(version, "srt/server_args.py", "_handle_pipeline_parallelism")


def _v2_branch_algorithms(version: str) -> tuple[str, ...] | None:
    func = function(version, "srt/server_args.py", "_handle_speculative_decoding")
    for node in ast.walk(func):
        if isinstance(node, ast.BoolOp) and f"envs.{R.SPEC_V2_ENV}.get()" in ast.unparse(node):
            for cmp in node.values:
                if isinstance(cmp, ast.Compare) and ast.unparse(cmp.left) == "self.speculative_algorithm":
                    right = cmp.comparators[0]
                    return tuple(sorted(strings(right)))
    return None


@pytest.mark.parametrize("version", _params())
def test_v2_branch_algorithms(version: str) -> None:
    rules = R.RELEASES[version].rules
    if rules.policy in ("env_gates_v1", "env_forces_v2"):
        assert _v2_branch_algorithms(version) == tuple(sorted(rules.v2_algorithms))


# --- flags -----------------------------------------------------------------------------------

def parser_options(version: str) -> dict[str, tuple[str, Any, bool]]:
    """option string -> (ServerArgs field, default, is store_true), read off add_cli_args."""
    defaults = field_defaults(version)
    out: dict[str, tuple[str, Any, bool]] = {}
    renames = {}
    for node in ast.walk(function(version, "srt/server_args.py", "from_cli_args")):
        if isinstance(node, ast.Assign):
            tgt, val = ast.unparse(node.targets[0]), ast.unparse(node.value)
            if tgt.startswith("args.") and val.startswith("args."):
                renames[val[5:]] = tgt[5:]
    for stmt in field_statements(version):  # 0.5.14+: options derived from Annotated fields
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        ann = stmt.annotation
        if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")):
            continue
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        meta = None
        for e in elts[1:]:
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                meta = {}
            elif isinstance(e, ast.Call) and ast.unparse(e.func) == "Arg":
                meta = {k.arg: k.value for k in e.keywords}
        if meta is None or ("no_cli" in meta and ast.literal_eval(meta["no_cli"])):
            continue
        name = stmt.target.id
        cli = ast.literal_eval(meta["cli_name"]) if "cli_name" in meta else "--" + name.replace("_", "-")
        names = [cli, *(ast.literal_eval(meta["aliases"]) if "aliases" in meta else [])]
        # (a BooleanOptionalAction flag also gets a --no-X spelling, which the table does not track)
        is_bool = ast.unparse(elts[0]) in ("bool", "Optional[bool]") and (
            "action" not in meta or ast.unparse(meta["action"]) == "argparse.BooleanOptionalAction")
        for n in names:
            out[n] = (name, defaults.get(name), is_bool)
    for node in ast.walk(tree(version, "srt/server_args.py")):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not names or not names[0].startswith("--"):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        dest = ast.literal_eval(kw["dest"]) if "dest" in kw else names[0][2:].replace("-", "_")
        dest = renames.get(dest, dest)
        if "default" in kw:
            d = kw["default"]
            if isinstance(d, ast.Attribute) and ast.unparse(d.value) == "ServerArgs":
                default = defaults.get(d.attr)
            else:
                default = _const_expr(d)
        else:
            default = defaults.get(dest)
        is_bool = "action" in kw and ast.unparse(kw["action"]) in ("'store_true'", '"store_true"',
                                                                   "DeprecatedStoreTrueAction")
        for n in names:
            out[n] = (dest, default, is_bool)
    return out


@pytest.mark.parametrize("version", _params())
def test_flags_table_matches_parser(version: str) -> None:
    options = parser_options(version)
    table = R.flags_for(version)
    tracked = {o for f in R.FLAGS for o in f.options}
    for flag in table:
        for option in flag.options:
            assert option in options, f"{version}: parser has no {option}"
            dest, default, is_bool = options[option]
            assert dest == flag.dest, (option, dest)
            assert is_bool == (flag.type == "bool"), option
            if not is_bool and flag.dest not in ("model_path",):
                assert default == flag.default, (option, default, flag.default)
    accepted = {o for f in table for o in f.options}
    for option in tracked - accepted:
        assert option not in options or options[option][0] not in {f.dest for f in R.FLAGS if option in f.options}, \
            f"{version}: {option} exists but the table says it does not"
    spec_options = {o for o in options if o.startswith("--speculative")}
    assert spec_options <= accepted, f"{version}: untracked speculative flags {sorted(spec_options - accepted)}"


def all_options(version: str) -> set[str]:
    """Every option string the release's parser registers (read off its sources): parser_options, the
    --no-X spelling of BooleanOptionalAction flags, and argparse's own --help."""
    out = set(parser_options(version)) | {"--help"}
    for f in field_statements(version):
        if isinstance(f, ast.AnnAssign) and "BooleanOptionalAction" in ast.unparse(f.annotation):
            out.add("--no-" + f.target.id.replace("_", "-"))
    for node in ast.walk(tree(version, "srt/server_args.py")):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument") \
                and "BooleanOptionalAction" in ast.unparse(node):
            out |= {"--no-" + a.value[2:] for a in node.args if isinstance(a, ast.Constant)
                    and isinstance(a.value, str) and a.value.startswith("--")}
    return out


@pytest.mark.parametrize("version", _params())
def test_cli_options_match_parser(version: str) -> None:
    """The release's full option list (fleetctl/engines/sglang/cli_options.json, stored as changes from the
    previous release) is what its parser registers: it decides unknown flags and ambiguous prefixes."""
    real = all_options(version)
    mine = set(R.cli_options(version))
    if real != mine:
        i = VERSIONS.index(version)
        prev = all_options(VERSIONS[i - 1]) if i else set()
        entry = {"added": sorted(real - prev), "removed": sorted(prev - real)}
        pytest.fail(f"{version}: cli_options.json entry should be {json.dumps(entry)}; "
                    f"missing {sorted(real - mine)[:10]}, extra {sorted(mine - real)[:10]}")


def _abbreviation(options: dict[str, Any], prefix: str) -> str | tuple[str, ...]:
    if prefix in options:
        return prefix
    matches = sorted(o for o in options if o.startswith(prefix))
    return matches[0] if len(matches) == 1 else tuple(matches)


@pytest.mark.parametrize("version", _params())
def test_abbreviations_match_parser(version: str) -> None:
    options = parser_options(version)
    for prefix, expected in R.RELEASES[version].abbreviations.items():
        got = _abbreviation(options, prefix)
        if isinstance(expected, tuple):
            assert isinstance(got, tuple) and set(got) == set(expected), (prefix, got)
        else:
            assert got == expected, (prefix, got)
    assert "allow_abbrev" not in ast.unparse(function(version, "srt/server_args.py", "prepare_server_args"))


@pytest.mark.parametrize("version", _params())
def test_algorithm_names(version: str) -> None:
    rel = R.RELEASES[version]
    algo_call = next((n for n in ast.walk(tree(version, "srt/server_args.py"))
                      if isinstance(n, ast.Call) and "--speculative-algorithm" in strings(n)
                      and ast.unparse(n.func).endswith("add_argument")), None)
    if algo_call is None:  # 0.5.14+: derived from the annotated field
        field = next(s for s in field_statements(version) if isinstance(s, ast.AnnAssign)
                     and ast.unparse(s.target) == "speculative_algorithm")
        assert "Literal" not in ast.unparse(field.annotation)
        algo_call = next((n for n in ast.walk(field.annotation) if isinstance(n, ast.Call)), None)
    choices = next((k.value for k in algo_call.keywords if k.arg == "choices"), None) if algo_call else None
    if rel.algorithm_choices:
        assert choices is not None and tuple(ast.literal_eval(choices)) == rel.algorithms
    else:
        assert choices is None
        spec_info = tree(version, "srt/speculative/spec_info.py")
        enum = next(n for n in spec_info.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
        members = {t.id for s in enum.body if isinstance(s, ast.Assign) for t in s.targets
                   if isinstance(t, ast.Name)} - {"NONE"}
        assert members | {"NEXTN"} == set(rel.algorithms)
        assert "NEXTN" in strings(function(version, _alias_file(version), "_resolve_speculative_algorithm_alias"))


def _alias_file(version: str) -> str:
    hook = "srt/arg_groups/speculative_hook.py"
    return hook if (pkg(version) / hook).exists() else "srt/server_args.py"


@pytest.mark.parametrize("version", _params())
def test_adaptive_flag_and_rules(version: str) -> None:
    rel = R.RELEASES[version]
    res = sglang.resolve_worker(version, {"--speculative-algorithm": "EAGLE3"}, {})
    has_flag = "--speculative-adaptive" in parser_options(version)
    assert res.adaptive_available == has_flag == (rel.adaptive is not None)
    if rel.adaptive is None:
        return
    params = tree(version, "srt/speculative/adaptive_spec_params.py")
    texts = "\n".join(strings(functions(params, "adaptive_unsupported_reason")[0]))
    for key, reason in rel.adaptive.reasons.items():
        chunks = re.split(r"\{[^}]*\}", reason.replace("{worker}", rel.adaptive.multi_layer_class))
        present = all(chunk in texts for chunk in chunks if chunk)
        assert present == (key != "overlap" or rel.adaptive.requires_overlap_off), (key, reason)
    default_cfg = next((n.value for n in ast.walk(params) if isinstance(n, (ast.Assign, ast.AnnAssign))
                        and ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target)
                        == "DEFAULT_ADAPTIVE_CONFIG"), None)
    if default_cfg is not None:
        cfg = ast.literal_eval(default_cfg)
        union = sorted({s for slot in cfg.values() for s in slot["candidate_steps"]})
    else:
        union = sorted(ast.literal_eval(next(n for n in ast.walk(params) if isinstance(n, ast.Call)
                                             and ast.unparse(n).startswith("cfg.get('candidate_steps'")).args[1]))
    assert tuple(union) == rel.adaptive.default_candidates
    hook = "srt/arg_groups/speculative_hook.py"
    if rel.adaptive.initializes_params:
        assert functions(tree(version, hook), "_init_adaptive_speculative_params")
    assert bool(functions(params, "validate_adaptive_initial_steps")) == rel.adaptive.validates_initial_steps \
        or rel.adaptive.initializes_params


# --- auto params and model overrides -----------------------------------------------------------

def _auto_from_wheel(version: str) -> tuple[tuple[int, ...], dict[str, tuple[int, ...]], tuple[int, ...]]:
    hook = "srt/arg_groups/speculative_hook.py"
    found = functions(tree(version, hook), "_auto_choose_speculative_params") if (pkg(version) / hook).exists() else []
    func = found[0] if found else function(version, "srt/server_args.py", "auto_choose_speculative_params")
    by_arch: dict[str, tuple[int, ...]] = {}
    default = standalone = None

    def walk(stmts: list[ast.stmt]) -> None:
        nonlocal default, standalone
        for s in stmts:
            if isinstance(s, ast.If):
                ret = next((b for b in s.body if isinstance(b, ast.Return)), None)
                value = tuple(ast.literal_eval(ret.value)) if ret else None
                if "STANDALONE" in strings(s.test):
                    standalone = value
                else:
                    for arch in strings(s.test):
                        by_arch.setdefault(arch, value)
                walk(s.orelse)
            elif isinstance(s, ast.Return):
                default = tuple(ast.literal_eval(s.value))
    walk(func.body)
    if default is None:  # the final `else: return ...`
        last = [s for s in func.body if isinstance(s, ast.If)][-1]
        while last.orelse and isinstance(last.orelse[0], ast.If):
            last = last.orelse[0]
        default = tuple(ast.literal_eval(last.orelse[-1].value))
    return default, by_arch, standalone


@pytest.mark.parametrize("version", _params())
def test_auto_params_match_wheel(version: str) -> None:
    auto = R.RELEASES[version].auto
    default, by_arch, standalone = _auto_from_wheel(version)
    assert default == auto.default and standalone == auto.standalone
    for arch, params in by_arch.items():
        assert auto.by_arch.get(arch, auto.default) == params, (arch, params)
    for arch, params in auto.by_arch.items():
        assert by_arch.get(arch, default) == params, arch


def _multi_layer_overrides(version: str) -> tuple[set[str], bool, set[str]]:
    mod = tree(version, "srt/server_args.py")
    consts = {t.id: strings(n.value) for n in mod.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name)}
    parents = {c: p for p in ast.walk(mod) for c in ast.iter_child_nodes(p)}
    archs: set[str] = set()
    substrings: set[str] = set()  # `"X" in model_arch`: any architecture containing X
    forces = False
    for node in ast.walk(mod):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "self.enable_multi_layer_eagle" \
                and isinstance(node.value, ast.Constant) and node.value.value is True:
            cur, conds = node, []
            while cur in parents:
                up = parents[cur]
                if isinstance(up, ast.If) and cur in up.body:
                    if "model_arch" in ast.unparse(up.test):
                        archs |= strings(up.test)
                        substrings |= {c.left.value for c in ast.walk(up.test) if isinstance(c, ast.Compare)
                                       and isinstance(c.left, ast.Constant) and isinstance(c.ops[0], ast.In)
                                       and ast.unparse(c.comparators[0]) == "model_arch"}
                        archs |= {s for n in ast.walk(up.test) if isinstance(n, ast.Name) for s in consts.get(n.id, ())}
                        forces = forces or f"{R.SPEC_V2_ENV}.set(True)" in ast.unparse(up)
                        break
                    conds.append(ast.unparse(up.test))
                cur = up
            assert conds == ["self.speculative_algorithm == 'EAGLE'"], conds
    return archs, forces, substrings


def _multi_layer_override_passes(version: str) -> tuple[set[str], set[str]]:
    """0.5.15+: model overrides are registered passes (`@_register_for(*archs)` or a predicate over the
    architecture) returning {"enable_multi_layer_eagle": True} when the algorithm is "EAGLE"."""
    files = [pkg(version) / "srt/arg_groups/overrides.py",
             *sorted((pkg(version) / "srt/arg_groups/model_overrides").glob("*.py"))]
    archs: set[str] = set()
    substrings: set[str] = set()
    for f in files:
        if not f.exists():
            continue
        for func in ast.walk(tree(version, str(f.relative_to(pkg(version))))):
            if not isinstance(func, ast.FunctionDef):
                continue
            src = ast.unparse(func)
            if not re.search(r"""(\['enable_multi_layer_eagle'\] = True|'enable_multi_layer_eagle': True)""", src):
                continue
            ifs = [n for n in ast.walk(func) if isinstance(n, ast.If) and "enable_multi_layer_eagle" in ast.unparse(n)
                   and "speculative_algorithm" in ast.unparse(n.test)]
            assert ifs and all(ast.unparse(n.test).endswith("speculative_algorithm == 'EAGLE'") for n in ifs), src
            decos = [d for d in func.decorator_list if "register" in ast.unparse(d)]
            assert decos, f"{version}: {func.name} is not a registered model override"
            archs |= {a for d in decos for a in strings(d)}
            # register_model_override_predicate(lambda arch: "X" in arch or ...): substring matches
            substrings |= {c.left.value for d in decos if "predicate" in ast.unparse(d.func if isinstance(d, ast.Call)
                                                                                     else d)
                           for c in ast.walk(d) if isinstance(c, ast.Compare) and isinstance(c.left, ast.Constant)
                           and isinstance(c.ops[0], ast.In)}
    return archs, substrings


@pytest.mark.parametrize("version", _params())
def test_multi_layer_model_overrides(version: str) -> None:
    rel = R.RELEASES[version]
    archs, forces, substrings = _multi_layer_overrides(version)
    pass_archs, pass_substrings = _multi_layer_override_passes(version)
    archs |= pass_archs
    substrings |= pass_substrings
    assert archs == set(rel.multi_layer_archs)
    assert substrings == set(rel.multi_layer_arch_substrings)
    for arch in rel.multi_layer_archs:  # a longer name containing it matches only where tested as a substring
        assert rel.forces_multi_layer("Tiny" + arch) == (arch in substrings)
    assert forces == rel.multi_layer_arch_forces_env
    if forces:
        assert R.MULTI_LAYER_FORCES_ENV_WARNING in strings(tree(version, "srt/server_args.py"))


# --- behaviour: run the wheel's own handlers and factory ----------------------------------------

class _Stub(types.ModuleType):
    """A module whose every attribute is a fresh class named after it (and remembers the module)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__module__": self.__name__, "__init__": lambda self, *a, **k: None})
        setattr(self, name, value)
        return value


class _Importer(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    STUB_ROOTS = ("sglang", "torch", "triton", "sgl_kernel", "transformers", "numpy")

    def __init__(self, pkg_dir: Path, real: tuple[str, ...], inject: dict[str, dict[str, Any]]) -> None:
        self.pkg_dir, self.real, self.inject = pkg_dir, real, inject

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in self.real:
            file = self.pkg_dir.parent / (fullname.replace(".", "/") + ".py")
            return importlib.util.spec_from_file_location(fullname, file)
        if fullname.split(".")[0] in self.STUB_ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        mod = _Stub(spec.name)
        mod.__path__ = []
        mod.__dict__.update(self.inject.get(spec.name, {}))
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class _Args:
    """A stand-in ServerArgs: the release's field defaults, scenario overrides, a fake model config."""

    def __init__(self, defaults: dict[str, Any], arch: str, **overrides: Any) -> None:
        self.__dict__.update(defaults)
        self.__dict__.update(device="cuda", page_size=1, attention_backend=None, enable_mixed_chunk=False)
        self.__dict__.update(overrides)
        self._arch = arch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def get_model_config(self) -> Any:
        return types.SimpleNamespace(hf_config=self.get_hf_config())

    def get_hf_config(self) -> Any:
        return types.SimpleNamespace(architectures=[self._arch])


def _declare(args: Any, source: str, **fields: Any) -> None:
    for k, v in fields.items():
        setattr(args, k, v)


def _run_pass(args: Any, fn: Any) -> None:
    declared = fn(args)
    if isinstance(declared, dict):  # (a pass this harness stubs out returns a stub object: no effect)
        _declare(args, fn.__name__, **declared)


# 0.5.15+ route ServerArgs changes through a resolution layer (declarations stashed on the record,
# read back through a "resolved view"). Stand-ins with the same effect for one record, applied at once:
# declare_resolution sets the fields, views are the record itself.
def _direct_writes(args: Any, source: str, fn: Any) -> None:
    fn(args)  # the real one records the writes fn makes to the record; here they land on it directly


_SAME = {"resolved_view": lambda args: args, "resolving_view": lambda args: args,
         "model_config_of": lambda args: args.get_model_config()}
RESOLUTION_STAND_INS: dict[str, dict[str, Any]] = {
    "sglang.srt.arg_groups.overrides": {
        **_SAME, "declare_resolution": _declare, "run_post_process_pass": _run_pass,
        "declare_late_resolution": _declare, "declare_direct_writes": _direct_writes,
        "record_foreign_defaults": lambda args, source, resolve: resolve(args),
        "attention_backends_of": lambda cfg: (cfg.prefill_attention_backend or cfg.attention_backend,
                                              cfg.decode_attention_backend or cfg.attention_backend)},
    "sglang.srt.arg_groups.model_override_base": dict(_SAME),
    "sglang.srt.runtime_context": {"attn_dp_enabled_of": lambda cfg: bool(cfg.enable_dp_attention),
                                   "get_platform": lambda: types.SimpleNamespace(is_npu=False, is_hip=False)},
    # an in-tree CUDA platform (not an out-of-tree plugin)
    "sglang.srt.platforms": {"current_platform": types.SimpleNamespace(is_out_of_tree=lambda: False)},
}


class Wheel:
    """The parts of one release that decide the speculative worker, runnable without GPUs."""

    REAL = ("sglang.srt.environ", "sglang.srt.speculative.spec_info", "sglang.srt.speculative.spec_registry",
            "sglang.srt.speculative.adaptive_spec_params", "sglang.srt.arg_groups.speculative_hook")

    def __init__(self, version: str) -> None:
        self.version = version
        self.rel = R.RELEASES[version]
        self.defaults = field_defaults(version)
        self.capture = _Capture()
        self.attn_dp_enabled_of, self.dp_layout = self._compile_dp_layout()
        self.ns = self._compile_server_args()

    def _compile_server_args(self) -> dict[str, Any]:
        mod = tree(self.version, "srt/server_args.py")
        wanted = {"_handle_pipeline_parallelism", "_handle_speculative_decoding", "auto_choose_speculative_params",
                  "_resolve_speculative_algorithm_alias"}
        defs = [n for n in ast.walk(mod) if isinstance(n, ast.FunctionDef) and n.name in wanted]
        consts = [n for n in mod.body if isinstance(n, ast.Assign) and isinstance(n.value, (ast.Tuple, ast.List))
                  and all(isinstance(e, ast.Constant) for e in n.value.elts)]
        code = compile(ast.Module(body=[*consts, *defs], type_ignores=[]), f"<{self.version} server_args>", "exec")
        ns: dict[str, Any] = {"logger": logging.getLogger("sglang.srt.server_args"), "os": os, "json": json,
                              "logging": logging}
        exec(code, ns)
        ns["_check_pp"] = self._compile_pp_check()
        handler = pp_handler(self.version)
        if handler.name == "_pipeline_parallel_overlap_disable":  # 0.5.15+: a post-process pass
            handler.decorator_list = []
            exec(compile(ast.Module(body=[handler], type_ignores=[]), f"<{self.version} overrides>", "exec"), ns)
            ns["_handle_pipeline_parallelism"] = lambda args: _run_pass(args, ns["_pipeline_parallel_overlap_disable"])
        return ns

    def _compile_dp_layout(self) -> tuple[Any, Any]:
        """0.5.22+: the release's own `attn_dp_enabled_of` (runtime_context.py) and
        `handle_deprecated_dp_attention` (parallel_hook.py, `--dp-size N --enable-dp-attention` ->
        attn_dp_size=N, dp_size=1), run before any handler; before: the enable_dp_attention flag."""
        rc, hook = "srt/runtime_context.py", "srt/arg_groups/parallel_hook.py"
        if not (pkg(self.version) / hook).exists() or not functions(tree(self.version, hook),
                                                                    "handle_deprecated_dp_attention"):
            return (lambda cfg: bool(cfg.enable_dp_attention)), (lambda args: None)
        defs = [copy.deepcopy(function(self.version, rc, "attn_dp_enabled_of")),
                copy.deepcopy(function(self.version, hook, "handle_deprecated_dp_attention"))]
        for d in defs:  # function-local imports: answered by the namespace
            d.body = [st for st in d.body if not isinstance(st, ast.ImportFrom)]
        ns: dict[str, Any] = {**_SAME, "declare_resolution": _declare, "ep_scale_joiner_of": lambda cfg: False}
        exec(compile(ast.Module(body=defs, type_ignores=[]), f"<{self.version} dp layout>", "exec"), ns)
        return ns["attn_dp_enabled_of"], ns["handle_deprecated_dp_attention"]

    def _compile_pp_check(self) -> Any:
        """The release's own `if pp_size > 1:` block of check_server_args, as a function of the args."""
        hook = "srt/arg_groups/validation_hook.py"
        where = hook if (pkg(self.version) / hook).exists() and functions(tree(self.version, hook),
                                                                            "check_server_args") \
            else "srt/server_args.py"
        check = function(self.version, where, "check_server_args")
        block = next(n for n in ast.walk(check) if isinstance(n, ast.If)
                     and ast.unparse(n.test) in ("self.pp_size > 1", "cfg.pp_size > 1"))
        helpers = [f for f in functions(tree(self.version, where), "check_pipeline_parallel_compat")]
        fn = ast.FunctionDef(name="_check_pp", args=ast.arguments(
            posonlyargs=[], args=[ast.arg("self"), ast.arg("cfg")], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=[block], decorator_list=[], returns=None, type_params=[])
        mod = ast.fix_missing_locations(ast.Module(body=[*helpers, fn], type_ignores=[]))
        ns: dict[str, Any] = {"get_platform": lambda: types.SimpleNamespace(is_npu=False),
                              "attn_dp_enabled_of": self.attn_dp_enabled_of}
        exec(compile(mod, f"<{self.version} check_server_args>", "exec"), ns)
        self.pp_ns = ns
        return lambda args: ns["_check_pp"](args, args)

    @contextlib.contextmanager
    def loaded(self) -> Iterator[None]:
        before = set(sys.modules)
        importer = _Importer(pkg(self.version), self.REAL, {
            "sglang.srt.server_args": {"auto_choose_speculative_params": self.ns.get("auto_choose_speculative_params")},
            **RESOLUTION_STAND_INS,
            "sglang.srt.runtime_context": {**RESOLUTION_STAND_INS["sglang.srt.runtime_context"],
                                           "attn_dp_enabled_of": self.attn_dp_enabled_of}})
        sys.meta_path.insert(0, importer)
        log = logging.getLogger("sglang")
        log.addHandler(self.capture)
        old_level, log.level = log.level, logging.DEBUG
        try:
            self.ns["envs"] = self.pp_ns["envs"] = importlib.import_module("sglang.srt.environ").envs
            self.spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
            self.hook = (importlib.import_module("sglang.srt.arg_groups.speculative_hook")
                         if self.rel.rules.handler.startswith("srt/arg_groups") else None)
            yield
        finally:
            log.removeHandler(self.capture)
            log.level = old_level
            sys.meta_path.remove(importer)
            for name in set(sys.modules) - before:
                del sys.modules[name]

    def run(self, fields: dict[str, Any], env: str | None, arch: str) -> dict[str, Any]:
        args = _Args(self.defaults, arch, **fields)
        self.capture.lines = []
        lines = self.capture.lines
        saved = os.environ.pop(R.SPEC_V2_ENV, None)
        if env is not None:
            os.environ[R.SPEC_V2_ENV] = env
        error = worker = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = lambda msg, *a, **k: lines.append(str(msg))
                self.dp_layout(args)  # 0.5.22+: resolves the deprecated DP-attention spelling first
                self.ns["_handle_pipeline_parallelism"](args)
                if self.hook is not None:
                    self.hook.handle_speculative_decoding(args)
                else:
                    self.ns["_handle_speculative_decoding"](args)
                self.ns["_check_pp"](args)
                worker = self._worker(args)
        except (ValueError, AssertionError, TypeError, NameError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            os.environ.pop(R.SPEC_V2_ENV, None)
            if saved is not None:
                os.environ[R.SPEC_V2_ENV] = saved
        return {"error": error, "worker": worker, "warnings": list(dict.fromkeys(lines)), "args": args}

    def _worker(self, args: _Args) -> tuple[str, str] | None:
        if args.speculative_algorithm is None:
            return None
        algo = self.spec_info.SpeculativeAlgorithm.from_string(args.speculative_algorithm)
        if self.rel.rules.decider.endswith("create_worker"):
            cls = algo.create_worker(args)
        else:  # the scheduler passes enable_overlap only to EAGLE-family factories
            kwargs = {"enable_overlap": not args.disable_overlap_schedule} if algo.is_eagle() else {}
            cls = type(algo.create_draft_worker(**kwargs))
        if cls.__name__.startswith("MultiLayerEagleWorker"):
            self._import_worker_module(cls.__module__)
        return cls.__module__, cls.__name__

    @cache  # noqa: B019 (one Wheel per test)
    def _import_worker_module(self, module: str) -> None:
        """Execute the worker's own module (its imports stubbed), as the scheduler's import would:
        an annotation naming a TYPE_CHECKING-only class raises NameError here on CPython <= 3.13."""
        file = pkg(self.version).parent / (module.replace(".", "/") + ".py")
        spec = importlib.util.spec_from_file_location(module + "_as_imported", file)
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


PARAMS = {  # (num_steps, topk, num_draft_tokens)
    "auto": (None, None, None), "topk1": (3, 1, 4), "topk1-tokens8": (3, 1, 8), "topk4": (3, 4, 8),
    "steps-only": (3, None, None), "topk-only": (None, 1, None),
}


def _scenarios(rel: R.Release) -> Iterator[tuple[dict[str, Any], str | None, str]]:
    has_multi = R.MULTI_LAYER in rel.rules.routes and rel.rules.decider.endswith("create_worker")
    algos = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
    envs = (None, "1", "0", "True", "nO", "bogus")
    for algo, env, params, dos, pp in itertools.product(algos, envs, PARAMS, (False, True), (1, 2)):
        yield _fields(algo, params, disable_overlap_schedule=dos, pp_size=pp), env, "LlamaForCausalLM"
    for algo, env, params in itertools.product(algos, (None, "1", "0"), ("auto", "topk1")):
        yield _fields(algo, params), env, "Qwen2ForCausalLM"
    for algo, env, dos, ml in itertools.product(algos, (None, "1", "0"), (False, True), (False, True)):
        if has_multi or not ml:
            yield _fields(algo, "topk1", disable_overlap_schedule=dos, enable_multi_layer_eagle=ml), env, "Qwen2ForCausalLM"
    for algo, env in itertools.product(algos, (None, "1")):
        yield _fields(algo, "topk1", enable_dp_attention=True, max_running_requests=16), env, "Qwen2ForCausalLM"
    # DP layouts: replicas, attention DP the old way, and (0.5.22+) --attn-dp-size, which resolves them
    attn_dp = "attn_dp_size" in {f.dest for f in R.flags_for(rel.version)}
    layouts = [{"dp_size": 2}, {"dp_size": 2, "enable_dp_attention": True},
               *([{"attn_dp_size": 2}, {"attn_dp_size": 2, "enable_dp_attention": True}] if attn_dp else [])]
    for algo, layout, adaptive in itertools.product(algos, layouts, (False, True) if rel.adaptive else (False,)):
        yield _fields(algo, "topk1", tp_size=4, speculative_adaptive=adaptive, **layout), None, "Qwen2ForCausalLM"
    if rel.adaptive is not None:
        for algo, env, params, dos, arch in itertools.product(
                ("EAGLE3", "STANDALONE"), (None, "0"), ("auto", "topk1", "topk4", "steps-only", "topk-only"),
                (False, True), ("LlamaForCausalLM", "Qwen2ForCausalLM")):
            yield _fields(algo, params, disable_overlap_schedule=dos, speculative_adaptive=True), env, arch
        yield _fields("EAGLE", (5, 1, 6), speculative_adaptive=True), None, "Qwen2ForCausalLM"
        yield _fields("EAGLE", "topk1", speculative_adaptive=True, enable_dp_attention=True), None, "Qwen2ForCausalLM"
        if has_multi:
            yield _fields("EAGLE", "topk1", speculative_adaptive=True, enable_multi_layer_eagle=True), None, "X"
    yield {"speculative_algorithm": None}, "1", "LlamaForCausalLM"
    yield {"speculative_algorithm": None, "pp_size": 2}, None, "LlamaForCausalLM"


def _fields(algo: str, params: str | tuple, **extra: Any) -> dict[str, Any]:
    steps, topk, tokens = PARAMS[params] if isinstance(params, str) else params
    return {"speculative_algorithm": algo, "speculative_num_steps": steps, "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": tokens, **extra}


def _flags(fields: dict[str, Any]) -> dict[str, Any]:
    return {"--" + k.replace("_", "-"): v for k, v in fields.items() if v is not None and v is not False}


@pytest.mark.parametrize("version", _params())
def test_resolve_worker_agrees_with_the_real_handlers(version: str) -> None:
    wheel = Wheel(version)
    mismatches: list[str] = []
    with wheel.loaded():
        for fields, env, arch in _scenarios(wheel.rel):
            real = wheel.run(fields, env, arch)
            mine = sglang.resolve_worker(version, _flags(fields), {} if env is None else {R.SPEC_V2_ENV: env},
                                         model_arch=arch)
            problems = _compare(real, mine)
            if problems:
                mismatches.append(f"{fields} env={env!r} arch={arch}: {'; '.join(problems)}")
    assert not mismatches, f"{len(mismatches)} mismatches, e.g.:\n" + "\n".join(mismatches[:8])


def _compare(real: dict[str, Any], mine: sglang.Resolution) -> list[str]:
    out = []
    if (real["error"] is None) != (mine.startup_error is None):
        return [f"error real={real['error']!r} mine={mine.startup_error!r}"]
    if real["error"] is not None:
        kind = real["error"].split(":")[0]
        if not mine.startup_error.startswith(kind):
            out.append(f"error kind real={real['error']!r} mine={mine.startup_error!r}")
        elif kind == "ValueError" and real["error"] != mine.startup_error:
            out.append(f"error text real={real['error']!r} mine={mine.startup_error!r}")
        return out
    args = real["args"]
    if real["worker"] is not None and mine.algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
        module, cls = real["worker"]
        file = module.removeprefix("sglang.").replace(".", "/") + ".py"
        if (cls, file) != (mine.worker_class, mine.worker_file):
            out.append(f"worker real={cls} mine={mine.worker_class}")
    keys = ("disable_overlap_schedule", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "max_running_requests", "enable_multi_layer_eagle",
            "speculative_adaptive")
    for key in keys:
        if key in mine.resolved_args and getattr(args, key) != mine.resolved_args[key]:
            out.append(f"{key} real={getattr(args, key)!r} mine={mine.resolved_args[key]!r}")
    if real["warnings"] != list(mine.warnings):
        out.append(f"warnings real={real['warnings']} mine={list(mine.warnings)}")
    return out


# --- the harness table of the facts brief (§2c) and the origin story ---------------------------

def _facts_cases() -> list[dict[str, Any]]:
    return json.loads((DATA / "facts_2c_cases.json").read_text())


@pytest.mark.parametrize("case", _facts_cases(), ids=lambda c: f"{c['version']}-{c['scenario']}")
def test_facts_harness_table(case: dict[str, Any]) -> None:
    res = sglang.resolve_worker(case["version"], case["flags"], case["env"], model_arch=case.get("model_arch"))
    assert res.known
    if case["worker"] is None:
        assert res.startup_error and case["error"] in res.startup_error
        return
    assert res.startup_error is None
    assert (res.worker_class, res.disable_overlap_schedule) == (case["worker"], case["disable_overlap_schedule"])
    for text in case["warnings"]:
        assert any(text in w for w in res.warnings), (text, res.warnings)
    for text in case.get("absent_warnings", []):
        assert not any(text in w for w in res.warnings), (text, res.warnings)
    for key, value in case.get("resolved", {}).items():
        assert res.resolved_args[key] == value, key


def test_origin_story() -> None:
    """0.5.9, EAGLE3, env unset: the non-overlap path, so the patch belongs in eagle_worker.py."""
    res = sglang.resolve_worker("0.5.9", {"--speculative-algorithm": "EAGLE3",
                                          "--speculative-draft-model-path": "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B",
                                          "--speculative-num-steps": 3, "--speculative-eagle-topk": 4,
                                          "--speculative-num-draft-tokens": 16, "--tp": 2}, {})
    assert res.disable_overlap_schedule is True
    assert (res.worker_class, res.worker_file) == ("EAGLEWorker", "srt/speculative/eagle_worker.py")
    assert res.reason == ("0.5.9 with SGLANG_ENABLE_SPEC_V2 unset -> disable_overlap_schedule=True -> "
                          "EAGLEWorker in srt/speculative/eagle_worker.py")
    assert res.resolved_args["tp_size"] == 2 and res.spec_v2_env == "unset"
    patched = sglang.resolve_worker("0.5.9", {"--speculative-algorithm": "EAGLE3", "--speculative-eagle-topk": 1,
                                              "--speculative-num-steps": 3},
                                    {R.SPEC_V2_ENV: "True"})
    assert patched.worker_class == "EAGLEWorkerV2" and patched.disable_overlap_schedule is False



def test_the_engines_memo_keys_every_input() -> None:
    """engine().resolve_worker answers each distinct launch once per command (most hosts share one):
    the same answer for equal inputs, and never another input's answer (env, flags, version, model)."""
    from fleetctl.engines import engine

    flags = {"--speculative-algorithm": "EAGLE3", "--speculative-eagle-topk": 1, "--speculative-num-steps": 3}
    unset = engine().resolve_worker("0.5.9", dict(flags), {})
    assert engine().resolve_worker("0.5.9", dict(flags), {}) is unset
    assert unset == sglang.resolve_worker("0.5.9", flags, {})
    assert unset.worker_class == "EAGLEWorker"
    v2 = engine().resolve_worker("0.5.9", dict(flags), {R.SPEC_V2_ENV: "True"})
    assert v2.worker_class == "EAGLEWorkerV2" and v2 == sglang.resolve_worker("0.5.9", flags, {R.SPEC_V2_ENV: "True"})
    off = engine().resolve_worker("0.5.9", {**flags, "--speculative-algorithm": None}, {})
    assert off.worker_class is None and off == sglang.resolve_worker("0.5.9", {**flags, "--speculative-algorithm": None}, {})
    other = engine().resolve_worker("0.5.14", dict(flags), {})
    assert other.version == "0.5.14" and other == sglang.resolve_worker("0.5.14", flags, {})
    for arch in ("LlamaForCausalLM", None):
        assert engine().resolve_worker("0.5.9", dict(flags), {}, model_arch=arch) == \
            sglang.resolve_worker("0.5.9", flags, {}, model_arch=arch)

# --- flag spelling -------------------------------------------------------------------------------

def test_flag_spellings_and_aliases() -> None:
    base = {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": "3", "--speculative-eagle-topk": "1"}
    a = sglang.resolve_worker("0.5.12", {**base, "--tp": 4, "--dp": "2", "--ep": 2,
                                         "--speculative-draft-model": "d"}, {})
    b = sglang.resolve_worker("0.5.12", {"speculative_algorithm": "EAGLE3", "speculative-num-steps": 3,
                                         "speculative_eagle_topk": 1, "tp_size": 4, "--data-parallel-size": 2,
                                         "--expert-parallel-size": 2, "--speculative-draft-model-path": "d"}, {})
    assert a.resolved_args == b.resolved_args
    assert a.resolved_args["tp_size"] == 4 and a.resolved_args["speculative_draft_model_path"] == "d"
    assert sglang.resolve_worker("0.5.12", {**base, "--pp": 2}, {}).startup_error.startswith("ambiguous option: --pp")
    assert sglang.resolve_worker("0.5.12", {**base, "--pp-size": 2}, {}).disable_overlap_schedule is True
    too_new = sglang.resolve_worker("0.5.10", {**base, "--speculative-adaptive": True}, {})
    assert too_new.startup_error == "unrecognized arguments: --speculative-adaptive"
    lower = sglang.resolve_worker("0.5.9", {**base, "--speculative-algorithm": "eagle3"}, {})
    assert "invalid choice: 'eagle3'" in lower.startup_error
    assert sglang.resolve_worker("0.5.12", {**base, "--speculative-algorithm": "eagle3"}, {}).algorithm == "EAGLE3"
    assert sglang.resolve_worker("0.5.9", {**base, "--speculative-algorithm": "NEXTN"}, {}).algorithm == "EAGLE"
    patched = sglang.resolve_worker("0.5.9", {**base, "--speculative-disable-batch-threshold": 16}, {})
    assert patched.unknown_flags == ("--speculative-disable-batch-threshold",)
    assert patched.resolved_args["speculative_disable_batch_threshold"] == 16
    assert patched.worker_class == "EAGLEWorker"


def test_model_override_turns_on_multi_layer() -> None:
    eagle = {"--speculative-algorithm": "EAGLE", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1}
    old = sglang.resolve_worker("0.5.9", eagle, {}, model_arch="MiMoV2FlashForCausalLM")
    assert (old.worker_class, old.disable_overlap_schedule) == ("MultiLayerEagleWorkerV2", False)
    assert old.warnings[0] == R.MULTI_LAYER_FORCES_ENV_WARNING
    assert old.resolved_args["enable_multi_layer_eagle"] is True
    nextn = sglang.resolve_worker("0.5.9", {**eagle, "--speculative-algorithm": "NEXTN"}, {},
                                  model_arch="MiMoV2FlashForCausalLM")
    assert nextn.worker_class == "EAGLEWorker"  # the override compares the raw string to "EAGLE"
    new = sglang.resolve_worker("0.5.12", eagle, {R.SPEC_V2_ENV: "0"}, model_arch="MiMoV2ForCausalLM")
    # the route is MultiLayerEagleWorker, whose module fails at import on 0.5.9-0.5.12 (CPython <= 3.13)
    assert (new.worker_class, new.disable_overlap_schedule) == (None, True)
    assert new.startup_error.startswith("NameError: name 'ModelRunner' is not defined")
    assert "refuses to start" in new.reason
    on = sglang.resolve_worker("0.5.12", eagle, {}, model_arch="MiMoV2ForCausalLM")
    assert on.worker_class == "MultiLayerEagleWorkerV2" and on.startup_error is None
    flag = {**eagle, "--enable-multi-layer-eagle": True, "--disable-overlap-schedule": True}
    assert sglang.resolve_worker("0.5.8", flag, {}).worker_class == "MultiLayerEagleWorker"  # imports fine
    assert sglang.resolve_worker("0.5.9", flag, {}).startup_error.startswith("NameError")
    assert sglang.resolve_worker("0.5.13", flag, {}).worker_class == "MultiLayerEagleWorkerV2"  # synchronous v2
    assert sglang.resolve_worker("0.5.8", eagle, {}, model_arch="Step3p5ForCausalLM").worker_class == "EAGLEWorker"


def test_resolution_edges() -> None:
    none = sglang.resolve_worker("0.5.10", {"--pp-size": 2}, {R.SPEC_V2_ENV: "1"})
    assert none.algorithm is None and none.worker_class is None and none.disable_overlap_schedule is True
    assert none.warnings == (R.PP_WARNING,)
    ngram = sglang.resolve_worker("0.5.10", {"--speculative-algorithm": "NGRAM"}, {})
    assert ngram.known and ngram.worker_class is None and "not an EAGLE-family" in ngram.reason
    bogus = sglang.resolve_worker("0.5.4.post3", {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3,
                                                  "--speculative-eagle-topk": 1}, {R.SPEC_V2_ENV: "Maybe"})
    assert bogus.spec_v2_env == "set to 'Maybe' (invalid -> default off)"
    assert bogus.warnings[1] == 'Invalid value for SGLANG_ENABLE_SPEC_V2: "maybe" is not a valid boolean value, ' \
        'using default "False"'
    adaptive = sglang.resolve_worker("0.5.14", {"--speculative-algorithm": "EAGLE3", "--speculative-adaptive": True},
                                     {})
    assert [adaptive.resolved_args[k] for k in ("speculative_num_steps", "speculative_eagle_topk",
                                                "speculative_num_draft_tokens")] == [3, 1, 4]
    assert adaptive.resolved_args["speculative_adaptive"] is True
    v1_only = sglang.resolve_worker("0.5.11", {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3,
                                               "--speculative-eagle-topk": 1, "--speculative-adaptive": True}, {})
    assert v1_only.resolved_args["speculative_adaptive"] is False and v1_only.worker_class == "EAGLEWorkerV2"
    assert any("adaptive is only implemented for EAGLEWorker v1" in w for w in v1_only.warnings)
    auto = sglang.resolve_worker("0.5.12", {"--speculative-algorithm": "EAGLE3"}, {})
    assert auto.worker_class == "EAGLEWorkerV2" and auto.resolved_args["speculative_eagle_topk"] is None
    assert "auto-chosen" in auto.reason
    assert sglang.eagle_worker_classes("0.5.14") == ("EAGLEWorkerV2", "MultiLayerEagleWorkerV2")
    assert "EAGLEWorker" not in sglang.worker_files("0.5.13")


# --- pipeline parallelism with speculative decoding: the release's own check_server_args block ------

@pytest.mark.parametrize("version", _params())
def test_pp_with_speculation_matches_check_server_args(version: str) -> None:
    """pp_size > 1 with a speculative algorithm: the server refuses to start (every release through
    0.5.20); from 0.5.21 EAGLE (not multi-layer) runs under SGLANG_ENABLE_PP_SPEC=1 on the last stage."""
    wheel = Wheel(version)
    mismatches: list[str] = []
    cases = itertools.product(("EAGLE", "EAGLE3", "NEXTN", "NGRAM", None), (None, "1", "0"),
                              ({}, {"enable_multi_layer_eagle": True}, {"speculative_adaptive": True},
                               {"enable_dp_attention": True}))
    with wheel.loaded():
        for algo, pp_env, extra in cases:
            if any(k not in wheel.defaults for k in extra):
                continue
            fields = {"speculative_algorithm": algo, "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                      "speculative_num_draft_tokens": 4, "pp_size": 2, **extra}
            args = _Args(wheel.defaults, "LlamaForCausalLM", **fields)
            args.disable_overlap_schedule = True  # what the PP handler has set by then
            if algo == "NEXTN":
                args.speculative_algorithm = "EAGLE"  # the alias is resolved before check_server_args
            saved = os.environ.pop(R.PP_SPEC_ENV, None)
            if pp_env is not None:
                os.environ[R.PP_SPEC_ENV] = pp_env
            try:
                wheel.ns["_check_pp"](args)
                real = None
            except AssertionError as exc:
                real = f"AssertionError: {exc}"
            finally:
                os.environ.pop(R.PP_SPEC_ENV, None)
                if saved is not None:
                    os.environ[R.PP_SPEC_ENV] = saved
            mine = sglang.resolve_worker(version, _flags(fields), {} if pp_env is None else {R.PP_SPEC_ENV: pp_env})
            got = mine.startup_error if (mine.startup_error and "ipeline" in mine.startup_error) or \
                (mine.startup_error or "").startswith(("AssertionError: SGLANG_ENABLE_PP_SPEC", "AssertionError: PP +")) \
                else None
            if algo == "NGRAM" and extra:  # other NGRAM/adaptive refusals come first in fleetctl; not this check
                continue
            if real != got:
                mismatches.append(f"{algo} {extra} {R.PP_SPEC_ENV}={pp_env!r}: real={real!r} mine={got!r}")
    assert not mismatches, "\n".join(mismatches[:10])


def test_model_specific_routing_not_ruled_out_without_the_model_config() -> None:
    """`--speculative-algorithm EAGLE` without the target's architectures: a model override of the release
    may turn on multi-layer EAGLE, so the answer says it is not certain (never a silent default)."""
    eagle = {"--speculative-algorithm": "EAGLE", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1}
    for version in ("0.5.9", "0.5.14", "0.5.23"):
        blind = sglang.resolve_worker(version, eagle, {})
        assert not blind.certain and blind.reason.startswith(
            "not certain: model config not readable, model-specific routing not ruled out: ")
        assert blind.worker_class is not None  # the answer for an architecture without an override
        known = sglang.resolve_worker(version, eagle, {}, model_arch="LlamaForCausalLM")
        assert known.certain and "not certain" not in known.reason
        mimo = sglang.resolve_worker(version, eagle, {}, model_arch="MiMoV2FlashForCausalLM")
        assert mimo.certain and mimo.worker_class == "MultiLayerEagleWorkerV2"
    # EAGLE3 (and NEXTN, compared before normalisation) are not touched by the multi-layer overrides; from
    # 0.5.17 other model overrides (tests/test_sglang_overrides.py) make any blind speculative answer uncertain
    for algo in ("EAGLE3", "NEXTN"):
        assert sglang.resolve_worker("0.5.16", {**eagle, "--speculative-algorithm": algo}, {}).certain
        assert not sglang.resolve_worker("0.5.23", {**eagle, "--speculative-algorithm": algo}, {}).certain
    assert sglang.resolve_worker("0.5.6", eagle, {}).certain  # no model override there yet
    giga = sglang.resolve_worker("0.5.21", eagle, {}, model_arch="GigaChat35ForCausalLM")
    assert giga.worker_class == "MultiLayerEagleWorkerV2"
    assert sglang.resolve_worker("0.5.20", eagle, {}, model_arch="GigaChat35ForCausalLM").worker_class == \
        "EAGLEWorkerV2"


def test_release_options_decide_unknown_and_ambiguous_flags() -> None:
    """Flags fleetctl does not track are judged by the release's own option list: registered ones are
    not "unknown" (0.5.20+ declare them outside server_args.py, so a text search there misses them),
    unique prefixes resolve, shared prefixes are refused as argparse does, others pass through."""
    base = {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1}
    for version in ("0.5.9", "0.5.20", "0.5.23"):
        res = sglang.resolve_worker(version, {**base, "--mem-fraction-static": 0.8, "--mem-frac": 0.8}, {})
        assert res.startup_error is None and res.unknown_flags == (), (version, res.unknown_flags)
    patch_flag = sglang.resolve_worker("0.5.23", {**base, "--speculative-disable-batch-threshold": 16}, {})
    assert patch_flag.unknown_flags == ("--speculative-disable-batch-threshold",)
    assert sglang.resolve_worker("0.5.9", {**base, "--cuda-graph-max": 8}, {}).resolved_args["cuda_graph_max_bs"] == 8
    amb = sglang.resolve_worker("0.5.23", {**base, "--cuda-graph-max": 8}, {})
    assert amb.startup_error.startswith("ambiguous option: --cuda-graph-max could match --cuda-graph-max-bs-decode")
    gone = sglang.resolve_worker("0.5.23", {**base, "--speculative-skip-dp-mlp-sync": True}, {})
    assert gone.startup_error == "unrecognized arguments: --speculative-skip-dp-mlp-sync"


# --- the target's architectures, from where the launch would read its config.json ----------------------

def _read_arch(model_path: str, env: dict[str, str], home: str, cwd: str) -> str | None:
    """What the host side does with the locations: the first readable config.json gives the answer."""
    from fleetctl.engines.sglang import model_config as mc

    for loc in mc.config_locations(model_path, env, home, cwd=cwd):
        path = loc.path
        if loc.kind == "hub":
            ref = Path(loc.ref or "")
            if not ref.is_file():
                continue
            path = mc.snapshot_config(loc.path, ref.read_text()) or ""
        if path and Path(path).is_file():
            return mc.architecture(Path(path).read_bytes())
    return None


def test_model_config_located_like_the_launch_would(tmp_path: Path) -> None:
    from fleetctl.engines.sglang import model_config as mc

    home, commit = tmp_path / "home", "0123456789abcdef0123456789abcdef01234567"
    repo = home / ".cache/huggingface/hub/models--XiaomiMiMo--MiMo-V2-Flash"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs/main").write_text(commit + "\n")
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps({"architectures": ["MiMoV2FlashForCausalLM"]}))
    arch = _read_arch("XiaomiMiMo/MiMo-V2-Flash", {}, str(home), str(tmp_path))
    assert arch == "MiMoV2FlashForCausalLM"
    eagle = {"--speculative-algorithm": "EAGLE", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1}
    res = sglang.resolve_worker("0.5.23", eagle, {}, model_arch=arch)
    assert res.certain and res.worker_class == "MultiLayerEagleWorkerV2"
    # the launch's HF_HOME moves the cache: the same id is then not found there -> not certain
    assert _read_arch("XiaomiMiMo/MiMo-V2-Flash", {"HF_HOME": str(tmp_path / "elsewhere")}, str(home),
                      str(tmp_path)) is None
    assert not sglang.resolve_worker("0.5.23", eagle, {}, model_arch=None).certain
    assert mc.hub_cache_dir({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}, "/root") == "/c"
    assert mc.hub_cache_dir({"HF_HOME": "~/hf"}, "/root") == "/root/hf/hub"
    assert mc.hub_cache_dir({"XDG_CACHE_HOME": "/x"}, "/root") == "/x/huggingface/hub"
    # a local directory (relative to the launch's working directory) comes first
    local = tmp_path / "models" / "llama"
    local.mkdir(parents=True)
    (local / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "x": 1}')
    assert _read_arch("models/llama", {}, str(home), str(tmp_path)) == "LlamaForCausalLM"
    # host data is untrusted: malformed, oversized or implausible configs give no architecture
    for bad in (b"{", b"[]", b'{"architectures": []}', b'{"architectures": [7]}',
                b'{"architectures": ["[red]x[/red]"]}', b"\xff", b" " * (mc.MAX_CONFIG_BYTES + 1)):
        assert mc.architecture(bad) is None, bad
    assert [loc.kind for loc in mc.config_locations("../../etc", {}, "/root", cwd="/w")] == ["local"]
    assert mc.snapshot_config("/r", "../../x") is None


def test_substring_architecture_match_through_0514() -> None:
    """Some architectures are tested with `"X" in model_arch` (0.5.7-0.5.14 ServerArgs; the Step
    models' predicate-registered pass from 0.5.15): a name containing X turns on multi-layer EAGLE
    there; MiMo's tuple (0.5.11+) and the registered passes match exactly."""
    eagle = {"--speculative-algorithm": "EAGLE", "--speculative-num-steps": 3, "--speculative-eagle-topk": 1,
             "--speculative-num-draft-tokens": 4}
    variant = "MiMoV2FlashForCausalLMVariant"
    assert sglang.resolve_worker("0.5.9", eagle, {}, model_arch=variant).worker_class == "MultiLayerEagleWorkerV2"
    assert sglang.resolve_worker("0.5.12", eagle, {}, model_arch=variant).worker_class == "EAGLEWorkerV2"  # a tuple
    step = "Step3p5ForCausalLMVariant"
    assert sglang.resolve_worker("0.5.14", eagle, {}, model_arch=step).worker_class == "MultiLayerEagleWorkerV2"
    assert sglang.resolve_worker("0.5.23", eagle, {}, model_arch=step).worker_class == "MultiLayerEagleWorkerV2"
    assert sglang.resolve_worker("0.5.23", eagle, {}, model_arch=variant).worker_class == "EAGLEWorkerV2"
