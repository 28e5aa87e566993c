"""Servers under a service manager (playbook `launch.manager`): what the agent is told per host.

fleetctl (default): the agent starts each server itself, detached (remote/servers.py).
supervisor: the agent writes a `[program:fleetctl-INSTANCE]` section into the host's
`supervisor_conf_dir` and starts/stops it through `supervisorctl` (`update`, `start`, `stop`).
systemd: the agent writes a `fleetctl-INSTANCE.service` unit into `systemd_unit_dir` and runs it
through `systemctl`; its log is the journal of that invocation (_SYSTEMD_INVOCATION_ID).
Either way the launch record, readiness wait, verify-logs' provenance checks, status and stop read
the same record (pid and start time from /proc, this launch's own log), so a rolling restart and
rollback work the same for every manager.
"""

from __future__ import annotations

import shlex
from typing import Any

from fleetctl.config.hosts import Host

SUPERVISORCTL = "supervisorctl"
SUPERVISOR_CONF_DIR = "/etc/supervisor/conf.d"
SYSTEMD_UNIT_DIR = "/etc/systemd/system"


def manager_request(host: Host, kind: str, stop_timeout: float) -> dict[str, Any] | None:
    """The `manager` part of a server_start request for `host` (None: fleetctl's own launch)."""
    if kind == "supervisor":
        return {"kind": "supervisor", "ctl": shlex.split(host.supervisorctl or SUPERVISORCTL),
                "conf_dir": host.supervisor_conf_dir or SUPERVISOR_CONF_DIR, "stop_timeout": stop_timeout}
    if kind == "systemd":
        return {"kind": "systemd", "unit_dir": host.systemd_unit_dir or SYSTEMD_UNIT_DIR, "ctl": ["systemctl"],
                "journalctl": ["journalctl"], "stop_timeout": stop_timeout, "unit": host.systemd_unit}
    return None
