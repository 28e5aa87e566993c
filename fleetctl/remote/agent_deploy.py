"""Agent part: the host's deploy state (lock, manifests, backups) and the one dangerous
primitive, `replace_file` (temp in the same dir -> fsync -> validate -> rename -> re-hash).

Layout under the host's state dir (default ~/.fleetctl, mode 0700):
    lock                         JSON of the holder; O_EXCL-created, removed on release
    deploys/<id>/manifest.json   what the deploy did, per file, and how far it got
    deploys/<id>/backup/<path>   the original bytes of every file the deploy changed
    deploys/<id>@<hostname>/     the same, when a state dir shared with another machine (an NFS home)
                                 already holds that machine's deploys/<id>
Locks and manifests record the machine that wrote them (see machine_identity): a host never takes
over another machine's lock on its own and never acts on another machine's manifest.
"""

if __name__ != "fleetctl_agent":  # imported locally (tests); on the host the parts are concatenated
    from fleetctl.remote.agent import *  # noqa: F403
    from fleetctl.remote.agent import (  # noqa: F401
        ACTIONS,
        DEPLOY_HOOKS,
        EXTRA_FACTS,
        AgentError,
        expand,
        file_info,
        jdumps,
        lazy_re,
        locate_package,
        read_json_file,
        run_probe,
        sha256_file,
        sha256_new,
        unwritable,
    )

import os
import stat
import sys
import time

# no json, re, hashlib or signal here (agent.py says why): jdumps/read_json_file, sha256_new, plain
# string checks, and `signal` imported where a process is signalled

MANIFEST = "manifest.json"
OPEN_STATES = ("preparing", "applying", "rolling-back")


# ----------------------------------------------------------------------------- test-only fault points


def fault_point(p, at, n=None):
    """TEST-ONLY fault injection. Inert unless the payload carries `_fault` naming this very point.

    `_fault` = {"at": point, "n": k, "how": "exit" | "wait" | "until" | "mark" | "stop", "marker": path,
                "hold": seconds, "release": path}
      at:     deploy:   locked, before_backup, after_backup, mid_write, between_renames, before_complete,
                        after_complete
              rollback: locked, before_restore, mid_write, between_restores, before_complete, after_complete
              any:      stale_lock_seen (inside the stale-lock take-over), guard_wait (just before the
                        take-over's guard is locked), lock_wait (--wait-lock: the first time this
                        agent waits for a lock another controller holds)
      n:      for per-file points (mid_write, between_*), the k-th file (1-based; default 1)
      marker: a file written with this process's pid when the point is reached (tests wait for it)
      how:    exit = die on the spot (os._exit(99), no cleanup: a killed agent);
              wait = sleep `hold` seconds (a test kills/freezes the session meanwhile, or holds the lock);
              until = wait until the file `release` exists (the test says when; `hold`: a hang bound only);
              mark = only write the marker and go on;
              stop = SIGSTOP itself (frozen until someone sends SIGCONT/SIGKILL)
    """
    f = p.get("_fault") if isinstance(p, dict) else None
    if isinstance(f, list):  # several points, each its own fault
        f = next((x for x in f if isinstance(x, dict) and x.get("at") == at), None)
    if not f or f.get("at") != at:
        return
    if n is not None and int(f.get("n", 1)) != n:
        return
    marker = f.get("marker")
    if marker:
        tmp = "%s.%d.tmp" % (marker, os.getpid())
        with open(tmp, "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(tmp, marker)
    how = f.get("how", "exit")
    if how == "exit":
        os._exit(99)
    elif how == "stop":
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)
    elif how == "wait":
        time.sleep(float(f.get("hold", 3600)))
    elif how == "until":
        end = time.time() + float(f.get("hold", 3600))
        while not os.path.exists(f.get("release") or "") and time.time() < end:
            time.sleep(0.02)


# ----------------------------------------------------------------------------- fs primitives


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def mkstemp(d, prefix):
    """tempfile.mkstemp(prefix=prefix, dir=d) without importing tempfile (with shutil and random:
    a few ms of every agent start that takes the host lock): a new file of a random name, created
    exclusively (O_EXCL, never following a symlink), mode 0600. Returns (fd, path)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = os.path.join(d, prefix + os.urandom(6).hex())
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError("no free temporary name in %s" % d)


def write_atomic(path, data, mode=0o600):
    """Write a small state file atomically (temp + fsync + rename + dir fsync)."""
    d = os.path.dirname(path)
    fd, tmp = mkstemp(d, ".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)


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
    """Replace `path` with `data` atomically. Nothing is changed unless every check passes.

    temp file in the same dir (O_EXCL, 0600) -> write -> fsync -> py_compile (host's python)
    -> chmod/chown as recorded -> [drop cached bytecode] -> rename over -> fsync dir -> [drop cached
    bytecode again: a process importing meanwhile may have cached the old bytes] -> re-hash == expect_sha.

    pyc: None, or {"prefixes": [pycache prefixes], "removed": [...]}: the source's cached bytecode
    is removed with it (bytecode_paths), so import runs exactly the new bytes.
    """
    d = os.path.dirname(path)
    base = os.path.basename(path)
    tmp = os.path.join(d, ".%s.%s.%d.tmp" % (base, tag, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
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
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)
    if pyc is not None:
        drop_bytecode(path, pyc.get("prefixes"), pyc.setdefault("removed", []))
    got = sha256_file(path)
    if expect_sha and got != expect_sha:
        raise AgentError("%s: after replace the file hashes %s, expected %s" % (path, got[:12], expect_sha[:12]),
                         "verify")
    return got


# ----------------------------------------------------------------------------- state dir, lock


def state_paths(state_dir):
    root = expand(state_dir)
    return root, os.path.join(root, "deploys"), os.path.join(root, "lock")


def ensure_state_dir(state_dir):
    """The state dir (created 0700) and its deploys/ dir, made private (0700) even if it existed with
    a looser mode. An existing state dir itself is left as it is: it may be a shared parent."""
    root, deploys, _ = state_paths(state_dir)
    for d in (root, deploys):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    try:
        st = os.lstat(deploys)
        if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.geteuid():
            os.chmod(deploys, 0o700)
    except OSError:
        pass
    return root


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


# ----------------------------------------------------------------------------- state files
# A playbook's non-package files live under <state_dir>/files/<name>; they are deployed and rolled
# back in the same transaction as the package files. A manifest entry of one has "root": "state",
# "rel": "files/<name>" and, as its path, "{state_dir}/files/<name>" (never a package path).

STATE_FILES = "files"
_NAME_CHARS = _TAG_CHARS | frozenset(".")


def _state_name_ok(name):
    """1-4 parts joined by /, each 1-100 of letters, digits, _ . - not starting with . or -."""
    parts = name.split("/")
    return len(parts) <= 4 and all(0 < len(x) <= 100 and x[0] not in ".-" and _NAME_CHARS.issuperset(x)
                                   for x in parts)


def state_rel(name):
    if not isinstance(name, str) or not _state_name_ok(name) or ".." in name.split("/"):
        raise AgentError("state file name %r: use letters, digits and _ . - in at most 4 parts" % (name,),
                         "bad_input")
    return STATE_FILES + "/" + name


def is_state(f):
    return f.get("root") == "state"


def entry_path(m, f):
    """The absolute path a manifest entry names (a package file, or a state file)."""
    if is_state(f):
        return os.path.join(m["state_real"], f["rel"])
    return os.path.join(m["package_dir"], f["path"])


def state_target(state_real, rel):
    """Absolute path of a state file, its directories created 0700; refuses symlinks on the way."""
    path = os.path.join(state_real, rel)
    makedirs_private(os.path.dirname(path))
    real = os.path.realpath(path)
    if not real.startswith(os.path.realpath(state_real) + os.sep) or os.path.islink(path):
        raise AgentError("%s: resolves outside the state dir or is a symlink; refusing to write it" % rel,
                         "bad_input")
    return path


def _sha_or_none(path):
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None


def _proc_stat(pid):
    """(state, start time in clock ticks) of pid from /proc; None where /proc cannot tell."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return ("gone", None) if os.path.isdir("/proc/self") else None
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return rest[0].decode(), int(rest[19])
    except (IndexError, ValueError):
        return None


def _pid_alive(pid, start=None):
    """True if pid runs. A zombie (killed, not yet reaped by its parent) does not run; nor does a
    process whose start time differs from `start` (the pid was reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process (which /proc may hide): not ours to judge
        return True
    st = _proc_stat(pid)
    if st is not None:
        state, ticks = st
        if state in ("Z", "X", "x", "gone"):
            return False
        if start is not None and ticks is not None and ticks != start:
            return False
    return True


# ----------------------------------------------------------------------------- machine identity
#
# The state dir may sit on a home shared by several machines (NFS): a pid means nothing on another
# machine. Locks and manifests record who wrote them: hostname (uname nodename), /etc/machine-id
# where the host has one, the boot id (/proc/sys/kernel/random/boot_id, new at every boot), pid and
# the process's start time. Two records are from the same machine when hostname and machine-id
# (where both have one) agree; a lock from this machine but another boot is stale (its holder died
# with that boot). There is no test hook here: the tests give a sandbox host another hostname by
# running its sshd in its own UTS namespace (unshare --uts), which is what another machine looks like.


def _read_first_line(path):
    try:
        with open(path) as fh:
            return fh.readline().strip() or None
    except OSError:
        return None


_IDENTITY = []  # this process's machine identity, read once (a boot id cannot change under a process)


def machine_identity():
    if not _IDENTITY:
        _IDENTITY.append({"hostname": os.uname()[1], "machine_id": _read_first_line("/etc/machine-id")
                          or _read_first_line("/var/lib/dbus/machine-id"),
                          "boot_id": _read_first_line("/proc/sys/kernel/random/boot_id")})
    return dict(_IDENTITY[0])


def writer_identity():
    """This process as the writer of a lock or manifest."""
    me = machine_identity()
    own = _proc_stat(os.getpid())
    me.update(pid=os.getpid(), start=own[1] if own else None)
    return me


def _ident_of(rec):
    """The machine identity a lock/manifest records (older ones recorded only `host`: the hostname
    for locks; for manifests, nothing, and they are taken as this machine's)."""
    w = rec.get("writer") if isinstance(rec, dict) else None
    if isinstance(w, dict):
        return w
    h = rec.get("host") if isinstance(rec, dict) and "pid" in rec else None
    return {"hostname": h} if isinstance(h, str) else None


def same_machine(ident, me=None):
    if not ident or not ident.get("hostname"):
        return True  # a record older than machine identities: nothing says it is another machine's
    me = me or machine_identity()
    if ident.get("hostname") != me["hostname"]:
        return False
    a, b = ident.get("machine_id"), me.get("machine_id")
    return not (a and b and a != b)


def describe_writer(ident):
    if not ident:
        return "an unknown machine"
    out = "%s" % ident.get("hostname")
    if ident.get("boot_id"):
        out += " (boot %s)" % str(ident.get("boot_id"))[:8]
    return out


LOCK_YOUNG = 30.0  # an unreadable lock younger than this may be one being written: not stale


def read_lock(state_dir):
    _, _, lock = state_paths(state_dir)
    try:
        info = read_json_file(lock)
        if not isinstance(info, dict):
            raise ValueError("not an object")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        info = {"holder": "unreadable lock file", "unreadable": True}
        try:
            age = time.time() - os.stat(lock).st_mtime
        except OSError:
            return None
        info["stale"] = age > LOCK_YOUNG
        return info
    pid = info.get("pid")
    start = info.get("start")
    ident = _ident_of(info)
    me = machine_identity()
    if not same_machine(ident, me):
        # another machine's pid cannot be checked from here: never stale, never taken over automatically
        info["foreign"] = True
        info["owner"] = describe_writer(ident)
        info["stale"] = False
        return info
    if ident and ident.get("boot_id") and me.get("boot_id") and ident.get("boot_id") != me.get("boot_id"):
        info["stale"] = True  # this machine, an earlier boot: its holder died with that boot
        info["stale_why"] = "taken before this machine's last reboot"
        return info
    info["stale"] = not (isinstance(pid, int) and _pid_alive(pid, start if isinstance(start, int) else None))
    return info


def _create_lock(lock, data):
    """Create `lock` holding `data` in one step: a complete temp file hard-linked to the lock name
    (fails if it exists), so nobody ever reads a half-written lock. True if created."""
    d = os.path.dirname(lock)
    fd, tmp = mkstemp(d, ".lock-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, lock)
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: O_EXCL create, then write
            try:
                lfd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return False
            with os.fdopen(lfd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        fsync_dir(d)
        return True
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _locked_error(held):
    if held.get("unreadable"):
        return AgentError("locked: the lock file is being written or is damaged (less than %ds old); "
                          "retry, or check that host" % LOCK_YOUNG, "locked")
    if held.get("foreign"):
        return AgentError("locked by another machine: %s %s by %s since %s (pid %s on %s); this state dir is "
                          "shared with that machine: a lock there is never taken over automatically; give each "
                          "host its own state_dir, or, if that holder is surely gone, rerun with --break-lock "
                          "for this host"
                          % (held.get("op"), held.get("id"), held.get("by"),
                             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held.get("since") or 0)),
                             held.get("pid"), held.get("owner")), "locked")
    return AgentError("locked: %s %s by %s since %s (pid %s); wait for it or check that host"
                      % (held.get("op"), held.get("id"), held.get("by"),
                         time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held.get("since") or 0)),
                         held.get("pid")), "locked")


def acquire_lock(state_dir, op, deploy_id, who, p=None):
    """_acquire_lock, waiting up to the payload's `wait_lock` seconds (the operator's --wait-lock)
    while another live controller of this machine holds the lock; without it, a held lock fails at
    once. Another machine's lock and an unreadable one are never waited for (they need a person)."""
    wait = 0.0
    if isinstance(p, dict):
        try:
            wait = max(0.0, min(float(p.get("wait_lock") or 0), 86400.0))
        except (TypeError, ValueError):
            wait = 0.0
    deadline = time.time() + wait
    waiting = False
    while True:
        try:
            return _acquire_lock(state_dir, op, deploy_id, who, p)
        except AgentError as e:
            held = read_lock(state_dir) if e.kind == "locked" else None
            if held is None or held.get("foreign") or held.get("unreadable"):
                raise
            if time.time() < deadline and not waiting:
                waiting = True
                fault_point(p, "lock_wait")
            if time.time() >= deadline:
                if wait:
                    raise AgentError("%s (waited %gs: --wait-lock)" % (e, wait), "locked") from None
                raise AgentError("%s (or rerun with --wait-lock SECONDS to wait for it)" % e, "locked") from None
            time.sleep(0.2)


def _acquire_lock(state_dir, op, deploy_id, who, p=None):
    """Take the host lock (created atomically with its content). A lock whose holder process is
    gone is reported and taken over, under a flock'ed guard so that only one of several agents that
    found it stale removes it (none ever removes the fresh lock another has just taken). Another
    machine's lock is never taken over, unless the payload says `break_lock` (the operator's
    --break-lock for this host)."""
    import fcntl

    root = ensure_state_dir(state_dir)
    _, _, lock = state_paths(state_dir)
    me = writer_identity()
    info = {"pid": me["pid"], "start": me["start"], "op": op, "id": deploy_id, "by": who,
            "since": time.time(), "host": me["hostname"], "writer": me}
    data = jdumps(info).encode()
    notes = []
    brk = bool(p.get("break_lock")) if isinstance(p, dict) else False

    def takeable(held):
        return held.get("stale") or (brk and held.get("foreign"))

    for _ in range(3):
        if _create_lock(lock, data):
            return notes
        held = read_lock(state_dir)
        if held is None:  # released meanwhile
            continue
        if not takeable(held):
            raise _locked_error(held)
        gfd = os.open(os.path.join(root, "lock.guard"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fault_point(p, "guard_wait")
            fcntl.flock(gfd, fcntl.LOCK_EX)
            held = read_lock(state_dir)  # again, now that no one else can take over
            if held is None:
                continue
            if not takeable(held):
                raise _locked_error(held)
            fault_point(p, "stale_lock_seen")
            if held.get("foreign"):
                notes.append("broke the lock of another machine (--break-lock): %s %s by %s (pid %s on %s)"
                             % (held.get("op"), held.get("id"), held.get("by"), held.get("pid"), held.get("owner")))
            else:
                notes.append("removed a stale lock of %s %s by %s (%s)"
                             % (held.get("op"), held.get("id"), held.get("by"),
                                held.get("stale_why") or "its process %s is gone" % held.get("pid")))
            try:
                os.unlink(lock)
            except FileNotFoundError:
                pass
            if _create_lock(lock, data):
                return notes
        finally:
            os.close(gfd)  # releases the flock
    raise AgentError("could not take the lock at %s" % lock, "locked")


def release_lock(state_dir):
    _, _, lock = state_paths(state_dir)
    try:
        info = read_json_file(lock)
        if info.get("pid") == os.getpid() and same_machine(_ident_of(info)):  # not another machine's pid
            os.unlink(lock)
    except (OSError, ValueError, AttributeError):
        pass


# ----------------------------------------------------------------------------- shared trees
#
# One package tree may be reached by several inventory entries: two entries for one machine, or
# several machines mounting one tree (NFS, a shared venv). Such a tree is deployed and rolled back
# once, and its records (lock, manifests, backups) then live next to it, where every host that
# reaches the tree can read them: <dir of the package>/.fleetctl-tree-<name>/ (a dot-dir, never
# importable). Every machine's manifests there are about that one tree, so none is "foreign" there.
# Its `id` file (random, written by the first deploy that records there) names the tree: two
# machines whose trees merely have equal inode numbers read different ids (or none).

TREE_DIR_PREFIX = ".fleetctl-tree-"
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "9p",
              "virtiofs", "afs", "ocfs2", "gfs2", "panfs", "wekafs", "fuse")
_SHARED_DIRS = {}  # real path of a shared tree's records dir -> that tree's real path as this host sees it


TREE_DIR_INSIDE = ".fleetctl-tree"


def tree_records_dir(pkg_dir):
    """Beside the package dir: where a shared tree keeps its records when its parent is shared too."""
    real = os.path.realpath(pkg_dir)
    return os.path.join(os.path.dirname(real), TREE_DIR_PREFIX + os.path.basename(real))


def tree_records_dirs(pkg_dir):
    """Both places a shared tree's records may be: beside it, or inside it (when a host mounts the
    package dir itself, its parent is not shared: the controller then chooses inside)."""
    real = os.path.realpath(pkg_dir)
    return [tree_records_dir(real), os.path.join(real, TREE_DIR_INSIDE)]


def mark_shared(state_dir, tree_real):
    _SHARED_DIRS[os.path.realpath(expand(state_dir))] = os.path.realpath(tree_real)


def is_shared(state_dir):
    return bool(_SHARED_DIRS) and os.path.realpath(expand(state_dir)) in _SHARED_DIRS


def _as_seen_here(state_dir, m):
    """A manifest of a shared tree's records dir is about that tree, wherever this host mounts it: its
    package paths are this host's path of the tree (another host may reach it by another path)."""
    tree = _SHARED_DIRS.get(os.path.realpath(expand(state_dir))) if _SHARED_DIRS else None
    if tree and isinstance(m, dict):
        m["package_dir"] = m["package_real"] = tree
    return m


def _unescape_mount(s):
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_of(path):
    """(fstype, source, mount point) of the mount holding `path` (/proc/self/mountinfo; Nones if unknown)."""
    best = (None, None, None)
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            raw = fh.read(4 << 20)
    except OSError:
        return best
    for line in raw.decode("utf-8", "replace").splitlines():
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 5 or len(b) < 2:
            continue
        mp = _unescape_mount(a[4])
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (best[2] is None or len(mp) >= len(best[2])):
            best = (b[0], _unescape_mount(b[1]), mp)
    return best


def tree_identity(pkg_dir):
    """What tells this package tree apart from every other, on this machine or another: its real path,
    device and inode, the mount it is on (a network filesystem: its source), this machine (boot id:
    new at every boot, never equal on two machines) and the tree's id if its records dir has one."""
    real = os.path.realpath(pkg_dir)
    try:
        st = os.stat(real)
    except OSError:
        return None
    fs, source, mp = mount_of(real)
    me = machine_identity()
    dirs = tree_records_dirs(real)
    tid = None
    for d in dirs:
        tid = tid or _read_first_line(os.path.join(d, "id"))
    out = {"real": real, "dev": st.st_dev, "ino": st.st_ino, "fs": fs, "source": source, "mount": mp,
           "boot_id": me.get("boot_id"), "machine_id": me.get("machine_id"), "hostname": me.get("hostname"),
           "records_dir": dirs[1] if mp == real else dirs[0], "mount_root": mp == real, "id": tid}
    out["network"] = bool(fs) and (fs in NETWORK_FS or fs.split(".")[0] in NETWORK_FS)
    return out


def ensure_tree_id(state_dir):
    """The shared tree's id file, created once (atomically) in its records dir."""
    path = os.path.join(expand(state_dir), "id")
    if _read_first_line(path):
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(os.urandom(16).hex() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


# ----------------------------------------------------------------------------- manifests


def _check_id(deploy_id):
    if not deploy_id or "/" in deploy_id or deploy_id.startswith(".") or "@" in deploy_id:
        raise AgentError("bad deploy id %r" % deploy_id, "bad_input")


def _host_tag():
    return "".join(c if c in _NAME_CHARS else "_" for c in machine_identity()["hostname"] or "unknown")


def deploy_dir(state_dir, deploy_id, entry=None):
    """This machine's directory for `deploy_id`: deploys/<id>, or deploys/<id>@<hostname> when a
    state dir shared with another machine already holds that machine's deploys/<id>, or
    deploys/<id>%<entry> when another inventory entry of this machine (one state dir, another
    tree) already holds deploys/<id> from the same command."""
    _check_id(deploy_id)
    _, deploys, _ = state_paths(state_dir)
    base = os.path.join(deploys, deploy_id)
    mine = "%s@%s" % (base, _host_tag())
    if os.path.isdir(mine):
        return mine
    ent = "%s%%%s" % (base, "".join(c if c in _NAME_CHARS else "_" for c in entry)) if entry else None
    if ent and os.path.isdir(ent):
        return ent
    try:
        m = read_json_file(os.path.join(base, MANIFEST))
    except (OSError, ValueError):
        return base
    if not isinstance(m, dict):
        return base
    if not is_shared(state_dir) and not same_machine(_ident_of(m)):
        return mine
    if ent and m.get("host") and m.get("host") != entry and not is_shared(state_dir):
        return ent
    return base


def manifest_path(state_dir, deploy_id, entry=None):
    return os.path.join(deploy_dir(state_dir, deploy_id, entry), MANIFEST)


def load_manifest(state_dir, deploy_id, entry=None):
    m = _as_seen_here(state_dir, read_json_file(manifest_path(state_dir, deploy_id, entry)))
    if not is_shared(state_dir) and not same_machine(_ident_of(m)):  # (deploy_dir never names another machine's; belt and braces)
        raise FileNotFoundError(deploy_id)
    return m


_SAVED_AT = {}  # (state dir, deploy id, created) -> where that manifest was saved by this process


def save_manifest(state_dir, m):
    m["updated"] = time.time()
    # a manifest's dir is fixed for its life: found once (deploy_dir reads the manifest there), then
    # kept for the deploy's later saves
    key = (state_dir, m.get("id"), m.get("created"))
    path = _SAVED_AT.get(key) or manifest_path(state_dir, m["id"], m.get("host"))
    # compact (json's C encoder): a deploy saves its manifest six times, under the lock
    write_atomic(path, jdumps(m, sort_keys=True).encode())
    _SAVED_AT[key] = path


def list_manifests(state_dir, include_foreign=False):
    """Every deploy manifest in the state dir, oldest first: only this machine's unless asked (a host
    never acts on a manifest another machine wrote into a shared state dir)."""
    _, deploys, _ = state_paths(state_dir)
    out = []
    try:
        names = os.listdir(deploys)
    except OSError:
        return out
    me = machine_identity()
    shared = is_shared(state_dir)
    for name in names:
        try:
            m = _as_seen_here(state_dir, read_json_file(os.path.join(deploys, name, MANIFEST)))
        except (OSError, ValueError):
            continue
        if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not isinstance(m.get("files"), list) \
                or not all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in m["files"]):
            continue  # not a manifest this agent wrote: never acted on
        if not shared and not same_machine(_ident_of(m), me):
            if not include_foreign:
                continue
            m["_foreign"] = describe_writer(_ident_of(m))
        out.append(m)
    out.sort(key=lambda m: (m.get("created", 0), m.get("id", "")))
    return out


def manifest_tree(m):
    """The real package dir the deploy wrote into (recorded since manifests record it; else as located)."""
    return m.get("package_real") or m.get("package_dir")


def gone_reason(m, cur_real, cur_version, hashes=None):
    """Why a complete (or interrupted) deploy is no longer on disk (None: it is). Its tree now holds
    another release, or every file a complete deploy patched holds its original bytes again (the
    package was reinstalled). Its backups then belong to another release: never to be written back."""
    if m.get("state") not in ("complete", *OPEN_STATES) or m.get("kind", "deploy") != "deploy":
        return None
    tree = manifest_tree(m)
    if cur_real and tree and os.path.realpath(tree) == cur_real and m.get("version") and cur_version \
            and m.get("version") != cur_version:
        return "package reinstalled/upgraded: it patched sglang %s, %s now holds %s" % (
            m.get("version"), cur_real, cur_version)
    if m.get("state") != "complete":
        return None
    applied = [f for f in m.get("files", []) if f.get("status") == "applied" and not is_state(f)]
    if not applied:
        return None
    for f in applied:
        if hashes is not None:
            now = hashes.get(f["path"])
        else:
            try:
                now = sha256_file(os.path.join(tree, f["path"]))
            except OSError:
                now = None
        if now != f.get("sha_before"):
            return None
    return "package reinstalled/upgraded: every file it patched holds its original bytes again"


def manifest_summary(m, pkg_dir=None, cur_real=None, cur_version=None):
    files = []
    tree = manifest_tree(m) or pkg_dir
    hashes = {}
    for f in m.get("files", []):
        cur = None
        if is_state(f) and not m.get("_foreign"):
            try:
                cur = sha256_file(entry_path(m, f))
            except OSError:
                cur = None
        elif tree and not m.get("_foreign"):
            try:
                cur = sha256_file(os.path.join(tree, f["path"]))
            except OSError:
                cur = None
        hashes[f["path"]] = cur
        files.append({"path": f["path"], "sha_before": f.get("sha_before"), "sha_after": f.get("sha_after"),
                      "status": f.get("status"), "sha_now": cur})
    out = dict((k, m.get(k)) for k in ("id", "state", "created", "updated", "package_dir", "version", "playbook",
                                       "by", "rolled_back_at", "note", "package_real", "host",
                                       "container"))
    out["kind"] = m.get("kind", "deploy")
    out["files"] = files  # (no dict `|`: the agent runs on Python >= 3.8)
    if m.get("_foreign"):
        out["foreign"] = m["_foreign"]
        return out
    gone = gone_reason(m, cur_real, cur_version, hashes)  # (what close_superseded will find, under the lock)
    if gone:
        out["gone"] = gone
    elif cur_real and tree and os.path.realpath(tree) != cur_real:
        out["moved"] = {"patched": tree, "imports_now": cur_real}
    return out


def _current_tree(sg):
    if not sg or not sg.get("found") or not sg.get("dir"):
        return None, None
    return os.path.realpath(sg["dir"]), sg.get("version")


def state_facts(p, sg):
    """Extra facts: lock holder and every manifest with the current hash of its files, each marked
    if another machine wrote it (`foreign`), if this python now imports another tree than the one it
    patched (`moved`), or if its patch is no longer on disk (`gone`)."""
    sd = p.get("state_dir") or "~/.fleetctl"
    cur_real, cur_version = _current_tree(sg)
    out = {"lock": read_lock(sd),
           "deploys": [manifest_summary(m, cur_real=cur_real, cur_version=cur_version)
                       for m in list_manifests(sd, include_foreign=True)],
           "state_dir": expand(sd), "machine": describe_writer(machine_identity()), "package_real": cur_real}
    why = unwritable(expand(sd), "it")
    if why:
        out["unwritable"] = why
    if cur_real:
        out["tree"] = tree_identity(cur_real)
        for rdir in tree_records_dirs(cur_real):
            if os.path.isdir(rdir) and os.path.realpath(rdir) != os.path.realpath(expand(sd)):
                mark_shared(rdir, cur_real)
                for m in list_manifests(rdir):
                    ms = manifest_summary(m, cur_real=cur_real, cur_version=cur_version)
                    ms["shared"] = rdir
                    out["deploys"].append(ms)
                out["tree_lock"] = out.get("tree_lock") or read_lock(rdir)
    return out


EXTRA_FACTS["state"] = state_facts


# ----------------------------------------------------------------------------- transactions


def _restore_files(state_dir, m, entries, force=False, forced_dir=None, p=None):
    """Put each entry's backup back (atomically) and verify sha_before. Returns per-file results."""
    results = []
    bdir = os.path.join(os.path.dirname(manifest_path(state_dir, m["id"], m.get("host"))), "backup")
    for i, f in enumerate(entries):
        if i:
            fault_point(p, "between_restores", i)
        path = entry_path(m, f)
        try:
            cur = sha256_file(path)
        except FileNotFoundError:
            cur = None
        pyc = {"prefixes": m.get("pycache_prefixes") or [], "removed": []}
        if is_state(f):
            results.append(_restore_state(m, f, path, cur, bdir, force, forced_dir))
            continue
        if cur == f["sha_before"]:
            # bytecode cached from the patched bytes meanwhile would still run them: drop it too
            drop_bytecode(path, pyc["prefixes"], pyc["removed"])
            results.append({"path": f["path"], "action": "already original", "bytecode_removed": pyc["removed"]})
            continue
        if cur != f.get("sha_after") and not force:
            results.append({"path": f["path"], "action": "refused", "sha_now": cur,
                            "why": "changed since the deploy (neither its patched nor its original bytes)"})
            continue
        if cur is not None and cur != f.get("sha_after") and forced_dir:
            makedirs_private(os.path.dirname(os.path.join(forced_dir, f["path"])))
            with open(path, "rb") as src:
                write_atomic(os.path.join(forced_dir, f["path"]), src.read(), 0o600)
        with open(os.path.join(bdir, f["path"]), "rb") as fh:
            data = fh.read()
        safe_target(m["package_dir"], f["path"])
        replace_file(path, data, f["mode"], f.get("uid"), f.get("gid"), f["sha_before"], validate_python=False,
                     tag="fleetctl-restore", hook=lambda k=i + 1: fault_point(p, "mid_write", k), pyc=pyc)
        results.append({"path": f["path"], "action": "restored", "sha_now": f["sha_before"],
                        "bytecode_removed": pyc["removed"]})
    return results


def _restore_state(m, f, path, cur, bdir, force, forced_dir):
    """Put a state file back as it was before the deploy: its backup, or no file if there was none."""
    if cur == f.get("sha_before"):
        return {"path": f["path"], "action": "already original"}
    if cur != f.get("sha_after") and not force:
        return {"path": f["path"], "action": "refused", "sha_now": cur,
                "why": "changed since the deploy (neither its deployed nor its original bytes)"}
    if cur is not None and cur != f.get("sha_after") and forced_dir:
        makedirs_private(os.path.join(forced_dir, "_state", os.path.dirname(f["rel"])))
        with open(path, "rb") as src:
            write_atomic(os.path.join(forced_dir, "_state", f["rel"]), src.read(), 0o600)
    if f.get("sha_before") is None:  # the deploy created it: remove it
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fsync_dir(os.path.dirname(path))
        return {"path": f["path"], "action": "removed", "sha_now": None}
    with open(os.path.join(bdir, "_state", f["rel"]), "rb") as fh:
        data = fh.read()
    replace_file(state_target(m["state_real"], f["rel"]), data, f["mode"], f.get("uid"), f.get("gid"),
                 f["sha_before"], validate_python=False, tag="fleetctl-restore")
    return {"path": f["path"], "action": "restored", "sha_now": f["sha_before"]}


def _temp_name(name):
    """(base, pid) of a replace_file temp name `.<base>.fleetctl[-restore].<pid>.tmp`, else None."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    head, dot, pid = name[1:-4].rpartition(".")
    if not dot or not (pid.isascii() and pid.isdigit()):
        return None
    for tag in (".fleetctl", ".fleetctl-restore"):
        if head.endswith(tag) and len(head) > len(tag):
            return head[:-len(tag)], int(pid)
    return None


def sweep_temp(pkg_dir, rels):
    """Remove the temp files `replace_file` left beside these targets when its process was killed
    between creating and renaming them (their pid is gone). Returns the paths removed."""
    removed = []
    by_dir = {}
    for rel in rels:
        by_dir.setdefault(os.path.dirname(os.path.join(pkg_dir, rel)), set()).add(os.path.basename(rel))
    for d, bases in sorted(by_dir.items()):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            mt = _temp_name(name)
            if not mt or mt[0] not in bases:
                continue
            pid = mt[1]
            if pid != os.getpid() and _pid_alive(pid):
                continue
            try:
                os.unlink(os.path.join(d, name))
                removed.append(os.path.relpath(os.path.join(d, name), pkg_dir))
            except OSError:
                pass
        if removed:
            fsync_dir(d)
    return removed


def recover_interrupted(state_dir):
    """Undo every deploy that was cut off half-way, so the host is all-original again (and remove
    the temp files a killed agent left in the package dir)."""
    notes = []
    for m in list_manifests(state_dir):
        if m.get("state") not in OPEN_STATES:
            continue
        gone = sweep_temp(m["package_dir"], [f["path"] for f in m.get("files", []) if not is_state(f)])
        if m.get("state_real"):
            gone += [os.path.join("{state_dir}", x) for x in
                     sweep_temp(m["state_real"], [f["rel"] for f in m.get("files", []) if is_state(f)])]
        if gone:
            notes.append("removed %d temp file(s) left by the interrupted %s: %s"
                         % (len(gone), m["id"], ", ".join(gone)))
        entries = [f for f in m.get("files", []) if f.get("backed_up")]
        res = _restore_files(state_dir, m, entries)
        bad = [r for r in res if r["action"] == "refused"]
        if bad:
            raise AgentError("interrupted deploy %s cannot be repaired automatically: %s %s"
                             % (m["id"], bad[0]["path"], bad[0]["why"]), "drifted")
        m["state"] = "interrupted-restored"
        m["note"] = "cut off while %s; restored to the original files" % m.get("state")
        save_manifest(state_dir, m)
        notes.append("repaired interrupted deploy %s: %d file(s) restored"
                     % (m["id"], sum(1 for r in res if r["action"] == "restored")))
    return notes


def close_superseded(state_dir, cur_real, cur_version):
    """Close the record of every complete deploy whose patch is no longer on disk (the package was
    reinstalled or upgraded under it): state `superseded`; nothing is restored (its backups belong to
    another release, or equal what is there). Returns notes."""
    notes = []
    for m in list_manifests(state_dir):
        why = gone_reason(m, cur_real, cur_version)
        if not why:
            continue
        m["note"] = "no longer on disk (%s) when %s; record closed, nothing restored" % (why, m.get("state"))
        m["state"] = "superseded"
        save_manifest(state_dir, m)
        notes.append("deploy %s is no longer on disk (%s): record closed, nothing restored" % (m["id"], why))
        notes += _undo_state_files(state_dir, m)
    return notes


def _undo_state_files(state_dir, m):
    """A superseded deploy's state files live in the state dir, not in the reinstalled tree: their
    backups still hold, so they are put back as before the deploy (removed if it created them) while
    they still hold what it wrote; never left behind untracked. Returns notes."""
    bdir = os.path.join(os.path.dirname(manifest_path(state_dir, m["id"], m.get("host"))), "backup")
    notes = []
    for f in m.get("files", []):
        if not is_state(f) or f.get("status") != "applied":
            continue
        path = entry_path(m, f)
        cur = _sha_or_none(path)
        if cur is None or cur != f.get("sha_after"):
            continue
        res = _restore_state(m, f, path, cur, bdir, False, None)
        notes.append("deploy %s: its state file %s %s" % (m["id"], f["path"], res["action"]))
    return notes


def last_container_deploy(state_dir):
    """The newest complete deploy that recorded the container it patched, any writer's (a re-created
    container is another hostname): {"id", "container"}; None if there is none."""
    for m in reversed(list_manifests(state_dir, include_foreign=True)):
        if m.get("state") == "complete" and m.get("kind", "deploy") == "deploy" \
                and isinstance(m.get("container"), dict):
            return {"id": m.get("id"), "container": m["container"]}
    return None


def live_deploys(state_dir, entry=None, cur_real=None):
    """Ids of this machine's complete deploys (what a rollback would undo), oldest first; with the
    asking inventory entry and its tree, not another entry's deploys of another tree."""
    return [m["id"] for m in list_manifests(state_dir)
            if m.get("state") == "complete" and m.get("kind", "deploy") == "deploy"
            and not (entry and cur_real and m.get("host") and m.get("host") != entry
                     and manifest_tree(m) and os.path.realpath(manifest_tree(m)) != cur_real)]


def _final(pkg, p, state_real=None):
    """Hashes of the files the controller wants verified, read after the transaction (state files
    as "{state_dir}/files/<name>")."""
    out = {}
    for rel in p.get("verify_paths", []):
        try:
            out[rel] = sha256_file(os.path.join(pkg, rel))
        except OSError:
            out[rel] = None
    for sf in p.get("state_files") or []:
        rel = state_rel(sf.get("name"))
        out["{state_dir}/" + rel] = _sha_or_none(os.path.join(state_real or os.path.realpath(expand(p["state_dir"])),
                                                              rel))
    return out


def _why(e):
    if isinstance(e, AgentError):
        return str(e)
    if isinstance(e, OSError) and e.strerror:
        return "%s%s" % (e.strerror, ": %s" % e.filename if e.filename else "")
    return "%s: %s" % (e.__class__.__name__, e)


def _close_unchanged(sd, m, bdir, e):
    """A deploy that failed before changing any package file: drop its partial backups and record
    it as failed-unchanged (best effort: if even that cannot be written, it stays open and the next
    deploy or rollback closes it, restoring nothing)."""
    import shutil
    shutil.rmtree(bdir, ignore_errors=True)
    for f in m["files"]:
        f["backed_up"] = False
    m["state"] = "failed-unchanged"
    m["note"] = _why(e)
    try:
        save_manifest(sd, m)
    except Exception:
        m["state"] = "preparing"


def _pycache_prefixes(p):
    """The pycache prefix the launch's python uses (PYTHONPYCACHEPREFIX, -X pycache_prefix), asked of
    that python itself with the launch's environment (the probe); [] without a launch."""
    launch = p.get("launch")
    if not launch:
        return []
    got = run_probe(launch)
    return [got["pycache_prefix"]] if got.get("pycache_prefix") else []


def _shown_paths(pkg, paths):
    """Paths as a note shows them: relative to the package dir when inside it (short, so a table
    cell does not cut them mid-word), else as they are (a PYTHONPYCACHEPREFIX tree)."""
    base = pkg.rstrip("/") + "/"
    return ", ".join(x[len(base):] if x.startswith(base) else x for x in paths)


def _drop_stale(pkg, rels, prefixes):
    """Remove the cached bytecode of files the deploy does not replace (the controller found it
    stale: import would run it instead of the file). Returns notes."""
    removed = []
    for rel in rels or []:
        drop_bytecode(safe_target(pkg, rel), prefixes, removed)
    if not removed:
        return []
    return ["removed %d stale cached bytecode file(s): %s" % (len(removed), _shown_paths(pkg, removed))]


def _deployed(p, res):
    """A deploy's answer, after the DEPLOY_HOOKS (still under the host lock)."""
    for hook in DEPLOY_HOOKS:
        hook(p, res)
    return res


def _check_shared_dir(sd, pkg):
    """A shared tree's records dir is the one beside that tree: nothing else is ever trusted so."""
    if not pkg or os.path.realpath(expand(sd)) not in [os.path.realpath(d) for d in tree_records_dirs(pkg)]:
        raise AgentError("%s is not the records dir of the tree %s" % (sd, pkg), "bad_input")
    mark_shared(sd, pkg)


def action_deploy(p):
    """Apply one host's planned files in one transaction: all intended, or all original."""
    sd = p["state_dir"]
    did = p["deploy_id"]
    pkg = p["package_dir"]
    kind = p.get("kind") or "deploy"
    if kind not in ("deploy", "restore-pristine"):
        raise AgentError("bad kind %r" % kind, "bad_input")
    if p.get("shared_tree"):
        _check_shared_dir(sd, pkg)
    notes = acquire_lock(sd, "deploy" if kind == "deploy" else "rollback", did, p.get("by", "?"), p)
    try:
        fault_point(p, "locked")
        if p.get("shared_tree"):
            ensure_tree_id(sd)
        notes += close_superseded(sd, os.path.realpath(pkg), p.get("version"))
        notes += recover_interrupted(sd)
        # what the plan saw for the files it does not change must still hold, now, under the lock: a
        # deploy never reports a host "as intended" from facts read before a concurrent rollback
        for rel, want in sorted((p.get("expect") or {}).items()):
            try:
                now = sha256_file(safe_target(pkg, rel))
            except FileNotFoundError:
                now = None
            if now != want:
                raise AgentError("%s changed since the plan (now %s, planned against %s; a concurrent rollback or "
                                 "deploy?); nothing was changed; run deploy again"
                                 % (rel, (now or "missing")[:12], (want or "missing")[:12]), "changed")
        files = p["files"]
        plan = []
        for f in files:
            path = safe_target(pkg, f["path"])
            # read once, under the lock: these bytes are checked against the plan and are the backup
            try:
                with open(path, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    old = fh.read()
            except FileNotFoundError:
                raise AgentError("%s: missing on the host" % f["path"], "missing") from None
            cur = sha256_new(old).hexdigest()
            if cur != f["sha_before"]:
                raise AgentError("%s changed since the plan (now %s, planned against %s); run deploy --check again"
                                 % (f["path"], cur[:12], f["sha_before"][:12]), "changed")
            plan.append((f, path, st, old))
        # the playbook's non-package files, under <state_dir>/files/: only those not already as intended
        state_real = os.path.realpath(expand(sd))
        splan = []
        for sf in p.get("state_files") or []:
            rel = state_rel(sf.get("name"))
            spath = state_target(state_real, rel)
            if os.path.isdir(spath):
                raise AgentError("{state_dir}/%s is a directory; nothing was changed" % rel, "bad_input")
            if _sha_or_none(spath) != sf["sha_after"]:
                splan.append((sf, rel, spath))
        if not plan and not splan:
            notes += _drop_stale(pkg, p.get("drop_bytecode"), _pycache_prefixes(p) if p.get("drop_bytecode") else [])
            return _deployed(p, {"deploy_id": None, "files": [], "notes": notes, "final": _final(pkg, p)})
        ddir = os.path.dirname(manifest_path(sd, did, p.get("host")))
        if os.path.exists(ddir):
            raise AgentError("deploy %s already exists on this host" % did, "bad_input")
        makedirs_private(os.path.join(ddir, "backup"))
        m = {"id": did, "kind": kind, "state": "preparing", "created": time.time(), "package_dir": os.path.realpath(pkg),
             "package_real": os.path.realpath(pkg), "package_located": pkg, "writer": writer_identity(),
             "version": p.get("version"), "playbook": p.get("playbook"), "by": p.get("by"),
             "host": p.get("host"), "files": [], "pycache_prefixes": _pycache_prefixes(p), "state_real": state_real}
        if isinstance(p.get("container"), dict):  # the container it patched (its id: re-creation loses the patch)
            m["container"] = p["container"]
        for f, path, st, _ in plan:
            m["files"].append({"path": f["path"], "sha_before": f["sha_before"], "sha_after": f["sha_after"],
                               "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
                               "status": "pending", "backed_up": False})
        for sf, rel, spath in splan:  # (sha_before None: the deploy creates it; rollback removes it)
            m["files"].append({"path": "{state_dir}/" + rel, "root": "state", "rel": rel,
                               "sha_before": _sha_or_none(spath), "sha_after": sf["sha_after"],
                               "mode": int(sf.get("mode", 0o644)) & 0o777, "uid": None, "gid": None,
                               "status": "pending", "backed_up": False})
        save_manifest(sd, m)
        fault_point(p, "before_backup")
        bdir = os.path.join(ddir, "backup")
        try:
            for entry, (f, path, st, old) in zip(m["files"], plan):  # (the bytes checked above)
                dst = os.path.join(bdir, f["path"])
                makedirs_private(os.path.dirname(dst))
                write_atomic(dst, old, 0o600)
                entry["backed_up"] = True
            for entry in m["files"][len(plan):]:  # state files: a copy of what was there, if anything
                if entry["sha_before"] is not None:
                    dst = os.path.join(bdir, "_state", entry["rel"])
                    makedirs_private(os.path.dirname(dst))
                    with open(entry_path(m, entry), "rb") as src:
                        data = src.read()
                    if sha256_new(data).hexdigest() != entry["sha_before"]:
                        raise AgentError("%s changed while backing up" % entry["path"], "changed")
                    write_atomic(dst, data, 0o600)
                entry["backed_up"] = True
            m["state"] = "applying"
            save_manifest(sd, m)
        except Exception as e:
            # nothing in the package was touched: close the record (not 'interrupted'), free the space
            _close_unchanged(sd, m, bdir, e)
            raise AgentError("%s: %s; nothing was changed on the host"
                             % ("backing up" if m["state"] == "failed-unchanged" else "saving the manifest",
                                _why(e)), getattr(e, "kind", "failed")) from None
        fault_point(p, "after_backup")
        fault = p.get("_fault_after_files")  # test hook: stop dead after N renames
        # the intended bytes are the same on every host of a version: the controller compiled them
        # once with its own Python; a host whose Python has the same grammar (major.minor) need not
        # compile them again; any other Python checks them itself before the rename
        validate = p.get("validate", True) and p.get("validated_by") != "%d.%d" % sys.version_info[:2]
        done = 0
        pyc = {"prefixes": m["pycache_prefixes"], "removed": []}
        try:
            for entry, (f, path, st, _) in zip(m["files"], plan):
                if done:
                    fault_point(p, "between_renames", done)
                data = f["content"]  # raw bytes (marshal carries them)
                replace_file(path, data, entry["mode"], entry["uid"], entry["gid"], f["sha_after"],
                             validate_python=validate,
                             hook=lambda k=done + 1: fault_point(p, "mid_write", k), pyc=pyc)
                entry["status"] = "applied"
                save_manifest(sd, m)
                done += 1
                if fault is not None and done >= fault:
                    os._exit(99)
            for entry, (sf, rel, spath) in zip(m["files"][len(plan):], splan):
                if done:
                    fault_point(p, "between_renames", done)
                replace_file(state_target(state_real, rel), sf["content"], entry["mode"],
                             None, None, sf["sha_after"], validate_python=False,
                             hook=lambda k=done + 1: fault_point(p, "mid_write", k))
                entry["status"] = "applied"
                save_manifest(sd, m)
                done += 1
                if fault is not None and done >= fault:
                    os._exit(99)
            fault_point(p, "before_complete")
        except BaseException as e:
            res = _restore_files(sd, m, [x for x in m["files"] if x["backed_up"]], force=True)
            m["state"] = "failed-restored"
            m["note"] = str(e)
            save_manifest(sd, m)
            kind = getattr(e, "kind", "failed")
            raise AgentError("%s; the host was restored to its original files (%d restored)"
                             % (e, sum(1 for r in res if r["action"] == "restored")), kind) from None
        m["state"] = "complete" if kind == "deploy" else "restored-pristine"
        save_manifest(sd, m)
        fault_point(p, "after_complete")
        if pyc["removed"]:
            notes.append("removed %d cached bytecode file(s) of the replaced sources: %s"
                         % (len(pyc["removed"]), _shown_paths(pkg, pyc["removed"])))
        notes += _drop_stale(pkg, p.get("drop_bytecode"), m["pycache_prefixes"])
        return _deployed(p, {"deploy_id": did, "files": [{"path": x["path"], "sha_after": x["sha_after"]}
                                                         for x in m["files"]],
                             "notes": notes, "final": _final(pkg, p, state_real)})
    finally:
        release_lock(sd)


def action_rollback(p):
    """Undo the named deploys, newest first, restoring their recorded original bytes."""
    sd = p["state_dir"]
    force = bool(p.get("force"))
    if p.get("shared_tree"):
        _check_shared_dir(sd, p["shared_tree"] if isinstance(p["shared_tree"], str) else p.get("package_dir"))
    notes = acquire_lock(sd, "rollback", p.get("rollback_id"), p.get("by", "?"), p)
    try:
        fault_point(p, "locked")
        cur_real = None
        if "engine" in p:  # where this python imports the package from now (what a restore must not miss)
            # (the launch's python when the controller sends the launch, as facts located it)
            cur_real, cur_version = _current_tree(locate_package(p["engine"], p.get("package_dir"), p.get("launch"),
                                                                 strict=False))
            notes += close_superseded(sd, cur_real, cur_version)
        notes += recover_interrupted(sd)
        expect = p.get("expect_live")
        live_now = live_deploys(sd, p.get("entry"), cur_real)
        if expect is not None and live_now != list(expect):
            # the plan was made from facts read without the lock: what it would undo is not what is here now
            raise AgentError("the deploys on this host changed since the plan (planned against %s, now %s; a "
                             "concurrent deploy?); nothing was changed; run rollback again"
                             % (", ".join(expect) or "none", ", ".join(live_now) or "none"), "changed")
        done = []
        for did in p["deploy_ids"]:
            try:
                m = load_manifest(sd, did, p.get("entry"))
            except FileNotFoundError:
                raise AgentError("no deploy %s on this host" % did, "bad_input") from None
            if m.get("state") not in ("complete",):
                done.append({"deploy_id": did, "state": m.get("state"), "files": [], "skipped": True})
                continue
            tree = manifest_tree(m)
            if cur_real and tree and os.path.realpath(tree) != cur_real and not p.get("old_tree"):
                raise AgentError("deploy %s patched %s; this python now imports %s; nothing was changed; rerun "
                                 "with --old-tree to restore %s anyway" % (did, tree, cur_real, tree), "moved")
            entries = [f for f in m["files"] if f.get("status") == "applied"]
            # check everything first: refuse before changing anything
            pre = []
            for f in entries:
                if not is_state(f):
                    safe_target(m["package_dir"], f["path"])
                try:
                    cur = sha256_file(entry_path(m, f))
                except FileNotFoundError:
                    cur = None
                if cur not in (f["sha_after"], f["sha_before"]) and not force:
                    pre.append("%s changed since deploy %s (now %s)" % (f["path"], did, (cur or "missing")[:12]))
            if pre:
                raise AgentError(pre[0] + "; rerun with --force to overwrite it (a copy is kept)", "drifted")
            m["state"] = "rolling-back"
            save_manifest(sd, m)
            fault_point(p, "before_restore")
            forced_dir = os.path.join(os.path.dirname(manifest_path(sd, did, m.get("host"))),
                                      "forced-%d" % int(time.time()))
            res = _restore_files(sd, m, entries, force=force, forced_dir=forced_dir, p=p)
            fault_point(p, "before_complete")
            m["state"] = "rolled-back"
            m["rolled_back_at"] = time.time()
            m["rolled_back_by"] = p.get("by")
            save_manifest(sd, m)
            done.append({"deploy_id": did, "state": "rolled-back", "files": res})
        fault_point(p, "after_complete")
        return {"rollbacks": done, "notes": notes}
    finally:
        release_lock(sd)


def action_read_files(p):
    from binascii import b2a_base64
    pkg = p["package_dir"]
    out = {}
    for rel in p["paths"]:
        path = safe_target(pkg, rel)
        try:
            with open(path, "rb") as fh:
                out[rel] = b2a_base64(fh.read(), newline=False).decode()
        except FileNotFoundError:
            out[rel] = None
    return out


ACTIONS.update({"deploy": action_deploy, "rollback": action_rollback, "read_files": action_read_files})
