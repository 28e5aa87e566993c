"""Agent part: files. The one dangerous primitive built on the atomic write (atomic.py
`write_atomic`), `replace_file` (a package file replaced, compile-checked, its cached bytecode
dropped, re-hashed), the path checks every write goes through (`safe_target`), whether a directory
can be written (`unwritable`) and the bytecode a source's import could load instead of a source.
"""

import os
import stat
import sys

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.atomic import fsync_dir, write_atomic
    from fleetctl.remote.core import AgentError, expand, sha256_file



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


# ----------------------------------------------------------------------------- paths


def safe_target(pkg_dir, rel):
    """Absolute path of rel inside pkg_dir; refuses escapes and symlinks (in the final part or on the way)."""
    if os.path.isabs(rel) or ".." in rel.split("/"):
        raise AgentError("%s: path escapes the package dir" % rel, "bad_input")
    pkg_real = os.path.realpath(pkg_dir)
    path = os.path.join(pkg_dir, rel)
    real = os.path.realpath(path)
    if not (real.startswith(pkg_real + os.sep)):
        raise AgentError("%s: resolves to %s, outside the package dir %s" % (rel, real, pkg_real), "bad_input")
    if os.path.islink(path):
        raise AgentError("%s: is a symlink (to %s); refusing to replace it" % (rel, os.readlink(path)), "bad_input")
    return path


def pyc_kind(path):
    """timestamp | checked-hash | unchecked-hash | invalid, from a pyc's header flags (bytes 4-8)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return "unreadable"
    if len(head) < 16:
        return "invalid"
    flags = int.from_bytes(head[4:8], "little")
    if flags & ~0b11:
        return "invalid"
    if flags & 0b1:
        return "checked-hash" if flags & 0b10 else "unchecked-hash"
    return "timestamp"


_TAG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _pyc_tail(t):
    """t is `<cache tag>.pyc` or `<cache tag>.opt-<N>.pyc` (tag: letters, digits, _ and -)."""
    if not t.endswith(".pyc"):
        return False
    tag, dot, opt = t[:-4].partition(".")
    if not tag or not _TAG_CHARS.issuperset(tag):
        return False
    return not dot or (opt.startswith("opt-") and len(opt) > 4 and opt[4:].isascii() and opt[4:].isdigit())


def bytecode_paths(path, prefixes=()):
    """Every cached bytecode file an import of the source `path` could load instead of compiling
    it: __pycache__/<stem>.<cache tag>[.opt-N].pyc of ANY interpreter and optimize level, and the
    same names under each pycache prefix (PYTHONPYCACHEPREFIX / -X pycache_prefix) tree."""
    d, base = os.path.split(path)
    if not base.endswith(".py"):
        return []
    stem = base[:-3] + "."
    dirs = [os.path.join(d, "__pycache__")]
    for pf in prefixes or ():
        if pf:
            dirs.append(os.path.join(expand(pf), os.path.abspath(d).lstrip(os.sep)))
    out = []
    for cd in dirs:
        try:
            names = sorted(os.listdir(cd))
        except OSError:
            continue
        out += [os.path.join(cd, n) for n in names if n.startswith(stem) and _pyc_tail(n[len(stem):])]
    return out


def drop_bytecode(path, prefixes=(), removed=None):
    """Remove every cached bytecode of the source `path` (see bytecode_paths): a hash-based pyc
    compiled from other bytes would keep CPython running that other code. Import recompiles from
    the source. Appends "pyc (kind)" to `removed`; a pyc that cannot be removed raises."""
    for pyc in bytecode_paths(path, prefixes):
        kind = pyc_kind(pyc)
        try:
            os.unlink(pyc)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise AgentError("%s: cannot remove its bytecode %s (%s pyc): %s; the code import would run could "
                             "differ from the file" % (path, pyc, kind, e.strerror or e), "bytecode") from None
        fsync_dir(os.path.dirname(pyc))
        if removed is not None:
            removed.append("%s (%s)" % (pyc, kind))


def replace_file(path, data, mode, uid, gid, expect_sha, validate_python=True, tag="fleetctl", hook=None,
                 pyc=None):
    """Replace `path` with `data` atomically (write_atomic). Nothing is changed unless every check passes.

    temp file `.<name>.<tag>.<pid>.tmp` in the same dir (what sweep_temp recognises) -> write ->
    fsync -> compile check (host's python) -> chown/chmod as recorded -> [drop cached bytecode] ->
    rename over -> fsync dir -> [drop cached bytecode again: a process importing meanwhile may have
    cached the old bytes] -> re-hash == expect_sha.

    pyc: None, or {"prefixes": [pycache prefixes], "removed": [...]}: the source's cached bytecode
    is removed with it (bytecode_paths), so import runs exactly the new bytes.
    """
    d = os.path.dirname(path)
    tmp = os.path.join(d, ".%s.%s.%d.tmp" % (os.path.basename(path), tag, os.getpid()))

    def before(tmp):
        if validate_python and path.endswith(".py"):
            # the same check py_compile does, on the bytes just written, without writing a .pyc
            with open(tmp, "rb") as fh:
                written = fh.read()
            try:
                compile(written, path, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as e:
                raise AgentError("%s: new content does not compile with %s (python %s): %s"
                                 % (path, sys.executable, sys.version.split()[0], e), "validate") from None
        if hook is not None:  # test-only fault point: the temp file is complete (0600), not yet renamed
            hook()
        if uid is not None and os.geteuid() == 0:
            try:
                os.chown(tmp, uid, gid)
            except OSError:
                pass
        os.chmod(tmp, mode)  # the target's own mode, just before it takes the target's place
        if pyc is not None:
            drop_bytecode(path, pyc.get("prefixes"), pyc.setdefault("removed", []))

    write_atomic(path, data, mode, tmp, before)
    if pyc is not None:
        drop_bytecode(path, pyc.get("prefixes"), pyc.setdefault("removed", []))
    got = sha256_file(path)
    if expect_sha and got != expect_sha:
        raise AgentError("%s: after replace the file hashes %s, expected %s" % (path, got[:12], expect_sha[:12]),
                         "verify")
    return got


def makedirs_private(path):
    """mkdir -p where every directory created is 0700 (os.makedirs gives intermediate ones the
    umask's default, e.g. 0755)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        makedirs_private(parent)
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)
    except FileExistsError:
        pass


def sha_or_none(path):
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None
