"""A real Docker engine for the container tests: `dockerd` (Debian's docker.io) started by the test on
a socket, data root and containerd namespace of its own, with no network setup of its own
(--bridge=none --iptables=false: containers use the host's network, loopback only). Stopped by its
pid in the fixture's finalizer, after every container it ran is removed.

No registry is reachable here, so images are made locally: `docker import` of a root filesystem the
test builds (tests/test_containers.py): a few dirs, an SGLang release tree in the lmsysorg/sglang
image layout (/sgl-workspace/sglang/python, a git checkout installed editable), and the machine's own
/usr bind-mounted read-only at run time for the python (a registry image brings its own).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from waiting import until

STOP_TIMEOUT = 30.0


@dataclass
class Dockerd:
    root: Path
    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def sock(self) -> Path:
        return self.root / "docker.sock"

    @property
    def cli(self) -> list[str]:
        """The client as the inventory's `container.command` names it."""
        return [client_binary() or "docker", "-H", f"unix://{self.sock}"]

    def run(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*self.cli, *args], capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
        return p


def client_binary() -> str | None:
    return shutil.which("docker")


def why_not() -> str | None:
    """Why no engine can be started here (None: it can be tried)."""
    if os.getuid() != 0:
        return "dockerd needs root"
    if not shutil.which("dockerd") or not client_binary():
        return "no dockerd/docker here (Debian's docker.io package; scripts/setup.sh installs it)"
    return None


def _accepts(sock: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(str(sock))
        s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
        return s.recv(64).startswith(b"HTTP/1.")
    except OSError:
        return False
    finally:
        s.close()


def start(root: Path) -> Dockerd:
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / "dockerd.log", "wb")
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "-H", f"unix://{root / 'docker.sock'}", "--pidfile", str(root / "dockerd.pid"),
         "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-forward=false", "--ip-masq=false",
         "--containerd-namespace", f"fleetctl-test-{os.getpid()}",
         "--containerd-plugins-namespace", f"fleetctl-test-{os.getpid()}-plugins"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    d = Dockerd(root, proc)
    try:  # (the event: the engine answers its API, or it exited)
        until(lambda: proc.poll() is not None or _accepts(d.sock), "dockerd to answer on its socket")
    except AssertionError:
        pass  # reported below, with dockerd's own words
    if proc.poll() is not None or not _accepts(d.sock):
        stop(d)
        tail = (root / "dockerd.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"dockerd did not start: {' | '.join(tail)}")
    return d


def stop(d: Dockerd) -> None:
    """Remove every container of this engine, then end dockerd (by its pid) and wait for it."""
    if _accepts(d.sock):
        ids = d.run("ps", "-aq", check=False).stdout.split()
        if ids:
            d.run("rm", "-f", *ids, check=False)
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
    for m in reversed(mounts_under(d.root)):  # what it left mounted (its network namespace file)
        subprocess.run(["umount", m], capture_output=True)


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, in mount order (from /proc/self/mountinfo)."""
    out = []
    prefix = str(root).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(prefix):
                out.append(point)
    return out


def make_tar(rootfs: Path) -> Path:
    tar = rootfs.with_suffix(".tar")
    with tarfile.open(tar, "w") as tf:
        for p in sorted(rootfs.iterdir()):
            tf.add(p, arcname=p.name)
    return tar


def import_rootfs(d: Dockerd | Podman, rootfs: Path, tag: str) -> None:
    """`docker import` (or podman's) the directory `rootfs` as image `tag`."""
    tar = make_tar(rootfs)
    d.run("import", str(tar), tag)
    tar.unlink()


@dataclass
class Podman:
    """podman with storage of its own under `root` (no daemon): the same `cli`/`run` as Dockerd.
    This machine's hard limits are below podman's default rlimits for a container (nofile, nproc:
    runc's setrlimit then fails), so containers get `RUN_ARGS`."""

    root: Path
    # podman refuses a runroot over 50 characters, which a pytest temp dir under an xdist worker's
    # (/tmp/pytest-of-root/pytest-11/popen-gw0/podman0/run) can pass: it gets a short dir of its own
    run_root: Path
    RUN_ARGS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096", "--init-path", "/usr/bin/docker-init")

    @classmethod
    def under(cls, root: Path) -> Podman:
        """Storage under `root`; the runroot in a new short dir under /tmp (podman_stop removes it)."""
        return cls(root, Path(tempfile.mkdtemp(prefix="fl-pm-", dir="/tmp")))

    @property
    def cli(self) -> list[str]:
        return [shutil.which("podman") or "podman", "--root", str(self.root / "storage"), "--runroot",
                str(self.run_root), "--tmpdir", str(self.root / "tmp"), "--cgroup-manager", "cgroupfs",
                "--events-backend", "file"]

    def run(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*self.cli, *args], capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
        return p


def podman_why_not() -> str | None:
    if os.getuid() != 0:
        return "rootful podman needs root"
    if not shutil.which("podman") or not os.access("/usr/bin/docker-init", os.X_OK):
        return "no podman (Debian's podman package) or no /usr/bin/docker-init (docker.io's tini) here"
    return None


def podman_stop(p: Podman) -> None:
    """Remove every container and image of this storage, then unmount what it left mounted."""
    ids = p.run("ps", "-aq", check=False).stdout.split()
    if ids:
        p.run("rm", "-f", "-t", "0", *ids, check=False)
    p.run("rmi", "-a", "-f", check=False)
    for m in reversed(mounts_under(p.root) + mounts_under(p.run_root)):
        subprocess.run(["umount", m], capture_output=True)
    shutil.rmtree(p.run_root, ignore_errors=True)
