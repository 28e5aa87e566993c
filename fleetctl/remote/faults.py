"""TEST-ONLY: the fault points of the agent, the one hook a test harness installs (tests/faulthook.py
sends this part with a request, as `_load`; in-process tests import it). fleetctl itself never
ships it: production code only calls core's `fault_point`, which does nothing without this hook.

A request's `_fault` names the point and what happens there:
`_fault` = {"at": point, "n": k, "how": "exit" | "wait" | "until" | "mark" | "stop", "marker": path,
            "hold": seconds, "release": path}, or a list of such (each its own point)
  at:     deploy:   locked, before_backup, after_backup, mid_write, between_renames, applied,
                    before_complete, after_complete
          rollback: locked, before_restore, mid_write, between_restores, before_complete, after_complete
          any:      stale_lock_seen (inside the stale-lock take-over), guard_wait (just before the
                    take-over's guard is locked), lock_wait (--wait-lock: the first time this agent
                    waits for a lock another controller holds)
  n:      for per-file points (mid_write, between_*, applied: the k-th file renamed), the k-th file
          (1-based; default 1)
  marker: a file written with this process's pid when the point is reached (tests wait for it)
  how:    exit = die on the spot (os._exit(99), no cleanup: a killed agent);
          wait = sleep `hold` seconds (a test kills/freezes the session meanwhile, or holds the lock);
          until = wait until the file `release` exists (the test says when; `hold`: a hang bound only);
          mark = only write the marker and go on;
          stop = SIGSTOP itself (frozen until someone sends SIGCONT/SIGKILL)
"""

import os
import time

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.core import FAULT


def fault(p, at, n=None):
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


FAULT[:] = [fault]
