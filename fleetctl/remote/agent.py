"""fleetctl's remote agent: stdlib-only, runs on the host under the host's SGLang interpreter.

Protocol: the controller runs `PYTHON -c BOOTSTRAP CACHE_DIR PYTHON KEY MAGIC CODEKEY`; the bootstrap
writes a hello (transport/session.py: is this agent's code cached here, verified by its hash; this
interpreter's bytecode magic); unless it is cached the controller sends the core's stripped source,
compressed (fleetctl/remote/__init__.py), which the bootstrap compiles and keeps; a part outside the
core (ON_DEMAND) comes with the first request that needs it (load_part), then (session mode, what the controller
uses) b"S" and requests framed as a 10-digit
length + marshal data (format 4: dict/list/str/int/float/bool/None only; the controller is trusted
in this direction) {"action": ..., ...}, each answered on stdout as a 10-digit length + JSON (the
controller checks every answer as untrusted), until stdin ends; or (one-shot mode) one marshalled
request up to EOF, answered by one JSON document on stdout. An answer is {"ok": true, "result": ...}
or {"ok": false, "error": "...", "kind": "..."}. JSON is written and read here without the json
module (jdumps/jloads below).
Every action is a function here taking the payload dict; they are unit-testable locally.

The agent knows no engine: which package to locate, the file that registers server flags and the
inventory key that pins the package dir come in each request as `engine` (fleetctl/engines/base.py,
`Engine.agent_facts()`).
"""


import marshal
import os
import stat
import sys
import time

# Imports the agent avoids on its common paths (facts, deploy, status, rollback): json (re, enum,
# functools, collections), re, hashlib (OpenSSL's _hashlib), signal (enum), subprocess, tempfile,
# shutil. A Python start costs ~12-16 ms of CPU; these would add as much again on every host per
# command. They are imported inside the few functions that need them.

AGENT_PROTOCOL = 1
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


class AgentError(Exception):
    def __init__(self, message, kind="failed"):
        Exception.__init__(self, message)
        self.kind = kind


# ----------------------------------------------------------------------------- JSON, sha256, regexes
# without json/hashlib/re (see the imports above)

_JSON_ESC = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _jstr(s):
    """A JSON string literal of s, ASCII only, as json.dumps(s) (ensure_ascii) writes it: \\uXXXX
    for the rest, a surrogate pair above the BMP, a lone surrogate (a surrogateescape'd byte of a
    file name) as itself."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'
    out = ['"']
    for ch in s:
        e = _JSON_ESC.get(ch)
        if e is not None:
            out.append(e)
        elif " " <= ch < "\x7f":
            out.append(ch)
        else:
            n = ord(ch)
            if n > 0xFFFF:
                n -= 0x10000
                out.append("\\u%04x\\u%04x" % (0xD800 | (n >> 10), 0xDC00 | (n & 0x3FF)))
            else:
                out.append("\\u%04x" % n)
    out.append('"')
    return "".join(out)


def _jfloat(o):
    if o != o:
        return "NaN"
    if o == float("inf"):
        return "Infinity"
    if o == float("-inf"):
        return "-Infinity"
    return float.__repr__(o)


def _jkey(k):
    if isinstance(k, str):
        return _jstr(k)
    if k is True:
        return '"true"'
    if k is False:
        return '"false"'
    if k is None:
        return '"null"'
    if isinstance(k, int):
        return '"%s"' % int.__repr__(k)
    if isinstance(k, float):
        return '"%s"' % _jfloat(k)
    raise TypeError("keys must be str, int, float, bool or None, not %s" % k.__class__.__name__)


def _jwrite(o, out, indent, sort_keys, level):
    if o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif isinstance(o, str):
        out.append(_jstr(o))
    elif isinstance(o, int):
        out.append(int.__repr__(o))
    elif isinstance(o, float):
        out.append(_jfloat(o))
    elif isinstance(o, (dict, list, tuple)):
        if level > 500:
            raise ValueError("nested too deeply")
        items = o.items() if isinstance(o, dict) else o
        if not items:
            out.append("{}" if isinstance(o, dict) else "[]")
            return
        if isinstance(o, dict) and sort_keys:
            items = sorted(items)
        opening, closing = ("{", "}") if isinstance(o, dict) else ("[", "]")
        if indent is None:
            sep, first, last = ", ", opening, closing
        else:
            pad = "\n" + " " * (indent * (level + 1))
            sep, first, last = "," + pad, opening + pad, "\n" + " " * (indent * level) + closing
        out.append(first)
        for i, item in enumerate(items):
            if i:
                out.append(sep)
            if isinstance(o, dict):
                out.append(_jkey(item[0]))
                out.append(": ")
                item = item[1]
            _jwrite(item, out, indent, sort_keys, level + 1)
        out.append(last)
    else:
        raise TypeError("Object of type %s is not JSON serializable" % o.__class__.__name__)


_C_ENCODER = {}


def _c_encoder(sort_keys=False):
    """json.dumps's own C encoder (the stdlib's _json), set up as json.dumps(o, sort_keys=sort_keys)
    sets it up, without importing json; None where _json is missing."""
    if sort_keys not in _C_ENCODER:
        try:
            from _json import encode_basestring_ascii, make_encoder
        except ImportError:
            _C_ENCODER[sort_keys] = None
        else:
            def default(o):
                raise TypeError("Object of type %s is not JSON serializable" % o.__class__.__name__)

            _C_ENCODER[sort_keys] = lambda o: make_encoder({}, default, encode_basestring_ascii, None, ": ", ", ",
                                                           bool(sort_keys), False, True)(o, 0)
    return _C_ENCODER[sort_keys]


def jdumps(o, indent=None, sort_keys=False, native=True):
    """JSON text of o (dict, list, tuple, str, int, float, bool, None), the text json.dumps(o,
    indent=indent, sort_keys=sort_keys) writes (ASCII: ensure_ascii). A compact document goes
    through json.dumps's own C encoder where there is one (native), else the writer above."""
    enc = _c_encoder(sort_keys) if native and indent is None else None
    if enc is not None:
        return "".join(enc(o))
    out = []
    _jwrite(o, out, indent, sort_keys, 0)
    return "".join(out)


class _JSONContext:
    """What the C scanner of the stdlib's _json (json.loads's own parser) reads from its context."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
    memo = None


_JSON_SCAN = []
_JSON_WS = " \t\n\r"


def jloads(data):
    """json.loads(data) for bytes or str: the same parser (the C scanner of the stdlib's _json,
    without importing json and with it re and enum); the json module where _json is missing or the
    text is not UTF-8 (json.loads detects UTF-16/32). Raises ValueError for what json.loads refuses
    (a malformed document imports json.decoder for its error: only then)."""
    if isinstance(data, (bytes, bytearray)):
        if data[:3] == b"\xef\xbb\xbf":
            data = data[3:]
        elif b"\x00" in data[:4]:
            import json

            return json.loads(data)
        data = data.decode("utf-8")
    if not _JSON_SCAN:
        try:
            from _json import make_scanner

            _JSON_SCAN.append(make_scanner(_JSONContext()))
        except ImportError:
            import json

            _JSON_SCAN.append(None)
    scan = _JSON_SCAN[0]
    if scan is None or data.startswith("\ufeff"):
        import json

        return json.loads(data)
    start = len(data) - len(data.lstrip(_JSON_WS))
    try:
        obj, end = scan(data, start)
    except StopIteration:
        raise ValueError("Expecting value: char %d" % start) from None
    if data[end:].strip(_JSON_WS):
        raise ValueError("Extra data: char %d" % end)
    return obj


def read_json_file(path):
    """jloads of a file's bytes (OSError, ValueError as json.load raises them)."""
    with open(path, "rb") as fh:
        return jloads(fh.read())


_SHA256 = {}
# The builtin sha256 hashes ~230 MB/s here, OpenSSL's ~1.3 GB/s (SHA-NI) but loading _hashlib costs
# ~2.5 ms (as much as ~0.6 MB through the builtin one): past this many bytes in one agent process
# the rest goes through OpenSSL; so does a request that carries at least OPENSSL_CONTENT bytes of
# files to write, from its start: a deploy hashes about twice what it writes (the bytes it replaces,
# read once under the lock; what it wrote, read back; the seal's and the servers' readings of the
# same files come from the request's memo): ~0.7 MB for the SGLang playbooks' ~0.34 MB, where the
# two cost the same (~2.6 ms); more content, OpenSSL is cheaper. Facts (~0.3 MB) and a deploy that
# writes nothing stay builtin.
BUILTIN_SHA256_BYTES = 2 << 20
OPENSSL_CONTENT = 128 << 10
_SHA256_BYTES = [0]


def sha256_new(data=b"", size=None):
    """A sha256 object: the interpreter's builtin implementation (_sha256 in 3.8-3.11, _sha2 from
    3.12) while this process has hashed at most BUILTIN_SHA256_BYTES with it, then hashlib's
    (OpenSSL). `size`: how many bytes will be fed to it (default: len(data))."""
    n = len(data) if size is None else size
    big = _SHA256_BYTES[0] + n > BUILTIN_SHA256_BYTES
    f = _SHA256.get(big)
    if f is None:
        f = None
        if not big:
            try:
                from _sha256 import sha256 as f
            except ImportError:
                try:
                    from _sha2 import sha256 as f
                except ImportError:
                    pass
        if f is None:
            try:
                from _hashlib import openssl_sha256 as f  # (hashlib.py itself adds ~1 ms to load)
            except ImportError:
                from hashlib import sha256 as f
        _SHA256[big] = f
    if not big:
        _SHA256_BYTES[0] += n
    return f(data)


_RX = {}


def lazy_re(pattern, flags=0):
    """re.compile(pattern, flags), importing re (and enum) on first use only, once per pattern."""
    key = (pattern, flags)
    rx = _RX.get(key)
    if rx is None:
        import re

        rx = _RX[key] = re.compile(pattern, flags)
    return rx


# ----------------------------------------------------------------------------- small helpers


def expand(path):
    return os.path.abspath(os.path.expanduser(path))


# Within one request a file hashed again (a manifest's file that is also a hashed package file; a
# no-op deploy's check under the lock and its final hashes) is not read again while it is the same
# inode with the same size, mtime and ctime. The agent's own writes (replace_file, write_atomic)
# always rename a new inode into place, so a file it wrote is always hashed afresh; the memo is
# dropped at the end of every request (the next request, e.g. a deploy after facts, reads again).
_SHA_MEMO = [None]


def sha256_file(path, chunk=1 << 20):
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        memo = _SHA_MEMO[0]
        key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if memo is not None and key in memo:
            return memo[key]
        h = sha256_new(size=st.st_size)
        while True:
            b = fh.read(chunk)
            if not b:
                break
            h.update(b)
    digest = h.hexdigest()
    if memo is not None:
        memo[key] = digest
    return digest


def unwritable(d, subject="its directory"):
    """Why this user cannot make and rename files in directory `d` (a deploy's temp file and swap),
    as a clause about `subject`, or None where it can. A directory not made yet is judged by the
    nearest one that exists (what makedirs would write in)."""
    asked = d
    while not os.path.isdir(d):
        up = os.path.dirname(d)
        if up == d:
            return None
        d = up
    if os.access(d, os.W_OK | os.X_OK):
        return None
    where = subject if d == asked else "%s (its parent %s)" % (subject, d)
    try:
        if os.statvfs(d).f_flag & os.ST_RDONLY:
            return "%s is on a read-only file system" % where
        st = os.stat(d)
    except OSError as e:
        return "%s cannot be read: %s" % (where, e.strerror or e)
    me, owner = os.getuid(), st.st_uid
    why = " (immutable, or denied by a security module?)" if me in (0, owner) else ""
    return "%s is not writable by %s (owner %s, mode %o)%s" % (
        where, _user_name(me), _user_name(owner), stat.S_IMODE(st.st_mode), why)


def _user_name(uid):
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OSError):
        return "uid %d" % uid


def file_info(pkg_dir, rel):
    """Hash and metadata of pkg_dir/rel, flagging symlinks and paths that leave pkg_dir."""
    path = os.path.join(pkg_dir, rel)
    info = {"path": rel, "exists": False}
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return info
    except OSError as e:
        info["error"] = "%s: %s" % (e.__class__.__name__, e.strerror)
        return info
    info["exists"] = True
    real = os.path.realpath(path)
    pkg_real = os.path.realpath(pkg_dir)
    info["escapes"] = not (real == pkg_real or real.startswith(pkg_real + os.sep))
    if stat.S_ISLNK(st.st_mode):
        info["symlink"] = os.readlink(path)
    if info["escapes"]:
        return info
    try:
        st = os.stat(path)
    except OSError as e:
        info["error"] = "%s: %s" % (e.__class__.__name__, e.strerror)
        return info
    if not stat.S_ISREG(st.st_mode):
        info["error"] = "not a regular file"
        return info
    info.update(mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid, size=st.st_size,
                mtime=st.st_mtime)
    why = unwritable(os.path.dirname(path))
    if why:
        info["unwritable"] = why
    try:
        info["sha256"] = sha256_file(path)
    except OSError as e:
        info["error"] = "%s: %s" % (e.__class__.__name__, e.strerror)
    return info


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


def _const_assign(source, names):
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


def read_os():
    u = os.uname()
    out = {"system": u.sysname, "release": u.release, "machine": u.machine}
    try:
        with open("/etc/os-release") as fh:
            kv = dict(
                line.rstrip("\n").split("=", 1) for line in fh if "=" in line and not line.startswith("#")
            )
        out["pretty"] = kv.get("PRETTY_NAME", "").strip('"')
    except OSError:
        out["pretty"] = "%s %s" % (out["system"], out["release"])
    return out


# ----------------------------------------------------------------------------- package discovery


def _find_dist_info(site_dir, name):
    try:
        entries = os.listdir(site_dir)
    except OSError:
        return None
    pref = name.lower().replace("-", "_") + "-"
    for e in sorted(entries):
        if e.endswith(".dist-info") and e.lower().replace("-", "_", 0).startswith(pref):
            return os.path.join(site_dir, e)
    return None


def _metadata(dist_dir):
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


LAST_PROBE = {}  # the last answer of run_probe asked where the package is (agent_seal.py reads it)


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
        pr = run_probe(launch, files, package=name)
        res["launch"] = dict((k, pr.get(k)) for k in ("executable", "version", "cache_tag", "optimize",
                                                      "pycache_prefix", "check_hash_based_pycs", "cwd", "path")
                             if k in pr)
        if pr.get("error") and not pr.get("executable"):
            res["error"] = pr["error"]
            res["unresolved"] = bool(pr.get("unresolved"))
            return res
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
        if not pkg:
            if pr.get("error"):
                res["error"] = pr["error"]
            return res
        res["how"] = "import path of the launch (%s)" % pr.get("executable")
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
    version = None
    for fname, names in (("_version.py", ("__version__", "version")), ("version.py", ("__version__",))):
        try:
            with open(os.path.join(pkg, fname), encoding="utf-8") as fh:
                version = _const_assign(fh.read(), names)
        except OSError:
            continue
        if version:
            break
    site_dir = os.path.dirname(pkg)
    dist = _find_dist_info(site_dir, name)
    editable_finder = any(isinstance(f, list) and f and "__editable__" in str(f[0]) for f in res.get("finders") or [])
    if dist is None and (editable_finder or res.get("namespace") or res.get("link_tree")):
        # an editable install keeps its dist-info in site-packages, away from the files: the launch's
        # sys.path entries are searched for it, in order
        for entry in (res.get("launch") or {}).get("path") or []:
            if isinstance(entry, str) and os.path.isabs(entry) and os.path.realpath(entry) != os.path.realpath(site_dir):
                dist = _find_dist_info(entry, name)
                if dist:
                    break
    requires = []
    kind = "unknown"
    if dist:
        fields, requires = _metadata(dist)
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
    else:
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
    if res.get("checkout"):
        g = git_info(res["checkout"])
        if g:
            res["git"] = g
    res["version"] = version
    res["install"] = kind
    res["torch_requires"] = [r for r in requires if _is_torch_requirement(r)]
    return res


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


# ----------------------------------------------------------------------------- model config.json

MODEL_CONFIG_MAX = 4 << 20  # bytes; a larger config.json is not read
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_HUB_CHARS = _ALNUM | frozenset("._-")
_HEX = frozenset("0123456789abcdef")


def _word(s, rest, longest, first=_ALNUM):
    """s is 1..longest characters, the first from `first`, the others from `rest` (no re)."""
    return 0 < len(s) <= longest and s[0] in first and rest.issuperset(s)


def _hub_id_ok(s):
    """`name` or `org/name`, each part 1-96 of letters, digits, . _ - starting with a letter or digit."""
    parts = s.split("/")
    return len(parts) <= 2 and all(_word(x, _HUB_CHARS, 96) for x in parts)


def _revision_ok(s):
    return _word(s, _HUB_CHARS | frozenset("/"), 128)


def _commit_ok(s):
    return len(s) == 40 and _HEX.issuperset(s)


def _ident_ok(s):
    return len(s) <= 128 and s.isascii() and s.isidentifier()


def _home_of(env):
    """What os.path.expanduser('~') gives the launch's python: its HOME, else the passwd entry."""
    if env.get("HOME"):
        return env["HOME"]
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir
    except Exception:
        return "/"


def hub_cache_dir(env, home):
    """The HF hub cache the launch's environment selects (huggingface_hub's precedence; mirrors
    fleetctl/engines/sglang/model_config.py, held to it by tests)."""
    def exp(p):
        return home + p[1:] if p == "~" or p.startswith("~/") else p
    if env.get("HF_HUB_CACHE"):
        return exp(env["HF_HUB_CACHE"])
    if env.get("HUGGINGFACE_HUB_CACHE"):
        return exp(env["HUGGINGFACE_HUB_CACHE"])
    if env.get("HF_HOME"):
        return os.path.join(exp(env["HF_HOME"]), "hub")
    return os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "huggingface", "hub")


def _read_bounded(path, limit):
    """The bytes of a regular file (symlinks followed, as the loader does), at most `limit`; never
    blocks on a FIFO or device."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > limit:
        raise ValueError("larger than %d bytes" % limit)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
    finally:
        os.close(fd)
    if n > limit:
        raise ValueError("larger than %d bytes" % limit)
    return b"".join(chunks)


def model_config_path(model_path, revision, env, home, cwd):
    """Which config.json the launch's SGLang would load for `model_path`: (path, None) or
    (None, why not). A local directory wins; otherwise a hub id is looked up in the HF cache."""
    if not model_path or "\x00" in model_path:
        return None, "no model path"
    local = model_path if os.path.isabs(model_path) else os.path.join(cwd, model_path)
    if os.path.isdir(local):
        return os.path.join(os.path.normpath(local), "config.json"), None
    rev = revision or "main"
    if not _hub_id_ok(model_path) or ".." in model_path or not _revision_ok(rev) or ".." in rev:
        return None, "%s is neither a directory nor a hub model id" % local
    repo = os.path.join(hub_cache_dir(env, home), "models--" + model_path.replace("/", "--"))
    ref = os.path.join(repo, "refs", rev)
    commit = None
    try:
        commit = _read_bounded(ref, 256).decode("ascii", "replace").strip()
    except (OSError, ValueError):
        if _commit_ok(rev):
            commit = rev
    if commit is None:
        return None, "%s is not a directory and the HF cache has no %s" % (local, ref)
    if not _commit_ok(commit):
        return None, "%s does not hold a commit hash" % ref
    return os.path.join(repo, "snapshots", commit, "config.json"), None


def read_model_config(model, launch):
    """The target model's config.json, read on this host exactly as the launch would find it (its
    environment: HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME; its working directory). Returns the
    fields routing needs (`architectures`, `model_type`) or {"error": why}; bounded and validated."""
    env = launch_environment(launch or {})
    cwd = launch_cwd((launch or {}).get("cwd"), env)
    path, why = model_config_path(model.get("path"), model.get("revision"), env, _home_of(env), cwd)
    if path is None:
        return {"error": why}
    try:
        data = _read_bounded(path, MODEL_CONFIG_MAX)
    except OSError as e:
        return {"error": "%s: %s" % (path, e.strerror or e.__class__.__name__), "path": path}
    except ValueError as e:
        return {"error": "%s: %s" % (path, e), "path": path}
    try:
        doc = jloads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {"error": "%s: not JSON" % path, "path": path}
    archs = doc.get("architectures") if isinstance(doc, dict) else None
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) and _ident_ok(a)
                                                           for a in archs[:8]):
        return {"error": "%s: no valid `architectures` list" % path, "path": path}
    mt = doc.get("model_type")
    return {"path": path, "architectures": archs[:8],
            "model_type": mt if isinstance(mt, str) and _ident_ok(mt) else None}


LAUNCH_FILE_MAX = 1 << 20  # bytes; a larger file named by a launch flag is not read


def read_launch_files(paths, launch):
    """Files the launch's flags name (an adaptive config), read as the launched server would open
    them: a relative path from the launch's working directory. {path: {"data": base64} or {"error"}}."""
    import base64

    env = launch_environment(launch or {})
    cwd = launch_cwd((launch or {}).get("cwd"), env)
    out = {}
    for path in list(paths or [])[:8]:
        if not isinstance(path, str) or not path or "\x00" in path or len(path) > 4096:
            continue
        full = path if os.path.isabs(path) else os.path.join(cwd, path)
        try:
            out[path] = {"data": base64.b64encode(_read_bounded(full, LAUNCH_FILE_MAX)).decode("ascii")}
        except OSError as e:
            out[path] = {"error": "%s: %s" % (full, e.strerror or e.__class__.__name__)}
        except ValueError as e:
            out[path] = {"error": "%s: %s" % (full, e)}
    return out


def torch_version():
    """The version of the torch distribution this interpreter would see first on sys.path (what
    importlib.metadata.version('torch') answers, without importing importlib.metadata: ~15 ms)."""
    for d in sys.path:
        try:
            entries = os.listdir(d or ".")
        except OSError:
            continue
        for e in sorted(entries):
            base, dot, ext = e.rpartition(".")
            if ext not in ("dist-info", "egg-info") or not dot:
                continue
            name, _, version = base.partition("-")
            if name.lower().replace("-", "_") != "torch" or not version:
                continue
            fields, _ = _metadata(os.path.join(d or ".", e)) if ext == "dist-info" else ({}, [])
            return fields.get("Version") or version.split("-")[0]
    return None


def spec_files(pkg_dir, dirs, extra):
    """Relative paths to hash: every file under `dirs` (recursively) plus `extra`."""
    rels = []
    for d in dirs:
        base = os.path.join(pkg_dir, d)
        for root, subdirs, files in os.walk(base):
            subdirs[:] = sorted(s for s in subdirs if s != "__pycache__")
            for f in sorted(files):
                rels.append(os.path.relpath(os.path.join(root, f), pkg_dir))
    for r in extra:
        if r not in rels:
            rels.append(r)
    return rels


def flag_registered(server_args_text, flag):
    """Does this server_args.py source register `flag`? Either the option string is spelled out, or
    ServerArgs has a field of that name (newer releases derive options from annotated fields)."""
    if ('"%s"' % flag) in server_args_text or ("'%s'" % flag) in server_args_text:
        return True
    dest = flag.lstrip("-").replace("-", "_")
    import re

    if re.search(r"^[ \t]+%s[ \t]*:" % re.escape(dest), server_args_text, re.M) is not None:
        return True
    # argparse also takes an unambiguous prefix of an option (allow_abbrev, on in SGLang's parser):
    # registered if it starts exactly one option string the file spells out
    if flag.startswith("--") and len(flag) > 3:
        options = set(re.findall(r"""["'](--[A-Za-z0-9][A-Za-z0-9_-]*)["']""", server_args_text))
        return len([o for o in options if o.startswith(flag)]) == 1
    return False


def registered_flags(pkg_dir, flags, args_file):
    """Which of `flags` the installed `args_file` (package-relative, the engine's) registers."""
    try:
        with open(os.path.join(pkg_dir, *args_file.split("/")), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return {}
    return dict((f, flag_registered(text, f)) for f in flags)


def which(name):
    """shutil.which(name) for a bare name, without importing shutil (fnmatch, re)."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _exit_code(status):
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1


def run_bounded(argv, timeout, limit=4 << 20):
    """(exit code, stdout, stderr) of `argv` (argv[0] a path; stdin /dev/null; this environment),
    each output capped at `limit` bytes; killed (and TimeoutError raised) past `timeout` seconds.
    subprocess.run without importing subprocess (signal, threading, selectors: ~7 ms per host)."""
    if not hasattr(os, "posix_spawn"):
        import subprocess

        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError("no answer within %gs" % timeout) from None
        return p.returncode, p.stdout[:limit], p.stderr[:limit]
    import select

    r_out, w_out = os.pipe()  # not inheritable: only the dup2'd copies reach the child
    r_err, w_err = os.pipe()
    try:
        pid = os.posix_spawn(argv[0], list(argv), os.environ,
                             file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                           (os.POSIX_SPAWN_DUP2, w_out, 1), (os.POSIX_SPAWN_DUP2, w_err, 2)])
    except BaseException:
        for fd in (r_out, w_out, r_err, w_err):
            os.close(fd)
        raise
    os.close(w_out)
    os.close(w_err)
    bufs = {r_out: [], r_err: []}
    sizes = {r_out: 0, r_err: 0}
    open_fds = [r_out, r_err]
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, 9)  # SIGKILL (the signal module imports enum)
                os.waitpid(pid, 0)
                pid = None
                raise TimeoutError("no answer within %gs" % timeout)
            ready = select.select(open_fds, [], [], left)[0]
            for fd in ready:
                b = os.read(fd, 65536)
                if not b:
                    open_fds.remove(fd)
                elif sizes[fd] < limit:
                    bufs[fd].append(b[:limit - sizes[fd]])
                    sizes[fd] += len(b)
        status = os.waitpid(pid, 0)[1]
        pid = None
    finally:
        if pid is not None:  # an error while reading: never leave the child behind
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
        os.close(r_out)
        os.close(r_err)
    return _exit_code(status), b"".join(bufs[r_out]), b"".join(bufs[r_err])


def gpu_queries(timeout=20):
    exe = which("nvidia-smi")
    if not exe:
        return {"available": False, "reason": "nvidia-smi not found on PATH"}
    out = {"available": True, "path": exe}
    queries = {
        "gpus": ["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu",
                 "--format=csv"],
        "apps": ["--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid", "--format=csv"],
    }
    for key, args in queries.items():
        try:
            rc, stdout, stderr = run_bounded([exe, *args], timeout)
        except (OSError, TimeoutError) as e:
            out["available"] = False
            out["reason"] = "nvidia-smi failed: %s" % e
            return out
        if rc != 0:
            out["available"] = False
            out["reason"] = "nvidia-smi exit %d: %s" % (rc, stderr.decode(errors="replace").strip()[:200])
            return out
        out[key] = stdout.decode(errors="replace")
    return out


# ----------------------------------------------------------------------------- actions


def action_facts(p, reread=None):
    """reread: (request, answer) of facts read earlier in this same request, after everything the
    request changed (a deploy's re-read for its seal, under the host lock: agent_seal.py). Where `p`
    locates the package exactly as that request did, its package (bytecode of `p`'s files only),
    torch, OS and user are taken from that answer instead of asking the launch's python again."""
    started = time.time()
    prior = reread[1] if reread is not None and _locates_alike(p, reread[0]) else None
    res = {
        "protocol": AGENT_PROTOCOL,
        "os": prior["os"] if prior is not None else read_os(),
        "python": {"executable": sys.executable, "version": sys.version.split()[0]},
        "user": prior["user"] if prior is not None else _user(),
    }
    if prior is not None:
        files = set(p.get("bytecode_files") or [])
        sg = dict(prior["package"])
        if isinstance(sg.get("bytecode"), dict):
            sg["bytecode"] = dict((k, v) for k, v in sg["bytecode"].items() if k in files)
    elif p.get("engine"):
        sg = locate_package(p["engine"], p.get("package_dir"), p.get("launch"), p.get("bytecode_files") or [],
                            p.get("strict_package_dir", True))
    else:  # the controller always sends its engine; a bare request gets host facts only
        sg = {"found": False, "error": "the request names no engine"}
    res["package"] = sg
    res["torch"] = prior["torch"] if prior is not None else torch_version()
    files = {}
    if sg.get("found"):
        for rel in spec_files(sg["dir"], p.get("hash_dirs", []), p.get("hash_files", [])):
            files[rel] = file_info(sg["dir"], rel)
    res["files"] = files
    if p.get("check_flags") and sg.get("found"):
        res["registered_flags"] = registered_flags(sg["dir"], p["check_flags"], p["engine"]["args_file"])
    if p.get("model"):
        res["model"] = read_model_config(p["model"], p.get("launch"))
    if p.get("draft_model"):  # the speculative draft model's config.json, read the same way
        res["draft_model"] = read_model_config(p["draft_model"], p.get("launch"))
    if p.get("launch_files"):
        res["launch_files"] = read_launch_files(p["launch_files"], p.get("launch"))
    if p.get("gpus", True):
        res["gpus"] = gpu_queries()
    hooks = p.get("with", [])
    for name in hooks:
        fn = EXTRA_FACTS.get(name)
        if fn is not None:
            res[name] = fn(p, sg)
    res["elapsed"] = round(time.time() - started, 4)
    for hook in FACTS_HOOKS:  # (agent_seal.py: the seal of this answer, kept for the deploy)
        hook(p, res)
    return res


def _locates_alike(p, q):
    """Whether facts request `p` locates the package as `q` did: the same engine, launch and package
    dir, `p`'s bytecode files among `q`'s, and `q` at least as strict (a strict location that
    succeeded is what a lenient one finds)."""
    return (bool(p.get("engine")) and p.get("engine") == q.get("engine") and p.get("launch") == q.get("launch")
            and p.get("launch") is not None and p.get("package_dir") == q.get("package_dir")
            and set(p.get("bytecode_files") or []) <= set(q.get("bytecode_files") or [])
            and (q.get("strict_package_dir", True) or not p.get("strict_package_dir", True)))


def _user():
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except Exception:
        return str(os.getuid())


def action_ping(p):
    return {"pong": True, "python": sys.version.split()[0], "pid": os.getpid()}


def action_locate(p):
    """Where the launch imports the engine's package from, and what import would load for `files` /
    `checks`."""
    return run_probe(p["launch"], p.get("files") or [], p.get("checks") or [],
                     package=(p.get("engine") or {}).get("package"))


ACTIONS = {"facts": action_facts, "ping": action_ping, "locate": action_locate}
EXTRA_FACTS = {}
FACTS_HOOKS = []  # fn(request, answer) run after every facts answer is complete
_REREAD = [None]  # (request, answer): facts a deploy re-read at its end in this request (agent_seal.py)
DEPLOY_HOOKS = []  # fn(request, answer) run at the end of a deploy, still under the host lock


PARTS_LOADED = {}  # on-demand parts exec'd into this namespace, by key


def _hex32(k):
    return isinstance(k, str) and len(k) == 32 and not k.strip("0123456789abcdef")


def cache_dir():
    """The host's agent cache (the bootstrap's first argument), only if it is a dir of ours nobody
    else can write (as the bootstrap trusts it); else None."""
    try:
        r = sys.argv[1] if __name__ == "fleetctl_agent" and len(sys.argv) > 1 else ""
        if r:
            r = os.path.expanduser(r)
            t = os.stat(r)
            if stat.S_ISDIR(t.st_mode) and t.st_uid == os.getuid() and not t.st_mode & 0o022:
                return r
    except OSError:
        pass
    return None


def _cached(d, name):
    """A cache file's bytes, only from a regular 0600 file of ours; else None."""
    try:
        f = os.path.join(d, name)
        t = os.lstat(f)
        if t.st_uid == os.getuid() and not t.st_mode & 0o077 and stat.S_ISREG(t.st_mode):
            with open(f, "rb") as fh:
                return fh.read()
    except OSError:
        pass
    return None


def load_part(ld):
    """An on-demand part of the agent (fleetctl/remote ON_DEMAND) exec'd into this namespace, once:
    {"key": sha256 of its stripped source, "code": sha256 of that compiled here as the controller
    compiles it ("" unless the controller's bytecode magic is ours), "blob": b"L"/b"Z" + the
    compressed source, or None}. Without a blob it comes from the host's cache, and only if the
    cached bytes hash to the key; else the answer is kind "need_part" and the controller sends it."""
    key, ck, blob = ld.get("key"), ld.get("code") or "", ld.get("blob")
    if not _hex32(key) or (ck and not _hex32(ck)):
        raise AgentError("a part's key must be 32 hex digits", "bad_input")
    if key in PARTS_LOADED:
        return
    tag = sys.implementation.cache_tag
    d = cache_dir()
    names = ([ck + "." + tag] if ck and tag else []) + [key + ".src"]
    code = None
    if blob is None:
        for n in names:
            b = _cached(d, "part-" + n) if d else None
            if b is not None and sha256_new(b).hexdigest()[:32] == n[:32]:
                try:
                    code = compile(b, "fleetctl-part", "exec") if n.endswith(".src") else marshal.loads(b)
                    break
                except Exception:
                    code = None
        if code is None:
            raise AgentError("part %s is not cached here" % key, "need_part")
    else:
        if not isinstance(blob, bytes) or blob[:1] not in (b"L", b"Z"):
            raise AgentError("a part's blob must be b'L' or b'Z' + its compressed source", "bad_input")
        if blob[:1] == b"L":
            import lzma

            src = lzma.decompress(blob[1:])
        else:
            import zlib

            src = zlib.decompress(blob[1:])
        if sha256_new(src).hexdigest()[:32] != key:
            raise AgentError("a part's source does not hash to its key", "bad_input")
        code = compile(src, "fleetctl-part", "exec")
        if d:
            n, data = names[-1], src
            if ck and tag:
                e = marshal.dumps(code, 2)
                if sha256_new(e).hexdigest()[:32] == ck:
                    n, data = names[0], e
            try:
                w = os.path.join(d, "part-%s.%d" % (n, os.getpid()))
                fd = os.open(w, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
                os.replace(w, os.path.join(d, "part-" + n))
            except OSError:
                pass
    exec(code, globals())
    PARTS_LOADED[key] = True


def _content_bytes(payload):
    """How many bytes of file contents a request carries to write."""
    files = payload.get("files")
    if not isinstance(files, list):
        return 0
    return sum(len(f["content"]) for f in files if isinstance(f, dict) and isinstance(f.get("content"), bytes))


def _handle(data):
    """One request (marshal bytes) -> one answer (JSON bytes); never raises."""
    try:
        payload = marshal.loads(data)
        if not isinstance(payload, dict):
            raise AgentError("a request must be a dict", "bad_input")
        _SHA_MEMO[0] = {}
        _REREAD[0] = None
        for ld in payload.pop("_load", None) or ():
            load_part(ld)
        fn = ACTIONS.get(payload.get("action"))
        if fn is None:
            raise AgentError("unknown action %r" % payload.get("action"), "bad_input")
        if _content_bytes(payload) >= OPENSSL_CONTENT:
            _SHA256_BYTES[0] = max(_SHA256_BYTES[0], BUILTIN_SHA256_BYTES)
        result = fn(payload)
        after = payload.get("then_facts")
        if isinstance(after, dict) and isinstance(result, dict):
            # facts read right after the action, in the same request (a deploy's restart reminder:
            # which servers now run older code); its failure is reported beside the action's result.
            # (The request's memo still holds: a file the action's end hashed is not read again; a
            # deploy that re-read its facts for its seal lends them: _REREAD.)
            try:
                result["then_facts"] = action_facts(after, _REREAD[0])
            except AgentError as e:
                result["then_facts_error"] = str(e)
            except Exception as e:
                result["then_facts_error"] = "%s: %s" % (e.__class__.__name__, e)
        doc = {"ok": True, "result": result}
    except AgentError as e:
        doc = {"ok": False, "error": str(e), "kind": e.kind}
    except Exception as e:  # report, never a traceback on the wire unless asked
        import traceback

        doc = {"ok": False, "error": "%s: %s" % (e.__class__.__name__, e), "kind": "internal",
               "traceback": traceback.format_exc()}
    _SHA_MEMO[0] = None
    _REREAD[0] = None
    try:
        return jdumps(doc).encode("ascii")
    except (TypeError, ValueError) as e:  # an action returned something JSON cannot hold
        return jdumps({"ok": False, "error": "answer not serialisable: %s" % e, "kind": "internal"}).encode("ascii")


def _main(data):
    """One-shot mode: the rest of stdin is one request; the answer is all of stdout."""
    sys.stdout.buffer.write(_handle(data))
    sys.stdout.flush()
    return 0


def _serve(stdin):
    """Session mode: requests framed as a 10-digit length + marshal data, each answered as a
    10-digit length + JSON, until stdin ends (the controller closed the session)."""
    out = sys.stdout.buffer
    while True:
        head = stdin.read(10)
        if len(head) < 10:
            return 0
        body = stdin.read(int(head))
        answer = _handle(body)
        out.write(b"%010d" % len(answer) + answer)
        out.flush()
