"""What the simulator logs of the code a launch constructs at start-up (it is NOT SGLang).

A real server builds, per scheduler rank, a Scheduler, the speculative worker the launch selects, the
model class its config.json names and the attention backends its flags name; whatever their
`__init__` logs is in the log. The simulator logs the same lines, read from the code as import loads
it on the host (bytecode included): each `logger.info/warning/error/critical/exception(...)` and `print(...)`
whose message is a string literal or an f-string (a formatted field shown as `<?>`: the simulator
has no value for it; a %-format's arguments are not applied). A condition around the call is not
evaluated: the line is logged as if it held. So a playbook's own log line in the code that runs is
seen by `verify-logs` on the sandbox, and a line in code that does not run is not.

Stdlib only (the host's python runs it, 3.8 or later): `dis` over the code objects, `ast` over the
attention registry, plain reads of config.json.
"""

from __future__ import annotations

import ast
import dis
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

LEVELS = ("info", "warning", "error", "critical", "exception")
FIELD = "<?>"  # a formatted field of an f-string: its value is not known here
_SKIP = ("CACHE", "PUSH_NULL", "PRECALL", "EXTENDED_ARG", "NOP", "RESUME")
_FORMAT = ("FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC")
_SPEC_FOLLOWS = ("FORMAT_VALUE", "FORMAT_WITH_SPEC", "CONVERT_VALUE")
_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)

# a site: (package-relative file, class, function)


def _walk(code: Any) -> Iterator[Any]:
    kinds = type(code)
    yield code
    for k in code.co_consts:
        if isinstance(k, kinds):
            yield from _walk(k)


def _message(ins: list[Any], k: int) -> str | None:
    """The message whose first instruction is ins[k]: a literal, or an f-string's pieces (fields as
    FIELD); None when the first argument is neither."""
    if k >= len(ins):
        return None
    first = ins[k]
    if first.opname == "LOAD_CONST" and isinstance(first.argval, str) and not _fstring_ahead(ins, k):
        return first.argval  # a literal message (a %-format's arguments follow it)
    parts: list[str] = []
    for j in range(k, min(len(ins), k + 80)):
        op = ins[j].opname
        if op == "BUILD_STRING":
            text = "".join(parts)
            return text if text.replace(FIELD, "").strip() else None
        if op.startswith("CALL"):
            break
        if op == "LOAD_CONST" and isinstance(ins[j].argval, str):
            after = ins[j + 1].opname if j + 1 < len(ins) else ""
            if after not in _SPEC_FOLLOWS:  # (a format spec: f"{x:.2f}")
                parts.append(ins[j].argval)
        elif op in _FORMAT:
            parts.append(FIELD)
    text = "".join(parts)
    return text if parts and text.replace(FIELD, "").strip() else None


def _fstring_ahead(ins: list[Any], k: int) -> bool:
    """Does a BUILD_STRING come before the call that takes the argument starting at ins[k]?"""
    for j in range(k + 1, min(len(ins), k + 80)):
        op = ins[j].opname
        if op == "BUILD_STRING":
            return True
        if op.startswith("CALL"):
            return False
    return False


def logged_messages(code: Any, class_name: str, function: str = "__init__") -> list[tuple[str, str]]:
    """(level, message) of each log call `class_name.function` (defined anywhere in the module code
    `code`) makes unconditionally (no jump of the function skips it; nested functions and calls
    under an if, a loop or and/or are left out) with a literal or f-string message, in bytecode
    order; `print` is level "print"."""
    kinds = type(code)
    out: list[tuple[str, str]] = []
    for c in _walk(code):
        if c.co_name != class_name:
            continue
        for f in c.co_consts:
            if not (isinstance(f, kinds) and f.co_name == function):
                continue
            raw = list(dis.get_instructions(f))
            jumps = [(i.offset, i.argval) for i in raw if i.opcode in _JUMPS and isinstance(i.argval, int)
                     and not i.opname.startswith("SETUP_")]
            ins = [i for i in raw if i.opname not in _SKIP]
            for n, a in enumerate(ins):
                if a.opname not in ("LOAD_GLOBAL", "LOAD_NAME"):
                    continue
                if any(at < a.offset < to for at, to in jumps):
                    continue  # under a condition (if, loop, and/or): not evaluated here, so not logged
                level, start = None, n + 1
                if a.argval == "print":
                    level = "print"
                elif (a.argval == "logger" and n + 1 < len(ins)
                      and ins[n + 1].opname in ("LOAD_ATTR", "LOAD_METHOD") and ins[n + 1].argval in LEVELS):
                    level, start = ins[n + 1].argval, n + 2
                if level is None:
                    continue
                msg = _message(ins, start)
                if msg is not None:
                    out.append((level, msg))
    return out


# ----------------------------------------------------------------------------- what the launch builds


def _class_module(pkg: Path, under: str, class_name: str) -> str | None:
    """The package-relative module under `under` that defines `class_name` at top level (plain text
    search: no module is parsed or imported)."""
    root = pkg / under
    needles = [f"\nclass {class_name}{end}".encode() for end in ("(", ":")]
    try:
        names = sorted(os.listdir(str(root)))
    except OSError:
        return None
    for name in names:
        if not name.endswith(".py"):
            continue
        try:
            data = (root / name).read_bytes()
        except OSError:
            continue
        if any(n in data or data.startswith(n[1:]) for n in needles):
            return f"{under}/{name}"
    return None


def model_architecture(model_path: Any, env: dict, cwd: str) -> str | None:
    """architectures[0] of the config.json the launch's model path names (a local directory or the
    HF cache, as fleetctl's agent finds it), or None."""
    from fleetctl.remote.hostfacts import home_of, model_config_path

    if not isinstance(model_path, str):
        return None
    path, _why = model_config_path(model_path, None, env, home_of(env), cwd)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(4 << 20).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    archs = doc.get("architectures") if isinstance(doc, dict) else None
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0].isidentifier():
        return archs[0]
    return None


def attention_classes(pkg: Path, backend: str) -> list[tuple[str, str]]:
    """(module file, class) the release's attention registry imports in the factory it registers
    for `backend` (`@register_attention_backend("name")`), read with ast from the host's file."""
    reg = pkg / "srt" / "layers" / "attention" / "attention_registry.py"
    try:
        tree = ast.parse(reg.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return []
    out: list[tuple[str, str]] = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        names = [d.args[0].value for d in fn.decorator_list
                 if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register_attention_backend"
                 and d.args and isinstance(d.args[0], ast.Constant)]
        if backend not in names:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang."):
                rel = node.module[len("sglang."):].replace(".", "/")
                for f in (rel + ".py", rel + "/__init__.py"):
                    if (pkg / f).is_file():
                        out += [(f, a.name) for a in node.names]
                        break
    return out


def startup_sites(pkg: Path, worker: tuple[str, str] | None, args: dict, env: dict, cwd: str) -> list[tuple[str, str, str]]:
    """The constructors a launch runs per scheduler rank that the simulator reads: the Scheduler, the
    selected speculative worker, the target's (and a named draft's) model class, the attention
    backends the flags name (a backend SGLang picks at startup from the GPU is not guessed)."""
    sites: list[tuple[str, str, str]] = [("srt/managers/scheduler.py", "Scheduler", "__init__")]
    if worker is not None:
        sites.append((worker[0], worker[1], "__init__"))
    models = [args.get("model_path")]
    if args.get("speculative_algorithm") and args.get("speculative_draft_model_path"):
        models.append(args.get("speculative_draft_model_path"))
    for m in models:
        arch = model_architecture(m, env, cwd)
        rel = _class_module(pkg, "srt/models", arch) if arch else None
        if rel is not None:
            sites.append((rel, arch, "__init__"))
    picked = [args.get(k) for k in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")]
    for name in dict.fromkeys(str(b) for b in picked if b):
        sites += [(rel, cls, "__init__") for rel, cls in attention_classes(pkg, name)]
    return list(dict.fromkeys(sites))


def startup_messages(pkg: Path, sites: list[tuple[str, str, str]], load: Callable[[Path, str], Any],
                     skip: str = "") -> list[tuple[str, str]]:
    """(level, message) of every site, each module's code as `load` (import's loader) hands it out;
    messages holding `skip` (the payload's marker: logged by its own rule) left out."""
    out: list[tuple[str, str]] = []
    for rel, cls, fn in sites:
        code = load(pkg, rel)
        if code is None:
            continue
        out += [(lv, m) for lv, m in logged_messages(code, cls, fn) if not (skip and skip in m)]
    return out
