"""The engine boundary (issue 12.1): no SGLang path, env name, flag, module or log literal outside
the engine package (fleetctl/engines/sglang/) and the sandbox (which simulates SGLang). Everything else asks
`fleetctl.engines.engine()`. Prose may say "SGLang"; docstrings and comments are not scanned."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fleetctl

ROOT = Path(fleetctl.__file__).parent
ENGINE_HOMES = ("engines", "sandbox")

# A string constant is a leak when it holds a package path, an env name, a server flag or a
# module path of the engine, or (spelled without whitespace, i.e. as a name, not in prose) names
# the package or a server argument.
ANYWHERE = [
    re.compile(r"srt/"),  # a path inside the package
    re.compile(r"python/sglang/"),  # the package inside a source checkout
    re.compile(r"SGLANG_"),  # an engine environment variable
    re.compile(r"(?<![\w-])--(speculative|tp\b|tp-size|tensor-parallel|dp\b|dp-size|data-parallel|enable-dp"
               r"|attn-dp|pp-size|ep-size|disable-overlap)"),  # an engine server flag
    re.compile(r"(?<![\w])sglang[./]"),  # an engine module path (sglang.launch_server, sglang/...)
    re.compile(r"server_args"),  # the engine's argument file / class / log dump
]
AS_NAME = re.compile(r"sglang|speculative", re.I)  # only in whitespace-free constants

# (file relative to fleetctl/, the constant or its start) -> why it stays
ALLOWED: dict[tuple[str, str], str] = {
    ("config/inventory.py", "sglang_dir"): "the inventory key users write (engine().dir_key, asserted equal below)",
    ("model/facts.py", "sglang"): "the `facts --json` key (docs/json.md), a stable output contract",
    ("commands/patch.py", "--sglang"): "fleetctl's own option naming a release, not a server flag",
    ("commands/validate.py", "--sglang"): "the same option's name in its error message",
    ("ops/container_advice.py", "--sglang"): "the same option in the `patch dockerfile` command it suggests",
    ("commands/sandbox.py", "--cpu-sglang"): "fleetctl's own sandbox option (hosts on a CPU venv of the real engine)",
    ("commands/patch.py", "Path inside the sglang package, e.g. srt/speculative/eagle_worker.py."):
        "--help example; command help must not import the engine (start-up, issue 16.10)",
    ("commands/patch.py", "Turn a git range of an SGLang source checkout (python/sglang/...)"):
        "--help text, same reason",
}


def _log_literals() -> set[str]:
    """The log lines the engine package knows (ready line, warnings, errors): spelled only there."""
    out: set[str] = set()
    for name in ("releases.py", "logs.py"):
        tree = ast.parse((ROOT / "engines" / "sglang" / name).read_text(encoding="utf-8"))
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) >= 20 and " " in n.value:
                out.add(n.value.split("{")[0].strip())
    return {s for s in out if len(s) >= 20}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def leaks(source: str, logs: set[str]) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Constant) and isinstance(n.value, str)) or id(n) in docs:
            continue
        s = n.value
        if (any(p.search(s) for p in ANYWHERE) or (not re.search(r"\s", s) and AS_NAME.search(s))
                or any(lit in s for lit in logs)):
            found.append((n.lineno, s))
    return found


def _scanned() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in ENGINE_HOMES)


def test_no_engine_literal_outside_the_engine_package() -> None:
    logs = _log_literals()
    bad = []
    used = set()
    for p in _scanned():
        rel = p.relative_to(ROOT).as_posix()
        for line, s in leaks(p.read_text(encoding="utf-8"), logs):
            hit = [k for k in ALLOWED if k[0] == rel and s.startswith(k[1])]
            if hit:
                used.update(hit)
            else:
                bad.append(f"fleetctl/{rel}:{line}: {s[:80]!r}")
    assert not bad, "engine literals outside fleetctl/engines/sglang/ (ask fleetctl.engines.engine()):\n" + "\n".join(bad)
    assert not set(ALLOWED) - used, f"stale allow-list entries: {sorted(set(ALLOWED) - used)}"


def engine_imports(source: str) -> list[int]:
    """Lines that import the engine package directly (instead of asking fleetctl.engines.engine())."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and n.module and (
                n.module == "fleetctl.engines.sglang" or n.module.startswith("fleetctl.engines.sglang.")
                or (n.module == "fleetctl.engines" and any(a.name == "sglang" for a in n.names))):
            out.append(n.lineno)
        elif isinstance(n, ast.Import) and any(a.name.startswith("fleetctl.engines.sglang") for a in n.names):
            out.append(n.lineno)
    return out


def test_only_the_engine_interface_imports_the_engine_package() -> None:
    bad = [f"fleetctl/{p.relative_to(ROOT).as_posix()}:{line}"
           for p in _scanned() if p.relative_to(ROOT).as_posix() != "engines/__init__.py"
           for line in engine_imports(p.read_text(encoding="utf-8"))]
    assert not bad, "import fleetctl.engines.sglang here: go through fleetctl.engines.engine() instead:\n" + "\n".join(bad)
    assert engine_imports("from fleetctl.engines.sglang import releases as R\nimport fleetctl.engines.sglang.logs\n"
                          "from fleetctl.engines import sglang\n") == [1, 2, 3]
    assert engine_imports("from fleetctl.engines import engine\nfrom fleetctl.engines import wheels\n") == []


def test_the_scan_catches_each_kind_of_literal() -> None:
    logs = _log_literals()
    assert any("fired up" in s for s in logs)  # the ready line is among the log literals
    for bad in ('X = "srt/server_args.py"', 'X = "SGLANG_ENABLE_SPEC_V2"', 'X = ["--speculative-algorithm"]',
                'X = "--tp"', 'X = "{python} -m sglang.launch_server"', 'X = "sglang"', 'X = "sglang_dir"',
                'X = "speculative_algorithm"', 'X = "The server is fired up and ready to roll!"',
                'X = f"its {d}/srt/x.py"'):
        assert leaks(bad, logs), bad
    for fine in ('"""Module docstring naming srt/server_args.py and SGLANG_X."""',
                 'X = "SGLang 0.5.9 is not a release fleetctl knows"', 'X = "--drop-unknown-flags"',
                 'X = "--tpu"', 'X = "no speculative worker runs"'):
        assert not leaks(fine, logs), fine


def test_the_engine_implements_the_interface() -> None:
    from fleetctl.engines import engine
    from fleetctl.engines.base import Engine

    e = engine()
    assert isinstance(e.package, str) and e.package
    for name in Engine.__annotations__:
        assert hasattr(e, name), name
    for name in ("agent_facts", "known_versions", "is_known", "worker_files", "resolve_worker", "shown_env",
                 "shown_flags"):
        assert callable(getattr(e, name)), name
    assert e.is_known(e.known_versions()[-1]) and not e.is_known("0.0.0")
    assert e.args_file in e.hash_files and set(e.key_files) >= {e.args_file}
    assert e.tp_flag in e.tp_spellings
    assert e.agent_facts()["package"] == e.package
    # the user-facing names allowed above are the engine's own
    assert ("config/inventory.py", e.dir_key) in ALLOWED and ("model/facts.py", e.package) in ALLOWED


def test_typed_facts_and_answers_name_the_package_not_the_engine() -> None:
    import dataclasses

    from fleetctl.model.facts import HostFacts
    from fleetctl.protocol import answers

    types = [HostFacts, *(t for t in vars(answers).values() if dataclasses.is_dataclass(t) and isinstance(t, type))]
    bad = [f"{t.__name__}.{f.name}" for t in types for f in dataclasses.fields(t) if "sglang" in f.name.lower()]
    bad += [t.__name__ for t in types if "sglang" in t.__name__.lower()]
    assert len(types) > 10 and not bad, bad


def test_the_agent_is_engine_blind() -> None:
    """The host agent holds no engine knowledge: no identifier names the engine (the literal scan
    above covers its strings); the controller sends `Engine.agent_facts()` in each request
    (docs/architecture.md, "The engine boundary")."""
    bad = []
    for p in sorted((ROOT / "remote").glob("*.py")):
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            name = getattr(n, "name", None) or getattr(n, "id", None) or getattr(n, "attr", None) or getattr(n, "arg", None)
            if isinstance(name, str) and "sglang" in name.lower():
                bad.append(f"{p.name}:{n.lineno}: {name}")
    assert not bad, bad


# Engine words in identifiers (issue 33.7): outside fleetctl/engines/ and the sandbox no name in code
# (a variable, attribute, function, class, parameter, keyword or import alias) says sglang, eagle,
# speculative or spec_v2: that knowledge lives in the engine. Each exception is a name users see.
ENGINE_WORD = re.compile(r"sglang|eagle|speculative|spec_v2", re.I)
NAMES_ALLOWED: dict[tuple[str, str], str] = {
    ("commands/patch.py", "sglang"): "fleetctl's own --sglang option (typer names the option after its parameter)",
    ("commands/patch.py", "sglang_version"): "the --sglang option's value, passed on as such",
    ("commands/validate.py", "sglang_version"): "the same option's checker",
    ("commands/validate.py", "SGLANG_VERSION"): "the same option's value pattern",
    ("commands/sandbox.py", "cpu_sglang"): "fleetctl's own sandbox option --cpu-sglang",
    ("config/hosts.py", "sglang_dir"): "the inventory key users write (engine().dir_key), kept as Host's field",
    ("config/inventory.py", "sglang_dir"): "the same inventory key, validated",
    ("model/facts.py", "sglang_dir"): "the same key, sent to the agent as the pinned package dir",
    ("ops/rollback.py", "sglang_dir"): "the same key, read for the pinned package dir",
    ("ops/verify.py", "spec_v2_env"): "the engine's Resolution field, shown in verify-logs --json's worker",
}


def engine_names(source: str) -> list[tuple[int, str]]:
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Name):
            names = [n.id]
        elif isinstance(n, ast.Attribute):
            names = [n.attr]
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [n.name]
        elif isinstance(n, ast.arg):
            names = [n.arg]
        elif isinstance(n, ast.keyword):
            names = [n.arg or ""]
        elif isinstance(n, ast.alias):
            names = [n.asname or n.name]
        else:
            continue
        out += [(getattr(n, "lineno", 0), x) for x in names if ENGINE_WORD.search(x)]
    return out


def test_engine_words_in_names_only_in_the_engine_package() -> None:
    bad, used = [], set()
    for p in _scanned():
        rel = p.relative_to(ROOT).as_posix()
        for line, name in engine_names(p.read_text(encoding="utf-8")):
            if (rel, name) in NAMES_ALLOWED:
                used.add((rel, name))
            else:
                bad.append(f"fleetctl/{rel}:{line}: {name}")
    assert not bad, "engine words in names outside fleetctl/engines/ (ask engine()):\n" + "\n".join(bad)
    assert not set(NAMES_ALLOWED) - used, f"stale entries: {sorted(set(NAMES_ALLOWED) - used)}"
    assert [x for _, x in engine_names("eagle_worker = 1\ndef spec(speculative_x): return o.sglang_dir\n")] == [
        "eagle_worker", "speculative_x", "sglang_dir"]
