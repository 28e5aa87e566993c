"""Run ON the host, under the LAUNCH's interpreter, options, environment and cwd: what would the
server import? (stdlib only, Python >= 3.8 grammar; no `from __future__`.)

The agent starts `INTERPRETER [launch options] -c <this file> ` with exactly the environment and
working directory the launch will have, and writes one request on stdin, marshalled (format 2,
which every Python 3 reads; the agent is the only writer), a dict:

    {"path0": dir or null, "files": [rel, ...], "checks": [{"file": rel, "class": C, "marker": m}],
     "package": the engine's package name (from the controller's request) or null}

`path0` replaces sys.path[0] (`''` under -c) the way the launch would set it: the cwd for `-m`, the
script's directory for a script. The answer (stdout, JSON written by `dumps` below: importing the
json module costs a Python start ~10-20 ms more, its `re` and `enum` imports, on every probe) says
which python runs, its sys.path, bytecode settings (cache tag, optimize level, pycache prefix, --check-hash-based-pycs), where
`package` is found (`package_dir`; importlib, nothing is imported), and per file what import would load:

    {"loader": "source" | "sourceless" | "extension" | "none", "file": path loaded,
     "pyc": the __pycache__ file import reads for this source (under the prefix and opt level),
     "pyc_kind": "timestamp" | "checked-hash" | "unchecked-hash" | "invalid",
     "pyc_used": import would run the pyc instead of compiling the source,
     "stale": the pyc it would run was NOT compiled from the source on disk,
     "other_pycs": other bytecode files of this module (other interpreters / opt levels)}

`checks` load the code object import would execute (the pyc when it would be used, else the
source compiled) and say whether `class.__init__` holds a string constant containing the marker.
The simulator (fleetctl/sandbox/simulator.py) uses the same functions locally.
"""

import marshal
import os
import sys

MAX_FILE = 64 << 20
# the module files this interpreter had loaded before the probe ran (site, sitecustomize, what a .pth
# imported): what decided its sys.path, for a seal (agent_seal.py)
STARTUP_FILES = sorted(set(f for f in (getattr(m, "__file__", None) for m in list(sys.modules.values()))
                           if isinstance(f, str) and f))


def _bootstrap_external():
    """The module importlib.util takes MAGIC_NUMBER and cache_from_source from (frozen, loaded at
    every start): importlib.util itself imports contextlib (~3 ms of every probe and agent)."""
    import importlib._bootstrap_external

    return importlib._bootstrap_external


def find_spec(name):
    """importlib.util.find_spec(name): for a top-level name not yet imported, the very function it
    calls (importlib._bootstrap._find_spec over sys.meta_path), without importing importlib.util."""
    if "." in name or name in sys.modules:
        import importlib.util

        return importlib.util.find_spec(name)
    import importlib._bootstrap

    return importlib._bootstrap._find_spec(name, None)


def _pyc_header(data):
    """(kind, header dict) of a pyc's 16-byte header; kind "invalid" if import would reject it."""
    if len(data) < 16 or data[:4] != _bootstrap_external().MAGIC_NUMBER:
        return "invalid", {}
    flags = int.from_bytes(data[4:8], "little")
    if flags & ~0b11:
        return "invalid", {}
    if flags & 0b1:
        return ("checked-hash" if flags & 0b10 else "unchecked-hash"), {"hash": data[8:16]}
    return "timestamp", {"mtime": int.from_bytes(data[8:12], "little"),
                         "size": int.from_bytes(data[12:16], "little")}


def _check_hash_mode():
    try:
        import _imp

        return getattr(_imp, "check_hash_based_pycs", "default")
    except ImportError:
        return "default"


def other_pycs(source_path):
    """Every bytecode file of this module besides the one import would read: __pycache__ entries of
    other interpreters / optimize levels, the pycache-prefix tree, a sourceless .pyc beside it."""
    d, base = os.path.split(source_path)
    stem = base[:-3] if base.endswith(".py") else base
    found = []
    dirs = [os.path.join(d, "__pycache__")]
    prefix = getattr(sys, "pycache_prefix", None)
    if prefix:
        dirs.append(os.path.join(prefix, os.path.abspath(d).lstrip(os.sep)))
    for cd in dirs:
        try:
            names = sorted(os.listdir(cd))
        except OSError:
            continue
        for n in names:
            if n.startswith(stem + ".") and n.endswith(".pyc") and "." not in n[len(stem) + 1:-4].replace(".opt-", "-"):
                found.append(os.path.join(cd, n))
    beside = os.path.join(d, stem + ".pyc")
    if os.path.isfile(beside):
        found.append(beside)
    return found


def import_view(path):
    """What `import` of the module whose source is `path` would load, under this interpreter."""
    import importlib.machinery

    d, base = os.path.split(path)
    stem = base[:-3] if base.endswith(".py") else base
    out = {"loader": "none", "file": None, "pyc": None, "pyc_kind": None, "pyc_used": False, "stale": False}
    # the path finder's order: extension modules, then source, then sourceless bytecode
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = os.path.join(d, stem + suffix)
        if os.path.isfile(p):
            out.update(loader="extension", file=p)
            out["other_pycs"] = other_pycs(path)
            return out
    if not os.path.isfile(path):
        p = os.path.join(d, stem + ".pyc")
        if os.path.isfile(p):
            out.update(loader="sourceless", file=p)
        return out
    out.update(loader="source", file=path)
    try:
        cfile = _bootstrap_external().cache_from_source(path)
    except NotImplementedError:  # sys.implementation.cache_tag is None: no bytecode cache
        cfile = None
    out["pyc"] = cfile
    out["other_pycs"] = [p for p in other_pycs(path) if p != cfile]
    if cfile is None:
        return out
    try:
        with open(cfile, "rb") as fh:
            head = fh.read(16)
    except OSError:
        out["pyc"] = None
        return out
    kind, h = _pyc_header(head)
    out["pyc_kind"] = kind
    if kind == "invalid":
        return out
    try:
        st = os.stat(path)
    except OSError:
        return out
    if kind == "timestamp":
        # CPython's contract: mtime and size of the source it was compiled from
        out["pyc_used"] = (h["mtime"] == int(st.st_mtime) & 0xFFFFFFFF and h["size"] == st.st_size & 0xFFFFFFFF)
        return out
    with open(path, "rb") as fh:
        source = fh.read(MAX_FILE)
    import importlib.util

    matches = h["hash"] == importlib.util.source_hash(source)
    mode = _check_hash_mode()
    checked = mode != "never" and (kind == "checked-hash" or mode == "always")
    out["pyc_used"] = matches if checked else True
    out["stale"] = out["pyc_used"] and not matches
    return out


def loaded_code(path, view=None):
    """The module code object import would execute for source `path` (None if it cannot be read)."""
    import marshal

    view = view or import_view(path)
    try:
        if view["loader"] == "sourceless" or (view["loader"] == "source" and view["pyc_used"]):
            with open(view["file"] if view["loader"] == "sourceless" else view["pyc"], "rb") as fh:
                data = fh.read(MAX_FILE)
            return marshal.loads(data[16:])
        if view["loader"] == "source":
            with open(path, "rb") as fh:
                return compile(fh.read(MAX_FILE), path, "exec", dont_inherit=True)
    except (OSError, ValueError, EOFError, TypeError, SyntaxError):
        return None
    return None


def code_marker(code, class_name, marker, function="__init__"):
    """Does the class `class_name` (defined anywhere in `code`) have a `function` (default __init__)
    whose code (nested code included) holds a string constant containing `marker`?"""
    out = {"class": False, "init": False, "marker": False}
    types = type(code)

    def walk(c):
        yield c
        for k in c.co_consts:
            if isinstance(k, types):
                yield from walk(k)

    def strings(c):
        for x in walk(c):
            for k in x.co_consts:
                if isinstance(k, str):
                    yield k

    for c in walk(code):
        if c.co_name != class_name:
            continue
        out["class"] = True
        for k in c.co_consts:
            if isinstance(k, types) and k.co_name == function:
                out["init"] = True
                if any(marker in s for s in strings(k)):
                    out["marker"] = True
                    return out
    return out


def probe(req):
    path0 = req.get("path0")
    if path0 and sys.path and sys.path[0] == "":
        sys.path[0] = path0
    res = {"executable": sys.executable, "version": sys.version.split()[0],
           "version_info": list(sys.version_info[:2]), "path": list(sys.path),
           "cache_tag": sys.implementation.cache_tag, "optimize": sys.flags.optimize,
           "pycache_prefix": getattr(sys, "pycache_prefix", None),
           "dont_write_bytecode": bool(sys.dont_write_bytecode), "check_hash_based_pycs": _check_hash_mode(),
           "pythonpath": os.environ.get("PYTHONPATH"), "cwd": os.getcwd(), "startup": STARTUP_FILES}
    site = sys.modules.get("site")
    if site is not None and getattr(site, "getusersitepackages", None):
        try:
            res["usersite"] = site.getusersitepackages()
        except Exception:
            pass
    spec = None
    if req.get("package"):
        try:
            spec = find_spec(req["package"])
        except (ImportError, ValueError) as e:
            res["error"] = f"{e.__class__.__name__}: {e}"
    pkg = None
    if spec is not None and spec.submodule_search_locations:
        pkg = os.path.abspath(next(iter(spec.submodule_search_locations)))
    res["package_dir"] = pkg
    views = {}
    if pkg:
        for rel in req.get("files") or []:
            views[rel] = import_view(os.path.join(pkg, rel))
        checks = []
        for c in req.get("checks") or []:
            path = os.path.join(pkg, c["file"])
            v = views.get(c["file"]) or import_view(path)
            code = loaded_code(path, v)
            r = {"file": c["file"], "class": c["class"], "marker": c["marker"], "view": v,
                 "loaded": code is not None}
            if code is not None:
                r["check"] = code_marker(code, c["class"], c["marker"], c.get("function") or "__init__")
            checks.append(r)
        res["checks"] = checks
    res["files"] = views
    return res


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _json_str(s):
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'
    out = []
    for ch in s:
        e = _ESCAPES.get(ch)
        if e is not None:
            out.append(e)
        elif " " <= ch < "\x7f":
            out.append(ch)
        else:  # as json.dumps (ensure_ascii): \uXXXX, a surrogate pair above the BMP, lone surrogates kept
            n = ord(ch)
            if n > 0xFFFF:
                n -= 0x10000
                out.append(f"\\u{0xD800 | (n >> 10):04x}\\u{0xDC00 | (n & 0x3FF):04x}")
            else:
                out.append(f"\\u{n:04x}")
    return '"' + "".join(out) + '"'


def _json_key(k):
    if isinstance(k, str):
        return _json_str(k)
    if k is True or k is False or k is None:
        return {True: '"true"', False: '"false"', None: '"null"'}[k]
    if isinstance(k, (int, float)):
        return '"' + dumps(k) + '"'
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def dumps(o):
    """JSON text of `o` (dict, list, tuple, str, int, float, bool, None), as json.dumps(o) reads back."""
    if o is None:
        return "null"
    if o is True:
        return "true"
    if o is False:
        return "false"
    if isinstance(o, str):
        return _json_str(o)
    if isinstance(o, int):
        return int.__repr__(o)
    if isinstance(o, float):
        if o != o:
            return "NaN"
        if o in (float("inf"), float("-inf")):
            return "Infinity" if o > 0 else "-Infinity"
        return float.__repr__(o)
    if isinstance(o, dict):
        return "{" + ", ".join(_json_key(k) + ": " + dumps(v) for k, v in o.items()) + "}"
    if isinstance(o, (list, tuple)):
        return "[" + ", ".join(dumps(v) for v in o) + "]"
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def main():
    data = sys.stdin.buffer.read()
    req = marshal.loads(data) if data else {}
    sys.stdout.write(dumps(probe(req)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
