"""SGLang inside a container, against a real Docker engine (tests/dockerd.py) on a sandbox host.

The sandbox host is a real sshd on 127.0.0.1; its SGLang lives in a container on that host, in the
lmsysorg/sglang image layout (/sgl-workspace/sglang/python: a git checkout, installed editable).
fleetctl reaches it as an operator would: SSH to the host, then `docker exec -i NAME` into the
container. Everything the tests start (dockerd, containers, the sandbox's sshd) is stopped in
finalizers by pid / container id. Skipped where no dockerd can run (tests/dockerd.py why_not).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from machine import NON_ROOT_PREFIX
from waiting import until

from tests import dockerd
from tests.jsoncli import cli, ok
from tests.test_become import LOGIN, accounts, sudoers  # noqa: F401  (accounts: the become tests' fixture)

pytestmark = [pytest.mark.usefixtures("ledger_dir"), pytest.mark.fleet]

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks" / "dynamic-spec-disable"
VERSION = "0.5.9"
SYSTEM_PYTHON = "/usr/bin/python3"  # the container's python: the machine's /usr, bind-mounted read-only
IMAGE = "fleetctl-test/sglang:0.5.9"
WORKSPACE = "/sgl-workspace/sglang"
PKG = f"{WORKSPACE}/python/sglang"
VENV = "/opt/venv"  # the image's python environment (its site-packages holds the editable install)
STATE = "/var/lib/fleetctl"  # the state volume's mount point in the container
TARGET = "srt/speculative/eagle_worker.py"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dockerd.Dockerd]:
    why = dockerd.why_not()
    if why:
        pytest.skip(why)
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    try:
        d = dockerd.start(Path(str(tmp_path_factory.mktemp("dockerd"))))
    except RuntimeError as e:  # (a machine whose kernel or cgroups no engine runs on)
        pytest.skip(str(e))
    try:
        yield d
    finally:
        dockerd.stop(d)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory, engine: dockerd.Dockerd) -> Iterator[Any]:
    from fleetctl.sandbox import lifecycle

    d = Path(str(tmp_path_factory.mktemp("ctr-sb"))) / "sb"
    try:
        yield lifecycle.up(d, hosts=1, versions=[VERSION], gpus=1, bare_shell=True, host_python=SYSTEM_PYTHON)
    finally:
        report = lifecycle.down(d, missing_ok=True)
        assert not report.survivors, report.survivors


def _pyver() -> str:
    return subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def image(engine: dockerd.Dockerd, rootfs: Path) -> str:
    engine.run("import", str(rootfs), IMAGE)
    return IMAGE


@pytest.fixture(scope="module")
def rootfs(sandbox: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's root filesystem (a tar): the sandbox host's SGLang release tree in the lmsysorg/sglang layout."""
    h = sandbox.hosts["h01"]
    root = Path(str(tmp_path_factory.mktemp("rootfs"))) / "rootfs"
    for d in ("etc", "tmp", "proc", "sys", "dev", "root", "run", "var/lib"):
        (root / d).mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    (root / "sbin").mkdir()  # (a dir of its own: docker mounts its init there)
    for link in ("bin", "lib", "lib64"):
        (root / link).symlink_to(f"usr/{link}")
    for f in ("passwd", "group"):
        shutil.copy(f"/etc/{f}", root / "etc" / f)
    ws = root / WORKSPACE.lstrip("/")
    shutil.copytree(h.sglang_dir, ws / "python" / "sglang")
    (ws / "python" / "pyproject.toml").write_text(
        f'[project]\nname = "sglang"\nversion = "{VERSION}"\ndependencies = [\n  "torch=={h.torch_version}",\n]\n')
    git = ["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", f"sglang {VERSION}"], check=True)
    venv = root / VENV.lstrip("/")
    pyver = _pyver()
    sp = venv / "lib" / f"python{pyver}" / "site-packages"
    sp.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(SYSTEM_PYTHON)
    (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {pyver}\n")
    # what `pip install -e python` leaves: a .pth naming the checkout's python dir, an editable dist-info
    (sp / f"__editable__.sglang-{VERSION}.pth").write_text(f"{WORKSPACE}/python\n")
    info = sp / f"sglang-{VERSION}.dist-info"
    shutil.copytree(next(h.site_packages.glob("sglang-*.dist-info")), info)
    (info / "direct_url.json").write_text(json.dumps({"url": f"file://{WORKSPACE}/python",
                                                      "dir_info": {"editable": True}}))
    torch = next(h.site_packages.glob("torch-*.dist-info"))  # (the sandbox's metadata-only stand-in)
    shutil.copytree(torch, sp / torch.name)
    # the sandbox's server simulator (fleetctl's host-side package), mounted read-only at run time
    (sp / "fleetctl_hostlib.pth").write_text("/opt/fleetctl-hostlib\n")
    tar = dockerd.make_tar(root)
    shutil.rmtree(root)
    return tar


class Box:
    """One container of the image, made by the test and removed in its finalizer."""

    def __init__(self, engine: dockerd.Dockerd | dockerd.Podman, sandbox: Any, name: str, state: Path | None,
                 read_only: bool = False, image: str = IMAGE) -> None:
        self.image = image
        self.engine, self.sandbox, self.name, self.state, self.read_only = engine, sandbox, name, state, read_only
        self.id = ""

    def run(self, *command: str) -> str:
        args = ["run", "-d", "--init", "--name", self.name, "--network", "host",
                "-v", "/usr:/usr:ro", "-v", f"{REPO}:/opt/fleetctl-hostlib:ro",
                # the sandbox host's nvidia-smi stand-in (it replays captures from the host's dir, with
                # the controller's python and fleetctl's script)
                "-v", f"{self.sandbox.dir}:{self.sandbox.dir}:ro", "-v", f"{REPO}:{REPO}:ro"]
        py_prefix = Path(os.path.realpath(self.sandbox.controller_python)).parent.parent
        if not str(py_prefix).startswith("/usr"):
            args += ["-v", f"{py_prefix}:{py_prefix}:ro"]
        if self.state is not None:
            self.state.mkdir(exist_ok=True)
            args += ["-v", f"{self.state}:{STATE}"]
        if self.read_only:
            args.append("--read-only")
        args += getattr(self.engine, "RUN_ARGS", ())
        self.id = self.engine.run(*args, self.image, *(command or ("sleep", "infinity"))).stdout.strip()
        return self.id

    def wait_log(self, line: str, count: int) -> None:
        """Until the container's output (its main process's) holds `line` `count` times."""

        def seen() -> bool:
            got = self.engine.run("logs", self.name, check=False)
            return (got.stdout + got.stderr).count(line) >= count

        until(seen, f"{line!r} x{count} in {self.name}'s output", every=0.1)

    def exec(self, *argv: str) -> str:
        return self.engine.run("exec", "-i", self.name, *argv).stdout

    def sha(self, rel: str) -> str:
        return self.exec("sha256sum", f"{PKG}/{rel}").split()[0]

    def remove(self) -> None:
        if self.id:
            self.engine.run("rm", "-f", self.id, check=False)


@pytest.fixture
def boxes(engine: dockerd.Dockerd, sandbox: Any, image: str) -> Iterator[list[Box]]:
    made: list[Box] = []
    try:
        yield made
    finally:
        for b in made:
            b.remove()


def inventory(tmp_path: Path, sandbox: Any, engine: dockerd.Dockerd | dockerd.Podman, name: str, *,
              state_dir: str = STATE, runtime: str = "docker", **container: Any) -> Path:
    doc = yaml.safe_load(sandbox.inventory_path.read_text())
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(sandbox.dir / doc["defaults"][k])
    doc["ssh_config"] = str(sandbox.dir / doc["ssh_config"])
    h = doc["hosts"]["h01"]
    h["python"] = f"{VENV}/bin/python"
    h["state_dir"] = state_dir
    h["container"] = {"runtime": runtime, "name": name, "command": engine.cli, **container}
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def test_the_loop_through_a_docker_container(engine: dockerd.Dockerd, sandbox: Any, boxes: list[Box],
                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """facts say container and image; deploy writes into the container's files (not the host's);
    launch and verify-logs run there; rollback restores the image's bytes."""
    box = Box(engine, sandbox, "fleetctl-test-c1", tmp_path / "state")
    boxes.append(box)
    cid = box.run()
    inv = inventory(tmp_path, sandbox, engine, box.name)
    host_tree = sandbox.hosts["h01"].sglang_dir
    host_before = hashlib.sha256((host_tree / TARGET).read_bytes()).hexdigest()
    pristine = box.sha(TARGET)

    facts = ok(capsys, "facts", "-i", inv)["hosts"][0]["facts"]
    assert facts["sglang"]["dir"] == PKG and facts["sglang"]["version"] == VERSION, facts["sglang"]
    assert facts["sglang"]["install"] in ("editable", "git checkout"), facts["sglang"]
    c = facts["container"]
    assert (c["runtime"], c["name"], c["id"], c["image"], c["running"], c["read_only"]) == (
        "docker", box.name, cid, IMAGE, True, False), c
    assert any(m["destination"] == STATE for m in c["mounts"]), c

    doc = ok(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert doc["hosts"][0]["status"] == "changed", doc["hosts"][0]
    assert box.sha(TARGET) != pristine  # the container's file is patched ...
    assert hashlib.sha256((host_tree / TARGET).read_bytes()).hexdigest() == host_before  # ... the host's is not
    assert list((tmp_path / "state").glob("deploys/*/manifest.json"))  # records on the volume
    again = ok(capsys, "deploy", PLAYBOOK, "-i", inv)["hosts"][0]
    # the no-op is re-checked by the seal's one command, run inside the container like the agent
    assert (again["status"], again["sealed"]) == ("unchanged", True), again

    ok(capsys, "launch", PLAYBOOK, "-i", inv)
    try:
        v = ok(capsys, "verify-logs", PLAYBOOK, "-i", inv)
        assert v["ok"] is True, v
    finally:
        ok(capsys, "stop", "-i", inv)

    ok(capsys, "rollback", "-i", inv)
    assert box.sha(TARGET) == pristine


def test_a_re_created_container_is_said_by_status_and_verify_logs(
        engine: dockerd.Dockerd, sandbox: Any, boxes: list[Box], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The deploy records the container's id; a container re-created from its image (the patch gone,
    the records kept on the state volume) is named as such by status and verify-logs, and a new
    deploy patches the new one."""
    box = Box(engine, sandbox, "fleetctl-test-c2", tmp_path / "state")
    boxes.append(box)
    old = box.run()
    inv = inventory(tmp_path, sandbox, engine, box.name)
    pristine = box.sha(TARGET)
    assert ok(capsys, "deploy", PLAYBOOK, "-i", inv)["hosts"][0]["status"] == "changed"
    manifest = json.loads(next((tmp_path / "state").glob("deploys/*/manifest.json")).read_text())
    assert manifest["container"]["id"] == old and manifest["container"]["image"] == IMAGE, manifest["container"]
    assert not ok(capsys, "status", "-i", inv)["hosts"][0].get("problems")

    box.remove()  # re-created from its image, same name, same state volume
    new = box.run()
    assert new != old and box.sha(TARGET) == pristine
    code, doc = cli(capsys, "status", "-i", inv)
    problems = doc["hosts"][0]["problems"]
    line = next((p for p in problems if "was re-created since deploy" in p), None)
    assert line is not None and f"container {old[:12]} then, {new[:12]} now" in line, problems
    assert code == 1, doc

    # (launch refuses the playbook's flag: the new container's SGLang does not register it)
    ok(capsys, "launch", PLAYBOOK, "-i", inv, "--drop-unknown-flags")
    try:
        code, v = cli(capsys, "verify-logs", PLAYBOOK, "-i", inv)
        assert code == 1, v
        said = json.dumps(v)
        assert f"docker container {box.name} was re-created since deploy {manifest['id']}" in said, said[:3000]
    finally:
        ok(capsys, "stop", "-i", inv)

    assert ok(capsys, "deploy", PLAYBOOK, "-i", inv)["hosts"][0]["status"] == "changed"
    assert box.sha(TARGET) != pristine
    doc = ok(capsys, "status", "-i", inv)
    assert not any("re-created" in p for p in doc["hosts"][0].get("problems") or []), doc


def test_read_only_container_is_refused_and_a_state_dir_off_volume_is_warned(
        engine: dockerd.Dockerd, sandbox: Any, boxes: list[Box], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    ro = Box(engine, sandbox, "fleetctl-test-ro", tmp_path / "state", read_only=True)
    boxes.append(ro)
    ro.run()
    inv = inventory(tmp_path, sandbox, engine, ro.name)
    pristine = ro.sha(TARGET)
    for extra in (["--check"], []):
        code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv, *extra)
        assert code == 1, doc
        row = doc["plan"]["hosts"][0]
        assert row["status"] == "refused", row
        assert f"docker container {ro.name} has a read-only root filesystem (image {IMAGE})" in row["reason"], row
        assert (f"'fleetctl patch dockerfile {PLAYBOOK}/playbook.yaml --sglang {VERSION} --package-dir {PKG} -o fleetctl-image'"
                in row["reason"]), row
    assert ro.sha(TARGET) == pristine
    assert not list((tmp_path / "state").glob("deploys/*"))

    eph = Box(engine, sandbox, "fleetctl-test-eph", None)  # no state volume
    boxes.append(eph)
    eph.run()
    inv = inventory(tmp_path, sandbox, engine, eph.name, state_dir="/root/.fleetctl")
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv, "--check")
    row = doc["plan"]["hosts"][0]
    assert row["status"] == "change", row
    assert (f"warning: state dir /root/.fleetctl is on docker container {eph.name}'s own filesystem: the deploy's "
            f"records and backups die with the container") in row["reason"], row


def test_patch_dockerfile_builds_the_patch_into_an_image(engine: dockerd.Dockerd, sandbox: Any, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The printed lines, in a real `docker build` FROM an image holding the pristine release, give an
    image whose files are the bytes deploy writes; FROM an image holding other bytes, the build fails."""
    from fleetctl.cli import main
    from fleetctl.config.playbook import load_playbook
    from fleetctl.plan.intended import intended_for

    h = sandbox.hosts["h01"]
    root = tmp_path / "base"
    # a base with only what the lines need: sh (dash), sha256sum, rm and libc, and the release tree
    for d in ("usr/bin", "usr/lib/x86_64-linux-gnu", "usr/lib64", "tmp"):
        (root / d).mkdir(parents=True)
    for link in ("bin", "lib", "lib64"):
        (root / link).symlink_to(f"usr/{link}")
    shutil.copy("/usr/bin/dash", root / "usr/bin/sh")
    for tool in ("sha256sum", "rm"):
        shutil.copy(f"/usr/bin/{tool}", root / "usr/bin" / tool)
    for lib in ("lib/x86_64-linux-gnu/libc.so.6", "lib64/ld-linux-x86-64.so.2"):
        shutil.copy(os.path.realpath(f"/{lib}"), root / "usr" / lib)
    shutil.copytree(h.sglang_dir, root / PKG.lstrip("/"))
    dockerd.import_rootfs(engine, root, "fleetctl-test/base:pristine")

    ctx = tmp_path / "ctx"
    capsys.readouterr()
    assert main(["patch", "dockerfile", str(PLAYBOOK), "--sglang", VERSION, "-o", str(ctx)]) == 0
    lines = capsys.readouterr().out
    assert (ctx / "Dockerfile.fleetctl").read_text() == lines
    (ctx / "Dockerfile").write_text("FROM fleetctl-test/base:pristine\n" + lines)
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    build = subprocess.run([*engine.cli, "build", "--network", "host", "-q", "-t", "fleetctl-test/patched:1",
                            str(ctx)], capture_output=True, text=True, env=env, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    made = engine.run("create", "fleetctl-test/patched:1", "/bin/sh").stdout.strip()
    try:
        it = intended_for(load_playbook(PLAYBOOK), VERSION)
        assert it is not None
        for rel, want in it.items():
            got = subprocess.run([*engine.cli, "cp", f"{made}:{PKG}/{rel}", "-"], capture_output=True,
                                 check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(got)) as tf:
                member = tf.extractfile(tf.getmembers()[0])
                assert member is not None
                assert hashlib.sha256(member.read()).hexdigest() == want.sha_intended, rel
    finally:
        engine.run("rm", "-f", made, check=False)

    # an image that does not hold the pristine release: the build stops at the first check
    (ctx / "Dockerfile").write_text("FROM fleetctl-test/patched:1\n" + lines)
    again = subprocess.run([*engine.cli, "build", "--network", "host", "-q", str(ctx)], capture_output=True,
                           text=True, env=env, timeout=300)
    assert again.returncode != 0 and f"fleetctl: the image does not hold pristine sglang {VERSION} files" in (
        again.stdout + again.stderr), again.stderr[-2000:]


def test_a_server_that_is_the_containers_main_process_is_restarted_by_restarting_it(
        engine: dockerd.Dockerd, sandbox: Any, boxes: list[Box], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The image's CMD is the server (as under docker compose): after a deploy, the reminder names the
    container restart, and that printed command, run as printed, brings the server back on the patched
    files (a restart keeps the container's files: same id, nothing re-created)."""
    import shlex
    import time

    from fleetctl.cli import main
    from fleetctl.engines.sglang import READY_LINE
    from tests.ports import free_ports

    port = free_ports(1)[0]
    flags = ("--model-path m --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
             f"--speculative-num-draft-tokens 4 --port {port}").split()
    box = Box(engine, sandbox, "fleetctl-test-main", tmp_path / "state")
    boxes.append(box)
    cid = box.run(f"{VENV}/bin/python", "-m", "fleetctl.sandbox.simulator", *flags)
    box.wait_log(READY_LINE, 1)
    inv = inventory(tmp_path, sandbox, engine, box.name, main_process=True)
    pristine = box.sha(TARGET)
    time.sleep(1.1)  # a file changed in the same second as the server started is not called newer
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert code == 0, doc
    rn = doc["restart_needed"]
    assert rn["servers"] == 1 and [b["host"] for b in rn["by_hand"]] == ["h01"], rn
    restart = shlex.join([*engine.cli, "restart", box.name])
    capsys.readouterr()
    assert main(["servers", "--discover", "-i", str(inv)]) == 0
    err = capsys.readouterr().err
    assert (f"h01: the server is its container's main process: restart the container ('{restart}' on h01)"
            in err), err
    assert "restart by hand" not in err

    subprocess.run(shlex.split(restart), check=True, capture_output=True, timeout=120)
    box.wait_log(READY_LINE, 2)
    assert box.sha(TARGET) != pristine  # a restart keeps the container's files
    doc = ok(capsys, "servers", "--discover", "-i", inv)
    (srv,) = doc["hosts"][0]["servers"]
    assert srv["stale"] is False and srv["instance"] is None, srv
    doc = ok(capsys, "facts", "-i", inv)
    assert doc["hosts"][0]["facts"]["container"]["id"] == cid  # restarted, not re-created
    doc = ok(capsys, "status", "-i", inv)
    assert not any("re-created" in p for p in doc["hosts"][0].get("problems") or []), doc


@pytest.fixture
def open_sandbox(request: pytest.FixtureRequest) -> Any:
    """A 1-host sandbox in a directory every user may enter (for a non-root login)."""
    import tempfile

    from fleetctl.sandbox import lifecycle

    d = Path(tempfile.mkdtemp(prefix=NON_ROOT_PREFIX + "ctr-", dir="/tmp"))
    d.chmod(0o755)

    def down() -> None:
        report = lifecycle.down(d / "sb", missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)
        assert not report.survivors, report.survivors

    request.addfinalizer(down)
    return lifecycle.up(d / "sb", hosts=1, versions=[VERSION], gpus=1, bare_shell=True, host_python=SYSTEM_PYTHON)


@pytest.mark.usefixtures("accounts")
def test_become_and_container_compose(engine: dockerd.Dockerd, image: str, open_sandbox: Any, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> None:
    """A login that may not use docker, `become: true`: sudo runs the runtime's client, the agent runs
    in the container (ssh -> sudo -n -u root -- docker exec -i NAME -> python). Without the sudoers
    rule, one line naming the rule for the client."""
    box = Box(engine, open_sandbox, "fleetctl-test-become", tmp_path / "state")
    request.addfinalizer(box.remove)
    box.run()
    inv = inventory(tmp_path, open_sandbox, engine, box.name)
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"]["user"] = LOGIN
    doc["hosts"]["h01"]["become"] = True
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    client = engine.cli[0]

    code, doc = cli(capsys, "facts", "-i", inv)
    assert code == 1, doc
    msg = doc["hosts"][0]["message"]
    assert msg.startswith("sudo asks for a password to become root") and f"NOPASSWD: {client}" in msg, msg

    sudoers(f"{LOGIN} ALL=(root) NOPASSWD: {client}\n")
    pristine = box.sha(TARGET)
    facts = ok(capsys, "facts", "-i", inv)["hosts"][0]["facts"]
    assert facts["user"] == "root" and facts["container"]["name"] == box.name, facts["user"]
    assert ok(capsys, "deploy", PLAYBOOK, "-i", inv)["hosts"][0]["status"] == "changed"
    assert box.sha(TARGET) != pristine
    ok(capsys, "rollback", "-i", inv)
    assert box.sha(TARGET) == pristine


@pytest.mark.usefixtures("accounts")
def test_become_restarts_a_main_process_container(engine: dockerd.Dockerd, image: str, open_sandbox: Any,
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  request: pytest.FixtureRequest) -> None:
    """A login that may not use docker, `become: true`, the server the container's main process: launch
    restarts the container through sudo (only the client's rule in sudoers: the shell that joins the
    log's two streams runs outside sudo) and status reads its log through sudo too: healthy."""
    from fleetctl.engines.sglang import READY_LINE
    from tests.ports import free_ports

    port = free_ports(1)[0]
    flags = ("--model-path m --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
             f"--speculative-num-draft-tokens 4 --port {port}").split()
    box = Box(engine, open_sandbox, "fleetctl-test-become-main", tmp_path / "state")
    request.addfinalizer(box.remove)
    cid = box.run(f"{VENV}/bin/python", "-m", "fleetctl.sandbox.simulator", *flags)
    box.wait_log(READY_LINE, 1)
    inv = inventory(tmp_path, open_sandbox, engine, box.name, main_process=True)
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"]["user"] = LOGIN
    doc["hosts"]["h01"]["become"] = True
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    sudoers(f"{LOGIN} ALL=(root) NOPASSWD: {engine.cli[0]}\n")

    def state() -> dict[str, Any]:
        got: dict[str, Any] = json.loads(engine.run("inspect", box.name).stdout)[0]
        return got

    first = state()["State"]["StartedAt"]
    doc = ok(capsys, "launch", PLAYBOOK, "-i", inv)
    (inst,) = doc["hosts"][0]["instances"]
    assert (inst["instance"], inst["status"]) == (box.name, "ready"), inst
    now = state()
    assert now["Id"] == cid and now["State"]["StartedAt"] != first, now["State"]
    st = ok(capsys, "status", "-i", inv)["hosts"][0]["main_process"]
    assert (st["healthy"], st["health"], st["port"], st["started_at"]) == (True, 200, port, now["State"]["StartedAt"]), st


def test_a_missing_or_stopped_container_is_one_line(engine: dockerd.Dockerd, sandbox: Any, boxes: list[Box],
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = cli(capsys, "facts", "-i", inventory(tmp_path, sandbox, engine, "fleetctl-test-nosuch"))
    assert code == 1, doc
    msg = doc["hosts"][0]["message"]
    assert msg.startswith("docker container fleetctl-test-nosuch: the runtime answered nothing (exit code 1): "
                          ) and "No such container: fleetctl-test-nosuch" in msg, msg  # (the runtime's own words)
    box = Box(engine, sandbox, "fleetctl-test-stopped", tmp_path / "state")
    boxes.append(box)
    box.run()
    engine.run("stop", "-t", "0", box.name)
    capsys.readouterr()
    from fleetctl.cli import main

    assert main(["deploy", "-i", str(inventory(tmp_path, sandbox, engine, box.name)), str(PLAYBOOK)]) == 1
    err = capsys.readouterr()
    said = err.out + err.err
    assert f"h01: docker container {box.name} is not running (id {box.id[:12]}, image {IMAGE})" in said, said
    assert f"(start it ('{shlex.join([*engine.cli, 'start', box.name])}' on the host))" in said.replace("\n    ", " "), said
    assert "Traceback" not in said


def test_a_re_created_container_whose_records_died_with_it_is_said_from_the_ledger(
        engine: dockerd.Dockerd, sandbox: Any, boxes: list[Box], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The state dir on the container's own filesystem (warned at deploy): re-creating the container
    takes the records too; status and verify-logs still say it, from this controller's ledger."""
    box = Box(engine, sandbox, "fleetctl-test-eph2", None)
    boxes.append(box)
    old = box.run()
    inv = inventory(tmp_path, sandbox, engine, box.name, state_dir="/root/.fleetctl")
    doc = ok(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert doc["hosts"][0]["status"] == "changed", doc["hosts"][0]
    box.remove()
    new = box.run()
    code, doc = cli(capsys, "status", "-i", inv)
    assert code == 1, doc
    line = next((p for p in doc["hosts"][0]["problems"] if "re-created" in p), "")
    assert f"container {old[:12]} then, {new[:12]} now" in line and "this controller's ledger says so" in line, doc
    ok(capsys, "launch", PLAYBOOK, "-i", inv, "--drop-unknown-flags")
    try:
        code, v = cli(capsys, "verify-logs", PLAYBOOK, "-i", inv)
        assert code == 1 and "this controller's ledger says so" in json.dumps(v), v
    finally:
        ok(capsys, "stop", "-i", inv)
    ok(capsys, "deploy", PLAYBOOK, "-i", inv)  # the new container patched: nothing to say any more
    code, doc = cli(capsys, "status", "-i", inv)
    assert not any("re-created" in p for p in doc["hosts"][0].get("problems") or []), doc


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dockerd.Podman]:
    why = dockerd.podman_why_not()
    if why:
        pytest.skip(why)
    p = dockerd.Podman.under(Path(str(tmp_path_factory.mktemp("podman"))))
    try:
        yield p
    finally:
        dockerd.podman_stop(p)


def test_the_loop_through_a_podman_container(podman: dockerd.Podman, rootfs: Path, sandbox: Any, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The same loop with podman (rootful, storage of the test's own, no daemon)."""
    podman.run("import", str(rootfs), IMAGE)
    box = Box(podman, sandbox, "fleetctl-test-p1", tmp_path / "state")
    try:
        cid = box.run()
        inv = inventory(tmp_path, sandbox, podman, box.name, runtime="podman")
        pristine = box.sha(TARGET)
        c = ok(capsys, "facts", "-i", inv)["hosts"][0]["facts"]["container"]
        assert (c["runtime"], c["id"], c["running"]) == ("podman", cid, True) and IMAGE in c["image"], c
        assert any(m["destination"] == STATE for m in c["mounts"]), c
        assert ok(capsys, "deploy", PLAYBOOK, "-i", inv)["hosts"][0]["status"] == "changed"
        assert box.sha(TARGET) != pristine
        ok(capsys, "launch", PLAYBOOK, "-i", inv)
        try:
            assert ok(capsys, "verify-logs", PLAYBOOK, "-i", inv)["ok"] is True
        finally:
            ok(capsys, "stop", "-i", inv)
        ok(capsys, "rollback", "-i", inv)
        assert box.sha(TARGET) == pristine
    finally:
        box.remove()


def test_rolling_restart_restarts_a_main_process_container_and_verify_reads_its_log(
        engine: dockerd.Dockerd, sandbox: Any, boxes: list[Box], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`deploy --restart` on a host whose server is its container's main process restarts the
    container through the runtime (same id, a new start), waits for its ready line, and verify-logs
    proves the marker from the container's own log of this start. After a rollback and a restart by
    hand, the earlier start's marker lines (still in `docker logs`) and a replayed marker line with an
    older time of its own do not count: the marker is missing."""
    _main_process_rolling(engine, "docker", sandbox, boxes, "fleetctl-test-main2", tmp_path, capsys)


def test_rolling_restart_of_a_main_process_container_with_podman(
        podman: dockerd.Podman, rootfs: Path, sandbox: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The same with real podman: `podman restart`, `podman logs --timestamps --since` (its times
    carry the host's offset)."""
    podman.run("import", str(rootfs), IMAGE)
    made: list[Box] = []
    try:
        _main_process_rolling(podman, "podman", sandbox, made, "fleetctl-test-pmain", tmp_path, capsys)
    finally:
        for b in made:
            b.remove()


def _main_process_rolling(engine: dockerd.Dockerd | dockerd.Podman, runtime: str, sandbox: Any, boxes: list[Box],
                          name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from fleetctl.engines.sglang import READY_LINE
    from tests.ports import free_ports

    port = free_ports(1)[0]
    flags = ("--model-path m --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
             f"--speculative-num-draft-tokens 4 --port {port}").split()
    state = tmp_path / "state"
    state.mkdir()
    replay = state / "replay.log"
    replay.write_text("")
    (state / "flags").write_text("")
    box = Box(engine, sandbox, name, state)
    boxes.append(box)
    # the main process first replays a file (empty until the end), then execs the server with the flags
    # of a file on the volume (as an operator edits a compose file's command): the patch's own flag
    # only once it is deployed
    # (and waits for a file 'go', which the test removes before the last restart and writes once that
    # restart is done: the replay then comes after the runtime noted the start, as a replayed log does)
    (state / "go").write_text("")
    cid = box.run("sh", "-c", f'while [ ! -e {STATE}/go ]; do sleep 0.05; done; cat {STATE}/replay.log >&2; '
                  f'exec "$@" $(cat {STATE}/flags)', "sh",
                  f"{VENV}/bin/python", "-m", "fleetctl.sandbox.simulator", *flags)
    box.wait_log(READY_LINE, 1)
    inv = inventory(tmp_path, sandbox, engine, box.name, runtime=runtime, main_process=True)
    marker = "Dynamic speculation disable enabled"
    (state / "flags").write_text("--speculative-disable-batch-threshold 16\n")

    def started() -> str:
        return json.loads(engine.run("inspect", box.name).stdout)[0]["State"]["StartedAt"]

    first = started()
    chk = ok(capsys, "launch", PLAYBOOK, "-i", inv, "--check")["hosts"][0]  # says the restart, runs nothing
    assert (chk["status"], f"'{shlex.join([*engine.cli, 'restart', name])}' on h01") == ("start", chk["message"][
        chk["message"].index("'"):chk["message"].index(", then")]), chk
    assert started() == first
    time.sleep(1.1)  # a file changed in the same second as the server started is not called newer
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv, "--restart")
    assert code == 0, doc
    (row,) = doc["rollout"]["hosts"]
    assert (row["status"], row["steps"].get("launch"), row["steps"].get("verify-logs")) == ("ok", "ok", "pass"), row
    second = started()
    assert second != first  # restarted ...
    assert json.loads(engine.run("inspect", box.name).stdout)[0]["Id"] == cid  # ... not re-created

    v = ok(capsys, "verify-logs", PLAYBOOK, "-i", inv)
    (iv,) = v["hosts"][0]["instances"]
    assert v["ok"] is True and iv["instance"] == box.name and iv["ready"] is True, iv
    assert all(r["markers"][marker] for r in iv["ranks"]), iv
    st = ok(capsys, "status", "-i", inv)["hosts"][0]["main_process"]  # the server's health, from the runtime
    assert (st["healthy"], st["running"], st["ready"], st["port"], st["health"], st["started_at"]) == (
        True, True, True, port, 200, second), st

    # rollback (files only), a replayed marker line with an older time of its own, a restart by hand
    ok(capsys, "rollback", "-i", inv)
    (state / "flags").write_text("")
    said = engine.run("logs", box.name)
    old = next(ln for ln in (said.stdout + said.stderr).splitlines() if marker in ln)
    stamp = old[1:20]  # "[YYYY-MM-DD HH:MM:SS..."
    older = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
                                                              - 3600))
    replay.write_text(old.replace(stamp, older, 1) + "\n")
    (state / "go").unlink()
    engine.run("restart", box.name)
    (state / "go").write_text("")
    box.wait_log(READY_LINE, 3)
    third = started()
    since = engine.run("logs", "--since", third, box.name)
    assert marker in since.stdout + since.stderr  # the replayed line is in the runtime's log of this start
    code, v = cli(capsys, "verify-logs", PLAYBOOK, "-i", inv)
    assert code == 1, v
    (iv,) = v["hosts"][0]["instances"]
    assert any(f"marker {marker!r} missing" in p for p in iv["problems"]), iv
    assert any("replayed" in e for e in iv["explanation"]), iv
