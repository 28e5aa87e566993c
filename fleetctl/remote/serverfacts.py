"""Agent part: what a host's servers are, read only (the facts hooks `servers` and `discover`).

`servers`: the instances fleetctl launched (their launch records under the state dir, alive or not,
and the deploy on disk against the one each was started on). `discover`: server processes that
fleetctl did not start, from /proc, bounded. A deploy that changes a host asks both (its restart
reminder), so this part is small and on its own: the start, wait, stop and grep actions are the
servers part's (servers.py, which needs this one loaded first: PART_NEEDS).
"""

import errno
import os

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.core import AgentError, expand, read_json_file, sha256_file
    from fleetctl.remote.hostfacts import EXTRA_FACTS
    from fleetctl.remote.records import list_manifests, mark_shared, tree_records_dirs


# no json, re or signal at start (core.py says why): read_json_file, plain string checks

_INSTANCE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def instance_name_ok(name):
    """1-64 of letters, digits, . _ - starting with a letter or digit."""
    return 0 < len(name) <= 64 and name[0] not in "._-" and _INSTANCE_CHARS.issuperset(name)


# The supervisor: `python -I -c SUPERVISOR EXIT_FILE PIPE_FD ARGV...`. Starts ARGV as its child (same
# session, stdio, env and cwd), hands the child's pid back over PIPE_FD ("E<why>" if it cannot
# start), waits for it and writes {"pid", "returncode", "ended_at"} to EXIT_FILE (atomically). It
# survives the SIGTERM/SIGINT/SIGHUP that `stop` sends the process group (a caught signal reverts to
# the default in the child at exec, so the server gets them as usual); SIGKILL ends both, and then
# no exit file says so. -I: the server's PYTHON* variables do not shape the supervisor.
SUPERVISOR = (
    "import os,sys,json,signal,subprocess,time\n"
    "x,w,a=sys.argv[1],int(sys.argv[2]),sys.argv[3:]\n"
    "for s in (signal.SIGTERM,signal.SIGINT,signal.SIGHUP):\n"
    " signal.signal(s,lambda *_:None)\n"
    "try:\n"
    " p=subprocess.Popen(a)\n"
    "except OSError as e:\n"
    " os.write(w,('E%s'%e).encode());sys.exit(127)\n"
    "os.write(w,str(p.pid).encode());os.close(w)\n"
    "rc=p.wait()\n"
    "d=json.dumps({'pid':p.pid,'returncode':rc,'ended_at':time.time()}).encode()\n"
    "t=x+'.tmp';f=os.open(t,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o600);os.write(f,d);os.fsync(f);os.close(f)\n"
    "os.replace(t,x)\n"
)


def proc_start_ticks(pid):
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot) and the state letter."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            raw = fh.read()
    except (OSError, ValueError):
        return None, None
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return int(rest[19]), rest[0].decode()
    except (IndexError, ValueError):
        return None, None


def boot_time():
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def ticks_to_epoch(ticks):
    bt = boot_time()
    if ticks is None or bt is None:
        return None
    return bt + ticks / float(os.sysconf("SC_CLK_TCK"))


def record_alive(rec):
    """True if the record's process still runs: same pid, same start time, not a zombie."""
    pid = rec.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    ticks, st = proc_start_ticks(pid)
    if ticks is None or st in ("Z", "X", "x"):
        return False
    return ticks == rec.get("start_ticks")


def _live_stats():
    """(pid, fields of /proc/PID/stat after the command name) of every live (non-zombie) process."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % n, "rb") as fh:
                raw = fh.read()
        except (OSError, ValueError):
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        if len(rest) > 19 and rest[0] not in (b"Z", b"X", b"x"):
            yield int(n), rest


def session_members(sid):
    """(pid, start ticks) of the live processes in session `sid` (the launch's pid tree: the agent
    starts every server in a new session), read from /proc."""
    out = []
    for pid, rest in _live_stats():
        try:
            if int(rest[3]) == sid:
                out.append((pid, int(rest[19])))
        except ValueError:
            continue
    return out


def proc_cmdline(pid, limit=65536):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            raw = fh.read(limit)
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def is_supervisor(rec, pid, argv):
    """The launch's exit-status supervisor (SUPERVISOR): often the very same python as the server,
    its argv even carries the server's argv; never the server."""
    return pid == rec.get("supervisor_pid") or SUPERVISOR in argv[1:4]


def find_server_process(rec):
    """The process of this launch that runs the server: in the launch's session, the oldest process
    whose executable is the launch's python (resolved on this host) and whose argv names the
    launch's module or script. Wrappers (a shell, nohup, numactl ...) never match: their executable
    is not that python; nor does the launch's supervisor (is_supervisor). Returns (pid, start
    ticks) or None (unknown, or not found)."""
    m = rec.get("server_match") or {}
    exe = m.get("executable")
    sid = rec.get("pgid") or rec.get("pid")
    if not exe or not isinstance(sid, int):
        return None
    want = os.path.realpath(exe)
    best = None
    for pid, ticks in session_members(sid):
        try:
            real = os.path.realpath("/proc/%d/exe" % pid)
        except OSError:
            continue
        if real != want:
            continue
        argv = proc_cmdline(pid)
        if is_supervisor(rec, pid, argv):
            continue
        target = m.get("target")
        if target and target not in argv and "-m" + target not in argv:
            continue
        if best is None or ticks < best[1]:
            best = (pid, ticks)
    return best


def server_alive(rec):
    """Is the SERVER of this launch alive (not merely its wrapper)? Judged by the server process
    identified when it became ready; a launch whose server was never identified (no python of the
    launch found, or an old record) is judged by its launch process."""
    spid = rec.get("server_pid")
    if isinstance(spid, int) and spid > 0:
        ticks, st = proc_start_ticks(spid)
        return ticks is not None and st not in ("Z", "X", "x") and ticks == rec.get("server_start_ticks")
    return record_alive(rec)


def launch_alive(rec):
    """Does any process of this launch still run: its launch process, its identified server, or
    another member of its process group that is not its supervisor (a wrapper's child that outlived
    the wrapper)?"""
    if record_alive(rec):
        return True
    spid = rec.get("server_pid")
    if isinstance(spid, int) and spid > 0 and server_alive(rec):
        return True
    pg = rec.get("pgid")
    if not isinstance(pg, int) or pg <= 0:
        return False
    return any(x != rec.get("supervisor_pid") for x in group_members(pg))


def identify_server(rec):
    """Record the server process of a launch in `rec` (server_pid/server_start_ticks); True if found."""
    got = find_server_process(rec)
    if got is None:
        return False
    rec["server_pid"], rec["server_start_ticks"] = got
    return True


def group_members(pgid):
    """Pids of the live (non-zombie) processes in process group `pgid`, read from /proc."""
    out = []
    for pid, rest in _live_stats():
        try:
            if int(rest[2]) == pgid:
                out.append(pid)
        except ValueError:
            continue
    return out


def check_name(name, what="instance"):
    if not isinstance(name, str) or not instance_name_ok(name):
        raise AgentError("bad %s name %r" % (what, name), "bad_input")
    return name


def servers_root(state_dir):
    return os.path.join(expand(state_dir), "servers")


def instance_dir(state_dir, name):
    return os.path.join(servers_root(state_dir), check_name(name))


def read_json(path):
    try:
        return read_json_file(path)
    except (OSError, ValueError):
        return None


def current_record(state_dir, name):
    return read_json(os.path.join(instance_dir(state_dir, name), "current.json"))


def read_exit(rec):
    """How the record's server ended: {"returncode": int, "ended_at": float, "pid": int}, or None
    (still running, killed with its supervisor, or launched before exit files existed)."""
    path = rec.get("exit_file")
    got = read_json(path) if isinstance(path, str) else None
    if not isinstance(got, dict) or not isinstance(got.get("returncode"), int):
        return None
    if got.get("pid") != rec.get("pid"):
        return None
    return {"returncode": got["returncode"], "ended_at": got.get("ended_at"), "pid": got.get("pid")}


def list_instances(state_dir, entry=None):
    """The instances with a launch record; with `entry` (the asking inventory entry), only that entry's."""
    root = servers_root(state_dir)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    names = [n for n in names if instance_name_ok(n) and os.path.isfile(os.path.join(root, n, "current.json"))]
    if entry:
        names = [n for n in names if owned_by(current_record(state_dir, n), entry)]
    return names


def owned_by(rec, entry):
    """Is this launch record the inventory entry `entry`'s? Two inventory entries may name one machine
    and one state dir (A/B servers on other GPUs and ports): each entry's servers are its own. A record
    names the entry that launched it ("host"); one that names none (or is unreadable) is every entry's."""
    owner = rec.get("host") if isinstance(rec, dict) else None
    return not entry or not isinstance(owner, str) or not owner or owner == entry


def hash_files(pkg_dir, rels):
    out = {}
    for rel in rels or []:
        try:
            out[rel] = sha256_file(os.path.join(pkg_dir, rel))
        except OSError:
            out[rel] = None
    return out


def tree_manifests(state_dir, pkg_dir):
    """The manifests recorded with a shared package tree (records.tree_records_dirs)."""
    out = []
    if not pkg_dir:
        return out
    real = os.path.realpath(pkg_dir)
    for rdir in tree_records_dirs(real):
        if os.path.isdir(rdir) and os.path.realpath(rdir) != os.path.realpath(expand(state_dir)):
            mark_shared(rdir, real)
            out += list_manifests(rdir)
    return out


def deploy_on_disk(state_dir, pkg_dir=None):
    """The newest complete deploy whose files all still hold its patched bytes (None: none does).
    With the package dir the server imports: only deploys of that tree, those recorded beside a
    shared tree (records.tree_records_dir) included."""
    ms = list_manifests(state_dir)
    real = os.path.realpath(pkg_dir) if pkg_dir else None
    if real:
        ms = sorted(ms + tree_manifests(state_dir, real), key=lambda m: (m.get("created", 0), m.get("id", "")))
        ms = [m for m in ms if os.path.realpath(m.get("package_real") or m.get("package_dir") or "") == real]
    for m in reversed(ms):
        if m.get("state") != "complete" or not m.get("files"):
            continue
        pkg = m.get("package_dir") or ""
        ok = True
        for f in m["files"]:
            try:
                cur = sha256_file(os.path.join(pkg, f["path"]))
            except OSError:
                cur = None
            if cur != f.get("sha_after"):
                ok = False
                break
        if ok:
            return {"id": m.get("id"), "at": m.get("updated") or m.get("created"), "created": m.get("created"),
                    "files": [f["path"] for f in m["files"]], "package_dir": pkg, "playbook": m.get("playbook")}
    return None


def port_free(port, host="127.0.0.1"):
    """True if nothing listens on host:port (a bind test; TIME_WAIT leftovers do not count)."""
    import socket
    for addr in (host, "0.0.0.0"):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, int(port)))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            if e.errno == errno.EADDRNOTAVAIL:
                continue
            raise
        finally:
            s.close()
    return True


def instance_state(state_dir, name, deploy_now=None, with_hashes=True):
    """Everything known about one instance: its record, alive or not, files changed since launch."""
    rec = current_record(state_dir, name)
    st = {"instance": name, "record": rec, "running": False}
    if rec is None:
        return st
    alive = launch_alive(rec)
    if alive and not rec.get("server_pid") and rec.get("state") == "started":
        identify_server(rec)  # identified late (not saved: facts are read-only)
    st["running"] = alive and server_alive(rec)
    st["launch_alive"] = alive
    if alive and not st["running"]:
        st["wrapper_only"] = True  # the server process is gone, a wrapper of the launch lives on
    if not alive:
        st["exit"] = read_exit(rec)  # how its launch process ended (its supervisor wrote it)
    pkg = rec.get("package_dir")
    at_launch = rec.get("worker_hashes") or {}
    if with_hashes and pkg and at_launch:
        now = hash_files(pkg, list(at_launch))
        st["hashes_now"] = now
        st["changed_files"] = sorted(r for r, h in at_launch.items() if now.get(r) != h)
    else:
        st["changed_files"] = []
    st["restart_needed"] = bool(st["changed_files"]) and st["running"]
    st["deploy_now"] = deploy_now
    st["log_exists"] = bool(rec.get("log")) and os.path.isfile(rec["log"])
    return st


def servers_facts(p, sg):
    """Extra facts hook ("servers"): every instance with a record, and which asked ports are free."""
    sd = p.get("state_dir") or "~/.fleetctl"
    dep = deploy_on_disk(sd, sg.get("dir") if sg and sg.get("found") else None)
    out = {"state_dir": expand(sd), "deploy_now": dep,
           "instances": [instance_state(sd, n, dep) for n in list_instances(sd, p.get("entry"))]}
    ports = p.get("server_ports") or []
    out["ports"] = dict((str(pt), port_free(pt)) for pt in ports)
    return out


SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH")


MAX_DISCOVERED = 64


MAX_ARGS = 256


MAX_ARG = 4096


def _read_proc(pid, name, limit=1 << 20):
    """Up to `limit` bytes of /proc/PID/NAME; None if unreadable. (os.read, not open(): a scan reads
    one such file per process of the host, and the buffered file object costs several times more.
    `cmdline` and `environ` answer a read with all they hold up to the size asked, so there a shorter
    answer is the end: no second read to see it. Others (net/tcp: a page of lines per read) are read
    to their end.)"""
    whole = name in ("cmdline", "environ")
    try:
        fd = os.open("/proc/%d/%s" % (pid, name), os.O_RDONLY)
    except (OSError, ValueError):
        return None
    try:
        parts = []
        got = 0
        while got < limit:
            ask = min(limit - got, 1 << 16)
            b = os.read(fd, ask)
            if not b:
                break
            parts.append(b)
            got += len(b)
            if whole and len(b) < ask:
                break
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def _readlink(path):
    try:
        return os.readlink(path)[:MAX_ARG]
    except (OSError, ValueError):
        return None


def server_argv_matches(argv, rules):
    """Does this command line start a server? rules: {"modules": ["pkg.mod", "pkg.cli serve"],
    "scripts": ["name serve"], "paths": ["pkg/launch_server.py"]} (words after the first: the
    subcommand that must follow)."""
    for i, a in enumerate(argv[:8]):
        for m in rules.get("modules") or []:
            mod, _, sub = m.partition(" ")
            hit = (a == "-m" and i + 1 < len(argv) and argv[i + 1] == mod) or a == "-m" + mod
            if hit:
                j = i + 2 if a == "-m" else i + 1
                if not sub or (j < len(argv) and argv[j] == sub):
                    return True
        for sc in rules.get("scripts") or []:
            name, _, sub = sc.partition(" ")
            if os.path.basename(a) == name and (not sub or (i + 1 < len(argv) and argv[i + 1] == sub)):
                return True
        for suffix in rules.get("paths") or []:
            if a.endswith("/" + suffix) or a == suffix:
                return True
    return False


def argv_needles(rules):
    """Byte strings at least one of which is in the raw /proc cmdline of every command line that
    server_argv_matches(rules) accepts (each rule's first word: the module, the script's name, the
    path's suffix, which the match needs whole inside one argument), so a process with none of them
    needs no decoding; None when no such list can be made (an empty or undecodable word)."""
    out = []
    for key in ("modules", "scripts", "paths"):
        for r in rules.get(key) or []:
            w = str(r).partition(" ")[0]
            if not w or "\ufffd" in w:
                return None
            try:
                out.append(w.encode("utf-8"))
            except UnicodeEncodeError:
                return None
    return tuple(out)


def _listening_ports(pid):
    """TCP ports a process listens on: its socket fds matched against /proc/net/tcp{,6}."""
    inodes = set()
    try:
        fds = os.listdir("/proc/%d/fd" % pid)[:4096]
    except OSError:
        return None
    for fd in fds:
        t = _readlink("/proc/%d/fd/%s" % (pid, fd)) or ""
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        raw = _read_proc(pid, "net/" + table, 8 << 20) or b""
        for line in raw.decode("ascii", "replace").splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and f[9] in inodes:
                try:
                    ports.add(int(f[1].rsplit(":", 1)[1], 16))
                except (IndexError, ValueError):
                    pass
    return sorted(ports)


def discover_facts(p, sg):
    """Extra facts hook ("discover"): server processes on this host whoever started them, from /proc.

    Each: pid, argv, start time, cwd, exe, log (fd 1/2), listening ports, the environment variables
    named by p["discover_env"] prefixes (never names that look secret; None if unreadable), the
    fleetctl instance whose record it is (if any), and `changed_files`: files of the located package
    (p["discover_files"], relative) whose inode changed after the process started, i.e. it runs older
    code than the files on disk, if it imports that package."""
    rules = p.get("discover") or {}
    prefixes = tuple(str(x) for x in (p.get("discover_env") or []))
    files = [str(x) for x in (p.get("discover_files") or [])]
    sd = p.get("state_dir") or "~/.fleetctl"
    by_pid = {}
    for n in list_instances(sd):
        rec = current_record(sd, n)
        if rec and isinstance(rec.get("pid"), int) and record_alive(rec):
            by_pid[rec["pid"]] = n
        if rec and isinstance(rec.get("server_pid"), int) and server_alive(rec):
            by_pid[rec["server_pid"]] = n  # the server under a wrapper (identified at ready)
    mine = set()
    pid = os.getpid()
    while pid > 1 and len(mine) < 64:  # this agent and its ancestors (the ssh session) are not servers
        mine.add(pid)
        raw = _read_proc(pid, "stat", 4096) or b""
        try:
            pid = int(raw[raw.rfind(b")") + 2:].split()[1])
        except (IndexError, ValueError):
            break
    pkg = sg.get("dir") if sg.get("found") else None
    changed_at = {}
    for rel in files:
        if pkg and safe_rel(rel):
            try:
                st = os.stat(os.path.join(pkg, rel))
                changed_at[rel] = max(st.st_mtime, st.st_ctime)
            except OSError:
                pass
    # The sandbox runs every "host" on one machine: there, a host is the processes whose environment
    # carries its FLEETCTL_SANDBOX_DIR and FLEETCTL_SANDBOX_HOST (the sandbox sets both in every session),
    # so one sandbox host does not see another's servers. Real hosts never set these.
    scope = [(k, os.environ[k]) for k in ("FLEETCTL_SANDBOX_DIR", "FLEETCTL_SANDBOX_HOST") if k in os.environ]
    scope = [("%s=%s" % kv).encode("utf-8", "replace") for kv in scope] if len(scope) == 2 else []
    out = []
    truncated = False
    try:
        pids = sorted(int(x) for x in os.listdir("/proc") if x.isdigit())
    except OSError:
        pids = []
    needles = argv_needles(rules)
    for pid in pids:
        if pid in mine:
            continue
        raw = _read_proc(pid, "cmdline")
        if not raw:
            continue
        if needles is not None and not any(n in raw for n in needles):
            continue  # (most of a host's processes: no rule's word anywhere in its command line)
        argv = [a.decode("utf-8", "replace")[:MAX_ARG] for a in raw.split(b"\0")[:-1][:MAX_ARGS]]
        if not argv or not server_argv_matches(argv, rules):
            continue
        ticks, state = proc_start_ticks(pid)
        if state in (None, "Z", "X", "x"):
            continue
        if len(out) >= MAX_DISCOVERED:
            truncated = True
            break
        started = ticks_to_epoch(ticks)
        env = None
        raw_env = _read_proc(pid, "environ")
        if scope and not (raw_env and all(x in raw_env.split(b"\0") for x in scope)):
            continue
        if raw_env is not None:
            env = {}
            for item in raw_env.split(b"\0"):
                k, eq, v = item.decode("utf-8", "replace").partition("=")
                if eq and k.startswith(prefixes) and not any(w in k.upper() for w in SECRET_WORDS):
                    env[k[:256]] = v[:MAX_ARG]
        try:
            uid = os.stat("/proc/%d" % pid).st_uid
        except OSError:
            uid = None
        stale = sorted(r for r, t in changed_at.items() if started is not None and t >= started + 1.0)
        stat = _read_proc(pid, "stat", 4096) or b""
        try:
            ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        except (IndexError, ValueError):
            ppid = None
        out.append({"pid": pid, "ppid": ppid, "argv": argv, "started": started, "start_ticks": ticks, "uid": uid,
                    "cwd": _readlink("/proc/%d/cwd" % pid), "exe": _readlink("/proc/%d/exe" % pid),
                    "stdout": _readlink("/proc/%d/fd/1" % pid), "stderr": _readlink("/proc/%d/fd/2" % pid),
                    "ports": _listening_ports(pid), "env": env, "instance": by_pid.get(pid),
                    "package_dir": pkg, "changed_files": stale})
    # a wrapper that runs the server as its child (`timeout 9h python -m ...`, fleetctl's own exit-status
    # supervisor) matches too: the server is the innermost match
    parents = set(x["ppid"] for x in out)
    out = [x for x in out if x["pid"] not in parents]
    return {"processes": out, "truncated": truncated}


def safe_rel(rel):
    return not rel.startswith("/") and ".." not in rel.split("/")


EXTRA_FACTS["servers"] = servers_facts
EXTRA_FACTS["discover"] = discover_facts
