"""What `fleetctl patch init` pre-fills in a new playbook's `launch:` section (SGLang's part).

Given the package files a user's patch changes on one release:
* the speculative flags and launch env under which that release runs the worker class of a patched
  worker file, found by asking fleetctl's routing (the rules held to each release's own code) over
  a small set of launches, fewest settings first, so the launch written runs the file patched;
* the server flags the patch adds to the argument file, each with the type and default its
  `add_argument` call declares (read from the patched file's AST).

Every value the user still has to give is a placeholder (`PLACEHOLDER` ...), which `patch check`
names and `launch` refuses.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass, field
from typing import Any

from fleetctl.engines.base import PLACEHOLDER
from fleetctl.engines.sglang import releases as R
from fleetctl.engines.sglang import routing

MODEL_FLAG = "--model-path"
DRAFT_FLAG = "--speculative-draft-model-path"
ARGS_FILE = "srt/server_args.py"


def placeholder(what: str) -> str:
    return f"{PLACEHOLDER}{what}>"


@dataclass
class Setting:
    name: str
    value: Any
    comment: str


@dataclass
class LaunchDraft:
    flags: list[Setting] = field(default_factory=list)
    env: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said in the README block
    worker_class: str | None = None  # the patched worker the launch runs


_ALGORITHMS = ("EAGLE3", "EAGLE", "STANDALONE")


def _speculative_launch(version: str, rel: str) -> tuple[dict[str, Any], dict[str, str], str] | None:
    """The fewest-settings launch (flags, env, worker class) under which `version` runs the worker in `rel`."""
    wanted = {cls for cls, f in routing.worker_files(version).items() if f == rel}
    if not wanted:
        return None
    combos = itertools.product(_ALGORITHMS, (False, True), (None, "1", "0"), (False, True))
    ranked = sorted(combos, key=lambda c: (c[1], c[2] is not None, c[3], _ALGORITHMS.index(c[0])))
    for algorithm, multi, env_v2, no_overlap in ranked:
        flags: dict[str, Any] = {MODEL_FLAG: "m", "--speculative-algorithm": algorithm,
                                 "--speculative-num-steps": 3, "--speculative-eagle-topk": 1,
                                 "--speculative-num-draft-tokens": 4}
        if multi:
            flags["--enable-multi-layer-eagle"] = True
        if no_overlap:
            flags["--disable-overlap-schedule"] = True
        env = {R.SPEC_V2_ENV: env_v2} if env_v2 is not None else {}
        res = routing.resolve_worker(version, flags, env, model_arch="LlamaForCausalLM")
        if res.unknown_flags or res.startup_error or res.worker_class not in wanted:
            continue
        return flags, env, res.worker_class or ""
    return None


def added_flags(patched_args_file: bytes, pristine_args_file: bytes) -> list[Setting]:
    """Server flags the patched argument file registers that the pristine one does not, with the
    value to start from (a store_true flag: true; else a placeholder naming its type and default)."""
    def options(src: bytes) -> dict[str, ast.Call]:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            return {}
        out: dict[str, ast.Call] = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument":
                for a in n.args:
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
                        out.setdefault(a.value, n)
        return out

    before = set(options(pristine_args_file))
    out = []
    for opt, call in options(patched_args_file).items():
        if opt in before:
            continue
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        action = kw.get("action")
        if isinstance(action, ast.Constant) and action.value == "store_true":
            out.append(Setting(opt, True, "added by your patch (a switch)"))
            continue
        typ = kw.get("type")
        tname = typ.id if isinstance(typ, ast.Name) else (ast.unparse(typ) if typ is not None else "str")
        default = ast.unparse(kw["default"]) if "default" in kw else "None"
        out.append(Setting(opt, placeholder(f"a value for {opt}"),
                           f"added by your patch: type {tname}, default {default} in the patched file"))
    return out


def parse_launch(command: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(flags, env) of a launch command line the user runs: leading NAME=value words (or an `env`
    prefix) are its environment; the flags are what follows the server's entry point."""
    import re
    import shlex

    from fleetctl.engines.sglang import processes

    words = shlex.split(command)
    env: dict[str, str] = {}
    while words and (words[0] == "env" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0])):
        w = words.pop(0)
        if w != "env":
            k, _, v = w.partition("=")
            env[k] = v
    return processes.server_flags(words), env


def _own_launch(version: str, patched: dict[str, tuple[bytes, bytes]], command: str, draft: LaunchDraft) -> None:
    """The user's own launch, kept as given (commented), and what it runs on `version`."""
    flags, env = parse_launch(command)
    model = flags.get(MODEL_FLAG)
    draft.flags.append(Setting(MODEL_FLAG, model if isinstance(model, str) and model else placeholder(
        "the target model: a directory on the host or a hub id"), "from your launch command" if model else
        "the target model (its config.json is read on each host by explain)"))
    draft.flags += [Setting(k, v, "from your launch command") for k, v in flags.items()
                    if k not in (MODEL_FLAG, "--port", "--host")]
    draft.env += [Setting(k, v, "from your launch command") for k, v in env.items()]
    res = routing.resolve_worker(version, flags, env, model_arch=None)
    if res.startup_error:
        draft.notes.append(f"WARNING: with your launch SGLang {version} refuses to start: {res.startup_error}")
    elif res.worker_file:
        draft.worker_class = res.worker_class
        if res.worker_file not in patched:
            draft.notes.append(f"WARNING: with your launch SGLang {version} runs {res.worker_class} from "
                               f"{res.worker_file}, which your edits do not change ({res.reason}): patch that "
                               "file too, or change the launch (the origin mistake)")
            draft.worker_class = None


def launch_draft(version: str, patched: dict[str, tuple[bytes, bytes]], command: str | None = None) -> LaunchDraft:
    """The `launch:` section for a patch of `version` changing `patched` (rel -> (pristine, patched));
    `command`: the user's own launch command line, kept as the launch (else one is found)."""
    draft = LaunchDraft()
    if command:
        _own_launch(version, patched, command, draft)
        if ARGS_FILE in patched:
            pristine, new = patched[ARGS_FILE]
            draft.flags += [s for s in added_flags(new, pristine) if s.name not in {f.name for f in draft.flags}]
        return draft
    draft.flags.append(Setting(MODEL_FLAG, placeholder("the target model: a directory on the host or a hub id"),
                               "the target model (its config.json is read on each host by explain)"))
    workers = [rel for rel in patched if rel in set(routing.worker_files(version).values())]
    found = None
    for rel in workers:
        found = _speculative_launch(version, rel)
        if found:
            break
    if workers and found is None:
        draft.notes.append(f"no launch fleetctl knows runs {', '.join(workers)} on SGLang {version}: "
                           "the launch below has no speculative flags")
    if found is not None:
        flags, env, cls = found
        draft.worker_class = cls
        draft.flags.append(Setting(DRAFT_FLAG, placeholder("the draft model: a directory on the host or a hub id"),
                                   "the draft model of the speculative algorithm"))
        why = {
            "--speculative-algorithm": f"with the settings below SGLang {version} runs {cls}, the worker you patched",
            "--speculative-num-steps": "draft steps per round (with topk 1, num-draft-tokens = steps + 1)",
            "--speculative-eagle-topk": "topk 1: a topk above 1 changes which worker runs on some releases",
            "--speculative-num-draft-tokens": "steps + 1",
            "--enable-multi-layer-eagle": f"multi-layer EAGLE: {cls}",
            "--disable-overlap-schedule": f"the overlap schedule off: {cls}",
        }
        for k, v in flags.items():
            if k != MODEL_FLAG:
                draft.flags.append(Setting(k, v, why.get(k, "")))
        for k, v in env.items():
            draft.env.append(Setting(k, v, f"{k}={v}: without it SGLang {version} runs another worker"))
    if ARGS_FILE in patched:
        pristine, new = patched[ARGS_FILE]
        draft.flags += added_flags(new, pristine)
    return draft


# ----------------------------------------------------------------------------- the marker


@dataclass
class FoundMarker:
    text: str  # the constant start of the message (what verify-logs looks for)
    file: str
    cls: str | None
    function: str | None
    per_rank: bool  # logged by every rank (False: a rank-0-only helper)
    where: str  # worker | file | anywhere
    line: int


_LEVELS = {"info", "warning", "error", "critical", "exception"}  # INFO and above: seen at the default level
_RANK0_HELPERS = {"log_info_on_rank0"}
MIN_MARKER = 8


def _message(node: ast.expr) -> str | None:
    """The constant start of a log message: a string, an f-string up to its first field, a %-format
    up to its first conversion."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value.split("%", 1)[0]
    elif isinstance(node, ast.JoinedStr):
        text = ""
        for part in node.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                break
            text += part.value
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _message(node.left)
    else:
        return None
    text = text.splitlines()[0].strip() if text.strip() else ""
    return text if len(text) >= MIN_MARKER else None


def _added_lines(pristine: bytes, patched: bytes) -> set[int]:
    import difflib

    a, b = pristine.splitlines(), patched.splitlines()
    out: set[int] = set()
    for tag, _i1, _i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("insert", "replace"):
            out.update(range(j1 + 1, j2 + 1))
    return out


def added_markers(version: str, rel: str, pristine: bytes, patched: bytes) -> list[FoundMarker]:
    """The log calls (INFO and above) the patch adds to `rel`, in file order, with where they run."""
    if not rel.endswith(".py"):
        return []
    try:
        tree = ast.parse(patched)
    except (SyntaxError, ValueError):
        return []
    added = _added_lines(pristine, patched)
    workers = set(routing.worker_files(version))
    out: list[FoundMarker] = []

    def visit(node: ast.AST, cls: str | None, fn: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name, None)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, cls, fn or child.name)
                continue
            if isinstance(child, ast.Call) and child.lineno in added:
                f = child.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                args = list(child.args)
                if name in _RANK0_HELPERS and len(args) >= 2:
                    args = args[1:]
                if (name in _LEVELS or name in _RANK0_HELPERS or name == "print") and args:
                    text = _message(args[0])
                    if text:
                        where = "worker" if cls in workers else "file" if cls else "anywhere"
                        # per rank: not a rank-0 helper's, and not a print(), whose line carries no
                        # rank prefix (verify-logs cannot tell which rank printed it)
                        out.append(FoundMarker(text, rel, cls, fn, name not in _RANK0_HELPERS and name != "print",
                                               where, child.lineno))
            visit(child, cls, fn)

    visit(tree, None, None)
    return sorted(out, key=lambda m: m.line)
