"""Families of alternative files a launch chooses between, read from a release's own code.

A *family* is a set of package files (or branches of one file) of which the launch runs one member
and not the others, chosen by the launch's flags, env, hardware or target model. A patch that
changes one member while the launch runs another changes code that never runs: the origin mistake
(eagle_worker_v2.py patched, EAGLEWorker from eagle_worker.py run). Each table below is derived
from the release's sources (its wheel, cached: sources.py) by reading them with `ast`,
never by importing them:

* speculative workers: the worker modules `srt/speculative/spec_info.py` (and the release table of
  releases.py) import; which one runs is routing.resolve_worker;
* model implementation: every `srt/models` module's `EntryClass` (what SGLang's model registry
  collects), the `srt/models` modules each imports (a model built on another's classes runs that
  module's code too), and the draft-model architecture rewrites of `srt/configs/model_config.py`;
* attention backend: `register_attention_backend("name")` factories in
  `srt/layers/attention/attention_registry.py` and the backend modules each imports on a CUDA host
  (an import under another platform's branch, `if _is_musa:` / `elif _is_hip:` / `if not
  _is_npu: ... else:`, is that platform's: kept apart, as code a CUDA host never runs); the default
  is one of the literals ServerArgs assigns to `attention_backend`;
* grammar backend: the `name == "x"` branches of `create_grammar_backend` and the modules they import;
* sampling backend: the `backend == "x"` branches of `srt/layers/sampler.py` (line spans, and the
  module-level functions only that branch calls) — the alternatives live in one file.

The derived table is cached as JSON next to the wheel cache (one file per release and format).
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

FORMAT = 2  # 2: imports under another platform's branch kept apart (attention_elsewhere)

SPEC_INFO = "srt/speculative/spec_info.py"
MODELS_DIR = "srt/models"
MODEL_CONFIG = "srt/configs/model_config.py"
ATTN_REGISTRY = "srt/layers/attention/attention_registry.py"
GRAMMAR_FILES = ("srt/constrained/base_grammar_backend.py", "srt/constrained/grammar_manager.py")
SAMPLER = "srt/layers/sampler.py"
ARGS_FILES = ("srt/server_args.py",)
ARG_GROUPS_DIR = "srt/arg_groups"


@dataclass
class Branch:
    """One alternative inside a file: the backend names that select it and its line spans."""

    names: list[str]
    spans: list[tuple[int, int]]  # 1-based inclusive, in the pristine file
    functions: list[str]  # module-level functions only this branch calls (their spans are in `spans`)


@dataclass
class FamilyTable:
    version: str
    spec_workers: dict[str, str] = field(default_factory=dict)  # worker class -> file
    models: dict[str, str] = field(default_factory=dict)  # architecture -> srt/models module file
    model_imports: dict[str, list[str]] = field(default_factory=dict)  # module file -> srt/models files it imports
    draft_renames: dict[str, str] = field(default_factory=dict)  # target arch -> arch loaded for the draft
    attention: dict[str, list[str]] = field(default_factory=dict)  # backend -> module files a CUDA host runs
    # backend -> module files its factory imports only for another platform (MUSA's fa3, HIP's dsv4)
    attention_elsewhere: dict[str, list[str]] = field(default_factory=dict)
    attention_defaults: list[str] = field(default_factory=list)
    grammar: dict[str, list[str]] = field(default_factory=dict)
    grammar_defaults: list[str] = field(default_factory=list)
    grammar_file: str | None = None
    sampling: list[Branch] = field(default_factory=list)  # in SAMPLER
    sampling_defaults: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what could not be read, said to the user

    def model_members(self) -> set[str]:
        return set(self.models.values())

    def attention_members(self) -> set[str]:
        """Every backend module, another platform's too: a patch of one is checked (and told what
        the launch runs instead)."""
        return {m for d in (self.attention, self.attention_elsewhere) for mods in d.values() for m in mods}

    def grammar_members(self) -> set[str]:
        return {m for mods in self.grammar.values() for m in mods}


# --- reading the sources ------------------------------------------------------------------------

def _parse(root: Path, rel: str) -> ast.Module | None:
    try:
        return ast.parse((root / rel).read_bytes(), filename=rel)
    except (OSError, SyntaxError, ValueError):
        return None


def module_file(root: Path, module: str) -> str | None:
    """`sglang.srt.x.y` -> `srt/x/y.py` (or its package __init__) when the release has it."""
    parts = module.split(".")
    if not parts or parts[0] != "sglang" or len(parts) < 2:
        return None
    rel = "/".join(parts[1:])
    for cand in (rel + ".py", rel + "/__init__.py"):
        if (root / cand).is_file():
            return cand
    return None


def _imports(node: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every absolute `from sglang... import` under `node`."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0 and n.module.startswith("sglang."):
            out.append((n.module, [a.name for a in n.names]))
    return out


# the platform predicates SGLang's code branches on (srt/utils.py is_cuda(), is_hip(), ..., and the
# module-level `_is_x = is_x()` copies), as a CUDA host answers them: fleetctl drives NVIDIA GPU hosts
# (it reads their GPUs with nvidia-smi)
ON_CUDA = {"cuda": True, "cuda_alike": True, "hip": False, "npu": False, "musa": False, "xpu": False,
           "cpu": False, "hpu": False, "mps": False}


def on_cuda(test: ast.AST) -> bool | None:
    """What `test` is on a CUDA host, when it is made of platform predicates only (with not/and/or);
    None when anything else decides it."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        v = on_cuda(test.operand)
        return None if v is None else not v
    if isinstance(test, ast.BoolOp):
        vals = [on_cuda(v) for v in test.values]
        decisive, other = (False, True) if isinstance(test.op, ast.And) else (True, False)
        if decisive in vals:
            return decisive
        return other if all(v is other for v in vals) else None
    fn = test.func if isinstance(test, ast.Call) and not test.args and not test.keywords else test
    name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
    word = name.lstrip("_")[3:] if name.lstrip("_").startswith("is_") else ""
    return ON_CUDA.get(word)


def platform_imports(node: ast.AST) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]:
    """_imports(node) split in two: those a CUDA host runs, and those only under a branch of another
    platform (`if _is_musa:` ... `else:`, `elif _is_hip:`)."""
    here: list[tuple[str, list[str]]] = []
    elsewhere: list[tuple[str, list[str]]] = []

    def visit(n: ast.AST, live: bool) -> None:
        if isinstance(n, ast.If):
            v = on_cuda(n.test)
            for s in n.body:
                visit(s, live and v is not False)
            for s in n.orelse:
                visit(s, live and v is not True)
            return
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0 and n.module.startswith("sglang."):
            (here if live else elsewhere).append((n.module, [a.name for a in n.names]))
        for c in ast.iter_child_nodes(n):
            visit(c, live)

    visit(node, True)
    return here, elsewhere


def _literal_strings(node: ast.AST | None) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literal_strings(node.body) + _literal_strings(node.orelse)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _literal_strings(e)]
    return []


def _spec_workers(root: Path, known: dict[str, str]) -> dict[str, str]:
    out = dict(known)
    tree = _parse(root, SPEC_INFO)
    if tree is not None:
        for mod, names in _imports(tree):
            rel = module_file(root, mod)
            if rel is None or not rel.startswith("srt/speculative/"):
                continue
            for name in names:
                if name.endswith(("Worker", "WorkerV2")) and not name.startswith("Base"):
                    out.setdefault(name, rel)
    return out


def _entry_classes(tree: ast.Module) -> list[str]:
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in n.targets):
            vals = n.value.elts if isinstance(n.value, ast.List | ast.Tuple) else [n.value]
            return [v.id if isinstance(v, ast.Name) else v.attr for v in vals if isinstance(v, ast.Name | ast.Attribute)]
    return []


def _models(root: Path, t: FamilyTable) -> None:
    mdir = root / MODELS_DIR
    if not mdir.is_dir():
        t.problems.append(f"{MODELS_DIR} not found")
        return
    for p in sorted(mdir.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        tree = _parse(root, rel)
        if tree is None:
            continue
        deps = sorted({f for mod, _ in _imports(tree) if (f := module_file(root, mod)) and f.startswith(MODELS_DIR + "/")
                       and f != rel})
        if deps:
            t.model_imports[rel] = deps
        if p.parent == mdir:  # the registry walks the package's top-level modules only
            for arch in _entry_classes(tree):
                t.models.setdefault(arch, rel)
    cfg = _parse(root, MODEL_CONFIG)
    if cfg is None:
        return
    for n in ast.walk(cfg):
        if not isinstance(n, ast.If) or "is_draft_model" not in ast.unparse(n.test):
            continue
        src: list[str] = []
        for c in ast.walk(n.test):
            if isinstance(c, ast.Compare) and "architectures" in ast.unparse(c.left):
                for comp in c.comparators:
                    src += _literal_strings(comp)
        for stmt in n.body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and "architectures" in ast.unparse(stmt.targets[0])):
                dst = _literal_strings(stmt.value)
                if len(dst) == 1:
                    for s in src:
                        t.draft_renames.setdefault(s, dst[0])


def _backend_module(root: Path, mod: str, under: str) -> str | None:
    rel = module_file(root, mod)
    if rel is None or not rel.startswith("srt/"):
        return None
    if under and not rel.startswith(under):
        return None
    return rel if "backend" in mod.rsplit(".", 2)[-1] or any("backend" in x for x in mod.split(".")[2:]) else None


def _attention(root: Path, t: FamilyTable) -> None:
    tree = _parse(root, ATTN_REGISTRY)
    if tree is None:
        t.problems.append(f"{ATTN_REGISTRY} not found: the attention backends are not checked")
        return
    for n in tree.body:
        if not isinstance(n, ast.FunctionDef):
            continue
        for d in n.decorator_list:
            if (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "register_attention_backend"
                    and d.args):
                here, elsewhere = platform_imports(n)
                for name in _literal_strings(d.args[0]):
                    mods = sorted({m for mod, _ in here if (m := _backend_module(root, mod, ""))})
                    t.attention[name] = mods
                    other = sorted({m for mod, _ in elsewhere if (m := _backend_module(root, mod, ""))} - set(mods))
                    if other:
                        t.attention_elsewhere[name] = other


def _compared_names(test: ast.AST, var_hint: str) -> list[str]:
    """The string literals `test` compares a `...backend` expression to (==, in)."""
    out: list[str] = []
    for c in ast.walk(test):
        if isinstance(c, ast.Compare) and var_hint in ast.unparse(c.left):
            for op, comp in zip(c.ops, c.comparators, strict=False):
                if isinstance(op, ast.Eq | ast.In):
                    out += _literal_strings(comp)
    return out


def _grammar(root: Path, t: FamilyTable) -> None:
    for rel in GRAMMAR_FILES:
        tree = _parse(root, rel)
        if tree is None:
            continue
        fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "create_grammar_backend"),
                  None)
        if fn is None:
            continue
        t.grammar_file = rel
        for n in ast.walk(fn):
            if isinstance(n, ast.If):
                names = _compared_names(n.test, "name") or _compared_names(n.test, "grammar_backend")
                if not names:
                    continue
                body = ast.Module(body=n.body, type_ignores=[])
                mods = [m for mod, _ in platform_imports(body)[0] if (m := _backend_module(root, mod, "srt/constrained/"))]
                for name in names:
                    t.grammar.setdefault(name, sorted(dict.fromkeys(mods)))
        return
    t.problems.append("create_grammar_backend not found: the grammar backends are not checked")


def _span(n: ast.AST) -> tuple[int, int]:
    return (n.lineno, n.end_lineno or n.lineno)  # type: ignore[attr-defined]


def sampling_branches(tree: ast.Module) -> list[Branch]:
    """The `backend == "x"` branches of the sampler: their bodies' spans, and the module-level
    functions only that branch calls (with their spans)."""
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    branches: list[tuple[list[str], list[ast.stmt]]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.If):
            names = _compared_names(n.test, "backend")
            if names and n.body:
                branches.append((names, n.body))
    called: dict[int, set[str]] = {}
    for i, (_, body) in enumerate(branches):
        called[i] = {c.func.id for s in body for c in ast.walk(s) if isinstance(c, ast.Call)
                     and isinstance(c.func, ast.Name) and c.func.id in funcs}
    out: list[Branch] = []
    for i, (names, body) in enumerate(branches):
        others = set().union(*(called[j] for j in called if j != i)) if len(called) > 1 else set()
        own = sorted(called[i] - others)
        spans = [(body[0].lineno, body[-1].end_lineno or body[-1].lineno)] + [_span(funcs[f]) for f in own]
        out.append(Branch(names, spans, own))
    return out


def _sampling(root: Path, t: FamilyTable) -> None:
    tree = _parse(root, SAMPLER)
    if tree is None:
        t.problems.append(f"{SAMPLER} not found: the sampling backends are not checked")
        return
    t.sampling = sampling_branches(tree)


_DEFAULT_FUNCS = {"attention_backend": ("attn", "attention"), "sampling_backend": ("sampling",),
                  "grammar_backend": ("grammar",)}


def _defaults(root: Path, dest: str) -> list[str]:
    """Every literal ServerArgs can give `dest` on its own: the field's default, and what its post-init
    (server_args.py, and the arg_groups hooks of later releases) assigns: `self.dest = "x"`,
    `"x" if c else "y"`, `declare_resolution(..., dest="x")`, `{"dest": "x"}`, and the literals a
    `*default*` function for it returns."""
    files = list(ARGS_FILES)
    gdir = root / ARG_GROUPS_DIR
    if gdir.is_dir():
        files += sorted(p.relative_to(root).as_posix() for p in gdir.rglob("*.py"))
    words = _DEFAULT_FUNCS.get(dest, ())
    out: list[str] = []
    for rel in files:
        tree = _parse(root, rel)
        if tree is None:
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef) and n.name == "ServerArgs":
                for s in n.body:
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == dest:
                        out += _literal_strings(s.value)
            elif isinstance(n, ast.Assign):
                for tgt in n.targets:
                    if isinstance(tgt, ast.Attribute) and tgt.attr == dest and ast.unparse(tgt.value) in (
                            "self", "server_args", "args", "cfg", "view"):
                        out += _literal_strings(n.value)
            elif isinstance(n, ast.Call):
                out += [s for k in n.keywords if k.arg == dest for s in _literal_strings(k.value)]
            elif isinstance(n, ast.Dict):
                out += [s for k, v in zip(n.keys, n.values, strict=False)
                        if isinstance(k, ast.Constant) and k.value == dest for s in _literal_strings(v)]
            elif (isinstance(n, ast.FunctionDef) and "default" in n.name and "backend" in n.name
                  and any(w in n.name for w in words)):
                out += [s for r in ast.walk(n) if isinstance(r, ast.Return) for s in _literal_strings(r.value)]
    return sorted(dict.fromkeys(out))


def derive(version: str, root: Path, known_workers: dict[str, str]) -> FamilyTable:
    """The table of `version` read from its package tree `root` (the `sglang` dir)."""
    t = FamilyTable(version)
    t.spec_workers = _spec_workers(root, known_workers)
    _models(root, t)
    _attention(root, t)
    t.attention_defaults = _defaults(root, "attention_backend")
    _grammar(root, t)
    t.grammar_defaults = _defaults(root, "grammar_backend")
    _sampling(root, t)
    t.sampling_defaults = _defaults(root, "sampling_backend")
    return t


def _from_json(doc: dict[str, Any]) -> FamilyTable:
    doc = dict(doc)
    doc["sampling"] = [Branch(b["names"], [tuple(s) for s in b["spans"]], b["functions"]) for b in doc["sampling"]]
    return FamilyTable(**doc)


@cache
def table(version: str) -> FamilyTable:
    """The release's table: from the cache, else derived from its wheel (fetched on first use)."""
    from fleetctl.engines.sglang import routing
    from fleetctl.engines.sglang.sources import WHEELS
    from fleetctl.engines.wheel_cache import cache_dir

    known = routing.worker_files(version) if routing.is_known(version) else {}
    path = cache_dir() / "families" / f"{version}-v{FORMAT}.json"
    try:
        return _from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        pass
    t = derive(version, WHEELS.package_dir(version), known)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(t), sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
    return t
