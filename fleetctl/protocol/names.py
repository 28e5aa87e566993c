"""The words of the agent protocol: action names, extra-facts hooks, and the state vocabularies a
host reports. The agent (fleetctl/remote, stdlib-only, Python 3.8) spells the same words itself;
tests/test_protocol.py checks the two agree."""

from __future__ import annotations

from typing import Final, Literal, get_args

# actions (agent.ACTIONS)
FACTS: Final = "facts"
PING: Final = "ping"
DEPLOY: Final = "deploy"
ROLLBACK: Final = "rollback"
READ_FILES: Final = "read_files"
SERVER_START: Final = "server_start"
SERVER_WAIT: Final = "server_wait"
SERVER_STOP: Final = "server_stop"
SERVER_GREP: Final = "server_grep"
WORKER_CHECK: Final = "worker_check"
LOCATE: Final = "locate"  # the probe under the launch's python (fleetctl/remote/probe.py)
ENGINE_PROBE: Final = "engine_probe"  # the host's own engine asked (fleetctl/remote/engine_probe.py)
# gpu-check's work dir, scripts and cleanup (fleetctl/remote/gpucheck.py)
GPUCHECK_PREPARE: Final = "gpucheck_prepare"
GPUCHECK_SCRIPT: Final = "gpucheck_script"
GPUCHECK_CLEANUP: Final = "gpucheck_cleanup"

# what the host's engine did with a launch's argv (the engine's host probe script)
ProbeStage = Literal["selected", "no_speculation", "no_worker", "refused", "import_failed", "probe_failed"]

# extra-facts hooks (agent.EXTRA_FACTS), asked for with the facts payload's "with"
WITH_STATE: Final = "state"
WITH_SERVERS: Final = "servers"
WITH_DISCOVER: Final = "discover"

# A deploy manifest's state on the host (remote/records.py and transaction.py write them).
ManifestState = Literal["preparing", "applying", "complete", "failed-unchanged", "failed-restored",
                        "rolling-back", "rolled-back", "interrupted-restored", "superseded", "restored-pristine"]
# cut off half-way: the files may be mixed; the next deploy or rollback repairs it first
OPEN_STATES: Final[tuple[ManifestState, ...]] = ("preparing", "applying", "rolling-back")
MANIFEST_STATES: Final[tuple[str, ...]] = get_args(ManifestState)

ManifestFileStatus = Literal["pending", "applied"]
RestoreAction = Literal["already original", "restored", "removed", "refused"]  # removed: a state file the deploy created
WaitStatus = Literal["ready", "failed", "forbidden", "exited", "timeout"]
StopAction = Literal["never launched", "not running", "stopped", "still running"]
