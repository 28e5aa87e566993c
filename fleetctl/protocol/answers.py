"""What each agent action answers, as types. These dataclasses are the schema: an answer is
checked against its type once, when it arrives (fleetctl/protocol/__init__.py `parse_reply`), and
everything downstream reads attributes. Fields the controller does not read are not listed (the
agent may send more); a field with a default may be absent."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import field
from typing import Annotated, Any, Literal

from fleetctl.protocol.names import (
    ManifestFileStatus,
    ManifestState,
    ProbeStage,
    RestoreAction,
    StopAction,
    WaitStatus,
)
from fleetctl.protocol.schema import answer_type

_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256(v: str) -> str | None:
    return None if _SHA256.fullmatch(v) else "expected a sha256 (64 lowercase hex digits)"


def _base64(v: str) -> str | None:
    try:
        base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        return "expected base64"
    return None


def _not_empty(v: str) -> str | None:
    return None if v else "is empty"


Sha256 = Annotated[str, _sha256]
Base64 = Annotated[str, _base64]
Name = Annotated[str, _not_empty]
Scalar = str | int | float | bool | None


# ------------------------------------------------------------------------------------------ facts


@answer_type
class FileFact:
    """One file of the package as the host sees it (agent.file_info)."""

    path: str
    exists: bool
    sha256: Sha256 | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    mtime: float | None = None
    symlink: str | None = None
    escapes: bool = False
    error: str | None = None
    unwritable: str | None = None  # why this user cannot replace it (its directory), None: it can


@answer_type
class OsInfo:
    """The host's OS (agent.read_os)."""

    pretty: str


@answer_type
class PythonInfo:
    """The interpreter that runs the agent (the inventory's `python:`)."""

    executable: str
    version: str


Loader = Literal["source", "sourceless", "extension", "none"]


@answer_type
class ImportView:
    """What `import` of one source file would load under the launch's python (probe.import_view)."""

    loader: Loader
    file: str | None = None  # the file loaded
    pyc: str | None = None  # the cached bytecode import reads for this source
    pyc_kind: str | None = None  # timestamp | checked-hash | unchecked-hash | invalid
    pyc_used: bool = False  # import would run that pyc instead of compiling the source
    stale: bool = False  # ... and it was not compiled from the source on disk
    other_pycs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"loader": self.loader, "file": self.file, "pyc": self.pyc, "pyc_kind": self.pyc_kind,
                "pyc_used": self.pyc_used, "stale": self.stale, "other_pycs": list(self.other_pycs)}


@answer_type
class LaunchPython:
    """The launch's own python as the probe saw it (interpreter, options, env and cwd of the launch)."""

    executable: str | None = None
    version: str | None = None
    cache_tag: str | None = None
    optimize: int | None = None
    pycache_prefix: str | None = None
    check_hash_based_pycs: str | None = None
    cwd: str | None = None
    path: list[str] = field(default_factory=list)


@answer_type
class ModuleOrigin:
    """Where the launch's python would import one package file from, when that is not simply the
    package dir's file by the path finder (probe.locate_module): another file, a start-up hook's
    loader, a module a start-up hook already imported, or none."""

    module: str
    file: str | None = None
    loader: str | None = None  # the loader's class name
    finder: str | None = None  # module.Class of the meta-path finder that answered
    finder_file: str | None = None
    preloaded: bool = False  # already imported while the interpreter started (a start-up hook)
    standard: bool = False  # a file loader of CPython's that runs `file` itself
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "file": self.file, "loader": self.loader, "finder": self.finder,
                "finder_file": self.finder_file, "preloaded": self.preloaded, "standard": self.standard,
                "error": self.error}


@answer_type
class EnvChange:
    """A variable the launch's interpreter start set or unset (value None), and who: a
    sitecustomize/usercustomize line, an executable .pth line, a `python:` shim script."""

    value: str | None = None
    by: str | None = None  # file:line (or the shim and what it sources); None: not known
    when: str = "site"  # site | wrapper


@answer_type
class LinkTree:
    """A setuptools strict editable install: the link tree the launch imports, the checkout its links
    lead to, and the project dir `pip install -e` was given."""

    tree: str
    checkout: str
    project: str


@answer_type
class GitInfo:
    """The git checkout the package lies in: HEAD's commit and `git describe --tags --long`."""

    commit: str | None = None
    describe: str | None = None


@answer_type
class Shadow:
    """The launch's sys.path[0] (its cwd for -m, a script's dir) holds the package's top-level dir:
    `by` (a regular package, or a namespace portion), and what the launch would import without it."""

    by: str
    regular: bool = False
    installed: str | None = None


@answer_type
class PackageInfo:
    """Where the launch's interpreter imports the engine's package from (fleetctl/model/launchspec.py: its options, env
    and cwd), its version and install kind, and what import would load for the asked files."""

    found: bool
    dir: str | None = None
    version: str | None = None
    install: str | None = None
    torch_requires: list[str] = field(default_factory=list)
    how: str | None = None
    error: str | None = None  # why it is not found (or the launch's python cannot be asked)
    unresolved: bool = False  # the launch command's python cannot be told
    notes: list[str] = field(default_factory=list)  # e.g. an inventory package dir the default launch does not import
    dir_mismatch: str | None = None  # the inventory package dir is not what the launch imports (why), when not refused
    launch: LaunchPython | None = None  # None: located by the agent's own python (no launch sent)
    bytecode: dict[str, ImportView] = field(default_factory=dict)  # rel -> what import would load
    # rel -> where the launch imports it from, where that is not `dir/rel` by CPython's path finder
    modules: dict[str, ModuleOrigin] = field(default_factory=dict)
    namespace: list[str] | None = None  # the top-level package is a namespace package: its portions
    finders: list[list[str | None]] = field(default_factory=list)  # [finder, its file] that served the files
    env_changes: dict[str, EnvChange] = field(default_factory=dict)  # what the interpreter's start set
    link_tree: LinkTree | None = None
    shadow: Shadow | None = None
    via_link_tree: str | None = None  # the link tree the launch imports (dir: its checkout, patched)
    checkout: str | None = None  # the git checkout the package dir lies in
    project: str | None = None  # an editable install's project dir (direct_url.json)
    git: GitInfo | None = None  # the checkout's HEAD (None: not a git checkout, or git not there)


@answer_type
class GpuQuery:
    """nvidia-smi's CSV answers, or why there are none."""

    available: bool
    reason: str = "not asked"
    gpus: str = ""  # nvidia-smi CSV
    apps: str = ""


@answer_type
class Lock:
    """The host lock as read by the agent; `stale`: its holder is gone."""

    stale: bool
    op: str | None = None
    id: str | None = None
    by: str | None = None
    pid: int | None = None
    unreadable: bool = False
    foreign: bool = False  # held by another machine (a shared state dir): never taken over automatically
    owner: str | None = None  # that machine, described
    stale_why: str | None = None

    def holder(self) -> str:
        return f"{self.op} {self.id} by {self.by}"


@answer_type
class ManifestFile:
    """One file of a deploy manifest, with its hash now."""

    path: Name
    sha_before: Sha256 | None = None
    sha_after: Sha256 | None = None
    status: ManifestFileStatus | None = None
    sha_now: Sha256 | None = None


@answer_type
class Moved:
    patched: str | None = None
    imports_now: str | None = None


@answer_type
class Manifest:
    """A deploy manifest on the host with the current hash of each of its files (remote/records.py)."""

    id: Name
    state: ManifestState
    files: list[ManifestFile] = field(default_factory=list)
    created: float | None = None
    updated: float | None = None
    package_dir: str | None = None
    version: str | None = None
    playbook: str | None = None
    by: str | None = None
    rolled_back_at: float | None = None
    note: str | None = None
    kind: str = "deploy"  # deploy | restore-pristine
    package_real: str | None = None  # the real path of the tree it patched
    foreign: str | None = None  # written by another machine (described): ignored, never acted on
    gone: str | None = None  # its patch is no longer on disk (why)
    moved: Moved | None = None  # this python now imports another tree than the one it patched
    pycache_prefixes: list[str] = field(default_factory=list)  # the launch's, when it was deployed
    shared: str | None = None  # recorded beside a shared tree: that records dir (remote/records.py tree_records_dir)
    host: str | None = None  # the inventory entry whose deploy it was
    container: dict[str, str | None] | None = None  # the container it patched (fleetctl/containers)


@answer_type
class TreeIdentity:
    """What tells the located package tree apart from every other (remote/records.py tree_identity)."""

    real: str
    dev: int
    ino: int
    records_dir: str
    fs: str | None = None
    source: str | None = None
    mount: str | None = None
    network: bool = False
    mount_root: bool = False  # the package dir is itself a mount point (its parent is not shared)
    boot_id: str | None = None
    machine_id: str | None = None
    hostname: str | None = None
    id: str | None = None  # the tree's id file in its records dir (written by its first shared deploy)


@answer_type
class StateFacts:
    """Facts hook "state": the lock and every deploy manifest, oldest first."""

    deploys: list[Manifest]
    lock: Lock | None = None
    state_dir: str | None = None
    machine: str | None = None  # this host, as it describes itself in locks and manifests
    package_real: str | None = None
    unwritable: str | None = None  # why this user cannot write the state dir (None: it can)
    tree: TreeIdentity | None = None  # the located package tree's identity (shared trees)
    tree_lock: Lock | None = None  # the lock of the shared tree's records dir, if it has one


@answer_type
class DeployOnDisk:
    """The newest complete deploy whose files all still hold its patched bytes."""

    id: str | None = None
    at: float | None = None
    created: float | None = None
    files: list[str] = field(default_factory=list)
    package_dir: str | None = None
    playbook: str | None = None


@answer_type
class Worker:
    """The worker launch resolved for an instance (launch writes it into the record)."""

    class_: str | None = field(default=None, metadata={"json": "class"})
    file: str | None = None
    disable_overlap_schedule: bool | None = None
    reason: str | None = None


@answer_type
class ExitInfo:
    """How a launched server ended (its supervisor's exit file): exit status, or -signal."""

    returncode: int
    ended_at: float | None = None
    pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"returncode": self.returncode, "ended_at": self.ended_at, "pid": self.pid}


@answer_type
class LaunchRecord:
    """A server's launch record (servers/<instance>/current.json, written by the agent)."""

    instance: Name
    launch_id: str | None = None
    launched_at: float | None = None
    process_started: float | None = None
    pid: int | None = None  # the launch command's process (the supervisor's child; maybe a wrapper)
    supervisor_pid: int | None = None  # the exit-status supervisor (its process group: pgid)
    server_pid: int | None = None  # the server's own python under any wrapper (identified at ready)
    log: str | None = None
    state: str | None = None  # started, failed-to-start, stopped, stop-failed
    stopped_at: float | None = None
    package_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    deploy: DeployOnDisk | None = None
    argv: list[str] = field(default_factory=list)  # as launched (secret values masked)
    cwd: str | None = None
    manager: str | None = None  # supervisor, systemd; None: fleetctl's own launch
    program: str | None = None  # the manager's name for it (supervisor program, systemd unit)
    # what launch put in the record ("extra")
    version: str | None = None
    port: int | None = None
    gpus: list[int] = field(default_factory=list)
    flags: dict[str, Scalar] = field(default_factory=dict)
    worker: Worker = field(default_factory=Worker)


@answer_type
class GrepHits:
    """Log lines matching one pattern (bounded by the agent)."""

    count: int
    lines: list[str]
    truncated: bool = False


@answer_type
class InstanceState:
    """One server instance: its record, alive or not, files changed since its launch."""

    instance: Name
    running: bool
    record: LaunchRecord | None = None
    changed_files: list[str] = field(default_factory=list)
    restart_needed: bool = False
    log_exists: bool = False
    matches: dict[str, GrepHits] = field(default_factory=dict)  # server_grep only
    tail: list[str] = field(default_factory=list)
    exit: ExitInfo | None = None  # not running: how it ended, if its supervisor wrote it
    launch_alive: bool = False  # a process of the launch runs (the server, or only a wrapper)
    wrapper_only: bool = False  # the server process is gone, a wrapper of its launch lives on


@answer_type
class ServersFacts:
    """Facts hook "servers": every instance with a record, and which asked ports are free."""

    instances: list[InstanceState]
    deploy_now: DeployOnDisk | None = None
    ports: dict[str, bool] = field(default_factory=dict)
    state_dir: str | None = None


@answer_type
class DiscoveredProcess:
    """A server process found from /proc (the "discover" hook), whoever started it."""

    pid: int
    argv: list[str]
    ppid: int | None = None
    started: float | None = None
    start_ticks: int | None = None
    uid: int | None = None
    cwd: str | None = None
    exe: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    ports: list[int] | None = None
    env: dict[str, str] | None = None  # the routing-relevant variables; None: not readable
    instance: str | None = None  # the fleetctl instance whose record it is
    package_dir: str | None = None
    changed_files: list[str] = field(default_factory=list)


@answer_type
class DiscoverFacts:
    processes: list[DiscoveredProcess]
    truncated: bool = False


@answer_type
class ModelConfigInfo:
    """The launch's target model config.json as the agent read it (validated again on arrival:
    fleetctl/engines/sglang/model_config.py `from_answer`), or why it could not."""

    path: str | None = None
    architectures: list[str] = field(default_factory=list)
    model_type: str | None = None
    error: str | None = None


@answer_type
class LaunchFileInfo:
    """A file the launch's flags name, as the agent read it (base64, at most 1 MiB), or why it could not."""

    data: str | None = None
    error: str | None = None


@answer_type
class FactsAnswer:
    """`facts`: what the host is, plus the hooks asked for (state, servers, registered flags)."""

    os: OsInfo
    python: PythonInfo
    user: str
    package: PackageInfo
    torch: str | None
    files: dict[str, FileFact]
    elapsed: float = 0.0
    gpus: GpuQuery | None = None
    registered_flags: dict[str, bool] | None = None
    state: StateFacts | None = None
    servers: ServersFacts | None = None
    discover: DiscoverFacts | None = None
    model: ModelConfigInfo | None = None  # asked with payload `model` (the launch's --model-path)
    draft_model: ModelConfigInfo | None = None  # asked with payload `draft_model` (its draft model path)
    launch_files: dict[str, LaunchFileInfo] | None = None  # asked with payload `launch_files`
    # asked with payload `settle` (a deploy's facts): nothing a deploy would look at changed since
    # shortly before the facts were read (remote/seal.py); with `seal` too, this reading's seal
    settled: bool = False
    seal: Seal | None = None


@answer_type
class PingAnswer:
    """`ping`: the agent process is alive."""

    pong: bool
    pid: int
    python: str


# ------------------------------------------------------------------------------------------ deploy


@answer_type
class DeployedFile:
    """A file the deploy replaced."""

    path: Name
    sha_after: Sha256


@answer_type
class Seal:
    """A deploy's seal (remote/seal.py; fleetctl/ops/seal.py): the paths and files whose `stat` and
    `sha256sum` text was taken, still under the host lock, around facts read again (`facts`: checked
    as a facts answer when it is used), or `why` there is none."""

    why: str | None = None
    env: str = ""  # sha256 of the agent's environment (fleetctl/ops/seal.py env_digest)
    paths: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    stat: str = ""
    sha: str = ""
    facts: dict[str, Any] | None = None


@answer_type
class DeployAnswer:
    """`deploy`: the transaction's deploy id (None: nothing to change), files and final hashes."""

    deploy_id: str | None
    files: list[DeployedFile]
    final: dict[str, Sha256 | None]  # hash of every verify path after the transaction
    notes: list[str] = field(default_factory=list)
    seal: Seal | None = None  # asked with `seal` in the request
    then_facts: FactsAnswer | None = None  # asked with `then_facts`: facts read right after the deploy
    then_facts_error: str | None = None  # why those could not be read


@answer_type
class Restored:
    """One file of a rollback (or of a repair)."""

    path: Name
    action: RestoreAction
    sha_now: Sha256 | None = None
    why: str = ""
    bytecode_removed: list[str] = field(default_factory=list)  # cached pycs removed with it


@answer_type
class RolledBack:
    """One deploy a rollback undid (or skipped)."""

    deploy_id: Name
    state: ManifestState | None = None
    files: list[Restored] = field(default_factory=list)
    skipped: bool = False


@answer_type
class RollbackAnswer:
    """`rollback`: the deploys undone, newest first."""

    rollbacks: list[RolledBack]
    notes: list[str] = field(default_factory=list)
    then_facts: FactsAnswer | None = None  # asked with `then_facts`: facts read right after the rollback
    then_facts_error: str | None = None


ReadFilesAnswer = dict[str, Base64 | None]  # path -> base64 bytes (None: no such file)


# ------------------------------------------------------------------------------------------ servers


@answer_type
class WaitResult:
    """`server_wait`, per instance: ready, or why not."""

    status: WaitStatus
    running: bool = False
    why: str | None = None
    line: str | None = None
    seconds: float | None = None
    tail: list[str] = field(default_factory=list)
    exit: ExitInfo | None = None
    server_pid: int | None = None  # the server's own python, identified at ready
    wrapper_only: bool = False  # the server process is gone, a wrapper of its launch lives on
    logged: list[str] = field(default_factory=list)  # crash-sign lines the server logged (it may survive them)


ServerWaitAnswer = dict[str, WaitResult]  # instance -> result


@answer_type
class StopResult:
    """`server_stop`, per instance."""

    instance: Name
    action: StopAction
    how: str | None = None
    pid: int | None = None
    launch_id: str | None = None
    seconds: float | None = None


ServerStopAnswer = list[StopResult]


@answer_type
class ContainerDeploy:
    """The newest complete deploy that recorded the container it patched."""

    id: str
    container: dict[str, str | None]


@answer_type
class ServerGrepAnswer:
    """`server_grep`: each instance's state with the matching lines of its current log."""

    instances: dict[str, InstanceState]
    deploy_now: DeployOnDisk | None = None
    tz_offset: int | None = None  # the host's UTC offset in seconds (log times are local)
    container_deploy: ContainerDeploy | None = None  # asked for a container host: its newest record


@answer_type
class MarkerCheck:
    """Whether the class's __init__ carries the marker (AST), or why it could not be read."""

    marker: bool = False
    error: str | None = None


@answer_type
class WorkerCheck:
    """`worker_check`, per worker file."""

    file: str
    exists: bool
    marker: str
    class_: str = field(metadata={"json": "class"})
    check: MarkerCheck | None = None
    sha256: Sha256 | None = None


WorkerCheckAnswer = list[WorkerCheck]


# ------------------------------------------------------------------------------------------ locate


@answer_type
class CodeMarker:
    """Does the code import would execute define the class, its __init__, the marker in it?"""

    class_: bool = field(default=False, metadata={"json": "class"})
    init: bool = False
    marker: bool = False


@answer_type
class LoadedCheck:
    """`locate`, per check: the code import would load for a worker file (bytecode included)."""

    file: str
    class_: str = field(metadata={"json": "class"})
    marker: str
    view: ImportView
    loaded: bool = False
    check: CodeMarker | None = None


@answer_type
class LocateAnswer:
    """`locate`: the probe run under the launch's interpreter, options, env and cwd (probe.py), or
    why it could not run (`error`; `unresolved`: the launch command's python cannot be told)."""

    executable: str | None = None
    version: str | None = None
    package_dir: str | None = None  # where it imports the request's engine package from
    pycache_prefix: str | None = None
    files: dict[str, ImportView] = field(default_factory=dict)
    checks: list[LoadedCheck] = field(default_factory=list)
    error: str | None = None
    unresolved: bool = False


@answer_type
class EngineProbeAnswer:
    """`engine_probe`: what the host's own engine did with a launch's argv (the engine's host probe), run under
    the launch's python, env and cwd with no GPU visible. `stage`: selected (worker_class chosen),
    no_speculation, no_worker, refused (`error`: SGLang's own exception or argparse error: the server
    would not start), import_failed (SGLang's server_args does not import), probe_failed (the probe
    could not run or answer: `error`, `timed_out`)."""

    stage: ProbeStage
    python: str | None = None
    package_version: str | None = None
    package_dir: str | None = None
    algorithm: str | None = None
    disable_overlap_schedule: bool | None = None
    worker_class: str | None = None
    worker_module: str | None = None
    worker_file: str | None = None
    error: str | None = None
    error_where: str | None = None
    warnings: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    standin: str | None = None
    timed_out: bool = False
    elapsed: float | None = None


@answer_type
class GpuCheckPrepareAnswer:
    """`gpucheck_prepare`: gpu-check's work dir on the host, a free port, and the work dirs of
    earlier checks whose agent was gone (their servers stopped, removed)."""

    dir: str
    port: int
    swept: list[str] = field(default_factory=list)


@answer_type
class GpuCheckScriptAnswer:
    """`gpucheck_script`: the engine script's JSON answer (checked again by the engine's reader), or
    why it did not answer."""

    ok: bool
    answer: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False


@answer_type
class GpuCheckStopped:
    instance: str
    action: StopAction | None = None
    pid: int | None = None
    how: str | None = None


@answer_type
class GpuCheckCleanupAnswer:
    """`gpucheck_cleanup`: the servers under the work dir stopped, and whether the dir is gone."""

    dir: str
    removed: bool
    stopped: list[GpuCheckStopped] = field(default_factory=list)
