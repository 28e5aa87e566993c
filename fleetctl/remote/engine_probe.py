"""Agent part: `engine_probe`, ask the host's own engine which worker a launch selects.

Runs the engine's host probe script (sent by the controller in the request: the agent is
engine-blind; for SGLang it is fleetctl/engines/sglang/host_probe.py) under the launch's interpreter,
options, environment and cwd, with three changes that keep the host untouched:
CUDA_VISIBLE_DEVICES="" (no GPU is visible), PYTHONDONTWRITEBYTECODE=1 (no .pyc written into
the package) and TMPDIR set to a private directory removed afterwards. The process runs in its own
session; its whole process group is killed when it answers, fails or runs past the timeout, so no
process is left behind. Stdlib only, Python 3.8 grammar.
"""

import os

# shutil, subprocess and tempfile are imported by the action itself: a command that never probes
# (a no-op deploy) must not pay for them on every host


if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.core import ACTIONS, AgentError, jdumps, jloads
    from fleetctl.remote.locate import launch_cwd, launch_environment, launch_path0



# shutil, subprocess and tempfile are imported by the action itself: the agent is one file, and a
# command that never probes (a no-op deploy) must not pay for them on every host

ENGINE_PROBE_TIMEOUT = 240.0
ENGINE_PROBE_MAX_OUT = 1 << 20
ENGINE_PROBE_MAX_ARGV = 512
ENGINE_PROBE_MAX_SCRIPT = 1 << 20


def kill_group(pid):
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _probe_env(launch, hardware, tmp):
    env = launch_environment(launch)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TMPDIR"] = tmp
    cap = hardware.get("capability") or [0, 0]
    env["FLEETCTL_PROBE_CAPABILITY"] = "%d.%d" % (int(cap[0]), int(cap[1]))
    return env


ENGINE_PROBE_MAX_OVERLAY = 12 << 20  # base64 characters of the files the probe imports instead


def run_engine_probe(script, launch, argv, hardware, timeout=ENGINE_PROBE_TIMEOUT, overlay=None):
    """The probe's answer, or {"stage": "probe_failed", "error": why}; bounded in time and output."""
    import shutil
    import subprocess
    import tempfile

    if not isinstance(script, str) or not script or len(script) > ENGINE_PROBE_MAX_SCRIPT:
        raise AgentError("script must be a non-empty string of at most %d characters" % ENGINE_PROBE_MAX_SCRIPT,
                         "bad_input")
    if launch.get("problem"):
        return {"stage": "probe_failed", "error": launch["problem"]}
    interp = launch.get("interpreter")
    if not interp:
        return {"stage": "probe_failed", "error": "the launch command names no python interpreter"}
    if not isinstance(argv, list) or len(argv) > ENGINE_PROBE_MAX_ARGV or \
            not all(isinstance(a, str) for a in argv):
        raise AgentError("argv must be a list of at most %d strings" % ENGINE_PROBE_MAX_ARGV, "bad_input")
    if overlay is not None and (not isinstance(overlay, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in overlay.items())
            or sum(len(v) for v in overlay.values()) > ENGINE_PROBE_MAX_OVERLAY):
        raise AgentError("overlay must map package paths to base64 text, at most %d characters in all"
                         % ENGINE_PROBE_MAX_OVERLAY, "bad_input")
    tmp = tempfile.mkdtemp(prefix="fleetctl-probe-")
    proc = None
    try:
        env = _probe_env(launch, hardware, tmp)
        cwd = launch_cwd(launch.get("cwd"), env)
        path0 = launch_path0(launch, cwd)
        ask = {"argv": argv, "hardware": hardware, "path0": path0}
        if overlay:
            ask["overlay"] = overlay
        req = jdumps(ask).encode()
        cmd = [interp, *(launch.get("options") or []), "-c", script]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, cwd=cwd, close_fds=True, start_new_session=True)
        except OSError as e:
            return {"stage": "probe_failed", "error": "the launch's python %r cannot run here: %s"
                    % (interp, e.strerror or e)}
        try:
            out, err = proc.communicate(req, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.communicate()
            return {"stage": "probe_failed", "timed_out": True,
                    "error": "the host's engine did not answer within %gs (killed)" % timeout}
        if len(out) > ENGINE_PROBE_MAX_OUT:
            return {"stage": "probe_failed", "error": "the probe answered more than %d bytes" % ENGINE_PROBE_MAX_OUT}
        try:
            res = jloads(out.decode("utf-8"))
        except ValueError:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["exit code %s" % proc.returncode]
            return {"stage": "probe_failed", "error": "the launch's python %r failed: %s" % (interp, tail[0][:300])}
        if not isinstance(res, dict):
            return {"stage": "probe_failed", "error": "the probe answered something unexpected"}
        return res
    finally:
        if proc is not None:
            kill_group(proc.pid)  # anything the engine started in the probe's session goes too
        shutil.rmtree(tmp, ignore_errors=True)


def action_engine_probe(p):
    return run_engine_probe(p.get("script"), p["launch"], p.get("argv") or [], p.get("hardware") or {},
                            float(p.get("timeout") or ENGINE_PROBE_TIMEOUT), p.get("overlay"))


ACTIONS.update({"engine_probe": action_engine_probe})
