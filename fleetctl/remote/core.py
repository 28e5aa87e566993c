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
Every action is a function of a part taking the payload dict, registered in ACTIONS; `handle_request` answers
one request (bytes in, bytes out, never raises): the entry point for an in-process host too.

The agent knows no engine: which package to locate, the file that registers server flags and the
inventory key that pins the package dir come in each request as `engine` (fleetctl/engines/base.py,
`Engine.agent_facts()`).

This part, the core: the serve loop and its framing (`handle_request`, `serve`), the on-demand parts
(`load_part`), JSON and sha256 without their modules, `run_bounded`, the request-scoped state and the
fault hook slot (`fault_point`: inert unless a test installed fleetctl/remote/faults.py).
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



# Imports the agent avoids on its common paths (facts, deploy, status, rollback): json (re, enum,
# functools, collections), re, hashlib (OpenSSL's _hashlib), signal (enum), subprocess, tempfile,
# shutil. A Python start costs ~12-16 ms of CPU; these would add as much again on every host per
# command. They are imported inside the few functions that need them.

AGENT_PROTOCOL = 1


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
    return finish_bounded([spawn_piped(argv)], timeout, limit)[0]


def spawn_piped(argv):
    """Start `argv` (argv[0] a path; stdin /dev/null; this environment) with stdout and stderr on
    pipes; OSError if it cannot start. The child is read, waited for and bounded by finish_bounded
    (or killed by abandon), so several can run at once. (Without posix_spawn: only noted here, run by
    finish_bounded with subprocess, one after the other.)"""
    if not hasattr(os, "posix_spawn"):
        return {"argv": list(argv), "pid": None, "fds": [], "later": True}
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
    return {"argv": list(argv), "pid": pid, "fds": [r_out, r_err]}


def abandon(children):
    """Kill and reap every child of spawn_piped still running, close its pipes (idempotent)."""
    for c in children:
        pid, c["pid"] = c["pid"], None
        if pid is not None:
            try:
                os.kill(pid, 9)  # SIGKILL (the signal module imports enum)
                os.waitpid(pid, 0)
            except OSError:
                pass
        for fd in c["fds"]:
            try:
                os.close(fd)
            except OSError:
                pass
        c["fds"] = []


def finish_bounded(children, timeout, limit=4 << 20):
    """[(exit code, stdout, stderr)] of children started by spawn_piped, in their order: their pipes
    read together until each child closes both, each output capped at `limit` bytes. Past `timeout`
    seconds from this call TimeoutError is raised; the children are then (and on any error) killed
    and reaped."""
    if any(c.get("later") for c in children):  # no posix_spawn: subprocess
        import subprocess

        out = []
        for c in children:
            try:
                p = subprocess.run(c["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError("no answer within %gs" % timeout) from None
            out.append((p.returncode, p.stdout[:limit], p.stderr[:limit]))
        return out
    import select

    bufs = dict((fd, []) for c in children for fd in c["fds"])
    sizes = dict((fd, 0) for fd in bufs)
    open_fds = list(bufs)
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer within %gs" % timeout)
            for fd in select.select(open_fds, [], [], left)[0]:
                b = os.read(fd, 65536)
                if not b:
                    open_fds.remove(fd)
                elif sizes[fd] < limit:
                    bufs[fd].append(b[:limit - sizes[fd]])
                    sizes[fd] += len(b)
        out = []
        for c in children:
            status = os.waitpid(c["pid"], 0)[1]
            c["pid"] = None
            out.append((_exit_code(status), b"".join(bufs[c["fds"][0]]), b"".join(bufs[c["fds"][1]])))
        return out
    finally:
        abandon(children)


def action_ping(p):
    return {"pong": True, "python": sys.version.split()[0], "pid": os.getpid()}


ACTIONS = {"ping": action_ping}  # each part adds its own: ACTIONS.update({...})
REREAD = [None]  # (request, answer): facts a deploy re-read at its end in this request (seal.py)

FAULT = []  # the test harness's fault hook, fn(request, point, n): installed only by fleetctl/remote/faults.py


def fault_point(p, at, n=None):
    """A step where a test may stop this agent (the points: faults.py). Nothing happens unless the
    test harness installed its hook: production requests never carry one."""
    if FAULT:
        FAULT[0](p, at, n)


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
    # (file name, the hash its bytes must have): the compiled form under the source's key too, so
    # that the bootstrap's hello can say a part is here from the key alone
    names = ([(key + "." + tag, ck)] if ck and tag else []) + [(key + ".src", key)]
    code = None
    if blob is None:
        for n, want in names:
            b = _cached(d, "part-" + n) if d else None
            if b is not None and sha256_new(b).hexdigest()[:32] == want:
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
            n, data = names[-1][0], src
            if ck and tag:
                e = marshal.dumps(code, 2)
                if sha256_new(e).hexdigest()[:32] == ck:
                    n, data = names[0][0], e
            if __name__ != "fleetctl_agent":  # (on the host atomic.py shares this namespace)
                from fleetctl.remote.atomic import write_atomic
            try:
                write_atomic(os.path.join(d, "part-" + n), data)
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


def handle_request(data):
    """One request (marshal bytes) -> one answer (JSON bytes); never raises."""
    try:
        payload = marshal.loads(data)
        if not isinstance(payload, dict):
            raise AgentError("a request must be a dict", "bad_input")
        _SHA_MEMO[0] = {}
        REREAD[0] = None
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
            # deploy that re-read its facts for its seal lends them: REREAD.)
            try:
                result["then_facts"] = ACTIONS["facts"](after, REREAD[0])
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
    REREAD[0] = None
    try:
        return jdumps(doc).encode("ascii")
    except (TypeError, ValueError) as e:  # an action returned something JSON cannot hold
        return jdumps({"ok": False, "error": "answer not serialisable: %s" % e, "kind": "internal"}).encode("ascii")


def serve_once(data):
    """One-shot mode: the rest of stdin is one request; the answer is all of stdout."""
    sys.stdout.buffer.write(handle_request(data))
    sys.stdout.flush()
    return 0


def serve(stdin):
    """Session mode: requests framed as a 10-digit length + marshal data, each answered as a
    10-digit length + JSON, until stdin ends (the controller closed the session)."""
    out = sys.stdout.buffer
    while True:
        head = stdin.read(10)
        if len(head) < 10:
            return 0
        body = stdin.read(int(head))
        answer = handle_request(body)
        out.write(b"%010d" % len(answer) + answer)
        out.flush()
