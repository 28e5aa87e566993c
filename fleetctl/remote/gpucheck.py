"""Agent part: `fleetctl gpu-check`'s work dir, its scripts and its cleanup on the host.

The check makes everything under ONE directory it creates, `<tmp>/fleetctl-gpucheck-<random>`
(tempfile.mkdtemp: the host's TMPDIR, else /tmp): the tiny models, the throwaway servers' state
(their launch records and logs, by the servers part's own start/wait/stop) and the scripts' TMPDIR.
`owner.json` in it names the agent process that made it. Cleanup stops every server recorded
there (its process group, by pid and start time, SIGTERM then SIGKILL) and removes the directory.
A directory whose agent is gone (a controller killed mid-check) is swept by the next check on the
host the same way. Stdlib only, Python 3.8 grammar.
"""

import os

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.core import ACTIONS, AgentError, jdumps, jloads, read_json_file
    from fleetctl.remote.engine_probe import kill_group
    from fleetctl.remote.locate import launch_cwd, launch_environment
    from fleetctl.remote.serverfacts import current_record, list_instances, port_free
    from fleetctl.remote.servers import stop_record

GPUCHECK_PREFIX = "fleetctl-gpucheck-"
GPUCHECK_MAX_OUT = 1 << 20
GPUCHECK_MAX_SCRIPT = 1 << 20


def _tmp_root():
    import tempfile

    return tempfile.gettempdir()


def _check_dir(path):
    """`path` is a gpu-check work dir this agent may remove: <tmp root>/fleetctl-gpucheck-*."""
    if not isinstance(path, str) or not path:
        raise AgentError("dir must be a path", "bad_input")
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(_tmp_root()) or \
            not os.path.basename(real).startswith(GPUCHECK_PREFIX):
        raise AgentError("%s is not a gpu-check work dir (%s%s*)" % (path, _tmp_root() + "/", GPUCHECK_PREFIX),
                         "bad_input")
    return real


def _pid_alive(pid, ticks):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return ticks is None or int(fields[19]) == ticks
    except (OSError, IndexError, ValueError):
        return False


def _my_ticks():
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def cleanup_dir(path, timeout=30.0):
    """Stop every server recorded under the dir's state, then remove the dir. What happened, as data."""
    import shutil

    sd = os.path.join(path, "state")
    stopped = []
    if os.path.isdir(os.path.join(sd, "servers")):
        for name in list_instances(sd):
            rec = current_record(sd, name)
            if rec is None:
                continue
            res = stop_record(rec, timeout)
            stopped.append({"instance": name, "action": res.get("action"), "pid": res.get("pid"),
                            "how": res.get("how")})
    left = [s for s in stopped if s["action"] == "still running"]
    if not left:
        shutil.rmtree(path, ignore_errors=True)
    return {"dir": path, "stopped": stopped, "removed": not os.path.exists(path)}


def _sweep():
    """Work dirs of earlier checks whose agent is gone: their servers stopped, the dirs removed."""
    root = _tmp_root()
    out = []
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith(GPUCHECK_PREFIX))
    except OSError:
        return out
    for n in names:
        d = os.path.join(root, n)
        owner = read_json_file(os.path.join(d, "owner.json")) if os.path.isdir(d) else None
        if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
            continue
        if _pid_alive(owner["pid"], owner.get("ticks")):
            continue  # a check still running (another controller's)
        out.append(cleanup_dir(d))
    return out


def action_gpucheck_prepare(p):
    """Make the work dir and pick a free port for the throwaway servers."""
    import socket
    import tempfile

    swept = _sweep()
    d = tempfile.mkdtemp(prefix=GPUCHECK_PREFIX)
    with open(os.path.join(d, "owner.json"), "w") as f:
        f.write(jdumps({"pid": os.getpid(), "ticks": _my_ticks(), "by": str(p.get("by") or "?")[:200]}))
    for sub in ("state", "models", "tmp"):
        os.mkdir(os.path.join(d, sub))
    # the engine names the ports its server opens beside --port (offsets); every one must be free
    # and under 65536, so candidates come from the kernel (a free port) shifted down into range
    offsets = [int(k) for k in (p.get("port_offsets") or [0, 1, 2, 3])][:16]
    top = 65535 - max(offsets)
    port = None
    for i in range(64):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", 0))
            cand = s.getsockname()[1]
        finally:
            s.close()
        if cand > top:
            cand = 20000 + (cand + 997 * i) % max(1, top - 20000)
        if all(0 < cand + k < 65536 and port_free(cand + k) for k in offsets):
            port = cand
            break
    if port is None:
        cleanup_dir(d)
        raise AgentError("no free port found on 127.0.0.1", "failed")
    return {"dir": d, "port": port, "swept": [s["dir"] for s in swept]}


def action_gpucheck_script(p):
    """Run a script the controller sends under the launch's interpreter, options, env and cwd, with
    TMPDIR in the work dir; its JSON answer (stdout) comes back, bounded in time and size; its whole
    process group is killed when it ends."""
    import shutil
    import tempfile

    script, launch = p.get("script"), p["launch"]
    if p.get("dir") is None:  # before the check makes anything (its plan): a private TMPDIR, removed after
        tmp = tempfile.mkdtemp(prefix=GPUCHECK_PREFIX + "plan-")
        try:
            return _run_script(p, script, launch, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return _run_script(p, script, launch, os.path.join(_check_dir(p["dir"]), "tmp"))


def _run_script(p, script, launch, tmp):
    import subprocess

    if not isinstance(script, str) or not script or len(script) > GPUCHECK_MAX_SCRIPT:
        raise AgentError("script must be a non-empty string of at most %d characters" % GPUCHECK_MAX_SCRIPT,
                         "bad_input")
    if launch.get("problem"):
        return {"ok": False, "error": launch["problem"]}
    interp = launch.get("interpreter")
    if not interp:
        return {"ok": False, "error": "the launch command names no python interpreter"}
    env = launch_environment(launch)
    env.update(dict((str(k), str(v)) for k, v in (p.get("env") or {}).items()))
    env["TMPDIR"] = tmp
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cwd = launch_cwd(launch.get("cwd"), env)
    timeout = float(p.get("timeout") or 300)
    try:
        proc = subprocess.Popen([interp, *(launch.get("options") or []), "-c", script], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, close_fds=True,
                                start_new_session=True)
    except OSError as e:
        return {"ok": False, "error": "the launch's python %r cannot run here: %s" % (interp, e.strerror or e)}
    try:
        try:
            out, err = proc.communicate(jdumps(p.get("request") or {}).encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.communicate()
            return {"ok": False, "timed_out": True, "error": "the script did not answer within %gs (killed)" % timeout}
    finally:
        kill_group(proc.pid)
    if len(out) > GPUCHECK_MAX_OUT:
        return {"ok": False, "error": "the script answered more than %d bytes" % GPUCHECK_MAX_OUT}
    try:
        res = jloads(out.decode("utf-8", "replace"))
    except ValueError:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["exit code %s" % proc.returncode]
        return {"ok": False, "error": "the launch's python %r failed: %s" % (interp, tail[0][:300])}
    if not isinstance(res, dict):
        return {"ok": False, "error": "the script answered something unexpected"}
    return {"ok": True, "answer": res}


def action_gpucheck_cleanup(p):
    return cleanup_dir(_check_dir(p.get("dir")), float(p.get("timeout") or 30))


ACTIONS.update({"gpucheck_prepare": action_gpucheck_prepare, "gpucheck_script": action_gpucheck_script,
                "gpucheck_cleanup": action_gpucheck_cleanup})
