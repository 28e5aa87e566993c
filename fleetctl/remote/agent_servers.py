"""Agent part: the servers fleetctl launches on a host (start, wait, stop, status, bounded grep).

Layout under the host's state dir:
    servers/<instance>/current.json          launch record of the instance's newest launch
    servers/<instance>/launches/<id>.json    every launch record (history)
    servers/<instance>/logs/<id>.log         stdout+stderr of that launch (a new file per launch)

A server is started detached (its own session and process group) with an exact argv list and an
exact environment; it is identified later by pid AND its start time in /proc (pids get reused).
Stopping signals that process group only. Log checks run here, on the host, and send back only
the matching lines (bounded), never a whole log.
"""

if __name__ != "fleetctl_agent":  # imported locally (tests, the sandbox simulator)
    from fleetctl.remote.agent import *  # noqa: F403
    from fleetctl.remote.agent import (
        ACTIONS,
        EXTRA_FACTS,
        AgentError,
        expand,
        launch_cwd,
        launch_environment,
        sha256_file,
    )
    from fleetctl.remote.agent_deploy import acquire_lock, list_manifests, release_lock, write_atomic

import errno
import json
import os
import re
import signal
import time

INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LAUNCH_RE = INSTANCE_RE
MAX_LINE = 65536


# ----------------------------------------------------------------------------- /proc


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


def session_members(sid):
    """(pid, start ticks) of the live processes in session `sid` (the launch's pid tree: the agent
    starts every server in a new session), read from /proc."""
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % n, "rb") as fh:
                raw = fh.read()
        except (OSError, ValueError):
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        try:
            if int(rest[3]) == sid and rest[0] not in (b"Z", b"X", b"x"):
                out.append((int(n), int(rest[19])))
        except (IndexError, ValueError):
            continue
    return out


def proc_cmdline(pid, limit=65536):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            raw = fh.read(limit)
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def find_server_process(rec):
    """The process of this launch that runs the server: in the launch's session, the oldest process
    whose executable is the launch's python (resolved on this host) and whose argv names the
    launch's module or script. Wrappers (a shell, nohup, numactl ...) never match: their executable
    is not that python. Returns (pid, start ticks) or None (unknown, or not found)."""
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
        target = m.get("target")
        if target and target not in proc_cmdline(pid):
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
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % n, "rb") as fh:
                raw = fh.read()
        except (OSError, ValueError):
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        try:
            if int(rest[2]) == pgid and rest[0] not in (b"Z", b"X", b"x"):
                out.append(int(n))
        except (IndexError, ValueError):
            continue
    return out


def group_alive(pgid):
    """True while a live process of the group remains (zombies waiting for their reaper do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if os.path.isdir("/proc/self"):
        return bool(group_members(pgid))
    return True


# ----------------------------------------------------------------------------- layout


def check_name(name, what="instance"):
    if not isinstance(name, str) or not INSTANCE_RE.match(name):
        raise AgentError("bad %s name %r" % (what, name), "bad_input")
    return name


def servers_root(state_dir):
    return os.path.join(expand(state_dir), "servers")


def instance_dir(state_dir, name):
    return os.path.join(servers_root(state_dir), check_name(name))


def mkdirs(path):
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700)


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def current_record(state_dir, name):
    return read_json(os.path.join(instance_dir(state_dir, name), "current.json"))


def save_record(state_dir, rec):
    d = instance_dir(state_dir, rec["instance"])
    data = json.dumps(rec, indent=1, sort_keys=True).encode()
    write_atomic(os.path.join(d, "launches", check_name(rec["launch_id"], "launch") + ".json"), data)
    write_atomic(os.path.join(d, "current.json"), data)


def list_instances(state_dir):
    root = servers_root(state_dir)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [n for n in names if INSTANCE_RE.match(n) and os.path.isfile(os.path.join(root, n, "current.json"))]


# ----------------------------------------------------------------------------- facts about files


def hash_files(pkg_dir, rels):
    out = {}
    for rel in rels or []:
        try:
            out[rel] = sha256_file(os.path.join(pkg_dir, rel))
        except OSError:
            out[rel] = None
    return out


def deploy_on_disk(state_dir):
    """The newest complete deploy whose files all still hold its patched bytes (None: none does)."""
    for m in reversed(list_manifests(state_dir)):
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
                    "files": [f["path"] for f in m["files"]], "package_dir": pkg}
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


def marker_in_init(source, class_name, marker):
    """Does `class_name.__init__` in `source` hold a string literal containing `marker`?

    Returns {"class": bool, "init": bool, "marker": bool, "error": str|None}. String literals
    include the constant parts of f-strings; comments and other methods do not count.
    """
    import ast
    out = {"class": False, "init": False, "marker": False, "error": None}
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        out["error"] = "does not parse: line %s: %s" % (e.lineno, e.msg)
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            out["class"] = True
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__":
                    out["init"] = True
                    for sub in ast.walk(item):
                        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and marker in sub.value:
                            out["marker"] = True
                            return out
    return out


# ----------------------------------------------------------------------------- log reading


def tail_lines(path, n=30, max_bytes=65536):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is probably cut
    return [ln[:2000] for ln in lines[-n:]]


def grep_log(path, patterns, max_per_pattern=256, max_line=MAX_LINE, max_total=4 << 20):
    """Lines of `path` containing each literal pattern: {pattern: {"count": n, "lines": [...]}}.

    Bounded: at most max_per_pattern lines per pattern, each cut at max_line bytes, and max_total
    bytes of lines overall (counts keep counting; "truncated" says lines were left out).
    """
    found = dict((p, {"count": 0, "lines": [], "truncated": False}) for p in patterns)
    enc = [(p, p.encode("utf-8")) for p in patterns]
    size = 0
    sent = 0
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                size += len(raw)
                for p, b in enc:
                    if b in raw:
                        slot = found[p]
                        slot["count"] += 1
                        part = raw[:max_line]
                        if len(slot["lines"]) < max_per_pattern and sent + len(part) <= max_total:
                            slot["lines"].append(part.decode("utf-8", "replace").rstrip("\r\n"))
                            sent += len(part)
                        else:
                            slot["truncated"] = True
    except OSError as e:
        raise AgentError("cannot read log %s: %s" % (path, e.strerror or e), "failed") from None
    return found, size


# ----------------------------------------------------------------------------- instance state


def instance_state(state_dir, name, deploy_now=None, with_hashes=True):
    """Everything known about one instance: its record, alive or not, files changed since launch."""
    rec = current_record(state_dir, name)
    st = {"instance": name, "record": rec, "running": False}
    if rec is None:
        return st
    launch_alive = record_alive(rec) or (isinstance(rec.get("pgid"), int) and group_alive(rec["pgid"]))
    if launch_alive and not rec.get("server_pid") and rec.get("state") == "started":
        identify_server(rec)  # identified late (not saved: facts are read-only)
    st["running"] = launch_alive and server_alive(rec)
    st["launch_alive"] = launch_alive
    if launch_alive and not st["running"]:
        st["wrapper_only"] = True  # the server process is gone, a wrapper of the launch lives on
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
    dep = deploy_on_disk(sd)
    out = {"state_dir": expand(sd), "deploy_now": dep,
           "instances": [instance_state(sd, n, dep) for n in list_instances(sd)]}
    ports = p.get("server_ports") or []
    out["ports"] = dict((str(pt), port_free(pt)) for pt in ports)
    return out


EXTRA_FACTS["servers"] = servers_facts


# ----------------------------------------------------------------------------- actions


def action_server_start(p):
    """Start one server detached: new session, exact argv and env, output to a new log file."""
    sd = p["state_dir"]
    name = check_name(p["instance"])
    lid = check_name(p["launch_id"], "launch")
    argv = p["argv"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise AgentError("argv must be a non-empty list of strings", "bad_input")
    # host basics (PATH, HOME, ...) from this host's session, then the launch's env: the same
    # computation the probe that located sglang for this launch used (an `env` prefix in argv does the rest)
    env = launch_environment({"env": p.get("env") or {}, "inherit": p.get("inherit_env") or []})
    # the host lock: no launch while a deploy or rollback is changing files (and vice versa)
    acquire_lock(sd, "launch", lid, p.get("by", "?"))
    try:
        return _start_locked(p, sd, name, lid, argv, env)
    finally:
        release_lock(sd)


def _start_locked(p, sd, name, lid, argv, env):
    import subprocess
    prev = current_record(sd, name)
    if prev is not None and record_alive(prev):
        raise AgentError("%s is already running (pid %s, launch %s); stop it first or use --replace"
                         % (name, prev.get("pid"), prev.get("launch_id")), "running")
    for m in list_manifests(sd):
        if m.get("state") in ("preparing", "applying", "rolling-back"):
            raise AgentError("deploy %s was interrupted (%s): the files are mixed; run 'fleetctl rollback' or "
                             "'fleetctl deploy' to repair before launching" % (m.get("id"), m.get("state")),
                             "interrupted")
    d = instance_dir(sd, name)
    for sub in ("", "logs", "launches"):
        mkdirs(os.path.join(d, sub))
    log = os.path.join(d, "logs", lid + ".log")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    pkg = p.get("package_dir")
    hashes = hash_files(pkg, p.get("hash_files")) if pkg else {}
    dep = deploy_on_disk(sd)
    cwd = launch_cwd(p.get("cwd"), env)
    rec = {"instance": name, "launch_id": lid, "launched_at": time.time(), "argv": p.get("public_argv") or argv,
           "env": p.get("public_env") or {}, "inherited_env": sorted(k for k in (p.get("inherit_env") or [])
                                                                     if k in os.environ),
           "log": log, "package_dir": pkg, "worker_hashes": hashes,
           "deploy": dep, "cwd": cwd}
    rec.update(p.get("extra") or {})
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env, cwd=cwd,
                                start_new_session=True, close_fds=True)
    except OSError as e:
        os.write(fd, ("fleetctl: cannot start %r: %s\n" % (argv[0], e)).encode())
        os.close(fd)
        rec.update(pid=None, state="failed-to-start", error=str(e))
        save_record(sd, rec)
        raise AgentError("cannot start %s: %s" % (argv[0], e), "failed") from None
    os.close(fd)
    ticks, _ = proc_start_ticks(proc.pid)
    rec.update(pid=proc.pid, pgid=proc.pid, start_ticks=ticks, process_started=ticks_to_epoch(ticks),
               state="started")
    save_record(sd, rec)
    return rec


def action_server_wait(p):
    """Wait until each named instance is ready, dead, shows a forbidden line, or time is up."""
    sd = p["state_dir"]
    names = [check_name(n) for n in p["instances"]]
    ready = p["ready_line"]
    forbidden = list(p.get("forbidden") or [])
    deadline = time.time() + float(p.get("timeout", 900))
    poll = float(p.get("poll", 0.05))
    ntail = int(p.get("tail", 30))
    st = {}
    for n in names:
        rec = current_record(sd, n)
        if rec is None or not rec.get("log"):
            st[n] = {"status": "failed", "why": "no launch record"}
            continue
        if p.get("launch_ids") and rec.get("launch_id") != p["launch_ids"].get(n):
            st[n] = {"status": "failed", "why": "launch record is of another launch (%s)" % rec.get("launch_id")}
            continue
        st[n] = {"status": None, "rec": rec, "offset": 0, "partial": b""}
    while True:
        pending = [n for n in names if st[n]["status"] is None]
        for n in pending:
            s = st[n]
            rec = s["rec"]
            if not rec.get("server_pid") and record_alive(rec):
                identify_server(rec)
            alive = record_alive(rec) and server_alive(rec)
            try:
                with open(rec["log"], "rb") as fh:
                    fh.seek(s["offset"])
                    chunk = fh.read()
            except OSError as e:
                s.update(status="failed", why="cannot read the log: %s" % e)
                continue
            s["offset"] += len(chunk)
            data = s["partial"] + chunk
            lines = data.split(b"\n")
            s["partial"] = lines.pop()
            if not alive and s["partial"]:  # the process is gone: its last line is complete
                lines.append(s["partial"])
                s["partial"] = b""
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                for f in forbidden:
                    if f in line:
                        s.update(status="forbidden", why="forbidden pattern %r in the log" % f, line=line[:2000])
                        break
                if s["status"]:
                    break
                if ready in line:
                    s.update(status="ready", line=line[:2000])
                    break
            if s["status"] is None and not alive:
                s.update(status="exited", why="the server process exited during start-up")
        if all(st[n]["status"] is not None for n in names):
            break
        if time.time() >= deadline:
            for n in names:
                if st[n]["status"] is None:
                    st[n].update(status="timeout", why="not ready after %gs" % float(p.get("timeout", 900)))
            break
        time.sleep(poll)
    # a failing server is usually still writing its traceback: let it finish (bounded) before the tail
    grace = time.time() + float(p.get("grace", 2.0))
    while time.time() < grace and any(st[n]["status"] == "forbidden" and record_alive(st[n]["rec"]) for n in names):
        time.sleep(0.05)
    out = {}
    now = time.time()
    for n in names:
        s = st[n]
        rec = s.get("rec") or {}
        if rec and s["status"] == "ready":
            if rec.get("server_pid") or identify_server(rec):
                save_record(sd, rec)  # judged by its server process from now on (status, verify-logs)
        r = {"status": s["status"], "why": s.get("why"), "line": s.get("line"),
             "running": record_alive(rec) if rec else False, "server_pid": rec.get("server_pid"),
             "seconds": round(now - rec["launched_at"], 3) if rec.get("launched_at") else None}
        if s["status"] != "ready" and rec.get("log"):
            r["tail"] = tail_lines(rec["log"], ntail)
        out[n] = r
    return out


def stop_record(rec, timeout, kill_after=5.0):
    """SIGTERM the record's process group, wait, then SIGKILL it. Returns what happened."""
    pid = rec.get("pid")
    if not isinstance(pid, int) or not record_alive(rec):
        return {"instance": rec["instance"], "action": "not running", "launch_id": rec.get("launch_id")}
    pgid = rec.get("pgid") or pid
    t0 = time.time()
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    how = "SIGTERM"
    deadline = t0 + timeout
    while time.time() < deadline and (record_alive(rec) or group_alive(pgid)):
        time.sleep(0.05)
    if record_alive(rec) or group_alive(pgid):
        how = "SIGKILL after %gs" % timeout
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        end = time.time() + kill_after
        while time.time() < end and (record_alive(rec) or group_alive(pgid)):
            time.sleep(0.05)
    gone = not record_alive(rec) and not group_alive(pgid)
    rec["state"] = "stopped" if gone else "stop-failed"
    rec["stopped_at"] = time.time()
    rec["stopped_how"] = how
    return {"instance": rec["instance"], "action": "stopped" if gone else "still running", "how": how,
            "pid": pid, "launch_id": rec.get("launch_id"), "seconds": round(time.time() - t0, 3)}


def action_server_stop(p):
    sd = p["state_dir"]
    names = p.get("instances")
    names = [check_name(n) for n in names] if names is not None else list_instances(sd)
    timeout = float(p.get("timeout", 30))
    out = []
    for n in names:
        rec = current_record(sd, n)
        if rec is None:
            out.append({"instance": n, "action": "never launched"})
            continue
        res = stop_record(rec, timeout)
        if res["action"] != "not running":
            save_record(sd, rec)
        out.append(res)
    return out


def action_server_status(p):
    sd = p["state_dir"]
    dep = deploy_on_disk(sd)
    names = p.get("instances")
    names = [check_name(n) for n in names] if names is not None else list_instances(sd)
    return {"deploy_now": dep, "instances": [instance_state(sd, n, dep) for n in names]}


def action_server_grep(p):
    """For each instance: its state plus the lines of its CURRENT launch's log matching the patterns."""
    sd = p["state_dir"]
    dep = deploy_on_disk(sd)
    patterns = [str(x) for x in p.get("patterns") or []]
    cap = int(p.get("max_per_pattern", 256))
    out = {"deploy_now": dep, "instances": {}}
    for n in [check_name(x) for x in p["instances"]]:
        st = instance_state(sd, n, dep)
        rec = st.get("record")
        if rec and st.get("log_exists"):
            st["matches"], st["log_size"] = grep_log(rec["log"], patterns, cap)
            if p.get("tail"):
                st["tail"] = tail_lines(rec["log"], int(p["tail"]))
        out["instances"][n] = st
    return out


def action_worker_check(p):
    """Does each named worker file on disk carry the marker inside its class's __init__ (AST)?"""
    pkg = p["package_dir"]
    out = []
    for c in p["checks"]:
        rel = c["file"]
        if os.path.isabs(rel) or ".." in rel.split("/"):
            raise AgentError("%s: path escapes the package dir" % rel, "bad_input")
        path = os.path.join(pkg, rel)
        r = {"file": rel, "class": c["class"], "marker": c["marker"], "exists": os.path.isfile(path)}
        if r["exists"]:
            with open(path, "rb") as fh:
                data = fh.read()
            import hashlib

            r["sha256"] = hashlib.sha256(data).hexdigest()
            r["check"] = marker_in_init(data.decode("utf-8", "replace"), c["class"], c["marker"])
        out.append(r)
    return out


def action_port_free(p):
    return dict((str(pt), port_free(pt)) for pt in p.get("ports") or [])


ACTIONS.update({"server_start": action_server_start, "server_wait": action_server_wait,
                "server_stop": action_server_stop, "server_status": action_server_status,
                "server_grep": action_server_grep, "worker_check": action_worker_check,
                "port_free": action_port_free})
