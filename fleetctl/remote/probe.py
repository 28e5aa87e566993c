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
# imported): what decided its sys.path, for a seal (seal.py)
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


# ----------------------------------------------------------------------------- per-module locate
# The loaders whose code is the file they name (what import runs is `origin`, bytecode aside): the path
# finder's, and what setuptools' PEP 660 finder hands back (spec_from_file_location: the same classes).
_FILE_LOADERS = ("SourceFileLoader", "SourcelessFileLoader", "ExtensionFileLoader")


def _plain_locations(locs):
    """A spec's submodule_search_locations as a plain list: a _NamespacePath of a nested package
    recomputes itself from sys.modules[parent] (not imported here), so its own list is read."""
    if locs is None:
        return None
    try:
        return [str(x) for x in list(locs)]
    except Exception:
        return [str(x) for x in (getattr(locs, "_path", None) or [])]


def _finder_name(finder):
    """Who answered a spec: the finder's class and the file it was defined in."""
    cls = finder if isinstance(finder, type) else type(finder)
    mod = sys.modules.get(getattr(cls, "__module__", "") or "")
    f = getattr(mod, "__file__", None)
    return f"{cls.__module__}.{cls.__qualname__}", (os.path.abspath(f) if isinstance(f, str) else None)


def locate_module(fullname, with_spec=False):
    """Which file `import fullname` would run in this interpreter, WITHOUT running any of its
    packages' code: CPython's own search, level by level (each finder of sys.meta_path asked with
    the parent's search locations: namespace portions, PEP 660 editable finders, .pth paths and any
    meta-path hook a start-up file installed). A parent not imported yet stands in sys.modules, while
    its children are searched, as an empty module with the locations its spec gives (what a
    namespace path reads); a package whose __init__ rewrites its own __path__ is not seen. A name
    already in sys.modules (imported by a start-up hook) is that module."""
    import types

    out = {"module": fullname, "file": None, "loader": None, "finder": None, "finder_file": None,
           "namespace": [], "preloaded": False, "standard": False, "via": []}
    parts = fullname.split(".")
    path = None
    spec = None
    stubs = []
    try:
        for i in range(len(parts)):
            name = ".".join(parts[:i + 1])
            mod = sys.modules.get(name)
            finder = None
            if mod is not None and getattr(mod, "__spec__", None) is not None:
                spec = mod.__spec__
                if name == fullname:
                    out["preloaded"] = True
            else:
                mod = None
                spec = None
                for f in list(sys.meta_path):
                    fs = getattr(f, "find_spec", None)
                    if fs is None:
                        continue
                    try:
                        spec = fs(name, path, None)
                    except (ImportError, ValueError, OSError, KeyError):
                        spec = None
                    if spec is not None:
                        finder = f
                        break
            if spec is None:
                out["error"] = f"No module named {name!r}"
                return (out, None) if with_spec else out
            locs = _plain_locations(getattr(mod, "__path__", None) if mod is not None
                                    else spec.submodule_search_locations)
            if spec.loader is None and locs is not None:  # a namespace package: its portions
                out["namespace"].append({"module": name, "portions": locs})
            if i < len(parts) - 1:
                if locs is None:
                    out["error"] = f"{name!r} is not a package"
                    return (out, None) if with_spec else out
                path = locs
                if mod is None:
                    stub = types.ModuleType(name)
                    stub.__path__ = list(locs)
                    stub.__spec__ = spec
                    sys.modules[name] = stub
                    stubs.append(name)
            if finder is not None:
                fname, ffile = _finder_name(finder)
                if not out["via"] or out["via"][-1][0] != fname:
                    out["via"].append([fname, ffile])
                if i == len(parts) - 1:
                    out["finder"], out["finder_file"] = fname, ffile
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
    loader = spec.loader
    lname = type(loader).__name__ if loader is not None else None
    out["loader"] = lname
    origin = spec.origin if spec.has_location else None
    if lname in _FILE_LOADERS and type(loader).__module__ in ("importlib._bootstrap_external",
                                                              "_frozen_importlib_external"):
        lpath = getattr(loader, "path", None)
        out["standard"] = bool(origin) and (lpath is None or os.path.abspath(lpath) == os.path.abspath(origin))
    if origin:
        out["file"] = os.path.abspath(origin)
    return (out, spec) if with_spec else out


def module_name(package, rel):
    """The module name of package file `rel` (`srt/a/b.py` -> `package.srt.a.b`; `x/__init__.py` -> `package.x`)."""
    stem = rel[:-3] if rel.endswith(".py") else rel
    parts = [p for p in stem.split("/") if p]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def package_root(located):
    """The one directory every located file lies in at its relative path (`root/rel` is the file
    import runs), or None when they disagree (or none was located)."""
    roots = set()
    for rel, m in located.items():
        f = m.get("file")
        if not f:
            continue
        tail = os.sep + rel.replace("/", os.sep)
        if not f.endswith(tail):
            return None
        roots.add(f[:-len(tail)])
    return roots.pop() if len(roots) == 1 else None


# ----------------------------------------------------------------------------- start-up hooks
# What the interpreter's start changed in the environment, and who did it. The probe is started with
# -S and runs site.main() itself (exactly what `import site` does at start), with os.environ's writes
# watched: each change is attributed to the file and line that made it (a sitecustomize.py, a
# usercustomize.py, an executable line of a .pth file).

_ENV_LOG = {}


def _caller_outside(skip):
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not any(fn.endswith(s) for s in skip):
            up = f.f_back
            if fn == "<string>" and up is not None and up.f_code.co_name == "addpackage":
                pth = up.f_locals.get("fullname")  # an executable line of a .pth file (site.addpackage)
                n = up.f_locals.get("n")
                if isinstance(pth, str):
                    return f"{pth}:{n + 1}" if isinstance(n, int) else pth
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return None


def run_site_watched():
    """site.main() with writes to os.environ recorded: {name: where} ('' + how for unknown)."""
    envcls = type(os.environ)
    set0, del0 = envcls.__setitem__, envcls.__delitem__
    skip = ("/os.py", "<frozen os>", "_collections_abc.py", "<frozen _collections_abc>")

    def setitem(self, key, value):
        set0(self, key, value)
        if self is os.environ:
            _ENV_LOG[key] = _caller_outside(skip)

    def delitem(self, key):
        del0(self, key)
        if self is os.environ:
            _ENV_LOG[key] = _caller_outside(skip)

    envcls.__setitem__, envcls.__delitem__ = setitem, delitem
    first = sys.path[0] if sys.path and sys.path[0] == "" else None
    if first is not None:  # sys.path[0] is inserted after site runs at a normal start
        del sys.path[0]
    try:
        import site

        site.main()
    finally:
        envcls.__setitem__, envcls.__delitem__ = set0, del0
        if first is not None:
            sys.path.insert(0, first)


def env_changes(passed, before, after):
    """{name: {"value": new or None (unset), "by": where, "when": "wrapper" | "site"}}: what differs
    between the env the agent passed, the env python started with (a wrapper script's doing) and the
    env after site initialisation."""
    out = {}
    if passed is not None:
        for k in set(passed) | set(before):
            if passed.get(k) != before.get(k):
                out[k] = {"value": before.get(k), "by": None, "when": "wrapper"}
    for k in set(before) | set(after):
        if before.get(k) != after.get(k):
            out[k] = {"value": after.get(k), "by": _ENV_LOG.get(k), "when": "site"}
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
    pkg_name = req.get("package")
    if pkg_name:
        try:
            spec = find_spec(pkg_name)
        except (ImportError, ValueError) as e:
            res["error"] = f"{e.__class__.__name__}: {e}"
    rels = list(req.get("files") or [])
    for c in req.get("checks") or []:
        if c["file"] not in rels:
            rels.append(c["file"])
    pkg = None
    if spec is not None and spec.submodule_search_locations:
        pkg = os.path.abspath(next(iter(spec.submodule_search_locations)))
    located = {}
    if pkg_name and spec is not None:
        # each file as `import package.x.y` would find it (the package's own dir is not assumed)
        for rel in rels:
            located[rel] = locate_module(module_name(pkg_name, rel))
        portions = _plain_locations(spec.submodule_search_locations) if spec.loader is None else None
        if portions is not None:
            res["namespace"] = portions
            root = package_root(located)
            pkg = root  # None: the files come from different places (reported per module)
            if root is None and not any(m.get("file") for m in located.values()):
                fix = ""
                for portion in portions:  # a checkout's root: its package is one level down
                    for sub in ("python", "src", "."):
                        d = os.path.normpath(os.path.join(portion, sub))
                        if os.path.isfile(os.path.join(d, pkg_name, "__init__.py")):
                            fix = (f": install it for this python ({sys.executable} -m pip install -e {d}), "
                                   f"or put {d} on its PYTHONPATH")
                            break
                    if fix:
                        break
                res["error"] = (f"{pkg_name} is only a namespace package here (portions: {', '.join(portions)}, "
                                f"directories without __init__.py on its sys.path) and none of its modules is "
                                f"importable{fix}")
        elif pkg is not None:
            res["top_file"] = spec.origin
        here = [x for x in (_plain_locations(spec.submodule_search_locations) or [spec.origin or ""])
                if path0 and x and os.path.dirname(os.path.abspath(x)) == os.path.abspath(path0)]
        if here and sys.path and sys.path[0] == path0:
            # the launch's sys.path[0] (its cwd for -m) holds the package: what it shadows
            saved = sys.path[0]
            del sys.path[0]
            try:
                alt = find_spec(pkg_name)
            except (ImportError, ValueError):
                alt = None
            finally:
                sys.path.insert(0, saved)
            alt_dir = None
            if alt is not None and alt.submodule_search_locations:
                alt_dir = os.path.abspath(next(iter(alt.submodule_search_locations)))
            res["shadow"] = {"by": here[0], "regular": spec.loader is not None, "installed": alt_dir}
        res["modules"] = dict((rel, m) for rel, m in located.items()
                              if not m["standard"] or m["preloaded"] or m.get("error")
                              or m["file"] != (os.path.join(pkg, rel) if pkg else None))
        served = {}
        for m in located.values():
            for fname, ffile in m.get("via") or []:
                served[fname] = ffile
        res["finders"] = [[k, served[k]] for k in sorted(served)]
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
    before = dict(os.environ)
    if req.get("site"):  # started with -S: the start's site initialisation, watched
        run_site_watched()
    global STARTUP_FILES
    STARTUP_FILES = sorted(set(f for f in (getattr(m, "__file__", None) for m in list(sys.modules.values()))
                               if isinstance(f, str) and f))
    res = probe(req)
    res["env_changes"] = env_changes(req.get("env"), before, dict(os.environ))
    sys.stdout.write(dumps(res))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
