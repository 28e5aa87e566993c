"""Run one tool process and report its own rusage (run with `python -S`, stdlib only).

    python -S bench/launch.py RESULT.json -- ARGV...

Why a launcher: Linux charges a process's ru_maxrss with the RSS its memory had before exec, so a
tool forked straight from the (bigger) bench driver would report the driver's RSS. This small
process forks and execs the tool, waits for it with wait4, and is a child subreaper, so processes
the tool leaves behind (ansible's ControlPersist ssh masters) become its children: they are sent
SIGTERM, reaped, and their CPU is added. Writes {"wall", "cpu", "user", "sys", "maxrss_kb", "rc",
"orphans_reaped"}; the tool's exit code is in "rc".
"""

import ctypes
import json
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def children():
    me = str(os.getpid())
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            out.append(int(name))
    return out


def main():
    result, argv = sys.argv[1], sys.argv[3:]
    try:
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    _, status, ru = os.wait4(pid, 0)
    wall = time.monotonic() - t0
    user, sys_, rss, reaped = ru.ru_utime, ru.ru_stime, ru.ru_maxrss, 0
    orphans = children()
    for p in orphans:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    for p in orphans:
        while True:
            try:
                got, _, r = os.wait4(p, os.WNOHANG)
            except ChildProcessError:
                break
            if got:
                user, sys_, rss, reaped = user + r.ru_utime, sys_ + r.ru_stime, max(rss, r.ru_maxrss), reaped + 1
                break
            if time.monotonic() > deadline:
                os.kill(p, signal.SIGKILL)
            time.sleep(0.02)
    with open(result, "w") as fh:
        json.dump({"wall": wall, "cpu": user + sys_, "user": user, "sys": sys_, "maxrss_kb": rss,
                   "rc": os.waitstatus_to_exitcode(status), "orphans_reaped": reaped}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
