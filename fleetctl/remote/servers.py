"""Agent part: the servers fleetctl launches on a host (start, wait, stop, bounded grep); what they
are (launch records read back, /proc) is serverfacts.py's, loaded before this part (PART_NEEDS).

Layout under the host's state dir:
    servers/<instance>/current.json          launch record of the instance's newest launch
    servers/<instance>/launches/<id>.json    every launch record (history)
    servers/<instance>/logs/<id>.log         stdout+stderr of that launch (a new file per launch)
    servers/<instance>/launches/<id>.exit    how that launch's server process ended (exit status, time)

A server is started detached (its own session and process group) with an exact argv list and an
exact environment, as the child of a small supervisor (SUPERVISOR, serverfacts.py; in the same process
group) whose only job is to wait for it and write its exit status to `<id>.exit`: the server is
no child of the agent, which is gone long before the server ends, so without it the status that
says "crashed" from "stopped" would be lost; it is identified later by pid AND its start time in /proc (pids get reused).
Stopping signals that process group only. Log checks run here, on the host, and send back only
the matching lines (bounded), never a whole log.
"""

import os
import sys
import time

# no json, re or signal at start (core.py says why): jdumps/read_json_file, plain string checks,
# `signal` imported where a process group is signalled


if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.atomic import write_atomic
    from fleetctl.remote.core import (
        ACTIONS,
        AgentError,
        jdumps,
        sha256_new,
    )
    from fleetctl.remote.locate import launch_cwd, launch_environment
    from fleetctl.remote.lock import acquire_lock, release_lock
    from fleetctl.remote.records import (
        OPEN_STATES,
        last_container_deploy,
        list_manifests,
    )
    from fleetctl.remote.serverfacts import (
        SUPERVISOR,
        check_name,
        current_record,
        deploy_on_disk,
        group_members,
        hash_files,
        identify_server,
        instance_dir,
        instance_state,
        launch_alive,
        list_instances,
        proc_start_ticks,
        read_exit,
        record_alive,
        server_alive,
        ticks_to_epoch,
        tree_manifests,
    )


MAX_LINE = 65536


# Under a service manager (launch.manager: supervisor, systemd) the manager starts this instead of
# SUPERVISOR: the same job (wait for the server, write its exit status), plus what the manager cannot
# hand over: the launch's exact environment (from a 0600 file, never on a command line or in the
# manager's config), its cwd, and the server's pid (a file, as SUPERVISOR's pipe would). It ignores
# TERM/INT/HUP: the manager stops the whole process group, the server ends, and so does this.
MANAGED_LAUNCHER = (
    "import os,sys,json,signal,subprocess,time\n"
    "e,x,q,c,a=sys.argv[1],sys.argv[2],sys.argv[3],sys.argv[4],sys.argv[5:]\n"
    "for s in (signal.SIGTERM,signal.SIGINT,signal.SIGHUP):\n"
    " signal.signal(s,lambda *_:None)\n"
    "f=open(e);env=json.load(f);f.close()\n"
    "def put(path,data):\n"
    " t=path+'.tmp';f=os.open(t,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o600);os.write(f,data);os.fsync(f);os.close(f)\n"
    " os.replace(t,path)\n"
    "try:\n"
    " p=subprocess.Popen(a,env=env,cwd=c)\n"
    "except OSError as err:\n"
    " put(q,('E%s'%err).encode());sys.exit(127)\n"
    "put(q,str(p.pid).encode())\n"
    "rc=p.wait()\n"
    "put(x,json.dumps({'pid':p.pid,'returncode':rc,'ended_at':time.time()}).encode())\n"
    "sys.exit(rc if rc>=0 else 128-rc)\n"
)


# ----------------------------------------------------------------------------- /proc


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


def mkdirs(path):
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700)


def save_record(state_dir, rec):
    d = instance_dir(state_dir, rec["instance"])
    data = jdumps(rec, indent=1, sort_keys=True).encode()
    write_atomic(os.path.join(d, "launches", check_name(rec["launch_id"], "launch") + ".json"), data)
    write_atomic(os.path.join(d, "current.json"), data)


def exit_path(state_dir, name, launch_id):
    return os.path.join(instance_dir(state_dir, name), "launches", check_name(launch_id, "launch") + ".exit")


def _read_pipe(fd, timeout):
    """What the supervisor says on its pipe (a pid, or E<why>), until it closes it; bounded."""
    import select
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    out = b""
    end = time.time() + timeout
    while len(out) < 4096:
        left = end - time.time()
        if left <= 0 or not poller.poll(left * 1000):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        out += chunk
    return out.decode("utf-8", "replace")


# ----------------------------------------------------------------------------- facts about files


def marker_in_init(source, class_name, marker, function="__init__"):
    """Does `class_name.<function>` (default __init__) in `source` hold a string literal containing `marker`?

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
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == function:
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
    acquire_lock(sd, "launch", lid, p.get("by", "?"), {"wait_lock": p.get("wait_lock")})
    try:
        return _start_locked(p, sd, name, lid, argv, env)
    finally:
        release_lock(sd)


def _start_locked(p, sd, name, lid, argv, env):
    import subprocess
    prev = current_record(sd, name)
    if prev is not None and launch_alive(prev):
        raise AgentError("%s is already running (pid %s, launch %s); stop it first or use --replace"
                         % (name, prev.get("pid"), prev.get("launch_id")), "running")
    pkg = p.get("package_dir")
    for m in list_manifests(sd) + tree_manifests(sd, pkg):
        if m.get("state") in OPEN_STATES:
            raise AgentError("deploy %s was interrupted (%s): the files are mixed; run 'fleetctl rollback' or "
                             "'fleetctl deploy' to repair before launching" % (m.get("id"), m.get("state")),
                             "interrupted")
    d = instance_dir(sd, name)
    for sub in ("", "logs", "launches"):
        mkdirs(os.path.join(d, sub))
    log = os.path.join(d, "logs", lid + ".log")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    hashes = hash_files(pkg, p.get("hash_files")) if pkg else {}
    dep = deploy_on_disk(sd, pkg)
    cwd = launch_cwd(p.get("cwd"), env)
    rec = {"instance": name, "launch_id": lid, "launched_at": time.time(), "argv": p.get("public_argv") or argv,
           "env": p.get("public_env") or {}, "inherited_env": sorted(k for k in (p.get("inherit_env") or [])
                                                                     if k in os.environ),
           "log": log, "package_dir": pkg, "worker_hashes": hashes,
           "deploy": dep, "cwd": cwd}
    rec.update(p.get("extra") or {})
    exit_file = exit_path(sd, name, lid)
    mgr = p.get("manager") or {}
    if mgr.get("kind") == "supervisor":
        os.close(fd)
        return _start_supervised(sd, d, name, lid, argv, env, cwd, rec, mgr)
    if mgr.get("kind") == "systemd":
        os.close(fd)
        return _start_systemd(sd, d, name, lid, argv, env, cwd, rec, mgr, p)
    rfd, wfd = os.pipe()
    try:
        sup = subprocess.Popen([sys.executable, "-I", "-c", SUPERVISOR, exit_file, str(wfd), *argv],
                               stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env, cwd=cwd,
                               start_new_session=True, close_fds=True, pass_fds=(wfd,))
        os.close(wfd)
        wfd = -1  # closed once: its number may be another thread's fd by the finally below
        said = _read_pipe(rfd, 30.0)
    except OSError as e:
        said = "E%s" % e
    finally:
        for x in (rfd, wfd):
            if x < 0:
                continue
            try:
                os.close(x)
            except OSError:
                pass
    if not said.isdigit():
        why = said[1:] if said.startswith("E") else "the supervisor ended without starting it"
        os.write(fd, ("fleetctl: cannot start %r: %s\n" % (argv[0], why)).encode())
        os.close(fd)
        rec.update(pid=None, state="failed-to-start", error=why)
        save_record(sd, rec)
        raise AgentError("cannot start %s: %s" % (argv[0], why), "failed") from None
    os.close(fd)
    pid = int(said)
    ticks, _ = proc_start_ticks(pid)
    rec.update(pid=pid, pgid=sup.pid, supervisor_pid=sup.pid, start_ticks=ticks,
               process_started=ticks_to_epoch(ticks), state="started", exit_file=exit_file)
    save_record(sd, rec)
    return rec


def _ctl(ctl, args, timeout):
    """Run the manager's control command (supervisorctl ...) with `args`: (exit status, its output)."""
    import subprocess

    try:
        r = subprocess.run([*ctl, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
    except OSError as e:
        return 127, "cannot run %s: %s" % (ctl[0] if ctl else "?", e)
    except subprocess.TimeoutExpired:
        return 124, "%s %s: no end within %gs" % (" ".join(ctl), " ".join(args), timeout)
    return r.returncode, r.stdout[-4000:].decode("utf-8", "replace").strip()


def supervisor_section(program, command, log, stop_timeout):
    """The [program:...] section fleetctl writes for one instance: started and stopped only by fleetctl
    (no autostart, no autorestart), stopped as a process group, output to this launch's log file."""
    import shlex

    for a in command:
        if "\n" in a or "\r" in a or "\0" in a:
            raise AgentError("an argument holds a newline: a supervisor program section cannot hold it", "bad_input")
    line = " ".join(shlex.quote(a) for a in command).replace("%", "%%")
    return "".join("%s\n" % x for x in (
        "; written by fleetctl (launch.manager: supervisor); rewritten at each launch", "[program:%s]" % program,
        "command=%s" % line, "autostart=false", "autorestart=false", "startsecs=0", "startretries=0",
        "stopsignal=TERM", "stopwaitsecs=%d" % max(1, int(stop_timeout + 0.999)), "stopasgroup=true",
        "killasgroup=true", "redirect_stderr=true", "stdout_logfile=%s" % log.replace("%", "%%"),
        "stdout_logfile_maxbytes=0", "stdout_logfile_backups=0"))


def _start_supervised(sd, d, name, lid, argv, env, cwd, rec, mgr):
    """Start the instance as a supervisord program: its section written to the manager's include dir,
    `supervisorctl update` and `start`; its process is MANAGED_LAUNCHER (the process group), whose
    child is the server. The record is the same as for fleetctl's own launches, plus the manager's."""
    ctl = [str(x) for x in mgr.get("ctl") or []]
    conf_dir = mgr.get("conf_dir") or ""
    if not ctl or not conf_dir:
        raise AgentError("launch.manager supervisor: no supervisorctl or conf dir given", "bad_input")
    if not os.path.isdir(conf_dir):
        raise AgentError("supervisor conf dir %s does not exist (set supervisor_conf_dir: in the inventory to "
                         "a directory supervisord's [include] reads)" % conf_dir, "bad_input")
    prog = "fleetctl-" + name
    launches = os.path.join(d, "launches")
    envfile = os.path.join(launches, lid + ".env")
    pidfile = os.path.join(launches, lid + ".pid")
    exit_file = exit_path(sd, name, lid)
    launcher = os.path.join(d, "launcher.py")
    write_atomic(envfile, jdumps(env).encode())
    write_atomic(launcher, MANAGED_LAUNCHER.encode(), 0o644)
    conf = os.path.join(conf_dir, prog + ".conf")
    section = supervisor_section(prog, [sys.executable, "-I", launcher, envfile, exit_file, pidfile, cwd, *argv],
                                 rec["log"], float(mgr.get("stop_timeout") or 30))
    write_atomic(conf, section.encode(), 0o644)
    rec.update(manager="supervisor", program=prog, manager_conf=conf, ctl=ctl, pid=None)
    t = float(mgr.get("timeout") or 60)
    for args in (["reread"], ["update", prog], ["start", prog]):
        rc, said = _ctl(ctl, args, t)
        if rc != 0 or "ERROR" in said:
            why = "supervisorctl %s: %s" % (" ".join(args), said.splitlines()[-1] if said else "exit %d" % rc)
            rec.update(state="failed-to-start", error=why)
            save_record(sd, rec)
            raise AgentError("cannot start %s under supervisor: %s" % (name, why), "failed")
    rc, said = _ctl(ctl, ["pid", prog], t)
    launcher_pid = int(said) if rc == 0 and said.isdigit() and int(said) > 0 else None
    server_pid = None
    deadline = time.time() + 30.0
    while launcher_pid and time.time() < deadline:  # the launcher writes the server's pid as it starts it
        try:
            with open(pidfile) as fh:
                got = fh.read()
        except OSError:
            got = ""
        if got.isdigit():
            server_pid = int(got)
            break
        if got.startswith("E") or proc_start_ticks(launcher_pid)[0] is None:
            break
        time.sleep(0.02)
    if not server_pid:
        why = got[1:] if launcher_pid and got.startswith("E") else "the managed launcher did not start it"
        rec.update(state="failed-to-start", error=why)
        save_record(sd, rec)
        raise AgentError("cannot start %s under supervisor: %s" % (argv[0], why), "failed")
    ticks, _ = proc_start_ticks(server_pid)
    rec.update(pid=server_pid, pgid=launcher_pid, supervisor_pid=launcher_pid, start_ticks=ticks,
               process_started=ticks_to_epoch(ticks), state="started", exit_file=exit_file)
    save_record(sd, rec)
    return rec


# ----------------------------------------------------------------------------- systemd


def _systemd_word(s, exec_line=False):
    """One word of a unit file line, double-quoted: backslash and quote escaped, % as %% (specifiers),
    and in ExecStart= $ as $$ (variable expansion)."""
    if "\n" in s or "\r" in s or "\0" in s:
        raise AgentError("a launch argument or env value holds a newline: a systemd unit cannot hold it",
                         "bad_input")
    s = s.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if exec_line:
        s = s.replace("$", "$$")
    return '"%s"' % s


def _systemd_path(path):
    """A path setting (WorkingDirectory=, EnvironmentFile=): taken as written (no quotes), % as %%."""
    if "\n" in path or "\r" in path or "\0" in path or not path.startswith("/"):
        raise AgentError("%r: a systemd path setting must be an absolute path on one line" % path, "bad_input")
    return path.replace("%", "%%")


def _service_lines(unit, argv, env, secret_file, cwd, stop_timeout):
    lines = ["ExecStart=" + " ".join(_systemd_word(a, True) for a in argv), "WorkingDirectory=" + _systemd_path(cwd)]
    for k in sorted(env):
        lines.append("Environment=" + _systemd_word("%s=%s" % (k, env[k])))
    if secret_file:
        lines.append("EnvironmentFile=" + _systemd_path(secret_file))
    lines += ["Restart=no", "KillMode=control-group", "TimeoutStopSec=%d" % max(1, int(stop_timeout + 0.999)),
              "SyslogIdentifier=" + unit[:-len(".service")], "StandardOutput=journal", "StandardError=journal"]
    return lines


def systemd_unit(unit, name, lid, argv, env, secret_file, cwd, stop_timeout):
    """The service unit fleetctl writes for one instance: the launch's exact argv (ExecStart=), its
    environment (Environment=; secret values only in the 0600 EnvironmentFile=), its cwd; started
    and stopped only by fleetctl (no Restart=, no [Install]), the whole cgroup stopped."""
    lines = ["# written by fleetctl (launch.manager: systemd) for launch %s; rewritten at each launch" % lid,
             "[Unit]", "Description=fleetctl server %s (launch %s)" % (name, lid), "", "[Service]", "Type=exec"]
    return "".join(x + "\n" for x in lines + _service_lines(unit, argv, env, secret_file, cwd, stop_timeout))


def systemd_dropin(unit, lid, argv, env, secret_file, cwd, stop_timeout):
    """A drop-in for an operator's own unit (inventory `systemd_unit:`): its ExecStart= cleared and
    replaced by the launch's, with the launch's env and cwd; the rest of the operator's unit holds."""
    lines = ["# written by fleetctl (launch.manager: systemd) for launch %s; rewritten at each launch" % lid,
             "[Service]", "ExecStart="]
    return "".join(x + "\n" for x in lines + _service_lines(unit, argv, env, secret_file, cwd, stop_timeout))


def operator_unit(given, name):
    """The unit an inventory's `systemd_unit:` names for instance `name` (a template's instance)."""
    if not given.endswith(".service") or "/" in given or given.startswith("."):
        raise AgentError("systemd_unit %r: name a service unit (NAME.service or a template NAME@.service)" % given,
                         "bad_input")
    return given[:-len("@.service")] + "@" + name + ".service" if given.endswith("@.service") else given


def env_file_text(env):
    """systemd's EnvironmentFile= format: KEY="value" (backslash and quote escaped), one a line."""
    out = []
    for k in sorted(env):
        v = env[k]
        if "\n" in v or "\0" in v:
            raise AgentError("env value of %s holds a newline: an EnvironmentFile cannot hold it" % k, "bad_input")
        out.append('%s="%s"\n' % (k, v.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")))
    return "".join(out)


def _show(ctl, unit, props, timeout):
    rc, said = _ctl(ctl, ["show", unit] + ["-p" + x for x in props], timeout)
    out = {}
    for ln in said.splitlines() if rc == 0 else []:
        k, _, v = ln.partition("=")
        out[k] = v
    return out


def _start_systemd(sd, d, name, lid, argv, env, cwd, rec, mgr, p):
    """Start the instance as a systemd service: its unit written to the manager's unit dir,
    `systemctl daemon-reload` and `start`; the record names the unit and this start's InvocationID,
    whose journal entries (and only those) are this launch's log (sync_journal)."""
    ctl = [str(x) for x in mgr.get("ctl") or ["systemctl"]]
    unit_dir = mgr.get("unit_dir") or ""
    if not os.path.isdir(unit_dir):
        raise AgentError("systemd unit dir %s does not exist (set systemd_unit_dir: in the inventory)" % unit_dir,
                         "bad_input")
    unit = operator_unit(mgr["unit"], name) if mgr.get("unit") else "fleetctl-%s.service" % name
    public = p.get("public_env") or {}
    given = p.get("env") or {}
    secret = dict((k, v) for k, v in env.items() if k in given and public.get(k) != v)
    plain = dict((k, v) for k, v in env.items() if k not in secret)
    secret_file = None
    if secret:
        secret_file = os.path.join(d, "launches", lid + ".env")
        write_atomic(secret_file, env_file_text(secret).encode())
    stop_t = float(mgr.get("stop_timeout") or 30)
    if mgr.get("unit"):  # the operator's unit: a drop-in in its .d directory
        mkdirs(os.path.join(unit_dir, unit + ".d"))
        path = os.path.join(unit_dir, unit + ".d", "50-fleetctl.conf")
        text = systemd_dropin(unit, lid, argv, plain, secret_file, cwd, stop_t)
    else:
        path = os.path.join(unit_dir, unit)
        text = systemd_unit(unit, name, lid, argv, plain, secret_file, cwd, stop_t)
    write_atomic(path, text.encode(), 0o644)
    rec.update(manager="systemd", program=unit, manager_conf=path, ctl=ctl,
               journalctl=[str(x) for x in mgr.get("journalctl") or ["journalctl"]], pid=None)
    t = float(mgr.get("timeout") or 90)
    for args in (["daemon-reload"], ["start", unit]):
        rc, said = _ctl(ctl, args, t)
        if rc != 0:
            why = "systemctl %s: %s" % (" ".join(args), said.splitlines()[-1] if said else "exit %d" % rc)
            rec.update(state="failed-to-start", error=why)
            save_record(sd, rec)
            raise AgentError("cannot start %s under systemd: %s" % (name, why), "failed")
    got = _show(ctl, unit, ["MainPID", "InvocationID"], t)
    pid = int(got["MainPID"]) if got.get("MainPID", "").isdigit() and int(got["MainPID"]) > 0 else None
    inv = got.get("InvocationID") or ""
    if pid is None or len(inv) != 32 or inv.strip("0123456789abcdef"):
        rec.update(state="failed-to-start", error="systemd reports no main process or invocation for %s" % unit)
        save_record(sd, rec)
        raise AgentError("cannot start %s under systemd: it has no main process (exited at once?)" % name, "failed")
    ticks, _ = proc_start_ticks(pid)
    rec.update(pid=pid, pgid=pid, start_ticks=ticks, process_started=ticks_to_epoch(ticks), state="started",
               invocation_id=inv)
    save_record(sd, rec)
    return rec


JOURNAL_MAX = 64 << 20  # bytes of journalctl output read at once for one launch
JOURNAL_MSG_MAX = 1 << 20  # bytes of one message kept


def parse_journal(raw, invocation_id):
    """journalctl -o json output (one JSON object a line) -> ([message text, ...], last cursor). Only
    entries of `invocation_id` count (journalctl was asked for those alone: checked again here);
    MESSAGE may be a string, a list of byte values (not UTF-8) or null (skipped); anything else in
    the output (a line that is not an object) is refused."""
    import json

    out = []
    cursor = None
    for ln in raw.split(b"\n"):
        if not ln.strip():
            continue
        try:
            e = json.loads(ln)
        except ValueError:
            raise AgentError("journalctl answered a line that is not JSON: %r" % ln[:80], "failed") from None
        if not isinstance(e, dict):
            raise AgentError("journalctl answered JSON that is not an entry", "failed")
        if e.get("_SYSTEMD_INVOCATION_ID") != invocation_id:
            continue
        c = e.get("__CURSOR")
        if isinstance(c, str):
            cursor = c
        m = e.get("MESSAGE")
        if isinstance(m, str):
            text = m
        elif isinstance(m, list) and all(isinstance(b, int) and 0 <= b < 256 for b in m):
            text = bytes(m).decode("utf-8", "replace")
        else:
            continue
        out.append(text[:JOURNAL_MSG_MAX])
    return out, cursor


def sync_journal(rec):
    """Append the journal entries of the record's invocation written since the last sync to its log
    file (the cursor kept beside it), so the readiness wait, grep and tail read this launch's log as
    for any launch. No-op for a launch not under systemd."""
    if rec.get("manager") != "systemd" or not rec.get("invocation_id") or not rec.get("log"):
        return
    log = rec["log"]
    cur_file = log + ".cursor"
    try:
        with open(cur_file) as fh:
            cursor = fh.read().strip() or None
    except OSError:
        cursor = None
    args = ["-o", "json", "--no-pager", "_SYSTEMD_INVOCATION_ID=" + rec["invocation_id"]]
    if cursor:
        args.append("--after-cursor=" + cursor)
    import subprocess

    try:
        r = subprocess.run(list(rec.get("journalctl") or ["journalctl"]) + args, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AgentError("cannot read the journal of %s: %s" % (rec.get("program"), e), "failed") from None
    raw = r.stdout[:JOURNAL_MAX]
    if len(r.stdout) > JOURNAL_MAX:
        raw = raw[:raw.rfind(b"\n") + 1]
    lines, last = parse_journal(raw, rec["invocation_id"])
    if lines:
        with open(log, "ab") as fh:
            fh.write("".join(x + "\n" for x in lines).encode("utf-8", "replace"))
    if last and last != cursor:
        write_atomic(cur_file, last.encode())


def action_server_wait(p):
    """Wait until each named instance is ready, dead, shows a forbidden line, or time is up."""
    sd = p["state_dir"]
    names = [check_name(n) for n in p["instances"]]
    ready = p["ready_line"]
    forbidden = list(p.get("forbidden") or [])
    survivable = list(p.get("survivable") or [])  # reported when seen; the server's fate decides
    deadline = time.time() + float(p.get("timeout", 900))
    poll = float(p.get("poll", 0.05))
    ntail = int(p.get("tail", 30))
    if p.get("stamp_re"):
        import re

        stamp_re = re.compile(p["stamp_re"])
    else:
        stamp_re = None
    st = _waited_instances(sd, names, p.get("launch_ids"))
    while True:
        for n in [n for n in names if st[n]["status"] is None]:
            _read_start_log(p, st[n], ready, forbidden, survivable, stamp_re)
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
    now = time.time()
    return dict((n, _server_wait_answer(sd, st[n], ntail, now)) for n in names)


def _waited_instances(sd, names, launch_ids):
    """Each named instance's wait state: its launch record and log position, or failed already."""
    st = {}
    for n in names:
        rec = current_record(sd, n)
        if rec is None or not rec.get("log"):
            st[n] = {"status": "failed", "why": "no launch record"}
            continue
        if launch_ids and rec.get("launch_id") != launch_ids.get(n):
            st[n] = {"status": "failed", "why": "launch record is of another launch (%s)" % rec.get("launch_id")}
            continue
        st[n] = {"status": None, "rec": rec, "offset": 0, "partial": b"", "logged": []}
    return st


def _read_start_log(p, s, ready, forbidden, survivable, stamp_re):
    """One look at a starting instance: the log lines written since the last look, against the ready
    line, the forbidden and survivable patterns; its status set when it is decided."""
    rec = s["rec"]
    if not rec.get("server_pid") and launch_alive(rec):
        identify_server(rec)
    alive = launch_alive(rec) and server_alive(rec)
    if rec.get("manager") == "systemd" and (not alive or time.time() >= s.get("synced", 0) + 0.25):
        sync_journal(rec)  # (bounded: at most 4 journalctl runs a second)
        s["synced"] = time.time()
    try:
        with open(rec["log"], "rb") as fh:
            fh.seek(s["offset"])
            chunk = fh.read()
    except OSError as e:
        s.update(status="failed", why="cannot read the log: %s" % e)
        return
    s["offset"] += len(chunk)
    data = s["partial"] + chunk
    lines = data.split(b"\n")
    s["partial"] = lines.pop()
    if not alive and s["partial"]:  # the process is gone: its last line is complete
        lines.append(s["partial"])
        s["partial"] = b""
    for raw in lines:
        line = raw.decode("utf-8", "replace")
        if stamp_re is not None and _before(line, stamp_re, p.get("stamp_fmt"), rec):
            continue  # written before this server started: replayed from an earlier run
        for f in forbidden:
            if f in line:
                s.update(status="forbidden", why="forbidden pattern %r in the log" % f, line=line[:2000])
                break
        for f in survivable:
            if f in line and len(s["logged"]) < 5:
                s["logged"].append(line[:2000])
                break
        if s["status"]:
            break
        if ready in line:
            s.update(status="ready", line=line[:2000])
            break
    if s["status"] is None and not alive:
        s.update(status="exited", why="the server process exited during start-up")


def _server_wait_answer(sd, s, ntail, now):
    """An instance's part of the answer: its status, whether it runs, its exit and the log's tail."""
    rec = s.get("rec") or {}
    if rec and s["status"] == "ready":
        if rec.get("server_pid") or identify_server(rec):
            save_record(sd, rec)  # judged by its server process from now on (status, verify-logs)
    alive = launch_alive(rec) if rec else False
    running = alive and server_alive(rec)
    r = {"status": s["status"], "why": s.get("why"), "line": s.get("line"), "running": running,
         "server_pid": rec.get("server_pid"), "wrapper_only": alive and not running,
         "seconds": round(now - rec["launched_at"], 3) if rec.get("launched_at") else None,
         "logged": s.get("logged") or []}
    if rec and not alive:  # the supervisor writes the status just after the server ends
        end = time.time() + 2.0
        pg = rec.get("pgid")
        r["exit"] = read_exit(rec)
        while r["exit"] is None and time.time() < end and isinstance(pg, int) and pg > 0 and group_alive(pg):
            time.sleep(0.05)
            r["exit"] = read_exit(rec)
    if s["status"] != "ready" and rec.get("log"):
        sync_journal(rec)
        r["tail"] = tail_lines(rec["log"], ntail)
    return r


def _before(line, stamp_re, fmt, rec, slack=2.0):
    """The line's own time (host local) is before the record's process started (by > slack s)."""
    started = rec.get("process_started")
    m = stamp_re.match(line)
    if not m or not isinstance(started, (int, float)):
        return False
    try:
        t = time.mktime(time.strptime(m.group(1), fmt or "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return False
    return t < started - slack


def stop_record(rec, timeout, kill_after=5.0):
    """SIGTERM the record's process group, wait, then SIGKILL it. Returns what happened."""
    pid = rec.get("pid")
    if not isinstance(pid, int) or not launch_alive(rec):
        return {"instance": rec["instance"], "action": "not running", "launch_id": rec.get("launch_id")}
    pgid = rec.get("pgid") or pid
    import signal

    t0 = time.time()
    if rec.get("manager") in ("supervisor", "systemd") and rec.get("program") and rec.get("ctl"):
        _ctl(rec["ctl"], ["stop", rec["program"]], timeout + 30)
        end = time.time() + kill_after
        while time.time() < end and (record_alive(rec) or group_alive(pgid)):
            time.sleep(0.05)
        if not record_alive(rec) and not group_alive(pgid):
            how = "%s stop" % ("supervisorctl" if rec["manager"] == "supervisor" else "systemctl")
            rec.update(state="stopped", stopped_at=time.time(), stopped_how=how)
            return {"instance": rec["instance"], "action": "stopped", "how": how, "pid": pid,
                    "launch_id": rec.get("launch_id"), "seconds": round(time.time() - t0, 3)}
        # supervisord did not stop it (or could not be asked): fleetctl's own way below
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
    # named instances are stopped whoever launched them (the operator named them); all: this entry's
    names = [check_name(n) for n in names] if names is not None else list_instances(sd, p.get("entry"))
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


def action_server_grep(p):
    """For each instance: its state plus the lines of its CURRENT launch's log matching the patterns."""
    sd = p["state_dir"]
    # the tree the servers import (their records name it): its deploys, those beside a shared tree too
    pkgs = [(current_record(sd, check_name(x)) or {}).get("package_dir") for x in p["instances"]]
    dep = deploy_on_disk(sd, next((x for x in pkgs if isinstance(x, str) and x), None))
    patterns = [str(x) for x in p.get("patterns") or []]
    cap = int(p.get("max_per_pattern", 256))
    # log timestamps are the host's local time: its UTC offset lets the controller compare them
    out = {"deploy_now": dep, "instances": {}, "tz_offset": time.localtime().tm_gmtoff}
    if p.get("container"):
        out["container_deploy"] = last_container_deploy(sd)
    for n in [check_name(x) for x in p["instances"]]:
        st = instance_state(sd, n, dep)
        rec = st.get("record")
        if rec and st.get("log_exists"):
            sync_journal(rec)
            st["matches"], st["log_size"] = grep_log(rec["log"], patterns, cap)
            if p.get("tail") or not st["running"]:  # a server that ended: its last words say why
                st["tail"] = tail_lines(rec["log"], int(p.get("tail") or 30))
        out["instances"][n] = st
    return out


def action_worker_check(p):
    """Does each named file on disk carry the marker inside its class's function (AST; default __init__)?"""
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
            r["sha256"] = sha256_new(data).hexdigest()
            r["check"] = marker_in_init(data.decode("utf-8", "replace"), c["class"], c["marker"],
                                        c.get("function") or "__init__")
        out.append(r)
    return out


ACTIONS.update({"server_start": action_server_start, "server_wait": action_server_wait,
                "server_stop": action_server_stop, "server_grep": action_server_grep,
                "worker_check": action_worker_check})
