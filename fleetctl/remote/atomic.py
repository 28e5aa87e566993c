"""Agent part: the one atomic write (`write_atomic`: temp beside the target -> fsync -> checks ->
rename -> dir fsync) and the primitives under it. Imports nothing of the agent: core.py caches a
loaded part with it, files.py and the rest build on it.
"""

import os


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


def write_atomic(path, data, mode=0o600, tmp=None, before=None, link=False):
    """THE atomic write of the agent (state files, manifests, backups, locks, package files): a new
    temp file beside `path` (created exclusively, 0600, never following a symlink: named `tmp`, else
    a random name), `data` written and fsync'd, `before(tmp)` (checks that may still refuse: then
    nothing was changed), its `mode`, then renamed over `path` (link=True: hard-linked to `path`,
    which must not exist: FileExistsError) and the directory fsync'd. The temp never outlives it."""
    d = os.path.dirname(path)
    if tmp is None:
        fd, tmp = mkstemp(d, ".tmp-")
    else:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if before is not None:
            before(tmp)
        if mode != 0o600:
            os.chmod(tmp, mode)
        if link:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if link:
        os.unlink(tmp)
    fsync_dir(d)
