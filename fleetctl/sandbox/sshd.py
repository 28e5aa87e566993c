"""One real OpenSSH server per sandbox host: keys, config, start, readiness.

Each sshd runs as `/usr/sbin/sshd -D -e -f <host dir>/sshd_config`, detached in its own session,
listening on 127.0.0.1 only. sshd writes its PidFile after its listen socket is bound, so the pid
file appearing is the readiness signal; a TCP connect that reads the `SSH-2.0` banner confirms it.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fleetctl.errors import FleetctlError
from fleetctl.sandbox import procs

SSHD = "/usr/sbin/sshd"
LOOPBACK = "127.0.0.1"
# listen ports come from below Linux's default ephemeral range (32768-60999), so they do not race
# with the source ports of outgoing connections
PORT_RANGE = (20000, 32000)
START_TIMEOUT = 15.0
PORT_RETRIES = 8

# options newer or older sshds may not know: probed once with `sshd -t`, dropped if refused
OPTIONAL = ("PerSourcePenalties no", "KbdInteractiveAuthentication no")


def sshd_binary() -> str:
    if os.access(SSHD, os.X_OK):
        return SSHD
    found = shutil.which("sshd", path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/local/sbin")
    if found:
        return found
    raise FleetctlError(f"no OpenSSH server: {SSHD} is missing", hint="install openssh-server",
                        reference="sandbox-failed")


def write_ed25519(path: Path, comment: str) -> str:
    """Write a new ed25519 private key (OpenSSH format, 0600) and `path`.pub; return the pub line."""
    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(priv)
    os.chmod(path, 0o600)
    line = f"{pub.decode()} {comment}"
    path.with_name(path.name + ".pub").write_text(line + "\n")
    return pub.decode()


@dataclass
class SshdSpec:
    """What one host's sshd_config says."""

    name: str
    host_dir: Path
    port: int
    authorized_keys: Path
    set_env: dict[str, str]

    @property
    def config(self) -> Path:
        return self.host_dir / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.host_dir / "ssh_host_ed25519_key"

    @property
    def pid_file(self) -> Path:
        return self.host_dir / "sshd.pid"

    @property
    def log(self) -> Path:
        return self.host_dir / "sshd.log"


def render_config(spec: SshdSpec, optional: tuple[str, ...]) -> str:
    lines = [
        f"# fleetctl sandbox: sshd for host {spec.name} (generated; loopback only, pubkey auth only)",
        f"ListenAddress {LOOPBACK}:{spec.port}",
        f"HostKey {spec.host_key}",
        f"PidFile {spec.pid_file}",
        f"AuthorizedKeysFile {spec.authorized_keys}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "PermitEmptyPasswords no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        # room for fleets of hundreds of hosts fanning in (notably through the jump host)
        "MaxStartups 4096",
        "MaxSessions 1024",
        "MaxAuthTries 6",
        "LoginGraceTime 30",
        "AllowTcpForwarding yes",
        "X11Forwarding no",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "AcceptEnv LANG LC_*",
        "Subsystem sftp internal-sftp",
        "LogLevel INFO",
        *optional,
    ]
    if spec.set_env:
        lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in spec.set_env.items()))
    return "\n".join(lines) + "\n"


def probe_optional(sshd: str, spec: SshdSpec) -> tuple[str, ...]:
    """The OPTIONAL lines this sshd accepts (checked with `sshd -t` on a scratch config)."""
    ensure_privsep_dir()
    keep = list(OPTIONAL)
    scratch = spec.host_dir / ".sshd_config.probe"
    try:
        for _ in range(len(OPTIONAL) + 1):
            scratch.write_text(render_config(spec, tuple(keep)))
            proc = subprocess.run([sshd, "-t", "-f", str(scratch)], capture_output=True, text=True,
                                  timeout=30)
            if proc.returncode == 0:
                return tuple(keep)
            bad = set(re.findall(r"Bad configuration option: (\S+)", proc.stderr))
            still = [o for o in keep if o.split()[0] not in bad]
            if still == keep:
                tail = proc.stderr.strip().splitlines()
                raise FleetctlError(f"sshd rejects the sandbox config: {tail[-1] if tail else proc.returncode}",
                                    hint=f"see {scratch}", reference="sandbox-failed")
            keep = still
        return tuple(keep)
    finally:
        scratch.unlink(missing_ok=True)


def free_port(taken: set[int]) -> int:
    """A loopback port nobody listens on right now (sshd binds it moments later; races are retried)."""
    for _ in range(1000):
        port = random.randint(*PORT_RANGE)
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise FleetctlError("no free loopback port found for the sandbox sshd", reference="sandbox-failed")


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def listener_pid(spec_config: Path, pid_file: Path) -> int | None:
    """The pid of the running sshd listener for this config, confirmed via its command line."""
    pid = read_pid(pid_file)
    if pid and procs.alive(pid) and f"-f {spec_config}" in procs.cmdline(pid):
        return pid
    return None


def banner_ok(port: int, timeout: float = 5.0) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


class PortBusy(Exception):
    pass


def _log_tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return ""
    return " | ".join(lines[-n:])


PRIVSEP_DIR = Path("/run/sshd")


def ensure_privsep_dir() -> None:
    """sshd run as root wants its privilege separation dir (Debian's package creates it at boot)."""
    if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


def start(sshd: str, spec: SshdSpec, env: dict[str, str], timeout: float = START_TIMEOUT) -> int:
    """Start the sshd for `spec` (config already written) and wait until it listens; return its pid.

    Raises PortBusy if the port is taken, FleetctlError on any other failure.
    """
    ensure_privsep_dir()
    spec.pid_file.unlink(missing_ok=True)
    with open(spec.log, "ab") as log:
        proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(spec.config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, env=env,
        )
    procs.track(proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = _log_tail(spec.log)
            if "Address already in use" in tail or "Cannot bind any address" in tail:
                raise PortBusy(tail)
            raise FleetctlError(f"{spec.name}: sshd exited with {proc.returncode}: {tail}",
                                hint=f"see {spec.log}", reference="sandbox-failed")
        if read_pid(spec.pid_file) == proc.pid:
            if banner_ok(spec.port):
                return proc.pid
        time.sleep(0.01)
    try:
        os.kill(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()
    raise FleetctlError(f"{spec.name}: sshd did not listen on port {spec.port} within {timeout:.0f}s",
                        hint=f"see {spec.log}", reference="sandbox-failed")
