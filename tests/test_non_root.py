"""A deploy as a user who is not root, over sshd as real hosts run it (the login user's own uid, its
login shell), against a package that user cannot write and then one it owns.

The sandbox hosts are reached as a throw-away local account (made here, removed at the end), so
what the host does is what a non-root login does: access checks, a state dir of its own, files it
may read but not replace. Needs root (to make the account) and a python every user may run."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from machine import NON_ROOT_PREFIX
from waiting import until

from tests.jsoncli import cli

pytestmark = [pytest.mark.usefixtures("ledger_dir"), pytest.mark.fleet]

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks" / "dynamic-spec-disable"
USER = "fleetctl-test-nr"
SYSTEM_PYTHON = "/usr/bin/python3"  # not root's pyenv: /root is not open to other users


@pytest.fixture
def account(request: pytest.FixtureRequest) -> str:
    if os.getuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to make a throw-away account")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", USER], check=True)
        request.addfinalizer(_remove_account)
    subprocess.run(["usermod", "-p", "*", USER], check=True)  # no password, not locked: key logins only
    return USER


def _remove_account() -> None:
    """userdel, waiting out the account's last processes (a session's sshd ending after the sandbox
    is down: userdel refuses an account with running processes)."""
    until(lambda: subprocess.run(["userdel", USER], capture_output=True).returncode == 0,
          f"userdel {USER} (the account's last processes to end)", every=0.1)


@pytest.fixture
def open_sandbox(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A 1-host bare-shell sandbox in a directory every user may enter (pytest's tmp dirs are 0700)."""
    from fleetctl.sandbox import lifecycle

    d = Path(tempfile.mkdtemp(prefix=NON_ROOT_PREFIX, dir="/tmp"))
    d.chmod(0o755)
    sb = d / "sb"

    def down() -> None:
        report = lifecycle.down(sb, missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)
        if report.survivors:
            raise RuntimeError(f"sandbox {sb}: processes outlived SIGKILL: {report.survivors}")

    request.addfinalizer(down)
    return lifecycle.up(sb, hosts=1, versions=["0.5.9"], gpus=1, bare_shell=True, host_python=SYSTEM_PYTHON)


def test_a_non_root_user_is_refused_at_plan_time_then_deploys_what_it_owns(
        account: str, open_sandbox, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    sb = open_sandbox
    h = sb.hosts["h01"]
    uid = pwd.getpwnam(account).pw_uid
    state = sb.dir / "nr-state"
    state.mkdir()
    os.chown(state, uid, -1)
    doc = yaml.safe_load(sb.inventory_path.read_text())
    doc["defaults"]["user"] = account
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(sb.dir / doc["defaults"][k])
    doc["ssh_config"] = str(sb.dir / doc["ssh_config"])
    doc["hosts"]["h01"]["state_dir"] = str(state)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = {p: p.read_bytes() for p in h.sglang_dir.rglob("*.py")}

    code, facts = cli(capsys, "facts", "-i", inv)
    assert code == 0 and facts["hosts"][0]["facts"]["user"] == account, facts
    files = facts["hosts"][0]["facts"]["files"]
    assert files["srt/server_args.py"]["unwritable"] == (
        f"its directory is not writable by {account} (owner root, mode 755)"), files["srt/server_args.py"]
    capsys.readouterr()
    from fleetctl.cli import main

    assert main(["facts", "-i", str(inv)]) == 0
    assert (f"27 of the 27 hashed files cannot be replaced by {account}: its directory is not writable by "
            f"{account} (owner root, mode 755) (deploy refuses to patch them)") in capsys.readouterr().out
    for extra in (["--check"], []):
        code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv, *extra)
        assert code == 1, doc
        row = doc["hosts"][0]
        assert row["status"] == "refused", row
        assert row["message"].startswith(f"srt/server_args.py is unwritable (its directory is not writable by "
                                         f"{account} (owner root, mode 755)); deploy as a user who can write"), row
        assert {f["state"] for f in doc["plan"]["hosts"][0]["files"]} == {"unwritable"}
    assert {p: p.read_bytes() for p in h.sglang_dir.rglob("*.py")} == before  # nothing written
    assert not any(state.glob("deploys/*"))  # nothing begun

    # the package handed to that user (as a venv it made itself would be): deploy, the sealed no-op,
    # rollback, all as that user
    subprocess.run(["chown", "-R", account, str(h.sglang_dir)], check=True)
    # ... but a state_dir that user cannot write (root's, and one not made yet under it): refused at
    # plan time, naming it and the inventory key
    for sd, where in ((h.state_dir, "it"), (h.state_dir / "not" / "yet", f"it (its parent {h.state_dir})")):
        doc_sd = yaml.safe_load(inv.read_text())
        doc_sd["hosts"]["h01"]["state_dir"] = str(sd)
        inv_sd = tmp_path / "inventory-root-state.yaml"
        inv_sd.write_text(yaml.safe_dump(doc_sd, sort_keys=False))
        code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv_sd)
        assert code == 1 and doc["hosts"][0]["status"] == "refused", doc
        assert doc["hosts"][0]["message"] == (
            f"state_dir {sd}: {where} is not writable by {account} (owner root, mode 755) (the host lock, "
            "backups and deploy records go there); set 'state_dir:' for this host in the inventory to a "
            "directory this user can write"), doc["hosts"][0]
        assert not (h.state_dir / "not").exists()
    assert {p: p.read_bytes() for p in h.sglang_dir.rglob("*.py")} == before
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert code == 0 and doc["hosts"][0]["status"] == "changed", json.dumps(doc)[:3000]
    code, doc = cli(capsys, "deploy", PLAYBOOK, "-i", inv)
    assert code == 0 and doc["hosts"][0]["status"] == "unchanged" and doc["hosts"][0]["sealed"], doc["hosts"][0]
    manifests = list(state.glob("deploys/*/manifest.json"))
    assert manifests and all(m.stat().st_uid == uid for m in manifests)  # written by that user
    code, doc = cli(capsys, "rollback", "-i", inv)
    assert code == 0 and doc["hosts"][0]["status"] == "changed", doc
    assert {p: p.read_bytes() for p in h.sglang_dir.rglob("*.py")} == before
