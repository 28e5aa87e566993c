"""Agent part: the host lock of the deploy state and the identity of who holds it.

Layout under the host's state dir (default ~/.fleetctl, mode 0700):
    lock                         JSON of the holder; O_EXCL-created, removed on release
    deploys/<id>/manifest.json   what the deploy did, per file, and how far it got
    deploys/<id>/backup/<path>   the original bytes of every file the deploy changed
    deploys/<id>@<hostname>/     the same, when a state dir shared with another machine (an NFS home)
                                 already holds that machine's deploys/<id>
Locks and manifests record the machine that wrote them (see machine_identity): a host never takes
over another machine's lock on its own and never acts on another machine's manifest.
"""

import errno
import os
import stat
import time

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.atomic import fsync_dir, write_atomic
    from fleetctl.remote.core import AgentError, expand, fault_point, jdumps, read_json_file



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


def pid_alive(pid, start=None):
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


def read_first_line(path):
    try:
        with open(path) as fh:
            return fh.readline().strip() or None
    except OSError:
        return None


_IDENTITY = []  # this process's machine identity, read once (a boot id cannot change under a process)


def machine_identity():
    if not _IDENTITY:
        _IDENTITY.append({"hostname": os.uname()[1], "machine_id": read_first_line("/etc/machine-id")
                          or read_first_line("/var/lib/dbus/machine-id"),
                          "boot_id": read_first_line("/proc/sys/kernel/random/boot_id")})
    return dict(_IDENTITY[0])


def writer_identity():
    """This process as the writer of a lock or manifest."""
    me = machine_identity()
    own = _proc_stat(os.getpid())
    me.update(pid=os.getpid(), start=own[1] if own else None)
    return me


def ident_of(rec):
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
    ident = ident_of(info)
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
    info["stale"] = not (isinstance(pid, int) and pid_alive(pid, start if isinstance(start, int) else None))
    return info


# errnos of a link(2) refused because the filesystem has no hard links (then the lock is made with O_EXCL)
NO_HARD_LINKS = tuple(getattr(errno, n) for n in ("EPERM", "EOPNOTSUPP", "ENOTSUP", "EXDEV", "EMLINK", "ENOSYS")
                      if hasattr(errno, n))


def _create_lock(lock, data):
    """Create `lock` holding `data` in one step: write_atomic's complete temp file hard-linked to the
    lock name (fails if it exists), so nobody ever reads a half-written lock. True if created."""
    try:
        write_atomic(lock, data, link=True)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in NO_HARD_LINKS:  # a full disk, a read-only dir...: no lock, the error says why
            raise
    # a filesystem without hard links: O_EXCL create, then write; a lock that could not be written
    # whole is removed again (a half-written lock would hold the host until someone breaks it)
    try:
        lfd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        with os.fdopen(lfd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        try:
            os.unlink(lock)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(lock))
    return True


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
        if info.get("pid") == os.getpid() and same_machine(ident_of(info)):  # not another machine's pid
            os.unlink(lock)
    except (OSError, ValueError, AttributeError):
        pass
