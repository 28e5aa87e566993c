"""SGLang as users install it (issue 31 items 1, 4, 7): fleetctl locates each file as CPython would
import it, on a sandbox host laid out that way for real.

One private 1-host sandbox (0.5.9, 1 GPU) whose wheel install is removed: each test builds its own
layout under the test's tmp dir (a real git checkout of the release wheel's files, a real
`pip install -e` into the host's venv, real sitecustomize.py / .pth files), and takes it down again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from test_launch import playbook_with, stop_all_local

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.sandbox import lifecycle
from fleetctl.sandbox.lifecycle import Sandbox

pytestmark = [pytest.mark.fleet, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "playbooks" / "dynamic-spec-disable"
MARKER = "Dynamic speculation disable enabled"
WORKER = "srt/speculative/eagle_worker.py"
SIM = "{python} -m fleetctl.sandbox.simulator"
PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "{version}"

[tool.setuptools.packages.find]
include = ["sglang*"]
"""


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Sandbox:
    from conftest import _down, require_sshd

    require_sshd()
    d = tmp_path_factory.mktemp("layouts") / "sb"
    request.addfinalizer(lambda: _down(d))
    sb = lifecycle.up(d, hosts=1, versions=["0.5.9"], gpus=1)
    h = sb.hosts["h01"]
    # no wheel install: each test installs SGLang its own way
    shutil.rmtree(h.sglang_dir)
    for info in h.site_packages.glob("sglang-*.dist-info"):
        shutil.rmtree(info)
    return sb


def venv_site(sb: Sandbox) -> Path:
    """The host venv's own site-packages (where pip installs and .pth files are read)."""
    h = sb.hosts["h01"]
    return next((h.host_dir / "lib").glob("python3*/site-packages"))


@pytest.fixture
def sb(one: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    site = venv_site(one)
    before = set(os.listdir(site))
    try:
        yield one
    finally:
        stop_all_local(one)
        h = one.hosts["h01"]
        for n in set(os.listdir(site)) - before:  # what the test installed there
            p = site / n
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        shutil.rmtree(h.state_dir / "deploys", ignore_errors=True)
        (h.state_dir / "lock").unlink(missing_ok=True)


def checkout(home: Path, version: str = "0.5.9") -> Path:
    """A git checkout at home/sglang as SGLang's repo lays it out (python/sglang, python/pyproject.toml),
    its files the release wheel's, committed. Returns the project dir (home/sglang/python)."""
    repo = home / "sglang"
    proj = repo / "python"
    proj.mkdir(parents=True)
    shutil.copytree(wheels.package_dir(version), proj / "sglang")
    (proj / "pyproject.toml").write_text(PYPROJECT.format(version=version))
    (repo / "README.md").write_text("checkout of the SGLang release files, for a fleetctl test\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", f"sglang {version}"]):
        subprocess.run([*git, *cmd], check=True, capture_output=True)
    return proj


def pip_install_editable(sb: Sandbox, proj: Path, *extra: str) -> None:
    """A real `pip install -e PROJECT` into the host's venv (its python: pip --python)."""
    h = sb.hosts["h01"]
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(h.python), "install", "-q", "--no-deps",
                        *extra, "-e", str(proj)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


def inventory(sb: Sandbox, path: Path, **host: Any) -> Path:
    doc = yaml.safe_load(sb.inventory_path.read_text())
    base = sb.inventory_path.parent
    doc["ssh_config"] = str(base / doc["ssh_config"])
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(base / doc["defaults"][k])
    h = doc["hosts"]["h01"]
    h["flags"] = {"--port": free_port()}
    for k, v in host.items():
        h[k] = {**h.get(k, {}), **v} if isinstance(v, dict) else v
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, Any, str]:
    capsys.readouterr()
    code = main([*map(str, args), "--json"])
    cap = capsys.readouterr()
    return code, json.loads(cap.out) if cap.out.strip() else None, cap.err


def seed_layout(sb: Sandbox, tmp_path: Path) -> tuple[Path, Path]:
    """The seed's layout: ~/sglang a git checkout, `pip install -e ~/sglang/python`, launched from
    ~ (the launch env's HOME). Returns (home, the checkout's package dir)."""
    home = tmp_path / "home"
    proj = checkout(home)
    pip_install_editable(sb, proj)
    return home, proj / "sglang"


# ----------------------------------------------------------------------------- item 1: the seed's layout


def test_seed_layout_facts_explain_deploy_launch_verify_rollback(sb: Sandbox, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    home, pkg = seed_layout(sb, tmp_path)
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM})

    code, doc, err = cli(capsys, "facts", "-i", inv)
    assert code == 0, (doc, err)
    sg = doc["hosts"][0]["facts"]["sglang"]
    assert sg["dir"] == str(pkg) and sg["version"] == "0.5.9" and sg["install"] == "editable", sg
    loc = doc["hosts"][0]["facts"]["locate"]
    assert loc["shadow"]["by"] == str(home / "sglang") and not loc["shadow"]["regular"]
    assert any("_EditableFinder" in f for f in loc["finders"]), loc

    code, doc, err = cli(capsys, "explain", "-i", inv, pb)
    assert code == 0, (doc, err)
    row = doc["hosts"][0]
    assert row["worker_class"] == "EAGLEWorker" and row["covered"] is True
    assert any("namespace package" in n and str(home / "sglang") in n for n in row["notes"]), row["notes"]

    code, doc, err = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0, (doc, err)
    assert MARKER in (pkg / WORKER).read_text()  # the checkout's own file, which the launch imports
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--timeout", "300")
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "stop", "-i", inv)
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "rollback", "-i", inv)
    assert code == 0, (doc, err)
    assert (pkg / WORKER).read_bytes() == (wheels.package_dir("0.5.9") / WORKER).read_bytes()


def test_seed_layout_with_sglang_dir_set_as_the_example_inventory_suggests(sb: Sandbox, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    home, pkg = seed_layout(sb, tmp_path)
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)}, sglang_dir="~/sglang/python/sglang"
                    .replace("~", str(home)))
    pb = playbook_with(tmp_path, {"command": SIM})
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb, "--check")
    assert code == 0, (doc, err)
    assert doc["plan"]["hosts"][0]["package_dir"] == str(pkg)


def test_launch_cwd_elsewhere_imports_the_package_whole(sb: Sandbox, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    home, pkg = seed_layout(sb, tmp_path)
    (tmp_path / "run").mkdir()
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM, "cwd": str(tmp_path / "run")})
    code, doc, err = cli(capsys, "explain", "-i", inv, pb)
    assert code == 0, (doc, err)
    row = doc["hosts"][0]
    assert not any("namespace" in n for n in row["notes"]), row["notes"]
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0 and doc["plan"]["hosts"][0]["package_dir"] == str(pkg), (doc, err)
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--check")
    assert code == 0, (doc, err)
    assert f'"cwd": "{tmp_path / "run"}"' in json.dumps(doc), doc
    code, doc, err = cli(capsys, "rollback", "-i", inv)
    assert code == 0, (doc, err)


def test_cwd_holding_a_package_shadows_the_installed_one(sb: Sandbox, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """An installed (editable) SGLang, and a full copy of the package in the launch's working dir:
    sys.path[0] wins; explain says so and names the fix (launch.cwd)."""
    home, pkg = seed_layout(sb, tmp_path)
    work = tmp_path / "work"
    shutil.copytree(wheels.package_dir("0.5.9"), work / "sglang")
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM, "cwd": str(work)})
    _, doc, _ = cli(capsys, "explain", "-i", inv, pb)
    row = doc["hosts"][0]
    shadow = [n for n in row["notes"] if "shadows the installed" in n]
    assert shadow and str(pkg) in shadow[0] and "launch.cwd" in shadow[0], row["notes"]
    _, doc, _ = cli(capsys, "deploy", "-i", inv, pb, "--check")
    assert doc["plan"]["hosts"][0]["package_dir"] == str(work / "sglang")


# ----------------------------------------------------------------------------- item 4: start-up hooks


@pytest.mark.parametrize("hook", ["sitecustomize", "pth"])
def test_a_start_up_hook_that_sets_spec_v2_is_judged_and_named(sb: Sandbox, tmp_path: Path, hook: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    home, pkg = seed_layout(sb, tmp_path)
    site = venv_site(sb)
    if hook == "sitecustomize":
        f = site / "sitecustomize.py"
        f.write_text("import os\nos.environ['SGLANG_ENABLE_SPEC_V2'] = '1'\n")
        where = f"{f}:2"
    else:
        f = site / "zz_site_env.pth"
        f.write_text("import os; os.environ.setdefault('SGLANG_ENABLE_SPEC_V2', '1')\n")
        where = f"{f}:1"
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM})
    code, doc, err = cli(capsys, "explain", "-i", inv, pb)
    assert code == 1, (doc, err)
    row = doc["hosts"][0]
    assert row["worker_class"] == "EAGLEWorkerV2", row
    assert f"SGLANG_ENABLE_SPEC_V2=1 set by {where}" in row["refused"], row["refused"]
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb)
    assert code != 0 and MARKER not in (pkg / WORKER).read_text()


def test_a_meta_path_hook_serving_other_code_is_refused(sb: Sandbox, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A sitecustomize installs a meta-path finder that serves eagle_worker from a stock copy: the
    patched file on disk is not what runs. explain and deploy refuse, naming the finder."""
    home, pkg = seed_layout(sb, tmp_path)
    stock = tmp_path / "stock" / "eagle_worker.py"
    stock.parent.mkdir()
    stock.write_bytes((wheels.package_dir("0.5.9") / WORKER).read_bytes())
    site = venv_site(sb)
    (site / "sitecustomize.py").write_text(
        "import importlib.abc, importlib.util, sys\n"
        "class StockLoader(importlib.abc.SourceLoader):\n"
        f"    def get_filename(self, name): return {str(stock)!r}\n"
        "    def get_data(self, path):\n"
        "        with open(path, 'rb') as f: return f.read()\n"
        "class StockWorkers:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'sglang.srt.speculative.eagle_worker':\n"
        f"            return importlib.util.spec_from_loader(name, StockLoader(), origin={str(stock)!r})\n"
        "sys.meta_path.insert(0, StockWorkers())\n")
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM})
    code, doc, err = cli(capsys, "explain", "-i", inv, pb)
    assert code == 1, (doc, err)
    refused = doc["hosts"][0]["refused"]
    assert "StockWorkers" in refused and "sitecustomize.py" in refused and "cannot vouch" in refused, refused
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb)
    assert code != 0 and MARKER not in (pkg / WORKER).read_text()


# ----------------------------------------------------------------------------- item 7: strict editable


def test_strict_editable_install_names_the_fix_that_keeps_the_checkout(sb: Sandbox, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    proj = checkout(home)
    pip_install_editable(sb, proj, "--config-settings", "editable_mode=strict")
    (tmp_path / "run").mkdir()
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM, "cwd": str(tmp_path / "run")})
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb, "--check")
    assert code != 0, (doc, err)
    reason = doc["plan"]["hosts"][0]["reason"]
    assert "editable_mode=compat" in reason and f"sglang_dir: {proj / 'sglang'}" in reason, reason
    assert "replace it with a regular file" not in reason
    # the fix that keeps the checkout, as printed: patch the checkout the links lead to
    inv = inventory(sb, tmp_path / "inv2.yaml", env={"HOME": str(home)}, sglang_dir=str(proj / "sglang"))
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0, (doc, err)
    assert MARKER in (proj / "sglang" / WORKER).read_text()
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--timeout", "300")
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "stop", "-i", inv)
    code, doc, err = cli(capsys, "rollback", "-i", inv)
    assert code == 0, (doc, err)


# ----------------------------------------------------------------------------- item 3: a moved checkout


def test_rollback_from_pristine_writes_only_the_playbooks_files_and_never_over_newer_ones(
        sb: Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A deploy whose record is lost, then the checkout moves on (a newer upstream commit changes a
    sibling under srt/speculative): --from-pristine restores only the files the playbook patches, and
    refuses a patched file that holds neither the release's bytes nor the playbook's patched bytes."""
    home, pkg = seed_layout(sb, tmp_path)
    h = sb.hosts["h01"]
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM})
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0, (doc, err)
    shutil.rmtree(h.state_dir / "deploys")  # the record is lost
    sibling = pkg / "srt" / "speculative" / "spec_info.py"
    newer = sibling.read_bytes() + b"\n# a newer upstream commit\n"
    sibling.write_bytes(newer)
    subprocess.run(["git", "-C", str(home / "sglang"), "-c", "user.email=t@example.invalid", "-c", "user.name=t",
                    "commit", "-qam", "upstream: newer spec_info"], check=True, capture_output=True)

    code, doc, err = cli(capsys, "rollback", "-i", inv, "--from-pristine")
    assert code == 1 and "-p PLAYBOOK" in doc["hosts"][0]["message"], (doc, err)
    assert MARKER in (pkg / WORKER).read_text() and sibling.read_bytes() == newer  # nothing written

    code, doc, err = cli(capsys, "rollback", "-i", inv, "--from-pristine", "-p", pb)
    assert code == 0, (doc, err)
    stock = wheels.package_dir("0.5.9")
    assert (pkg / WORKER).read_bytes() == (stock / WORKER).read_bytes()
    assert sibling.read_bytes() == newer  # not a file the playbook patches: left alone

    # a patched file that moved on upstream (not the release's bytes, not the patched ones): refused
    (pkg / WORKER).write_bytes((stock / WORKER).read_bytes() + b"\n# newer upstream\n")
    code, doc, err = cli(capsys, "rollback", "-i", inv, "--from-pristine", "-p", pb)
    assert code == 1 and "not that release's" in doc["hosts"][0]["message"], (doc, err)
    assert (pkg / WORKER).read_bytes().endswith(b"# newer upstream\n")


# ----------------------------------------------------------------------------- item 2: between releases

GIT_ID = ["-c", "user.email=t@example.invalid", "-c", "user.name=t"]


def upstream_commit(home: Path, edits: dict[Path, bytes], message: str) -> str:
    """Tag HEAD v0.5.9 (once), write `edits`, commit: the checkout is now between releases."""
    repo = str(home / "sglang")
    tags = subprocess.run(["git", "-C", repo, "tag"], capture_output=True, text=True, check=True).stdout
    if "v0.5.9" not in tags.split():
        subprocess.run(["git", "-C", repo, *GIT_ID, "tag", "v0.5.9"], check=True, capture_output=True)
    for p, data in edits.items():
        p.write_bytes(data)
    subprocess.run(["git", "-C", repo, *GIT_ID, "commit", "-qam", message], check=True, capture_output=True)
    return subprocess.run(["git", "-C", repo, "describe", "--tags", "--long"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_between_release_checkout_whose_patched_files_are_the_releases(sb: Sandbox, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    home, pkg = seed_layout(sb, tmp_path)
    sibling = pkg / "srt" / "speculative" / "spec_info.py"
    desc = upstream_commit(home, {sibling: sibling.read_bytes() + b"\n# upstream, after v0.5.9\n"}, "upstream")
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM})
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb, "--check")
    assert code == 0, (doc, err)
    reason = doc["plan"]["hosts"][0]["reason"]
    assert desc in reason and "byte-equal to 0.5.9's, so 0.5.9's patch set applies" in reason, reason


def test_between_release_checkout_ported_onto_the_hosts_bytes(sb: Sandbox, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The checkout is 1 commit after v0.5.9 and that commit changed the worker file the playbook
    patches: refused, naming the commit and the way forward; --port-onto-host merges the 0.5.9 patch
    onto the tree's own bytes, which launch and verify-logs then run; rollback restores them exactly."""
    home, pkg = seed_layout(sb, tmp_path)
    worker = pkg / WORKER
    upstream = b"# upstream change after v0.5.9\n" + worker.read_bytes()
    desc = upstream_commit(home, {worker: upstream}, "upstream: eagle_worker")
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM})

    code, doc, err = cli(capsys, "deploy", "-i", inv, pb, "--check")
    assert code == 1, (doc, err)
    reason = doc["plan"]["hosts"][0]["reason"]
    assert desc in reason and "nearest release 0.5.9" in reason and "--port-onto-host" in reason, reason
    assert worker.read_bytes() == upstream

    code, doc, err = cli(capsys, "deploy", "-i", inv, pb, "--port-onto-host")
    assert code == 0, (doc, err)
    now = worker.read_bytes()
    assert now.startswith(b"# upstream change after v0.5.9\n") and MARKER.encode() in now
    (fp,) = [f for f in doc["plan"]["hosts"][0]["files"] if f["path"] == WORKER]
    assert fp["ported"] and fp["sha_pristine"] == fp["sha_now"]  # recorded against the tree's own hash
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb, "--port-onto-host")
    assert code == 0 and doc["hosts"][0]["status"] == "unchanged", (doc, err)
    code, doc, err = cli(capsys, "launch", "-i", inv, pb, "--timeout", "300")
    assert code == 0, (doc, err)
    code, doc, err = cli(capsys, "verify-logs", "-i", inv, pb)
    assert code == 0, (doc, err)
    cli(capsys, "stop", "-i", inv)
    code, doc, err = cli(capsys, "rollback", "-i", inv)
    assert code == 0, (doc, err)
    assert worker.read_bytes() == upstream


def test_a_python_shim_that_sources_an_env_file_is_named(sb: Sandbox, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`python:` is a shell script that sources a file setting SGLANG_ENABLE_SPEC_V2=1, then execs the
    interpreter: the server runs EAGLEWorkerV2, and explain says which file set it."""
    home, pkg = seed_layout(sb, tmp_path)
    h = sb.hosts["h01"]
    envfile = tmp_path / "sglang.env"
    envfile.write_text("SGLANG_ENABLE_SPEC_V2=1\nexport SGLANG_ENABLE_SPEC_V2\n")
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\n. {envfile}\nexec {h.python} \"$@\"\n")
    shim.chmod(0o755)
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)}, python=str(shim))
    pb = playbook_with(tmp_path, {"command": SIM})
    code, doc, err = cli(capsys, "explain", "-i", inv, pb)
    assert code == 1, (doc, err)
    row = doc["hosts"][0]
    assert row["worker_class"] == "EAGLEWorkerV2", row
    assert f"SGLANG_ENABLE_SPEC_V2=1 set by {shim} (sources {envfile})" in row["refused"], row["refused"]
    assert MARKER not in (pkg / WORKER).read_text()


def test_checkout_moved_on_after_a_deploy_rollback_and_force(sb: Sandbox, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Deployed, then the checkout moved on without a reinstall (a newer commit changes a sibling of
    the patched files): rollback undoes fleetctl's own deploy from its backups and leaves the sibling
    (named); --force onto a worker that moved on names the siblings that are not the release's."""
    home, pkg = seed_layout(sb, tmp_path)
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    pb = playbook_with(tmp_path, {"command": SIM})
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb)
    assert code == 0, (doc, err)
    sibling = pkg / "srt" / "speculative" / "spec_info.py"
    newer = sibling.read_bytes() + b"\n# upstream, after v0.5.9\n"
    subprocess.run(["git", "-C", str(home / "sglang"), *GIT_ID, "tag", "v0.5.9", "HEAD"], check=True,
                   capture_output=True)
    sibling.write_bytes(newer)
    code, doc, err = cli(capsys, "rollback", "-i", inv)
    assert code == 0, (doc, err)
    stock = wheels.package_dir("0.5.9")
    assert (pkg / WORKER).read_bytes() == (stock / WORKER).read_bytes() and sibling.read_bytes() == newer
    assert "spec_info.py" in json.dumps(doc), doc

    desc = upstream_commit(home, {pkg / WORKER: b"# newer\n" + (stock / WORKER).read_bytes()}, "upstream")
    code, doc, err = cli(capsys, "deploy", "-i", inv, pb, "--force", "--check")
    assert code == 0, (doc, err)
    reason = doc["plan"]["hosts"][0]["reason"]
    assert "mixed tree" in reason and "spec_info.py" in reason and desc in reason, reason


def test_a_checkout_never_installed_names_the_install_that_fixes_it(sb: Sandbox, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """~/sglang cloned but never `pip install -e`'d, launched from ~: `import sglang` finds only the
    checkout's root (a namespace portion) and no module; the message names the install that works."""
    home = tmp_path / "home"
    proj = checkout(home)
    inv = inventory(sb, tmp_path / "inv.yaml", env={"HOME": str(home)})
    code, doc, err = cli(capsys, "facts", "-i", inv)
    sg = doc["hosts"][0]["facts"]["sglang"]
    assert not sg["found"] and "namespace package" in sg["error"], (doc, err)
    assert f"-m pip install -e {proj}" in sg["error"], sg["error"]
    # that install (made here by pip --python: the sandbox venv has no pip of its own) fixes it
    pip_install_editable(sb, proj)
    code, doc, err = cli(capsys, "facts", "-i", inv)
    assert code == 0 and doc["hosts"][0]["facts"]["sglang"]["dir"] == str(proj / "sglang"), (doc, err)
