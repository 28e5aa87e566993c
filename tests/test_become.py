"""become through the real sudo, as a real non-root login (issue 32.1).

The sandbox host is reached over sshd as a throw-away account that cannot write the SGLang
package nor the state dir; `become: true` makes the agent run as root (or another account) through
`sudo -n -H -u USER -- python ...`. Each case writes its own sudoers rule (checked by visudo, removed
at the end): NOPASSWD for the interpreter; a password (with --ask-become-pass fed through a pty
and through stdin, and without it); a sudoers that denies the interpreter. Needs root (to make the
accounts and sudoers files) and the sudo package (scripts/setup.sh installs it)."""

from __future__ import annotations

import json
import os
import pty
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from machine import NON_ROOT_PREFIX, machine_lock
from waiting import until

from tests.jsoncli import cli

pytestmark = [pytest.mark.usefixtures("ledger_dir"), pytest.mark.fleet]

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks" / "dynamic-spec-disable"
LOGIN = "fleetctl-test-bl"  # the SSH login: may not write the package
OWNER = "fleetctl-test-bo"  # a second account to become (owns the package in one test)
SYSTEM_PYTHON = "/usr/bin/python3"
SUDOERS = Path("/etc/sudoers.d/fleetctl-test-become")
PASSWORD = "become-pw-7Qx"  # the login's password (sudo asks for it in the password cases)


def _need_root() -> None:
    if os.getuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to make throw-away accounts")
    if shutil.which("sudo") is None or shutil.which("visudo") is None:
        pytest.skip("the sudo package is missing (scripts/setup.sh installs it)")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing")


def _make_account(name: str) -> bool:
    """Make the account unless it exists; True when this call made it."""
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", name], check=True)
        return True


def _remove_account(name: str) -> None:
    # (a session's sshd may still be ending: userdel refuses a busy account until it has)
    until(lambda: subprocess.run(["userdel", name], capture_output=True).returncode == 0,
          f"userdel {name} (the account's last processes to end)", every=0.1)


@pytest.fixture
def accounts() -> Iterator[tuple[str, str]]:
    """LOGIN and OWNER, and the sudoers file: this test's alone until it ends, when the accounts it
    made and the sudoers file are removed (another session, or xdist worker, running a test that
    uses them waits: tests/machine.py)."""
    _need_root()
    with machine_lock("become-accounts"):
        made = [name for name in (LOGIN, OWNER) if _make_account(name)]
        try:
            subprocess.run(["chpasswd"], input=f"{LOGIN}:{PASSWORD}\n".encode(), check=True)
            yield LOGIN, OWNER
        finally:
            SUDOERS.unlink(missing_ok=True)
            for name in made:
                _remove_account(name)


def sudoers(text: str) -> None:
    """Install a sudoers rule for the test, refused by visudo when it is not valid."""
    tmp = SUDOERS.with_name(".fleetctl-test-become.tmp")
    tmp.write_text(text)
    tmp.chmod(0o440)
    subprocess.run(["visudo", "-c", "-q", "-f", str(tmp)], check=True)
    tmp.replace(SUDOERS)


@pytest.fixture
def sb(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A 1-host bare-shell sandbox in a directory every user may enter (pytest's tmp dirs are 0700)."""
    from fleetctl.sandbox import lifecycle

    d = Path(tempfile.mkdtemp(prefix=NON_ROOT_PREFIX + "become-", dir="/tmp"))
    d.chmod(0o755)
    box = d / "sb"

    def down() -> None:
        report = lifecycle.down(box, missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)
        if report.survivors:
            raise RuntimeError(f"sandbox {box}: processes outlived SIGKILL: {report.survivors}")

    request.addfinalizer(down)
    return lifecycle.up(box, hosts=1, versions=["0.5.9"], gpus=1, bare_shell=True, host_python=SYSTEM_PYTHON)


def inventory(sb: Any, tmp_path: Path, name: str = "inventory.yaml", **host: Any) -> Path:
    doc = yaml.safe_load(sb.inventory_path.read_text())
    doc["defaults"]["user"] = LOGIN
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(sb.dir / doc["defaults"][k])
    doc["ssh_config"] = str(sb.dir / doc["ssh_config"])
    doc["hosts"]["h01"].update(host)
    inv = tmp_path / name
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def tree(sb: Any) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sb.hosts["h01"].sglang_dir.rglob("*.py")}


def python_of(sb: Any) -> str:
    """The host's interpreter as the inventory names it (the sandbox's venv python): what sudoers must name."""
    return str(sb.hosts["h01"].python)


def nopasswd(sb: Any) -> str:
    return f"{LOGIN} ALL=(root,{OWNER}) NOPASSWD: {python_of(sb)}\n"


def test_become_root_end_to_end_deploy_launch_verify_rollback(accounts: Any, sb: Any, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    sudoers(nopasswd(sb))
    h = sb.hosts["h01"]
    before = tree(sb)
    plain = inventory(sb, tmp_path, "plain.yaml")
    # without become the login cannot write the package: refused at plan time
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", plain)
    assert code == 1 and doc["hosts"][0]["status"] == "refused", doc
    # -b on the command line: the agent runs as root
    code, facts = cli(capsys, "facts", "-i", plain, "-b")
    assert code == 0 and facts["hosts"][0]["facts"]["user"] == "root", facts["hosts"]
    # ... and the inventory's become: false wins over -b (Ansible's precedence)
    off = inventory(sb, tmp_path, "off.yaml", become=False)
    code, facts = cli(capsys, "facts", "-i", off, "-b")
    assert code == 0 and facts["hosts"][0]["facts"]["user"] == LOGIN, facts

    inv = inventory(sb, tmp_path, become=True)
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert code == 0 and doc["hosts"][0]["status"] == "changed", json.dumps(doc)[:3000]
    assert tree(sb) != before
    records = [p for p in h.state_dir.rglob("*") if p.is_file() or p.is_dir()]
    assert records and all(p.stat().st_uid == 0 for p in records), [(p, p.stat().st_uid) for p in records]
    for f in (p for p in h.sglang_dir.rglob("*.py") if before.get(p) != p.read_bytes()):
        assert f.stat().st_uid == 0  # the patched file was written by root, not the login

    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, PLAYBOOK, "--timeout", "300")
    try:
        assert code == 0, json.dumps(doc)[:3000]
        code, doc = cli(capsys, "verify-logs", "-i", inv, PLAYBOOK)
        assert code == 0 and doc["ok"], json.dumps(doc)[:3000]
        code, doc = cli(capsys, "servers", "-i", inv)
        assert code == 0, doc
    finally:
        code, doc = cli(capsys, "stop", "-i", inv)
    assert code == 0, doc
    code, doc = cli(capsys, "rollback", "-i", inv)
    assert code == 0 and doc["hosts"][0]["status"] == "changed", doc
    assert tree(sb) == before

    # the same through an Ansible INI inventory: become from the group's vars
    d = yaml.safe_load(inv.read_text())
    hv = d["hosts"]["h01"]
    ini = tmp_path / "hosts.ini"
    ini.write_text(f"[gpu]\nh01 ansible_host=127.0.0.1 ansible_port={hv['port']} ansible_user={LOGIN} "
                   f"ansible_ssh_private_key_file={d['defaults']['identity_file']} "
                   f"ansible_python_interpreter={hv['python']} fleetctl_known_hosts={d['defaults']['known_hosts']} "
                   f"fleetctl_state_dir={hv['state_dir']}\n\n[gpu:vars]\nansible_become=true\n")
    code, facts = cli(capsys, "facts", "-i", ini)
    assert code == 0 and facts["hosts"][0]["facts"]["user"] == "root", facts["hosts"]


def test_become_another_user_owns_state_backups_and_lock(accounts: Any, sb: Any, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    sudoers(nopasswd(sb))
    h = sb.hosts["h01"]
    owner = pwd.getpwnam(OWNER).pw_uid
    subprocess.run(["chown", "-R", OWNER, str(h.sglang_dir)], check=True)
    state = sb.dir / "owner-state"
    state.mkdir()
    os.chown(state, owner, -1)
    inv = inventory(sb, tmp_path, become=True, become_user=OWNER, state_dir=str(state / "fleetctl"))
    before = tree(sb)
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert code == 0 and doc["hosts"][0]["status"] == "changed", json.dumps(doc)[:3000]
    made = list((state / "fleetctl").rglob("*"))
    assert any(p.name == "manifest.json" for p in made) and any("backup" in str(p) for p in made), made
    assert all(p.stat().st_uid == owner for p in [state / "fleetctl", *made]), \
        [(str(p), p.stat().st_uid) for p in made if p.stat().st_uid != owner]
    code, doc = cli(capsys, "rollback", "-i", inv)
    assert code == 0 and tree(sb) == before, doc


def test_sudo_that_asks_for_a_password(accounts: Any, sb: Any, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    sudoers(f"{LOGIN} ALL=(root) {python_of(sb)}\n")  # a password is required
    inv = inventory(sb, tmp_path, become=True)
    code, doc = cli(capsys, "facts", "-i", inv)
    assert code == 1, doc
    msg = doc["hosts"][0]["message"]
    assert msg.startswith("sudo asks for a password to become root (become, sudo -n)"), msg
    assert PASSWORD not in json.dumps(doc)
    from fleetctl.cli import main

    capsys.readouterr()
    assert main(["facts", "-i", str(inv)]) == 1
    said = "".join(capsys.readouterr())
    assert f"NOPASSWD: {python_of(sb)}" in said and "--ask-become-pass" in said, said

    # --ask-become-pass through stdin (not a terminal), and through a pty: the prompt, nothing echoed
    args = [sys.executable, "-m", "fleetctl", "facts", "-i", str(inv), "--json", "-K"]
    env = {**os.environ}
    got = subprocess.run(args, input=(PASSWORD + "\n").encode(), capture_output=True, env=env, timeout=120)
    assert got.returncode == 0, got.stderr.decode()[-2000:]
    assert json.loads(got.stdout)["hosts"][0]["facts"]["user"] == "root"
    assert b"BECOME password: " in got.stderr and PASSWORD.encode() not in got.stderr + got.stdout

    out = run_in_pty(args, PASSWORD, env)
    assert out.count(b"BECOME password: ") == 1 and PASSWORD.encode() not in out, out[-2000:]
    assert b'"user": "root"' in out, out[-2000:]

    # a wrong password: refused by sudo, one line, nothing started
    got = subprocess.run(args, input=b"not-the-password\n", capture_output=True, env=env, timeout=120)
    assert got.returncode == 1, got.stderr.decode()[-2000:]
    row = json.loads(got.stdout)["hosts"][0]
    assert row["message"].startswith("sudo did not accept the become password to become root ("), row


def run_in_pty(args: list[str], password: str, env: dict[str, str]) -> bytes:
    """Run `args` with a pty as its stdin/stdout/stderr; type `password` once its prompt shows. The
    process's whole output (what the terminal would show: an echoed password would be in it)."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execve(args[0], args, env)
    out = bytearray()
    sent = False
    try:
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:
                break
            if not data:
                break
            out += data
            if not sent and b"BECOME password: " in out:
                os.write(fd, (password + "\n").encode())
                sent = True
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    return bytes(out)


def test_sudoers_that_denies_the_interpreter(accounts: Any, sb: Any, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    sudoers(f"{LOGIN} ALL=(root) NOPASSWD: ALL, !{python_of(sb)}\n")
    inv = inventory(sb, tmp_path, become=True)
    before = tree(sb)
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert code == 1, doc
    msg = doc["hosts"][0]["message"]
    assert msg.startswith(f"sudoers does not let {LOGIN} run {python_of(sb)} as root (become) ("), msg
    assert tree(sb) == before


def test_become_methods_and_users_refused_with_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  a: {address: 127.0.0.1, become: true, become_method: su}\n")
    code, _ = cli(capsys, "facts", "-i", inv)
    assert code == 2
    from fleetctl.cli import main

    capsys.readouterr()
    assert main(["facts", "-i", str(inv)]) == 2
    said = capsys.readouterr().err
    assert "become_method" in said and "su: not supported" in said and "sudo" in said, said
    ok_inv = tmp_path / "ok.yaml"
    ok_inv.write_text("hosts:\n  a: {address: 127.0.0.1}\n")
    assert main(["facts", "-i", str(ok_inv), "-b", "--become-method", "doas"]) == 2
    said = capsys.readouterr().err
    assert "--become-method: become_method doas: not supported" in said, said
    assert main(["facts", "-i", str(ok_inv), "-b", "--become-user", "bad user"]) == 2
