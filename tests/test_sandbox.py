"""The sandbox fleet: real sshd hosts on 127.0.0.1, driven through the CLI, the API and system ssh."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from waiting import until

from fleetctl.config.inventory import load_inventory
from fleetctl.engines import wheels
from fleetctl.errors import InputError
from fleetctl.sandbox import lifecycle, nvidia_smi, procs
from fleetctl.sandbox.lifecycle import Sandbox

CAPTURES = Path(lifecycle.__file__).parent / "captures" / "h200-1gpu"
pytestmark = pytest.mark.fleet
needs_sshd = pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(),
                                reason="/usr/sbin/sshd is missing: sandbox tests need the OpenSSH server")

QUERY_GPU = "index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu,power.draw," \
            "driver_version,pci.bus_id"
QUERY_APPS = "pid,process_name,used_gpu_memory,gpu_uuid"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def gone(pid: int) -> bool:
    """No such process, or only a zombie left for its parent to reap."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return raw[raw.rfind(b")") + 2:].split()[0] in (b"Z", b"X")


def ssh(sb: Sandbox, host: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", str(sb.ssh_config_path), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                           host, command], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def smi(sb: Sandbox, host: str, args: str = "") -> subprocess.CompletedProcess[str]:
    """The host's nvidia-smi found on the PATH the inventory gives the host."""
    h = sb.host(host)
    return ssh(sb, host, f"PATH={h.path_env()} nvidia-smi {args}")


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()


@pytest.fixture
def cli_dir(tmp_path: Path) -> Iterator[Path]:
    """A dir for a CLI-made sandbox; whatever the test did, it is taken down afterwards."""
    d = tmp_path / "sb"
    yield d
    lifecycle.down(d, missing_ok=True)


# ---- the CLI ---------------------------------------------------------------------------------

@needs_sshd
def test_cli_up_status_down(cli_dir: Path) -> None:
    d = cli_dir
    r = cli("sandbox", "up", "--hosts", "2", "--dir", str(d), "--versions", "0.5.9", "--gpus", "1",
            "--busy-gpus", "h02")
    assert r.returncode == 0, r.stderr
    assert "inventory.yaml" in r.stdout and "stand-in" in r.stdout
    for f in ("inventory.yaml", "inventory-jump.yaml", "ssh_config", "known_hosts", "client_key", "README.txt"):
        assert (d / f).is_file(), f

    st = cli("sandbox", "status", "--dir", str(d), "--json")
    assert st.returncode == 0, st.stderr
    hosts = json.loads(st.stdout)["hosts"]
    assert [h["name"] for h in hosts] == ["h01", "h02", "jump"]
    assert all(h["alive"] and h["listening"] for h in hosts)
    assert [h["gpu_state"] for h in hosts] == ["idle", "busy", None]
    pids = [h["pid"] for h in hosts]
    assert len(set(pids)) == 3 and all(not gone(p) for p in pids)
    table = cli("sandbox", "status", "--dir", str(d))
    assert table.returncode == 0 and "3/3 sshd running" in table.stdout

    again = cli("sandbox", "up", "--hosts", "2", "--dir", str(d))
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "running" in again.stderr
    assert "sandbox down --dir" in again.stderr and again.stderr.startswith("error: ")
    assert all(not gone(p) for p in pids), "a refused up must leave the running sandbox alone"

    down = cli("sandbox", "down", "--dir", str(d))
    assert down.returncode == 0, down.stderr
    assert "stopped 3 process(es)" in down.stdout
    assert all(gone(p) for p in pids)
    st = json.loads(cli("sandbox", "status", "--dir", str(d), "--json").stdout)["hosts"]
    assert not any(h["alive"] for h in st)

    idem = cli("sandbox", "down", "--dir", str(d))
    assert idem.returncode == 0 and "nothing was running" in idem.stdout

    # a stopped sandbox can be rebuilt in place
    re_up = cli("sandbox", "up", "--hosts", "1", "--dir", str(d), "--versions", "0.5.9", "--json")
    assert re_up.returncode == 0, re_up.stderr
    doc = json.loads(re_up.stdout)
    assert [h["name"] for h in doc["hosts"]] == ["h01", "jump"]
    assert not (d / "hosts" / "h02").exists()
    purge = cli("sandbox", "down", "--dir", str(d), "--purge")
    assert purge.returncode == 0 and not d.exists()
    assert all(gone(h["pid"]) for h in doc["hosts"])


@pytest.mark.parametrize("args, needle", [
    (["--hosts", "0"], "--hosts 0"),
    (["--hosts", "many"], "--hosts"),
    (["--gpus", "-1"], "--gpus"),
    (["--busy-gpus", "h09"], "no host h09"),
    (["--versions", "0.5.9,latest"], "'latest' is not an SGLang version"),
    (["--versions", ","], "names no version"),
])
@needs_sshd
def test_cli_bad_args_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    d = tmp_path / "sb"
    r = cli("sandbox", "up", "--dir", str(d), *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert not (d / "sandbox.json").exists()


@needs_sshd
def test_cli_refuses_foreign_dirs(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    r = cli("sandbox", "up", "--dir", str(tmp_path))
    assert r.returncode == 2 and "not empty and not a sandbox" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # untouched, no lock file left
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    spaced = tmp_path / "a dir"
    r = cli("sandbox", "up", "--dir", str(spaced))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    for cmd in ("status", "down"):
        r = cli("sandbox", cmd, "--dir", str(tmp_path / "nothing-here"))
        assert r.returncode == 2 and "no sandbox" in r.stderr, r.stderr


def test_api_up_twice_refuses(sandbox: Sandbox) -> None:
    pids = [h.pid for h in sandbox.all_hosts()]
    with pytest.raises(InputError, match="running"):
        lifecycle.up(sandbox.dir, hosts=1)
    assert [h.pid for h in sandbox.all_hosts()] == pids


# ---- the hosts, over real ssh ----------------------------------------------------------------

def test_status_all_alive(sandbox: Sandbox) -> None:
    rows = lifecycle.status(sandbox.dir)
    assert [r.name for r in rows] == ["h01", "h02", "h03", "jump"]
    assert [r.version for r in rows] == ["0.5.9", "0.5.14", "0.5.9", None]
    assert all(r.alive and r.listening and r.pid for r in rows)
    assert len({r.port for r in rows}) == 4


def test_ssh_direct_and_through_the_jump_host(sandbox: Sandbox) -> None:
    jump_log = sandbox.jump.log
    before = jump_log.read_text().count("Accepted publickey")
    for name in sandbox.hosts:
        r = ssh(sandbox, name, "echo $FLEETCTL_SANDBOX_HOST; id -un")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [name, "root" if os.getuid() == 0 else r.stdout.split()[1]]
        r = ssh(sandbox, f"{name}-via-jump", "echo $FLEETCTL_SANDBOX_HOST")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == name
    # each -via-jump connection authenticated at the jump host first (ProxyJump, for real)
    until(lambda: jump_log.read_text().count("Accepted publickey") >= before + len(sandbox.hosts),
          "the jump host's log of each authentication")


def test_unknown_keys_are_refused(sandbox: Sandbox, tmp_path: Path) -> None:
    h = sandbox.hosts["h01"]
    other = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    r = subprocess.run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                        "-i", str(other), "-p", str(h.port), "-o", "StrictHostKeyChecking=yes",
                        "-o", f"UserKnownHostsFile={sandbox.known_hosts_path}", "root@127.0.0.1", "true"],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 255 and "Permission denied" in r.stderr


def test_python_wrapper_finds_the_hosts_own_sglang(sandbox: Sandbox) -> None:
    code = ("import importlib.util as u, importlib.metadata as m, sys; s = u.find_spec('sglang'); "
            "print(s.origin); print(m.version('sglang')); print(m.version('torch')); print(sys.executable); "
            "print(u.find_spec('yaml') is None, u.find_spec('fleetctl.sandbox.simulator') is not None)")
    for name, h in sandbox.hosts.items():
        r = ssh(sandbox, name, f"{h.python} -c \"{code}\"")
        assert r.returncode == 0, r.stderr
        origin, version, torch, exe, no_controller_packages, simulator = r.stdout.split()
        assert origin == str(h.sglang_dir / "__init__.py")
        assert version == h.version
        tree = wheels.extracted(h.version or "")
        assert torch == lifecycle.torch_pin(tree, version) == h.torch_version
        # the host dir is a bare venv of the controller's base interpreter (not the controller's venv
        # and its installs); bin/python is that interpreter itself, no wrapper script
        assert exe == str(h.python) and os.path.realpath(exe) == sandbox.host_python
        assert h.python.is_symlink() and (h.host_dir / "pyvenv.cfg").is_file()
        assert no_controller_packages == "True" and simulator == "True"
        assert (h.sglang_dir / "srt/speculative/eagle_worker_v2.py").is_file()
        assert (h.sglang_dir / "srt/speculative/eagle_worker.py").is_file() == (version == "0.5.9")
    assert sandbox.hosts["h01"].torch_version == "2.9.1"
    assert sandbox.hosts["h02"].torch_version == "2.11.0"
    r = ssh(sandbox, "h01", f"{sandbox.hosts['h01'].python} -c 'import torch'")
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr  # a stand-in: metadata only


def test_inventories_load(sandbox: Sandbox) -> None:
    inv = load_inventory(sandbox.inventory_path)
    assert [h.name for h in inv.hosts] == ["h01", "h02", "h03"]
    for h in inv.hosts:
        sh = sandbox.hosts[h.name]
        assert (h.address, h.port, h.user) == ("127.0.0.1", sh.port, "root" if os.getuid() == 0 else h.user)
        assert h.python == str(sh.python) and h.state_dir == str(sh.state_dir)
        assert h.identity_file == str(sandbox.client_key) and h.known_hosts == str(sandbox.known_hosts_path)
        assert h.gpus == (0, 1)
        assert h.env["PATH"].startswith(f"{sh.bin_dir}:")
        assert h.groups == ("sandbox", "v" + (sh.version or "").replace(".", "_"))
        assert h.launch_command == "{python} -m fleetctl.sandbox.simulator"
    assert [h.name for h in inv.select("v0_5_9")] == ["h01", "h03"]
    via = load_inventory(sandbox.jump_inventory_path)
    assert [h.name for h in via.hosts] == ["h01-via-jump", "h02-via-jump", "h03-via-jump"]
    assert all(h.from_ssh_config and h.port is None for h in via.hosts)
    known = sandbox.known_hosts_path.read_text().splitlines()
    assert sorted(ln.split()[0] for ln in known) == sorted(f"[127.0.0.1]:{h.port}" for h in sandbox.all_hosts())


def test_copies_are_real_and_independent(sandbox: Sandbox) -> None:
    h01, h03 = sandbox.hosts["h01"], sandbox.hosts["h03"]  # both 0.5.9
    cache = wheels.extracted("0.5.9")
    seen: dict[int, Path] = {}
    count = 0
    for h in (h01, h03):
        for p in h.site_packages.rglob("*"):
            st = p.lstat()
            assert not p.is_symlink(), p
            if p.is_file():
                assert st.st_nlink == 1, p
                assert st.st_ino not in seen, (p, seen.get(st.st_ino))
                seen[st.st_ino] = p
                count += 1
    cached = sum(1 for p in (cache / "sglang").rglob("*") if p.is_file())
    assert count >= 2 * cached
    rel = "srt/speculative/eagle_worker.py"
    a, b, c = h01.sglang_dir / rel, h03.sglang_dir / rel, cache / "sglang" / rel
    assert a.read_bytes() == b.read_bytes() == c.read_bytes()
    assert len({a.stat().st_ino, b.stat().st_ino, c.stat().st_ino}) == 3
    assert os.access(a, os.W_OK)
    dist = h01.site_packages / "sglang-0.5.9.dist-info" / "METADATA"
    assert dist.read_bytes() == (cache / "sglang-0.5.9.dist-info" / "METADATA").read_bytes()


# ---- the stand-in nvidia-smi -----------------------------------------------------------------

def test_nvidia_smi_replays_the_captures(fresh_sandbox: Callable[..., Sandbox]) -> None:
    sb = fresh_sandbox(hosts=1, versions=("0.5.9",), gpus=1, busy_gpus=("h01",))
    busy = {"": "nvidia-smi-busy.txt", "-L": "nvidia-smi-L.txt",
            f"--query-gpu={QUERY_GPU} --format=csv": "query-gpu-busy.csv",
            f"--query-compute-apps={QUERY_APPS} --format=csv": "query-apps-busy.csv"}
    idle = {"": "nvidia-smi.txt", "-L": "nvidia-smi-L.txt", "-q": "nvidia-smi-q.txt",
            f"--query-gpu={QUERY_GPU} --format=csv": "query-gpu.csv",
            f"--query-compute-apps={QUERY_APPS} --format=csv": "query-apps-idle.csv"}
    for args, name in busy.items():  # busy from `up --busy-gpus`
        r = smi(sb, "h01", args)
        assert (r.returncode, r.stdout) == (0, capture(name)), args
    q = smi(sb, "h01", "-q").stdout
    assert re.search(r"\n {8}Process ID +: 423\n", q) and re.search(r"\n {8}Used +: 21711 MiB\n", q)
    sb.set_gpu_state("h01", "idle")
    for args, name in idle.items():
        r = smi(sb, "h01", args)
        assert (r.returncode, r.stdout) == (0, capture(name)), args
    sb.set_gpu_state("h01", "busy")
    assert smi(sb, "h01").stdout == capture("nvidia-smi-busy.txt")


def test_nvidia_smi_serves_each_gpu(sandbox: Sandbox) -> None:
    rows = smi(sandbox, "h02", f"--query-gpu={QUERY_GPU} --format=csv,noheader").stdout.splitlines()
    cap = capture("query-gpu.csv").splitlines()[1]
    assert rows[0] == cap and len(rows) == 2
    assert rows[1].split(", ")[0] == "1" and rows[1].split(", ")[1] != cap.split(", ")[1]
    assert smi(sandbox, "h02", "-L").stdout.splitlines()[0] == capture("nvidia-smi-L.txt").strip()
    table = smi(sandbox, "h02").stdout.splitlines()
    one = capture("nvidia-smi.txt").splitlines()
    assert table[:12] == one[:12] and table[12].startswith("|   1  NVIDIA H200")
    units = smi(sandbox, "h02", "--query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits")
    assert units.stdout == "0, 0, 0\n1, 0, 0\n"
    try:
        lifecycle.set_gpu_state(sandbox.dir, "h02", "busy")
        apps = smi(sandbox, "h02", f"--query-compute-apps={QUERY_APPS} --format=csv,noheader").stdout.splitlines()
        assert [a.split(", ")[0] for a in apps] == ["423", "424"]
        assert smi(sandbox, "h01", "--query-compute-apps=pid --format=csv,noheader").stdout == ""
    finally:
        sandbox.set_gpu_state("h02", "idle")


def test_nvidia_smi_refuses_unknown_args(sandbox: Sandbox) -> None:
    for args in ("--bogus", "-L -q", "--query-gpu=index", "--query-gpu=nope --format=csv", "--format=csv"):
        r = smi(sandbox, "h01", args)
        assert r.returncode == 2, args
        assert "nvidia-smi -h" in r.stdout or "not a valid" in r.stdout or "Missing --format" in r.stdout, args
    r = smi(sandbox, "h01", "-i 7 -L")
    assert r.returncode == 6 and "No devices were found" in r.stdout


def test_nvidia_smi_render_unit() -> None:
    env = {"FLEETCTL_SANDBOX_GPUS": "3", "FLEETCTL_SANDBOX_HOST_DIR": "/nonexistent"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        text, code = nvidia_smi.render(["--query-gpu=gpu_bus_id,index", "--format=csv,noheader", "-i", "2"])
        assert (text, code) == ("00000000:00:08.0, 2\n", 0)
        text, code = nvidia_smi.render(["-q"])
        assert code == 0 and text.count("\nGPU 0000") == 3 and "Attached GPUs                                          : 3" in text
        assert nvidia_smi.render(["--help"])[1] == 0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_nvidia_smi_query_starts_light(tmp_path: Path) -> None:
    """The stand-in runs once per query, as the host's wrapper runs it (-I -S, imported from its own
    dir): a GPU query imports no module beyond os and sys's own (the real tool answers in ~25 ms;
    with dataclasses, pathlib and re it took ~70 ms of CPU), and the forms that need `re` still work."""
    (tmp_path / "gpu-state").write_text("busy\n")
    probe = ("import sys; sys.path.insert(0, sys.argv.pop(1)); before = set(sys.modules); import nvidia_smi; "
             "nvidia_smi.main(); print(sorted(set(sys.modules) - before))")
    env = {"FLEETCTL_SANDBOX_HOST_DIR": str(tmp_path), "FLEETCTL_SANDBOX_GPUS": "2", "PATH": os.environ["PATH"]}
    for args, heavy_ok in ((["--query-gpu=index,uuid", "--format=csv"], False),
                           (["--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"], False),
                           (["-q"], True)):
        r = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(Path(nvidia_smi.__file__).parent), *args],
                           capture_output=True, text=True, env=env, timeout=60, check=True)
        *out, loaded = r.stdout.splitlines()
        assert out and "GPU-" in "\n".join(out), r.stdout
        new = set(ast.literal_eval(loaded))
        assert "nvidia_smi" in new
        heavy = new & {"re", "dataclasses", "pathlib", "inspect", "enum"}
        assert bool(heavy) == heavy_ok, (args, sorted(new))
    # the host's wrapper runs exactly that launcher
    assert "import nvidia_smi" in lifecycle.NVIDIA_SMI_LAUNCHER and " -I -S -c " in lifecycle.NVIDIA_SMI_WRAPPER


# ---- breaking hosts, and taking everything down ----------------------------------------------

def test_stop_and_start_a_host(fresh_sandbox: Callable[..., Sandbox]) -> None:
    sb = fresh_sandbox(hosts=2)
    h01 = sb.hosts["h01"]
    port, old = h01.port, h01.pid
    session = subprocess.Popen(sb.ssh_argv("h01", "sleep 300"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(procs.cmdline(p) == "sleep 300" for p in procs.descendants([old or 0])))
        kids = {p for p in procs.descendants([old or 0]) if not gone(p)}
        stopped = sb.stop_host("h01")
        assert {s.pid for s in stopped} >= {old, *kids}
        assert gone(old or 0) and all(gone(k) for k in kids)
        assert ssh(sb, "h01", "true").returncode == 255
        assert ssh(sb, "h02", "true").returncode == 0  # the others are untouched
        assert [s.alive for s in lifecycle.status(sb.dir)] == [False, True, True]
        new = sb.start_host("h01")
        assert new != old and h01.port == port and h01.pid == new
        assert ssh(sb, "h01", "true").returncode == 0
        assert ssh(sb, "h01-via-jump", "true").returncode == 0
    finally:
        session.kill()
        session.wait()


def test_down_stops_sessions_and_servers_only_its_own(fresh_sandbox: Callable[..., Sandbox],
                                                      tmp_path: Path) -> None:
    sb = fresh_sandbox(hosts=2, versions=("0.5.9",))
    h01, h02 = sb.hosts["h01"], sb.hosts["h02"]
    listeners = [h.pid or 0 for h in sb.all_hosts()]
    session = subprocess.Popen(sb.ssh_argv("h01", "sleep 300"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # a "server" launched detached through ssh (its own session; outlives the ssh command), recorded
    # like fleetctl's launch records it: state/servers/<instance>/current.json
    rec_dir = h02.state_dir / "servers" / "sim"
    launch = (f"mkdir -p {rec_dir}; cd {rec_dir}; "
              f"setsid nohup {h02.python} -c 'import time; time.sleep(300)' >/dev/null 2>&1 </dev/null & "
              f"echo $! > {rec_dir}/pid.txt")
    assert ssh(sb, "h02", launch).returncode == 0
    server = int((rec_dir / "pid.txt").read_text())
    (rec_dir / "current.json").write_text(json.dumps({"pid": server, "pgid": server}))
    # a process that is NOT the sandbox's, whose pid lands in a state dir: down must leave it alone
    bystander = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, env={"PATH": os.environ["PATH"]})
    (h01.state_dir / "servers").mkdir(parents=True, exist_ok=True)
    (h01.state_dir / "servers" / "stray.pid").write_text(f"{bystander.pid}\n")
    try:
        _wait_for(lambda: any(procs.cmdline(p) == "sleep 300" for p in procs.descendants([listeners[0]])))
        session_procs = procs.descendants([listeners[0]])
        assert not gone(server)
        running = {p for p in [*listeners, *session_procs, server] if not gone(p)}
        report = lifecycle.down(sb.dir)
        stopped = {s.pid for s in report.stopped}
        assert running <= stopped
        assert bystander.pid not in stopped and bystander.poll() is None
        assert all(gone(p) for p in [*listeners, *session_procs, server])
        assert not report.survivors
        assert lifecycle.down(sb.dir).stopped == []  # idempotent
    finally:
        bystander.kill()
        bystander.wait()
        session.kill()
        session.wait()


def _wait_for(cond: Callable[[], bool]) -> None:
    until(cond, "a process in the session")


@pytest.mark.usefixtures("ledger_dir")
def test_linked_trees_keep_hosts_independent(fresh_sandbox, capsys) -> None:
    """link_trees (the bench's 1,000-host sandboxes): hosts share the files' inodes with one copy per
    release, and a deploy (renames) on one host leaves the others and that copy pristine."""
    from tests.jsoncli import ok

    sb = fresh_sandbox(hosts=2, versions=("0.5.14",), gpus=1, bare_shell=True, link_trees=True)
    rel = "srt/speculative/eagle_worker_v2.py"
    h1, h2 = sb.hosts["h01"], sb.hosts["h02"]
    shared = sb.dir / lifecycle.SHARED_TREES / "0.5.14" / "sglang" / rel
    assert (h1.sglang_dir / rel).stat().st_ino == (h2.sglang_dir / rel).stat().st_ino == shared.stat().st_ino
    pristine = shared.read_bytes()
    playbook = Path(__file__).resolve().parent.parent / "playbooks" / "dynamic-spec-disable"
    ok(capsys, "deploy", playbook, "-i", sb.inventory_path, "--limit", "h01")
    assert (h1.sglang_dir / rel).read_bytes() != pristine
    assert (h2.sglang_dir / rel).read_bytes() == pristine == shared.read_bytes()
    ok(capsys, "rollback", "-i", sb.inventory_path, "--limit", "h01")
    assert (h1.sglang_dir / rel).read_bytes() == pristine == shared.read_bytes()
