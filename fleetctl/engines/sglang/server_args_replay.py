"""Run the self-contained checks of a server_args.py (the one on a sandbox host's disk, or the one a
playbook's patch makes).

Used by the sandbox SIMULATOR (the file on disk) and by `explain` (`patched_refusal`: a check the
playbook's patch adds that refuses the launch is shown before launch, not first by the crash).
A real server runs `ServerArgs.check_server_args()`; a patch (the payload's included) may add a
check there, e.g. one that refuses the patch's flag with settings it does not support. The
simulator cannot import SGLang (no torch here), so it replays what it can of that file's own code:
every `ServerArgs` method that `check_server_args` calls whose body reads only fields of the launch's
resolved arguments (or fields with a literal default in that file) and uses nothing but builtins and
self-contained functions it imports from the package on disk (e.g. a reason function). Such a method
is compiled from the file on disk and run against those arguments; what it raises is what the real
server would raise. Methods
that need anything else are skipped (not guessed), so this can miss a refusal, never invent one
the file does not contain. Nothing here is evidence about SGLang: the real files' own code is.
"""

from __future__ import annotations

import ast
import builtins
import copy
import types
from pathlib import Path
from typing import Any

_ALLOWED = set(dir(builtins))


def _attrs_of(fn: ast.FunctionDef, name: str) -> set[str]:
    return {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == name}


def _free_names(fn: ast.FunctionDef) -> set[str]:
    assigned = {a.arg for a in fn.args.args} | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                                                  and isinstance(n.ctx, ast.Store)}
    used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - assigned


def _field_defaults(cls: ast.ClassDef) -> dict[str, Any]:
    """ServerArgs fields whose default is a plain literal (`enable_pdmux: bool = False`)."""
    out: dict[str, Any] = {}
    for n in cls.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
            try:
                out[n.target.id] = ast.literal_eval(n.value)
            except ValueError:
                continue
    return out


class _Replay:
    """The replayable checks of one server_args.py, with the package-level helpers they import."""

    def __init__(self, source: str, pkg_dir: Path | None) -> None:
        self.pkg_dir = pkg_dir
        self.methods: list[tuple[ast.FunctionDef, dict[str, Any]]] = []
        self.defaults: dict[str, Any] = {}
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"), None)
        if cls is None:
            return
        self.defaults = _field_defaults(cls)
        methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
        check = methods.get("check_server_args")
        if check is None:
            return
        called = [c.func.attr for c in ast.walk(check) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)
                  and c.func.value.id == "self"]
        for name in dict.fromkeys(called):
            fn = methods.get(name)
            if fn is not None and len(fn.args.args) == 1 and not fn.decorator_list:
                self.methods.append((fn, {}))

    def _helper(self, module: str, name: str, fields: set[str]) -> ast.FunctionDef | None:
        """A top-level function of the package file `module` that reads only its one argument's
        fields and builtins (e.g. a reason function the check imports)."""
        if self.pkg_dir is None or not module.startswith("sglang."):
            return None
        path = self.pkg_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError):
            return None
        fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is None or len(fn.args.args) != 1 or fn.decorator_list:
            return None
        fn.returns = None  # annotations are not run: they may name classes the file imports
        for a in fn.args.args:
            a.annotation = None
        arg = fn.args.args[0].arg
        if not _attrs_of(fn, arg) <= fields or not _free_names(fn) <= _ALLOWED:
            return None
        return fn

    def checks(self, args: dict[str, Any]) -> list[tuple[ast.FunctionDef, dict[str, ast.FunctionDef]]]:
        fields = set(self.defaults) | set(args)
        out = []
        for fn, _ in self.methods:
            helpers: dict[str, ast.FunctionDef] = {}
            ok = True
            for imp in [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]:
                if not isinstance(imp, ast.ImportFrom) or imp.module is None:
                    ok = False
                    break
                for alias in imp.names:
                    h = self._helper(imp.module, alias.name, fields)
                    if h is None:
                        ok = False
                        break
                    helpers[alias.asname or alias.name] = h
            if not ok or not _attrs_of(fn, "self") <= fields or not _free_names(fn) <= _ALLOWED | set(helpers):
                continue
            out.append((fn, helpers))
        return out


def replayable_checks(source: str, args: dict[str, Any], pkg_dir: Path | None = None) -> list[ast.FunctionDef]:
    """The ServerArgs methods check_server_args calls that can be replayed for these arguments."""
    return [fn for fn, _ in _Replay(source, pkg_dir).checks(args)]


class _NoImports(ast.NodeTransformer):
    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        return ast.Pass()


def run_checks(source: str, args: dict[str, Any], pkg_dir: Path | None = None) -> str | None:
    """'ValueError: ...' from the first replayable check that refuses these arguments, else None."""
    replay = _Replay(source, pkg_dir)
    self_ns = types.SimpleNamespace(**{**replay.defaults, **args})
    for fn, helpers in replay.checks(args):
        body = [*helpers.values(), _NoImports().visit(copy.deepcopy(fn))]
        code = compile(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])),
                       "<server_args.py on disk>", "exec")
        ns: dict[str, Any] = {"__builtins__": builtins}
        exec(code, ns)
        try:
            ns[fn.name](self_ns)
        except (ValueError, AssertionError, TypeError) as e:
            return f"{e.__class__.__name__}: {e}"
    return None


ARGS_FILE = "srt/server_args.py"


def patched_refusal(version: str, intended: dict[str, bytes], args: dict[str, Any]) -> str | None:
    """What a check the playbook's patch adds to server_args.py raises for these resolved arguments
    (e.g. the payload refusing its flag with a topk adaptive speculation does not support), replayed
    from the patched file with the release's own package for the helpers it imports; None when the
    patched file refuses nothing the pristine one does not refuse too (that is the table's part)."""
    from fleetctl.engines.sglang.sources import WHEELS

    patched = intended.get(ARGS_FILE)
    if patched is None or not args:
        return None
    try:
        pkg = WHEELS.package_dir(version)
        pristine = WHEELS.pristine_bytes(version, ARGS_FILE)
    except Exception:  # (no wheel to compare with: not guessed)
        return None
    try:
        got = run_checks(patched.decode("utf-8", "replace"), dict(args), pkg)
        if got is None or run_checks(pristine.decode("utf-8", "replace"), dict(args), pkg) == got:
            return None
    except Exception:  # a check that cannot be replayed here is skipped, never guessed
        return None
    return got
