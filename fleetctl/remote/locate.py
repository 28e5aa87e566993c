"""Agent part: launch locating. The launch's environment, cwd and sys.path[0] as the controller
described it, fleetctl's probe (probe.py) run under the launch's interpreter (or in this process when
the launch would start exactly as the agent did: same_start), and `locate_package`: where the launch
imports the engine's package from, its version and install kind.
"""

import marshal
import os
import sys

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.core import ACTIONS, AgentError, expand, jloads, lazy_re, read_json_file



PROBE_TIMEOUT = 30.0
PROBE_MAX_OUT = 4 << 20

# How this interpreter started (before the bootstrap applies the secret-env block): the in-process
# probe is used only when the launch's python would start exactly so (see same_start)
_START_ENV = dict(os.environ)
try:
    _START_CWD = os.getcwd()
except OSError:
    _START_CWD = None
# the interpreter word the controller started the agent with (BOOTSTRAP's second argument)
_AGENT_PYTHON = sys.argv[2] if __name__ == "fleetctl_agent" and len(sys.argv) > 2 and sys.argv[2] else None
# variables the SSH session and login set for this session only: a launch never gets them, and no
# python start reads them. Any other variable the agent has and the launch does not (a login rc's
# PYENV_VERSION, CONDA_PREFIX, ...) could change what the launch's python does: then it is asked.
SESSION_ONLY = frozenset(("SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "MAIL", "PWD", "OLDPWD",
                          "SHLVL", "_", "MOTD_SHOWN", "TERM", "XDG_SESSION_ID", "XDG_SESSION_TYPE",
                          "XDG_SESSION_CLASS", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"))

if __name__ != "fleetctl_agent":  # imported locally; on the host the source is appended as a string
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py"), encoding="utf-8") as _fh:
        PROBE_SOURCE = _fh.read()


def _assign_line(line):
    """(targets, text) of a plain line `a = b: str = 'text'  # comment` (no escapes or quotes in
    the text, no indentation), else None."""
    targets = []
    rest = line
    while True:
        eq = rest.find("=")
        if eq < 0:
            return None
        name, colon, ann = rest[:eq].partition(":")
        name = name.rstrip(" \t")
        if not (name.isascii() and name.isidentifier()) or (colon and ann.strip(" \t") != "str"):
            return None
        targets.append(name)
        rest = rest[eq + 1:].lstrip(" \t")
        if rest[:1] in ("'", '"'):
            break
    end = rest.find(rest[0], 1)
    if end < 0:
        return None
    text = rest[1:end]
    if "'" in text or '"' in text or "\\" in text:
        return None
    tail = rest[end + 1:].lstrip(" \t")
    if tail and tail[0] != "#":
        return None
    return targets, text


def const_assign(source, names):
    """The string constant a top-level `NAME = '...'` (or `a = b = '...'`) gives one of `names`.
    A plain line is read by _assign_line (no re); anything else goes through ast (a few ms)."""
    for line in source.split("\n"):
        m = _assign_line(line)
        if m is not None and any(t in names for t in m[0]):
            return m[1]
    import ast
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            # `__version__ = version = '0.5.9'`
            for t in targets:
                if isinstance(t, ast.Name) and t.id in names and isinstance(value, ast.Constant):
                    if isinstance(value.value, str):
                        return value.value
    return None


# ----------------------------------------------------------------------------- package discovery


def find_dist_info(site_dir, name):
    try:
        entries = os.listdir(site_dir)
    except OSError:
        return None
    pref = name.lower().replace("-", "_") + "-"
    for e in sorted(entries):
        if e.endswith(".dist-info") and e.lower().replace("-", "_", 0).startswith(pref):
            return os.path.join(site_dir, e)
    return None


def read_metadata(dist_dir):
    """The header fields of a dist-info METADATA (up to its first blank line) and its Requires-Dist.
    Reads only as far as the header goes: the long description after it can be most of the file."""
    try:
        with open(os.path.join(dist_dir, "METADATA"), encoding="utf-8", errors="replace") as fh:
            text = ""
            while True:
                chunk = fh.read(16384)
                text += chunk
                if not chunk or "\n\n" in text:
                    break
    except OSError:
        return {}, []
    head = text.split("\n\n", 1)[0]
    fields = {}
    requires = []
    for line in head.splitlines():
        if ":" not in line:
            continue
        k, v = line.split(":", 1)
        v = v.strip()
        if k == "Requires-Dist":
            requires.append(v)
        else:
            fields.setdefault(k, v)
    return fields, requires


def launch_environment(launch):
    """The environment the launch's python sees: the host basics it inherits from this session
    (login environment), the playbook + inventory env, then what an `env` prefix in the launch
    command does (-i, -u NAME, NAME=value). The same computation server_start uses."""
    env = {}
    if not launch.get("clear"):
        for k in launch.get("inherit") or []:
            if k in os.environ:
                env[k] = os.environ[k]
        env.update(dict((str(k), str(v)) for k, v in (launch.get("env") or {}).items()))
        for k in launch.get("unset") or []:
            env.pop(k, None)
    env.update(dict((str(k), str(v)) for k, v in (launch.get("command_env") or {}).items()))
    return env


def launch_path0(launch, cwd):
    """sys.path[0] of the launch's python: the script's directory, the cwd for `-m`, else None."""
    if launch.get("target_kind") == "script":
        return os.path.dirname(os.path.realpath(os.path.join(cwd, launch.get("target") or "")))
    if launch.get("target_kind") == "module":
        return cwd
    return None


def launch_cwd(cwd, env):
    """The working directory a launch runs in: the one asked, else the launch env's HOME, else ~."""
    home = env.get("HOME") or expand("~")
    if cwd and (cwd == "~" or cwd.startswith("~/")):  # launch.cwd: ~ is the launch env's HOME
        cwd = home + cwd[1:]
    cwd = cwd or home
    return cwd if os.path.isdir(cwd) else "/"


def same_start(launch, env, cwd, path0, start_env=None, start_cwd=None, agent_python=None):
    """Would the launch's python start exactly as this agent's did? The same interpreter word (so
    the same resolution, wrapper and flags), no interpreter options, every launch variable set here
    to the same value, and nothing else here but SESSION_ONLY variables and fleetctl's own
    FLEETCTL_* markers. Then the import system the probe would see (sys.path, site dirs and .pth
    files, user site, bytecode flags) is this process's own. The working directory may differ (sshd
    starts sessions in the account's home) only where a start cannot depend on it: the launch's
    sys.path[0] is set (path0) and PYTHONPATH holds only absolute entries (site makes relative ones
    absolute against the cwd)."""
    start_env = _START_ENV if start_env is None else start_env
    start_cwd = _START_CWD if start_cwd is None else start_cwd
    agent_python = _AGENT_PYTHON if agent_python is None else agent_python
    if not agent_python or launch.get("interpreter") != agent_python or launch.get("options") or launch.get("clear"):
        return False
    if not start_cwd:
        return False
    if os.path.realpath(cwd) != os.path.realpath(start_cwd):
        pp = env.get("PYTHONPATH")
        if path0 is None or (pp is not None and not all(os.path.isabs(e) for e in pp.split(os.pathsep))):
            return False
    for k, v in env.items():
        if start_env.get(k) != v:
            return False
    for k in start_env:
        if k not in env and k not in SESSION_ONLY and not k.startswith("FLEETCTL_"):
            return False
    return True


_PROBE_NS = {}


def _probe_code():
    """probe.py compiled: the bootstrap brings it (PROBE_CODE: from the host's verified compiled
    cache, or compiled beside the agent); else compiled here, once per process (nothing is cached
    that the controller could not verify)."""
    pc = globals().get("PROBE_CODE")
    if pc is None:
        pc = globals()["PROBE_CODE"] = compile(PROBE_SOURCE, "fleetctl-probe", "exec")
    return pc


def probe_here(req, cwd):
    """probe.py's answer computed in this process (same_start holds): the same JSON document, with
    sys.path[0] set for the launch only while it runs, and the launch's working directory."""
    if not _PROBE_NS:
        ns = {"__name__": "fleetctl_probe"}
        exec(_probe_code(), ns)
        _PROBE_NS.update(ns)
    saved = list(sys.path)
    try:
        res = _PROBE_NS["probe"](req)  # fresh plain data (what its dumps writes), no round trip
    finally:
        sys.path[:] = saved
    res["cwd"] = os.path.realpath(cwd)  # what os.getcwd() answers in a process started there
    return res


LAST_PROBE = {}  # the last answer of run_probe asked where the package is (seal.py reads it)


def run_probe(launch, files=(), checks=(), timeout=PROBE_TIMEOUT, package=None):
    """Run fleetctl's probe (probe.py) under the launch's interpreter, options, env and cwd.
    Returns the probe's answer, or {"error": why} (bounded in time and output). With `package`, the
    probe also says where that interpreter imports it from (`package_dir`). When the launch's
    python would start exactly as this agent did (same_start), the probe runs in this process:
    one Python start less per host per command."""
    if launch.get("problem"):
        return {"error": launch["problem"], "unresolved": True}
    interp = launch.get("interpreter")
    if not interp:
        return {"error": "the launch command names no python interpreter", "unresolved": True}
    env = launch_environment(launch)
    cwd = launch_cwd(launch.get("cwd"), env)
    path0 = launch_path0(launch, cwd)
    if package:  # (a locate: what a seal is made from; other probes leave it alone)
        LAST_PROBE.clear()
    if same_start(launch, env, cwd, path0):
        res = probe_here({"path0": path0, "files": list(files), "checks": list(checks), "package": package}, cwd)
        res["launch_env_pythonpath"] = env.get("PYTHONPATH")
        if package:
            LAST_PROBE.update(res, in_agent=True)
        return res
    import subprocess
    # marshal format 2 (every Python 3 reads it): the probe need not import json; the request holds
    # only what the controller's request held (str, list, dict, None)
    opts = list(launch.get("options") or [])
    # -S: the probe runs the start's site initialisation itself, watching what it sets in the env
    # (sitecustomize, usercustomize, .pth lines); a launch that passes -S gets none
    site = "-S" not in opts
    req = marshal.dumps({"path0": path0, "files": list(files), "checks": list(checks), "package": package,
                         "site": site, "env": env}, 2)
    argv = [interp, *opts, *(["-S"] if site else []), "-c", PROBE_SOURCE]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=cwd, close_fds=True)
    except OSError as e:
        return {"error": "the launch's python %r cannot run here (PATH=%s): %s"
                         % (interp, env.get("PATH", ""), e.strerror or e)}
    try:
        out, err = proc.communicate(req, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": "the launch's python %r did not answer within %gs" % (interp, timeout)}
    if proc.returncode != 0 or len(out) > PROBE_MAX_OUT:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["exit code %s" % proc.returncode]
        return {"error": "the launch's python %r failed: %s" % (interp, tail[0][:300])}
    try:
        res = jloads(out.decode("utf-8"))
    except ValueError:
        return {"error": "the launch's python %r answered something that is not JSON" % interp}
    if not isinstance(res, dict):
        return {"error": "the launch's python %r answered something unexpected" % interp}
    res["launch_env_pythonpath"] = env.get("PYTHONPATH")
    res["env_changes"] = _start_env_changes(res.get("env_changes"), interp, env)
    if package:
        LAST_PROBE.update(res, in_agent=False)
    return res


def _script_sources(path):
    """(is a script, the files it sources) of the launch's interpreter word: a `python:` shim that
    is a shell script (`. FILE` / `source FILE` lines), else (False, [])."""
    import shutil

    exe = path if os.sep in path else (shutil.which(path) or path)
    try:
        with open(exe, "rb") as fh:
            head = fh.read(65536)
    except OSError:
        return False, []
    if not head.startswith(b"#!"):
        return False, []
    sources = []
    for line in head.decode("utf-8", "replace").splitlines():
        w = line.strip().split()
        if len(w) >= 2 and w[0] in (".", "source"):
            sources.append(w[1])
    return True, sources


def _start_env_changes(changes, interp, env):
    """The probe's env changes, attributed: those made before python ran (by a `python:` shim that
    is a script: its path and what it sources); python's own start-up (PEP 538 sets LC_CTYPE) is
    not a hook. Values of names that look secret are not passed on."""
    if not isinstance(changes, dict):
        return {}
    script = None
    out = {}
    for k, c in changes.items():
        if not isinstance(c, dict):
            continue
        c = dict(c)
        if k == "LC_CTYPE" and c.get("when") == "wrapper" and c.get("value") in ("C.UTF-8", "C.utf8", "UTF-8"):
            continue  # python's own locale coercion (PEP 538), not a hook
        if c.get("when") == "wrapper":
            if script is None:
                script = _script_sources(interp)
            if not script[0]:
                continue
            c["by"] = interp + ("" if not script[1] else " (sources %s)" % ", ".join(script[1]))
        up = k.upper()
        if any(w in up for w in ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")):
            c["value"] = None if c.get("value") is None else "***"
        out[k] = c
    return out


def locate_package(engine, package_dir=None, launch=None, files=(), strict=True):
    """Where the LAUNCH's interpreter would import the engine's package from (its options,
    environment and cwd: `launch`, computed by the controller), its version and install kind, and
    per file of `files` what import would load (bytecode). An inventory package dir (the key
    `engine["dir_key"]`) must be that same directory. `engine`: the request's engine facts.

    Without `launch` (old callers), the agent's own interpreter and environment are asked. With
    strict=False (no playbook: the launch's env is not fully known) a package dir that is not what
    the default launch imports is used, with a note naming both, instead of refused."""
    name, key = engine["package"], engine["dir_key"]
    res = {"found": False}
    if launch is not None:
        pkg = _locate_by_launch(res, name, key, package_dir, launch, files, strict)
        if not pkg:
            return res
    elif package_dir:
        pkg = expand(package_dir)
        if not os.path.isfile(os.path.join(pkg, "__init__.py")):
            raise AgentError("%s %s holds no __init__.py" % (key, pkg), "bad_input")
        res["how"] = "inventory %s" % key
    else:
        import importlib.util

        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as e:
            spec = None
            res["error"] = str(e)
        if spec is None or not spec.submodule_search_locations:
            return res
        pkg = os.path.abspath(list(spec.submodule_search_locations)[0])
        res["how"] = "import path of %s" % sys.executable
    res["found"] = True
    res["dir"] = pkg
    version = _package_version_of(pkg)
    version, kind, requires = _install_kind_of(res, pkg, name, version)
    if res.get("checkout"):
        g = git_info(res["checkout"])
        if g:
            res["git"] = g
    res["version"] = version
    res["install"] = kind
    res["torch_requires"] = [r for r in requires if _is_torch_requirement(r)]
    return res


def _locate_by_launch(res, name, key, package_dir, launch, files, strict):
    """locate_package's answer from the launch probe, filled into `res`: the package dir the launch
    imports (or the inventory's, where that is allowed), or None (res then says why)."""
    pr = run_probe(launch, files, package=name)
    res["launch"] = dict((k, pr.get(k)) for k in ("executable", "version", "cache_tag", "optimize",
                                                  "pycache_prefix", "check_hash_based_pycs", "cwd", "path")
                         if k in pr)
    if pr.get("error") and not pr.get("executable"):
        res["error"] = pr["error"]
        res["unresolved"] = bool(pr.get("unresolved"))
        return None
    notes = []
    login_pp = os.environ.get("PYTHONPATH")
    if login_pp and login_pp != pr.get("launch_env_pythonpath"):
        notes.append("the host's login environment sets PYTHONPATH=%s, which the launch does not pass on "
                     "(it gets PYTHONPATH=%s)" % (login_pp, pr.get("launch_env_pythonpath") or "unset"))
    res["notes"] = notes
    res["bytecode"] = pr.get("files") or {}
    for k in ("modules", "namespace", "finders", "env_changes", "shadow"):
        if pr.get(k):
            res[k] = pr[k]
    pkg = pr.get("package_dir")
    tree = link_tree(pkg) if pkg else None
    if tree:
        res["link_tree"] = tree
    if package_dir:
        pkg = _inventory_dir_against_launch(res, notes, pr, pkg, tree, name, key, package_dir, strict)
    if not pkg:
        if pr.get("error"):
            res["error"] = pr["error"]
        return None
    res["how"] = "import path of the launch (%s)" % pr.get("executable")
    return pkg


def _inventory_dir_against_launch(res, notes, pr, pkg, tree, name, key, package_dir, strict):
    """The inventory's package dir held to what the launch imports (`pkg`): the dir to use."""
    given = expand(package_dir)
    if not os.path.isfile(os.path.join(given, "__init__.py")):
        raise AgentError("%s %s holds no __init__.py" % (key, given), "bad_input")
    why = None
    if pkg and tree and os.path.realpath(given) == os.path.realpath(tree["checkout"]):
        # a strict editable install: the launch imports links into this checkout; fleetctl
        # patches the checkout's files in place of the links (the links then lead to them)
        notes.append("the launch imports %s, a strict editable install's link tree into %s (%s): "
                     "fleetctl patches the checkout's files" % (pkg, given, key))
        res["via_link_tree"] = pkg
        pkg = given
    elif not pkg:
        why = ("%s %s: the launch's python %s imports no %s with the launch's environment and "
               "cwd" % (key, given, pr.get("executable"), name))
    elif os.path.realpath(given) != os.path.realpath(pkg):
        why = ("%s %s is not the %s the launch imports: %s (python %s with the launch's "
               "environment and cwd); fix or remove %s" % (key, given, name, pkg, pr.get("executable"), key))
    if why and strict:
        raise AgentError(why, "bad_input")
    if why:
        notes.append(why + " (without a playbook fleetctl uses %s; with one it refuses)" % key)
        res["dir_mismatch"] = why
        pkg = given
    return pkg


def _package_version_of(pkg):
    """The version the package's own files spell (_version.py, else version.py), or None."""
    version = None
    for fname, names in (("_version.py", ("__version__", "version")), ("version.py", ("__version__",))):
        try:
            with open(os.path.join(pkg, fname), encoding="utf-8") as fh:
                version = const_assign(fh.read(), names)
        except OSError:
            continue
        if version:
            break
    return version


def _install_kind_of(res, pkg, name, version):
    """How the package is installed (wheel, editable, git checkout, source tree), read from its
    dist-info or the tree around it: (version, kind, requirements); the checkout and project go into `res`."""
    site_dir = os.path.dirname(pkg)
    dist = find_dist_info(site_dir, name)
    editable_finder = any(isinstance(f, list) and f and "__editable__" in str(f[0]) for f in res.get("finders") or [])
    if dist is None and (editable_finder or res.get("namespace") or res.get("link_tree")):
        # an editable install keeps its dist-info in site-packages, away from the files: the launch's
        # sys.path entries are searched for it, in order
        for entry in (res.get("launch") or {}).get("path") or []:
            if isinstance(entry, str) and os.path.isabs(entry) and os.path.realpath(entry) != os.path.realpath(site_dir):
                dist = find_dist_info(entry, name)
                if dist:
                    break
    if dist:
        return _installed_from_dist(res, pkg, name, version, dist, editable_finder)
    requires = []
    kind = "unknown"
    # editable installs keep only a .pth/finder in site-packages; look for a git checkout
    d = pkg
    for _ in range(4):
        d = os.path.dirname(d)
        if os.path.exists(os.path.join(d, ".git")):
            kind = "git checkout"
            res["checkout"] = d
            break
    pyproject = os.path.join(os.path.dirname(pkg), "pyproject.toml")
    if os.path.isfile(pyproject):
        with open(pyproject, encoding="utf-8", errors="replace") as fh:
            for m in lazy_re(r'"(torch\s*[=<>!~][^"]*)"').finditer(fh.read()):
                requires.append(m.group(1))
        if kind == "unknown":
            kind = "source tree"
    return version, kind, requires


def _installed_from_dist(res, pkg, name, version, dist, editable_finder):
    """_install_kind_of for a package with a dist-info: (version, 'wheel' or 'editable', requirements)."""
    fields, requires = read_metadata(dist)
    meta = fields.get("Version")
    if version and meta and meta != version and isinstance(res.get("notes"), list):
        # a checkout that moved on (or was rebuilt) without a reinstall: the files decide
        res["notes"].append("the installed metadata %s says %s %s, the files say %s (a checkout that moved "
                            "without a reinstall?): fleetctl goes by the files" % (dist, name, meta, version))
    version = version or meta
    kind = "wheel"
    try:
        du = read_json_file(os.path.join(dist, "direct_url.json"))
        if du.get("dir_info", {}).get("editable"):
            kind = "editable"
            url = du.get("url")
            if isinstance(url, str) and url.startswith("file://"):
                res["project"] = url[7:]
    except (OSError, ValueError, AttributeError):
        pass
    if kind == "wheel" and (editable_finder or res.get("link_tree")):
        kind = "editable"
    d = pkg
    for _ in range(4):
        d = os.path.dirname(d)
        if os.path.exists(os.path.join(d, ".git")):
            res["checkout"] = d
            break
    return version, kind, requires


def git_info(d, timeout=5.0):
    """{"commit", "describe"} of the git checkout `d` (`git describe --tags --long --always`), or None
    where git is not installed or does not answer in time. (subprocess only here: a checkout.)"""
    import subprocess

    out = {}
    for key, args in (("commit", ["rev-parse", "HEAD"]), ("describe", ["describe", "--tags", "--long", "--always"])):
        try:
            p = subprocess.run(["git", "-C", d, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, timeout=timeout, close_fds=True)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = p.stdout[:200].decode("ascii", "replace").strip()
        if p.returncode != 0 or not text or any(c.isspace() for c in text):
            return out or None
        out[key] = text
    return out


def link_tree(pkg):
    """A setuptools strict editable install's link tree (`PROJECT/build/__editable__.NAME-.../PKG`,
    whose files are links into the checkout): {"tree", "checkout", "project"}, else None."""
    parent = os.path.dirname(pkg)
    if not os.path.basename(parent).startswith("__editable__.") or os.path.basename(os.path.dirname(parent)) != "build":
        return None
    init = os.path.join(pkg, "__init__.py")
    if not os.path.islink(init):
        return None
    checkout = os.path.dirname(os.path.realpath(init))
    return {"tree": pkg, "checkout": checkout, "project": os.path.dirname(os.path.dirname(parent))}


def _is_torch_requirement(r):
    """r names torch: `torch`, then optional space, then its end or a specifier, marker or extra."""
    rest = r[5:].lstrip() if r.startswith("torch") else None
    return rest is not None and (rest == "" or rest[0] in "=<>!~;[(")


def action_locate(p):
    """Where the launch imports the engine's package from, and what import would load for `files` /
    `checks`."""
    return run_probe(p["launch"], p.get("files") or [], p.get("checks") or [],
                     package=(p.get("engine") or {}).get("package"))


ACTIONS.update({"locate": action_locate})
