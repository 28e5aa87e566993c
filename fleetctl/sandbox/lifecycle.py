"""A local fleet of real OpenSSH hosts on loopback, for trying and testing fleetctl.

`up(dir, hosts=N)` builds, in `dir`:

    client_key, client_key.pub     the one key every host accepts (pubkey auth only)
    known_hosts                    every host key, as `[127.0.0.1]:PORT ssh-ed25519 ...`
    ssh_config                     `Host h01` ... plus `Host h01-via-jump` (ProxyJump jump) and `Host jump`
    inventory.yaml                 the fleet, reached directly (address 127.0.0.1 + port)
    inventory-jump.yaml            the same hosts reached by their `-via-jump` ssh_config aliases
    sandbox.json                   what was built (ports, versions); pids live in the sshd.pid files
    hostlib/fleetctl               the fleetctl package link (the simulator runs from it)
    README.txt                     this layout, and what is a stand-in
    jump/                          the jump host's sshd (no SGLang)
    hosts/<name>/
        sshd_config, ssh_host_ed25519_key, sshd.pid, sshd.log     the host's own sshd
        site-packages/sglang/, sglang-<v>.dist-info/               a REAL COPY of the pristine wheel tree
        site-packages/torch-<v>.dist-info/METADATA                 STAND-IN torch: metadata only
        pyvenv.cfg, lib/python3.X/site-packages/fleetctl_sandbox_site.pth, bin/python
                                                                   the host's python: a bare venv
        bin/nvidia-smi                                             STAND-IN nvidia-smi (real captures)
        gpu-state                                                  `idle` or `busy`, read by the stand-in
        state/                                                     the host's fleetctl state dir
        home/                                                      with --bare-shell: the sessions' HOME (empty)

Stand-ins, on purpose: there is no GPU and no real torch on a sandbox host.
  * torch: only `torch-<v>.dist-info/METADATA` (Name/Version), with the version the host's SGLang
    release pins in its own `Requires-Dist: torch==...` line, so `importlib.metadata.version("torch")`
    answers what a correctly installed host would. `import torch` fails.
  * nvidia-smi: `fleetctl/sandbox/nvidia_smi.py` replays real H200 captures (see that module).
  * the SGLang server: the inventory's `launch_command` runs `fleetctl.sandbox.simulator`.

Login shell: by default a host's sessions run this machine's account login shell with its HOME and
rc files (here root's ~/.bashrc starts pyenv: ~0.1 s of CPU per remote command). `bare_shell=True`
(`sandbox up --bare-shell`) gives each fleet host's sessions their own empty HOME (sshd SetEnv), so
`bash -c` reads no ~/.bashrc: the login shell of a bare image. Both kinds exist among GPU hosts.

Everything else is real: one `/usr/sbin/sshd -D -e -f <cfg>` per host (detached, own session,
127.0.0.1 only), real ssh, real ProxyJump through the jump host, real files that fleetctl patches.
The host's python is the host dir itself made a bare virtualenv of the controller's base
interpreter (`pyvenv.cfg`; `bin/python` is the interpreter, a symlink as in any venv, no wrapper
script; no packages: a host does not carry the controller's installs; no user site); the venv's one
.pth names the host's site-packages, then `hostlib/` (a link to the stdlib-only fleetctl package,
for the simulator), AFTER PYTHONPATH and the stdlib as on a real host, so
`importlib.util.find_spec("sglang")` finds that host's tree unless PYTHONPATH names another.

Speed: `up` is dominated by creating the SGLang files (every host gets its own full copy, ~2,000
files for 0.5.9 and ~3,200 for 0.5.14), done by parallel `cp` processes. File creation is the
cost, not bytes: on a busy ext4 disk 32 hosts can take tens of seconds, on tmpfs (e.g. a --dir
under /dev/shm) a few seconds. Keys are generated in-process (no ssh-keygen), sshds start in parallel.

Every process the sandbox starts or its sessions spawn carries `FLEETCTL_SANDBOX_DIR=<dir>` in its
environment; `down` stops, by pid, only processes it can tie to the sandbox that way, by its sshd
config path, or by descent from one of its sshd listeners.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetctl.engines import wheels
from fleetctl.errors import FleetctlError, InputError
from fleetctl.sandbox import procs, sshd
from fleetctl.sandbox.sshd import LOOPBACK, SshdSpec

DEFAULT_VERSIONS: tuple[str, ...] = ("0.5.9", "0.5.14")
DEFAULT_GPUS = 2
MAX_HOSTS = 1000
MAX_GPUS = 64
JUMP = "jump"
VIA_JUMP = "-via-jump"
META = "sandbox.json"
SHARED_TREES = "shared-trees"  # link_trees: the one copy of each release the hosts hard-link to
HOSTPYTHON = "hostpython"  # (sandboxes made before hosts were venvs themselves; removed by a rebuild)
HOSTLIB = "hostlib"
LOCK = ".sandbox.lock"
FORMAT = 1
GPU_STATES = ("idle", "busy")
LAUNCH_COMMAND = "{python} -m fleetctl.sandbox.simulator"
NVIDIA_SMI = Path(__file__).resolve().parent / "nvidia_smi.py"
PROBE_PORT = 1  # `sshd -t` never binds; any valid port number does for the config probe

# what `up` writes at the top of the dir (and may remove again when rebuilding a stopped sandbox)
MANAGED = ("hosts", "jump", "client_key", "client_key.pub", "known_hosts", "ssh_config",
           "inventory.yaml", "inventory-jump.yaml", META, "README.txt", HOSTPYTHON, HOSTLIB, SHARED_TREES)

_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@:=,-]+$")
_VERSION = re.compile(r"^\d+(\.\d+)+((\.post|\.dev|rc|a|b)\d+)*$")
_TORCH_PIN = re.compile(r"^Requires-Dist:\s*torch\s*\(?\s*(===|==|>=|~=)\s*([0-9][^\s,;)]*)", re.M)

Progress = Callable[[str], None]


# ---- the model -------------------------------------------------------------------------------

@dataclass
class SandboxHost:
    """One sshd host of the sandbox (a fleet host, or the jump host)."""

    name: str
    role: str  # "fleet" or "jump"
    port: int
    host_dir: Path
    version: str | None = None
    torch_version: str | None = None
    # all sandbox hosts share 127.0.0.1, so each gets its own block of SGLang server ports
    # (written into the inventory as the host's --port flag; instances use port + i)
    server_port: int | None = None
    # bare login shell: the host's sshd gives its sessions HOME=<host dir>/home (empty, no rc files),
    # so the login shell (bash -c) starts bare instead of running this machine's ~/.bashrc
    bare_shell: bool = False

    @property
    def home(self) -> Path | None:
        return self.host_dir / "home" if self.bare_shell else None

    @property
    def via_jump(self) -> str | None:
        return f"{self.name}{VIA_JUMP}" if self.role == "fleet" else None

    @property
    def sshd_config(self) -> Path:
        return self.host_dir / "sshd_config"

    @property
    def pid_file(self) -> Path:
        return self.host_dir / "sshd.pid"

    @property
    def log(self) -> Path:
        return self.host_dir / "sshd.log"

    @property
    def site_packages(self) -> Path:
        return self.host_dir / "site-packages"

    @property
    def sglang_dir(self) -> Path:
        return self.site_packages / "sglang"

    @property
    def bin_dir(self) -> Path:
        return self.host_dir / "bin"

    @property
    def python(self) -> Path:
        return self.bin_dir / "python"

    @property
    def nvidia_smi(self) -> Path:
        return self.bin_dir / "nvidia-smi"

    @property
    def state_dir(self) -> Path:
        return self.host_dir / "state"

    @property
    def gpu_state_file(self) -> Path:
        return self.host_dir / "gpu-state"

    @property
    def pid(self) -> int | None:
        """The running sshd listener's pid (None if it is not running)."""
        return sshd.listener_pid(self.sshd_config, self.pid_file)

    @property
    def alive(self) -> bool:
        return self.pid is not None

    def path_env(self) -> str:
        return f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "port": self.port, "host_dir": str(self.host_dir),
                "version": self.version, "torch_version": self.torch_version, "server_port": self.server_port,
                "bare_shell": self.bare_shell}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SandboxHost:
        return cls(name=d["name"], role=d["role"], port=int(d["port"]), host_dir=Path(d["host_dir"]),
                   version=d.get("version"), torch_version=d.get("torch_version"),
                   server_port=d.get("server_port"), bare_shell=bool(d.get("bare_shell", False)))


@dataclass
class HostStatus:
    name: str
    role: str
    version: str | None
    port: int
    pid: int | None
    alive: bool
    listening: bool
    gpu_state: str | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class DownReport:
    dir: Path
    stopped: list[procs.Stopped]
    survivors: list[procs.Stopped]
    purged: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"dir": str(self.dir), "purged": self.purged,
                "stopped": [s.__dict__ for s in self.stopped],
                "survivors": [s.__dict__ for s in self.survivors]}


@dataclass
class Sandbox:
    """A sandbox fleet on this machine. Get one from `up()` or `load()`."""

    dir: Path
    hosts: dict[str, SandboxHost]  # fleet hosts, in order
    jump: SandboxHost
    gpus: int
    versions: list[str]
    controller_python: str
    host_python: str = ""  # the interpreter each host's venv is of ("" in sandboxes made before it)
    cpu_site: str = ""  # --cpu-sglang: the CPU venv's site-packages, a site dir of every host
    created: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.yaml"

    @property
    def jump_inventory_path(self) -> Path:
        return self.dir / "inventory-jump.yaml"

    @property
    def ssh_config_path(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def client_key(self) -> Path:
        return self.dir / "client_key"

    def all_hosts(self) -> list[SandboxHost]:
        return [*self.hosts.values(), self.jump]

    def host(self, name: str) -> SandboxHost:
        if name == JUMP:
            return self.jump
        base = name.removesuffix(VIA_JUMP)
        if base in self.hosts:
            return self.hosts[base]
        raise InputError(f"sandbox {self.dir} has no host {name!r}",
                         hint=f"hosts: {', '.join([*self.hosts, JUMP])}", reference="sandbox-invalid")

    def stop_host(self, name: str, timeout: float = 5.0) -> list[procs.Stopped]:
        """Make `name` unreachable: stop its sshd listener and its live ssh sessions (by pid).

        Processes the host's sessions left running detached (e.g. a launched server) keep running,
        as they would on a real host whose sshd died; `down` stops them.
        """
        h = self.host(name)
        with _locked(self.dir):
            pid = h.pid
            if pid is None:
                return []
            targets = {pid: f"{h.name} sshd listener"}
            for c in procs.descendants([pid]):
                targets[c] = f"{h.name} ssh session: {procs.cmdline(c)[:80]}"
            done = procs.stop(targets, timeout=timeout)
        left = [s for s in done if not s.gone]
        if left:
            raise FleetctlError(f"{h.name}: {len(left)} process(es) outlived SIGKILL: "
                                + ", ".join(str(s.pid) for s in left), reference="sandbox-failed")
        return [s for s in done if s.signal]

    def start_host(self, name: str) -> int:
        """Start `name`'s sshd again, on the same port; returns its pid (the running one if it runs)."""
        h = self.host(name)
        with _locked(self.dir):
            pid = h.pid
            if pid is not None:
                return pid
            spec = _spec_for(self.dir, h)
            try:
                return sshd.start(sshd.sshd_binary(), spec, _sshd_env(self.dir))
            except sshd.PortBusy:
                raise FleetctlError(f"{h.name}: port {h.port} is taken by another process",
                                    hint="free the port, or rebuild the sandbox", reference="sandbox-failed") from None

    def set_gpu_state(self, name: str, state: str) -> None:
        """Make the stand-in nvidia-smi of fleet host `name` report its GPUs `idle` or `busy`."""
        set_gpu_state(self.dir, name, state)

    def ssh_argv(self, name: str, command: str, *, batch: bool = True) -> list[str]:
        """`ssh -F <dir>/ssh_config ... NAME COMMAND` for the system OpenSSH client."""
        argv = ["ssh", "-F", str(self.ssh_config_path), "-o", "ConnectTimeout=10"]
        if batch:
            argv += ["-o", "BatchMode=yes"]
        return [*argv, name, command]

    def ssh(self, name: str, command: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run `command` on `name` (any ssh_config alias) with the system ssh client."""
        return subprocess.run(self.ssh_argv(name, command), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def status(self) -> list[HostStatus]:
        return status(self.dir)

    def down(self, timeout: float = 5.0) -> DownReport:
        return down(self.dir, timeout=timeout)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dir": str(self.dir),
            "created": self.created,
            "controller_python": self.controller_python,
            "host_python": self.host_python,
            "cpu_site": self.cpu_site,
            "gpus": self.gpus,
            "versions": self.versions,
            "hosts": [h.to_json() for h in self.all_hosts()],
        }


# ---- helpers ---------------------------------------------------------------------------------

def _abs_dir(d: Path | str) -> Path:
    p = Path(d).expanduser()
    p = Path(os.path.abspath(p))
    if not _SAFE_PATH.match(str(p)):
        raise InputError(f"sandbox dir {str(p)!r} holds characters ssh/sshd configs cannot take",
                         hint="use a path of letters, digits and ._-/+@:=, only (no spaces or %)",
                         reference="sandbox-invalid")
    return p


@contextmanager
def _locked(d: Path) -> Iterator[None]:
    d.mkdir(parents=True, exist_ok=True)
    with open(d / LOCK, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sshd_env(d: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[procs.MARKER_VAR] = str(d)
    return env


def session_env(d: Path, h: SandboxHost) -> dict[str, str]:
    """What the host's sshd sets in every session (SetEnv), over the account's login environment."""
    set_env = {procs.MARKER_VAR: str(d), "FLEETCTL_SANDBOX_HOST": h.name}
    if h.role == "fleet":
        set_env = {"PATH": h.path_env(), **set_env}
    if h.home is not None:  # sshd's SetEnv overrides the HOME it takes from the password database
        set_env["HOME"] = str(h.home)
    return set_env


def _spec_for(d: Path, h: SandboxHost) -> SshdSpec:
    return SshdSpec(name=h.name, host_dir=h.host_dir, port=h.port, authorized_keys=d / "client_key.pub",
                    set_env=session_env(d, h))


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def torch_pin(tree: Path, version: str) -> str:
    """The torch version release `version` pins in its own METADATA (`Requires-Dist: torch==X`)."""
    metas = sorted(tree.glob("sglang-*.dist-info/METADATA"))
    if not metas:
        raise FleetctlError(f"sglang {version}: no dist-info METADATA in {tree}", reference="sandbox-failed")
    m = _TORCH_PIN.search(metas[0].read_text(errors="replace"))
    if not m:
        raise FleetctlError(f"sglang {version}: its METADATA names no torch version (Requires-Dist: torch==...)",
                            reference="sandbox-failed")
    return m.group(2)


def group_for(version: str) -> str:
    return "v" + re.sub(r"[^A-Za-z0-9]", "_", version)


def host_names(n: int) -> list[str]:
    width = max(2, len(str(n)))
    return [f"h{i:0{width}d}" for i in range(1, n + 1)]


def load(d: Path | str) -> Sandbox:
    """The sandbox described by `d`/sandbox.json."""
    d = _abs_dir(d)
    try:
        meta = json.loads((d / META).read_text())
    except FileNotFoundError:
        raise InputError(f"{d}: no sandbox here (no {META})",
                         hint=f"create one with 'fleetctl sandbox up --dir {d}'", reference="sandbox-invalid") from None
    except json.JSONDecodeError as e:
        raise FleetctlError(f"{d / META}: unreadable: {e}", reference="sandbox-failed") from None
    hosts = [SandboxHost.from_json(h) for h in meta.get("hosts", [])]
    fleet = {h.name: h for h in hosts if h.role == "fleet"}
    jumps = [h for h in hosts if h.role == "jump"]
    if not jumps:
        raise FleetctlError(f"{d / META}: no jump host recorded (an interrupted 'sandbox up'?)",
                            hint=f"run 'fleetctl sandbox down --dir {d}' and up again", reference="sandbox-failed")
    return Sandbox(dir=d, hosts=fleet, jump=jumps[0], gpus=int(meta.get("gpus", DEFAULT_GPUS)),
                   versions=list(meta.get("versions", [])), controller_python=meta.get("controller_python", ""),
                   host_python=meta.get("host_python", ""), cpu_site=meta.get("cpu_site", ""),
                   created=float(meta.get("created", 0.0)))


def set_gpu_state(d: Path | str, name: str, state: str) -> None:
    """Flip fleet host `name` of the sandbox in `d` to `idle` or `busy` GPUs (the stand-in nvidia-smi
    reads the file on every call)."""
    if state not in GPU_STATES:
        raise InputError(f"GPU state {state!r}: expected one of {', '.join(GPU_STATES)}", reference="sandbox-invalid")
    sb = load(d)
    h = sb.host(name)
    if h.role != "fleet":
        raise InputError(f"{name} has no GPUs (the jump host)", reference="sandbox-invalid")
    _write(h.gpu_state_file, state + "\n")


# ---- building the hosts ----------------------------------------------------------------------

SITE_PTH = "fleetctl_sandbox_site.pth"


def install_host_python(root: Path, base: str, site_dirs: list[Path]) -> Path:
    """Make `root` a bare virtual environment of the interpreter `base` (`root/pyvenv.cfg`, no
    system site-packages, so no user site either) whose `root/bin/python` IS the interpreter (a
    symlink, as in any venv: no wrapper script), and whose one .pth adds `site_dirs` as site dirs
    (after the stdlib and the venv's own site-packages, as a real host's site-packages; .pth files
    in them are read). So sys.path is ordered as on a real host: script dir / cwd, PYTHONPATH, stdlib,
    site-packages. Returns root/bin/python."""
    real = os.path.realpath(base)
    ver = subprocess.run([real, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    major_minor = ".".join(ver.split(".")[:2])
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "pyvenv.cfg").write_text(f"home = {os.path.dirname(real)}\ninclude-system-site-packages = false\n"
                                     f"version = {ver}\n")
    sp = root / "lib" / f"python{major_minor}" / "site-packages"
    sp.mkdir(parents=True, exist_ok=True)
    # site dirs (their own .pth files are read, as in a real site-packages), after the venv's own
    (sp / SITE_PTH).write_text("".join(f"import site; site.addsitedir({str(d)!r})\n" for d in site_dirs))
    py = root / "bin" / "python"
    py.symlink_to(real)
    return py


NVIDIA_SMI_WRAPPER = """\
#!/bin/sh
# STAND-IN for NVIDIA's nvidia-smi: fleetctl sandbox host {name} has no GPU.
# Replays real H200 captures (fleetctl/sandbox/captures/h200-1gpu) for {gpus} GPU(s), idle or busy
# as {state_file} says. See fleetctl/sandbox/nvidia_smi.py. (-S: it is stdlib only, and the real one, a
# C program, runs no site-packages start-up hooks: a .pth that imports something costs every query.
# Imported, not run as a script: its compiled form is cached, as a program's binary is.)
FLEETCTL_SANDBOX_HOST_DIR={host_dir}
FLEETCTL_SANDBOX_GPUS={gpus}
{marker}={sandbox}
export FLEETCTL_SANDBOX_HOST_DIR FLEETCTL_SANDBOX_GPUS {marker}
exec {python} -I -S -c {launcher} {script_dir} "$@"
"""
# the stand-in's module imported from its own directory (given as the first argument, taken off
# before it reads the rest): only os and sys are imported before it, none of them from there
NVIDIA_SMI_LAUNCHER = "import sys; sys.path.insert(0, sys.argv.pop(1)); import nvidia_smi; sys.exit(nvidia_smi.main())"

TORCH_METADATA = """\
Metadata-Version: 2.1
Name: torch
Version: {version}
Summary: fleetctl sandbox STAND-IN for torch: metadata only, no code. The version is the one sglang {sglang} pins (Requires-Dist: torch=={version}).
"""


def _copy_tree(src: Path, dst: Path) -> None:
    """A real, independent copy (new inodes, writable files). GNU cp runs outside the GIL; the
    Python fallback is used if cp is missing or fails."""
    cp = shutil.which("cp")
    if cp:
        proc = subprocess.run([cp, "-R", "--no-preserve=all", str(src), str(dst)], capture_output=True)
        if proc.returncode == 0:
            return
        shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, copy_function=shutil.copyfile)


def _host_interpreter(d: Path) -> str:
    """The hosts' base interpreter (each host is a bare venv of it: install_host_python), and
    hostlib/fleetctl -> this fleetctl package (its host-side modules are stdlib only). A host thus
    starts Python as a real SGLang host would, without the controller's installs (an editable
    install's import hook alone costs ~10 ms per start)."""
    lib = d / HOSTLIB
    lib.mkdir()
    (lib / "fleetctl").symlink_to(Path(__file__).resolve().parent.parent, target_is_directory=True)
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _checked_host_python(py: str, cpu_sglang: bool) -> str:
    """The real path of `py` if it is a CPython >= 3.8 (the oldest the agent supports), else InputError."""
    if cpu_sglang:
        raise InputError("--host-python and --cpu-sglang do not go together (the CPU venv has its own python)",
                         reference="sandbox-invalid")
    exe = shutil.which(py) or py
    try:
        p = subprocess.run([exe, "-I", "-c", "import sys; print(sys.implementation.name, *sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=60)
        name, major, minor = p.stdout.split()
        ok = p.returncode == 0 and name == "cpython" and (int(major), int(minor)) >= (3, 8)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise InputError(f"--host-python {py!r}: not a CPython >= 3.8 that runs here",
                         hint="give the path of a python3.8 ... python3.13 interpreter", reference="sandbox-invalid")
    return os.path.realpath(exe)


def _cpu_site(sb: Sandbox) -> list[Path]:
    """With --cpu-sglang: the cached CPU venv's site-packages (real torch and SGLang's requirements),
    after the host's own."""
    if not sb.cpu_site:
        return []
    return [Path(sb.cpu_site)]


def _build_fleet_host(sb: Sandbox, h: SandboxHost, tree: Path, busy: bool, link: bool = False) -> None:
    assert h.version and h.torch_version
    h.site_packages.mkdir(parents=True)
    h.bin_dir.mkdir()
    h.state_dir.mkdir()
    if h.home is not None:
        h.home.mkdir()
    if link and shutil.which("cp") and subprocess.run(
            ["cp", "-al", str(tree / "sglang"), str(h.sglang_dir)], capture_output=True).returncode == 0:
        pass  # own dirs, file inodes shared with the sandbox's one copy (link_trees)
    else:
        shutil.rmtree(h.sglang_dir, ignore_errors=True)
        _copy_tree(tree / "sglang", h.sglang_dir)
    for info in tree.glob("sglang-*.dist-info"):
        shutil.copytree(info, h.site_packages / info.name, copy_function=shutil.copyfile)
    tdir = h.site_packages / f"torch-{h.torch_version}.dist-info"
    tdir.mkdir()
    (tdir / "METADATA").write_text(TORCH_METADATA.format(version=h.torch_version, sglang=h.version))
    (tdir / "INSTALLER").write_text("fleetctl-sandbox-stand-in\n")
    q = shlex.quote
    install_host_python(h.host_dir, sb.host_python or sb.controller_python,
                        [h.site_packages, *_cpu_site(sb), sb.dir / HOSTLIB])
    _write(h.nvidia_smi, NVIDIA_SMI_WRAPPER.format(
        name=h.name, gpus=sb.gpus, state_file=h.gpu_state_file, host_dir=q(str(h.host_dir)),
        marker=procs.MARKER_VAR, sandbox=q(str(sb.dir)), python=q(sb.host_python or sb.controller_python),
        launcher=q(NVIDIA_SMI_LAUNCHER), script_dir=q(str(NVIDIA_SMI.parent))), 0o755)
    _write(h.gpu_state_file, ("busy" if busy else "idle") + "\n")


def _ssh_config(sb: Sandbox) -> str:
    def entry(alias: str, port: int, jump: bool) -> list[str]:
        lines = [f"Host {alias}", f"  HostName {LOOPBACK}", f"  Port {port}", f"  User {_user()}",
                 f"  IdentityFile {sb.client_key}", "  IdentitiesOnly yes",
                 f"  UserKnownHostsFile {sb.known_hosts_path}", "  StrictHostKeyChecking yes"]
        if jump:
            lines.append(f"  ProxyJump {JUMP}")
        return [*lines, ""]

    out = [f"# fleetctl sandbox in {sb.dir} (generated by 'fleetctl sandbox up'; loopback only)",
           "# HOST: direct; HOST-via-jump: the same host through the jump host (ProxyJump)", ""]
    out += entry(JUMP, sb.jump.port, False)
    for h in sb.hosts.values():
        out += entry(h.name, h.port, False)
    for h in sb.hosts.values():
        out += entry(f"{h.name}{VIA_JUMP}", h.port, True)
    return "\n".join(out)


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _inventories(sb: Sandbox) -> tuple[str, str]:
    defaults = {"user": _user(), "identity_file": "client_key", "known_hosts": "known_hosts"}

    def host_entry(h: SandboxHost, direct: bool) -> dict[str, Any]:
        e: dict[str, Any] = {}
        if direct:
            e["address"] = LOOPBACK
            e["port"] = h.port
        e.update({
            "python": str(h.python),
            "state_dir": str(h.state_dir),
            "gpus": sb.gpus,
            "env": {"PATH": h.path_env()},
            "groups": ["sandbox", group_for(h.version or "")] + ([] if direct else ["via_jump"]),
            "launch_command": LAUNCH_COMMAND,
        })
        if h.server_port:
            e["flags"] = {"--port": h.server_port}
        return e

    head = (f"# fleetctl sandbox inventory for {sb.dir} (generated by 'fleetctl sandbox up').\n"
            "# Hosts are real sshd servers on 127.0.0.1. torch and nvidia-smi on them are stand-ins,\n"
            "# and launch_command runs the SGLang server simulator; see README.txt.\n")
    direct = {"ssh_config": "ssh_config", "defaults": defaults,
              "hosts": {h.name: host_entry(h, True) for h in sb.hosts.values()}}
    via = {"ssh_config": "ssh_config", "defaults": defaults,
           "hosts": {f"{h.name}{VIA_JUMP}": host_entry(h, False) for h in sb.hosts.values()}}
    dump = lambda doc: yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=200)  # noqa: E731
    via_head = head + "# Every host here is an ssh_config alias reached through the jump host (ProxyJump).\n"
    return head + dump(direct), via_head + dump(via)


README = """\
fleetctl sandbox: {n} hosts + a jump host, real OpenSSH servers on 127.0.0.1 ({created}).

  fleetctl facts -i {dir}/inventory.yaml
  ssh -F {dir}/ssh_config h01 true              # direct
  ssh -F {dir}/ssh_config h01-via-jump true     # through the jump host
  fleetctl sandbox status --dir {dir}
  fleetctl sandbox down --dir {dir}

Per host, hosts/<name>/site-packages holds a real copy of the pristine SGLang wheel tree.
STAND-INS (no GPU, no torch here): torch-<v>.dist-info is metadata only (the version that SGLang
release pins); bin/nvidia-smi replays real H200 captures (gpu-state: idle|busy); the inventory's
launch_command runs fleetctl.sandbox.simulator, not SGLang. Each host dir is a bare venv (none of
the controller's packages; bin/python is the interpreter itself) whose .pth names the host's
site-packages and hostlib/ (fleetctl's stdlib-only package, for the simulator), after PYTHONPATH.
"""


# ---- up / status / down ----------------------------------------------------------------------

def _recorded_hosts(d: Path) -> list[SandboxHost]:
    """Hosts recorded in sandbox.json; else whatever host dirs exist (an interrupted `up`)."""
    try:
        meta = json.loads((d / META).read_text())
        return [SandboxHost.from_json(h) for h in meta.get("hosts", [])]
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        pass
    found = []
    dirs = sorted((d / "hosts").glob("*/sshd_config")) + sorted(d.glob("jump/sshd_config"))
    for cfg in dirs:
        found.append(SandboxHost(name=cfg.parent.name, role="jump" if cfg.parent.name == JUMP else "fleet",
                                 port=0, host_dir=cfg.parent))
    return found


def _is_sandbox_dir(d: Path) -> bool:
    return (d / META).exists() or (d / "hosts").is_dir() or (d / JUMP / "sshd_config").exists()


def _refuse_foreign(d: Path) -> None:
    """Refuse a --dir that exists and holds anything but a (stopped) sandbox: it is never wiped."""
    if not d.exists():
        return
    if not d.is_dir():
        raise InputError(f"{d}: not a directory", hint="give an empty or new --dir", reference="sandbox-invalid")
    if _is_sandbox_dir(d):
        return
    leftovers = sorted(p.name for p in d.iterdir() if p.name != LOCK)
    if leftovers:
        raise InputError(f"{d}: not empty and not a sandbox ({', '.join(leftovers[:3])}"
                         f"{', ...' if len(leftovers) > 3 else ''})", hint="give an empty or new --dir",
                         reference="sandbox-invalid")


def _running(d: Path) -> list[str]:
    out = [f"{h.name} sshd pid {h.pid}" for h in _recorded_hosts(d) if h.alive]
    out += [f"pid {p}" for p in sorted(procs.marked(d))]
    return out


def up(
    dir: Path | str,
    hosts: int = 3,
    versions: Sequence[str] = DEFAULT_VERSIONS,
    gpus: int = DEFAULT_GPUS,
    busy_gpus: Iterable[str] = (),
    progress: Progress | None = None,
    cpu_sglang: bool = False,
    bare_shell: bool = False,
    link_trees: bool = False,
    host_python: str = "",
    sshd_hosts: bool = True,
) -> Sandbox:
    """Build and start a sandbox fleet of `hosts` hosts (+ the jump host) in `dir`.

    cpu_sglang: the hosts' python is the cached CPU venv (fleetctl/sandbox/cpu_venv.py: real torch
    CPU build, SGLang's pure-Python requirements, the labelled GPU stand-in) instead of a bare one,
    so each host's own SGLang tree imports far enough for `explain --probe`.

    Versions cycle through `versions` (h01 gets the first). Refuses (InputError) if a sandbox runs
    in `dir`, or if `dir` holds anything that is not a stopped sandbox. `bare_shell`: every fleet
    host's sessions get their own empty HOME (no ~/.bashrc, ~/.profile: a bare image's login shell)
    instead of this machine's account HOME and its rc files. `link_trees` (benchmarks of hundreds of
    hosts): each host's SGLang files are hard links to one shared copy of the pristine tree (its own
    dirs, shared file inodes; ~38 GB less at 1,000 hosts). Safe only for what replaces files by
    rename (fleetctl's deploy/rollback, the bench's reset), never for an in-place write of a file.
    `host_python`: the interpreter the hosts run (a real GPU host's may be 3.8 to 3.13) instead of
    the controller's; refused if it is not a CPython >= 3.8 (the oldest the agent supports).
    `sshd_hosts=False`: every file of every host, but no sshd is started (tests of ops reach such
    hosts in-process, tests/fakehost.py); the inventories name free loopback ports nobody listens on.
    """
    say = progress or (lambda _msg: None)
    t0 = time.monotonic()
    d = _abs_dir(dir)
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
        raise InputError(f"--hosts {hosts!r}: expected a count from 1 to {MAX_HOSTS}", reference="sandbox-invalid")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_GPUS:
        raise InputError(f"--gpus {gpus!r}: expected a count from 0 to {MAX_GPUS}", reference="sandbox-invalid")
    versions = [v.strip() for v in versions if v.strip()]
    if not versions:
        raise InputError("--versions names no version", hint="e.g. --versions 0.5.9,0.5.14",
                         reference="sandbox-invalid")
    for v in versions:
        if not _VERSION.match(v):
            raise InputError(f"--versions: {v!r} is not an SGLang version", hint="e.g. 0.5.9 or 0.5.4.post3",
                             reference="sandbox-invalid")
    names = host_names(hosts)
    busy = {b.strip() for b in busy_gpus if b.strip()}
    unknown = sorted(busy - set(names))
    if unknown:
        raise InputError(f"--busy-gpus: no host {', '.join(unknown)} in a {hosts}-host sandbox",
                         hint=f"hosts are {names[0]}..{names[-1]}", reference="sandbox-invalid")
    host_python = _checked_host_python(host_python, cpu_sglang) if host_python else ""
    binary = sshd.sshd_binary() if sshd_hosts else ""
    if not sys.executable:
        raise FleetctlError("cannot tell this Python's interpreter path (sys.executable is empty)",
                            reference="sandbox-failed")

    _refuse_foreign(d)
    with _locked(d):
        running = _running(d)
        if running:
            raise InputError(f"{d}: a sandbox is running here ({len(running)} process(es): {running[0]}, ...)",
                             hint=f"run 'fleetctl sandbox down --dir {d}' first", reference="sandbox-invalid")
        if _is_sandbox_dir(d):
            for name in MANAGED:
                p = d / name
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
        _refuse_foreign(d)
        try:
            return _up(d, names, versions, gpus, busy, binary, say, t0, cpu_sglang, bare_shell, link_trees,
                       host_python, sshd_hosts)
        except BaseException:
            _stop_everything(d, timeout=5.0)
            raise


def _up(d: Path, names: list[str], versions: list[str], gpus: int, busy: set[str], binary: str,
        say: Progress, t0: float, cpu_sglang: bool = False, bare_shell: bool = False,
        link_trees: bool = False, host_python: str = "", sshd_hosts: bool = True) -> Sandbox:
    timings: dict[str, float] = {}
    mark = time.monotonic()

    def lap(what: str) -> None:
        nonlocal mark
        now = time.monotonic()
        timings[what] = round(now - mark, 3)
        mark = now

    trees: dict[str, Path] = {}
    pins: dict[str, str] = {}
    for v in dict.fromkeys(versions):
        trees[v] = wheels.extracted(v)
        pins[v] = torch_pin(trees[v], v)
    lap("wheels")

    (d / "hosts").mkdir()
    fleet = {}
    for i, n in enumerate(names):
        v = versions[i % len(versions)]
        fleet[n] = SandboxHost(name=n, role="fleet", port=0, host_dir=d / "hosts" / n, version=v,
                               torch_version=pins[v], bare_shell=bare_shell)
    jump = SandboxHost(name=JUMP, role="jump", port=0, host_dir=d / JUMP)
    sb = Sandbox(dir=d, hosts=fleet, jump=jump, gpus=gpus, versions=versions,
                 controller_python=sys.executable, created=time.time(), timings=timings)

    say(f"keys for {len(names)} hosts + jump")
    sshd.write_ed25519(sb.client_key, f"fleetctl-sandbox-client@{d}")
    pubs: dict[str, str] = {}
    for h in sb.all_hosts():
        h.host_dir.mkdir(parents=True)
        pubs[h.name] = sshd.write_ed25519(h.host_dir / "ssh_host_ed25519_key", f"{h.name}@fleetctl-sandbox")
    lap("keys")
    sb.host_python = _host_interpreter(d)
    if host_python:  # (checked by up())
        sb.host_python = host_python
    if cpu_sglang:
        from fleetctl.sandbox import cpu_venv

        py = cpu_venv.ensure_cpu_venv()
        sb.host_python = os.path.realpath(py)
        sb.cpu_site = str(cpu_venv.site_packages(py.parent.parent))
    lap("host python")

    say(f"copying SGLang trees ({', '.join(dict.fromkeys(versions))}) to {len(names)} hosts")
    workers = min(len(names), max(4, 2 * (os.cpu_count() or 2)))
    with ThreadPoolExecutor(workers) as ex:
        if link_trees:  # one private copy per release (never the wheel cache), hard-linked per host
            shared = {}
            for v in dict.fromkeys(versions):
                shared[v] = d / SHARED_TREES / v
                shared[v].mkdir(parents=True)
                _copy_tree(trees[v] / "sglang", shared[v] / "sglang")
                for info in trees[v].glob("sglang-*.dist-info"):
                    shutil.copytree(info, shared[v] / info.name, copy_function=shutil.copyfile)
            trees = shared
        list(ex.map(lambda h: _build_fleet_host(sb, h, trees[h.version or ""], h.name in busy, link_trees),
                    fleet.values()))
    lap("copies")

    taken: set[int] = set()
    if sshd_hosts:
        _start_sshds(d, sb, binary, taken, say)
    else:
        for h in sb.all_hosts():
            h.port = sshd.free_port(taken)
        _write(d / META, json.dumps(sb.to_json(), indent=2) + "\n")
    lap("sshd")

    block = max(1, gpus)
    for h in sb.hosts.values():
        h.server_port = _free_block(block, taken)
    _write(d / META, json.dumps(sb.to_json(), indent=2) + "\n")
    _write(sb.known_hosts_path, "".join(f"[{LOOPBACK}]:{h.port} {pubs[h.name]}\n" for h in sb.all_hosts()))
    _write(sb.ssh_config_path, _ssh_config(sb), 0o600)
    direct, via = _inventories(sb)
    _write(sb.inventory_path, direct)
    _write(sb.jump_inventory_path, via)
    _write(d / "README.txt", README.format(n=len(names), dir=d, created=time.strftime("%Y-%m-%d %H:%M:%S")))

    from fleetctl.config.inventory import load_inventory

    for inv in (sb.inventory_path, sb.jump_inventory_path):
        got = load_inventory(inv)
        if len(got.hosts) != len(names):
            raise FleetctlError(f"{inv}: the inventory loader sees {len(got.hosts)} hosts, not {len(names)}",
                                reference="sandbox-failed")
    lap("configs")
    timings["total"] = round(time.monotonic() - t0, 3)
    return sb


def _start_sshds(d: Path, sb: Sandbox, binary: str, taken: set[int], say: Progress) -> None:
    """Start every host's sshd (the jump host's too), each on a free loopback port."""
    say(f"starting {len(sb.hosts) + 1} sshd on {LOOPBACK}")
    jump = sb.jump
    lock = threading.Lock()
    probe_spec = _spec_for(d, jump)
    probe_spec.port = PROBE_PORT
    optional = sshd.probe_optional(binary, probe_spec)
    env = _sshd_env(d)

    def launch(h: SandboxHost) -> None:
        for attempt in range(sshd.PORT_RETRIES):
            with lock:
                h.port = sshd.free_port(taken)
            spec = _spec_for(d, h)
            _write(spec.config, sshd.render_config(spec, optional))
            try:
                sshd.start(binary, spec, env)
                return
            except sshd.PortBusy:
                if attempt == sshd.PORT_RETRIES - 1:
                    raise FleetctlError(f"{h.name}: no free port after {sshd.PORT_RETRIES} tries",
                                        reference="sandbox-failed") from None

    # record what is being built first, so an interrupted up can still be taken down
    _write(d / META, json.dumps(sb.to_json(), indent=2) + "\n")
    with ThreadPoolExecutor(min(32, len(sb.hosts) + 1)) as ex:
        list(ex.map(launch, sb.all_hosts()))


SERVER_PORT_RANGE = (10000, 19900)  # below the sshd ports and the kernel's ephemeral range


def _free_block(size: int, taken: set[int]) -> int:
    """A base port whose `size` consecutive loopback ports are free now and not handed out."""
    import random
    import socket

    for _ in range(1000):
        base = random.randint(*SERVER_PORT_RANGE)
        ports = range(base, base + size)
        if any(p in taken for p in ports):
            continue
        ok = True
        for p in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((LOOPBACK, p))
                except OSError:
                    ok = False
                    break
        if ok:
            taken.update(ports)
            return base
    raise FleetctlError("no free block of loopback ports for the sandbox servers", reference="sandbox-failed")


def status(dir: Path | str) -> list[HostStatus]:
    """Per host (fleet hosts, then the jump host): port, listener pid, alive, answering on its port."""
    sb = load(dir)
    out = []
    for h in sb.all_hosts():
        pid = h.pid
        gpu: str | None = None
        if h.role == "fleet":
            try:
                gpu = h.gpu_state_file.read_text().strip()
            except FileNotFoundError:
                gpu = None
        out.append(HostStatus(name=h.name, role=h.role, version=h.version, port=h.port, pid=pid,
                              alive=pid is not None, listening=pid is not None and sshd.banner_ok(h.port, 2.0),
                              gpu_state=gpu))
    return out


@dataclass
class _ServerRecord:
    pid: int
    pgid: int | None
    start_ticks: int | None
    source: Path


def _server_records(d: Path) -> list[_ServerRecord]:
    """Server pids recorded in the hosts' state dirs: `*.pid` files anywhere there, and the launch
    records (`servers/<instance>/current.json`, `launches/*.json`: pid, pgid, start_ticks)."""
    out: list[_ServerRecord] = []
    for f in sorted((d / "hosts").glob("*/state/**/*.pid")):
        pid = sshd.read_pid(f)
        if pid:
            out.append(_ServerRecord(pid=pid, pgid=None, start_ticks=None, source=f))
    records = sorted((d / "hosts").glob("*/state/servers/*/current.json"))
    records += sorted((d / "hosts").glob("*/state/servers/*/launches/*.json"))
    for f in records:
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        pid = rec.get("pid") if isinstance(rec, dict) else None
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
            pgid, ticks = rec.get("pgid"), rec.get("start_ticks")
            out.append(_ServerRecord(pid=pid, pgid=pgid if isinstance(pgid, int) else None,
                                     start_ticks=ticks if isinstance(ticks, int) else None, source=f))
    return out


def _belongs(pid: int, d: Path) -> bool:
    if procs.has_marker(pid, d):
        return True
    needle = str(d) + "/"
    if needle in procs.cmdline(pid) + " ":
        return True
    return any(needle.encode() in e for e in procs.environ(pid))


def _targets(d: Path) -> dict[int, str]:
    """Every live process of the sandbox in `d`, each confirmed to belong to it (pid -> what)."""
    parents = procs.parent_map()
    targets: dict[int, str] = {}

    def add_tree(root: int, what: str) -> None:
        targets.setdefault(root, what)
        for c in sorted(procs.descendants([root], parents)):
            targets.setdefault(c, f"{what} > {procs.cmdline(c)[:80]}")

    # sessions outlive a SIGTERM'd listener and get reparented: collect them via ppid first
    for h in _recorded_hosts(d):
        pid = h.pid
        if pid is not None:
            add_tree(pid, f"{h.name} sshd listener (port {h.port})")
    for rec in _server_records(d):
        st = procs.stat(rec.pid)
        if st is None or not procs.alive(rec.pid) or not _belongs(rec.pid, d):
            continue
        if rec.start_ticks is not None and st.start_ticks != rec.start_ticks:
            continue  # the recorded process is gone and its pid was reused
        what = f"server ({rec.source.relative_to(d)}): {procs.cmdline(rec.pid)[:80]}"
        add_tree(rec.pid, what)
        if rec.pgid:
            for member in procs.group_members(rec.pgid):
                if _belongs(member, d):
                    add_tree(member, f"{what} [group]")
    for pid in sorted(procs.marked(d)):
        if procs.alive(pid):
            add_tree(pid, f"sandbox process: {procs.cmdline(pid)[:80]}")
    for p in procs.own_lineage():
        targets.pop(p, None)
    return targets


def _stop_everything(d: Path, timeout: float) -> tuple[list[procs.Stopped], list[procs.Stopped]]:
    stopped: list[procs.Stopped] = []
    survivors: list[procs.Stopped] = []
    # a second pass catches anything a dying session spawned in between
    for _ in range(2):
        targets = _targets(d)
        if not targets:
            break
        done = procs.stop(targets, timeout=timeout)
        stopped += [s for s in done if s.signal and s.gone]
        survivors = [s for s in done if not s.gone]
        if survivors:
            break
    return stopped, survivors


def down(dir: Path | str, timeout: float = 5.0, purge: bool = False, missing_ok: bool = False) -> DownReport:
    """Stop every process of the sandbox in `dir` (by pid, verified; SIGKILL after `timeout`).

    Idempotent. `purge` then removes the dir. `missing_ok`: no dir is not an error.
    """
    d = _abs_dir(dir)
    if not d.is_dir() or not _is_sandbox_dir(d):
        if missing_ok:
            return DownReport(dir=d, stopped=[], survivors=[])
        raise InputError(f"{d}: no sandbox here", hint="give the --dir used with 'fleetctl sandbox up'",
                         reference="sandbox-invalid")
    with _locked(d):
        stopped, survivors = _stop_everything(d, timeout)
    report = DownReport(dir=d, stopped=stopped, survivors=survivors)
    if purge and not survivors:
        shutil.rmtree(d)
        report.purged = True
    return report
