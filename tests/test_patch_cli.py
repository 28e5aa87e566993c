"""`fleetctl patch apply|check|new` end to end, as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.engines import wheels
from fleetctl.patching import make_patch

VERSION, OTHER = "0.5.9", "0.5.10.post1"
REL = "srt/speculative/eagle_worker.py"


def fleetctl(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "fleetctl", *map(str, args)], capture_output=True, cwd=cwd,
                          timeout=120)


@pytest.fixture(scope="module")
def pristine() -> bytes:
    try:
        return wheels.pristine_bytes(VERSION, REL)
    except Exception as e:
        pytest.skip(f"SGLang wheel unavailable: {e}")


def edited(pristine: bytes) -> bytes:
    """A real-looking edit: one new line in the middle, one changed line near the end."""
    lines = pristine.split(b"\n")
    mid = len(lines) // 2
    lines.insert(mid, lines[mid][: len(lines[mid]) - len(lines[mid].lstrip())] + b"pass  # fleetctl test")
    lines[-5] = lines[-5] + b"  # edited \xe2\x80\x94 by a test"
    return b"\n".join(lines)


# ---------------------------------------------------------------- apply


def test_apply_writes_out_and_prints_offsets(tmp_path: Path, pristine: bytes) -> None:
    new = edited(pristine)
    patch = tmp_path / "p.diff"
    patch.write_bytes(make_patch(pristine, new, REL))
    base = tmp_path / "base.py"
    base.write_bytes(pristine)
    out = tmp_path / "out.py"
    proc = fleetctl("patch", "apply", base, patch, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == new
    assert b"offset" not in proc.stdout

    shifted = tmp_path / "shifted.py"
    shifted.write_bytes(pristine.replace(b"\n", b"\n# one more\n", 1))
    proc = fleetctl("patch", "apply", shifted, patch, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert b"hunk 1 applied at offset +1" in proc.stdout
    assert out.read_bytes() == new.replace(b"\n", b"\n# one more\n", 1)


def test_apply_refusal_exits_1_and_writes_nothing(tmp_path: Path, pristine: bytes) -> None:
    patch = tmp_path / "p.diff"
    patch.write_bytes(make_patch(pristine, edited(pristine), REL))
    lines = pristine.split(b"\n")
    mid = len(lines) // 2
    lines[mid - 1] += b"  # drift"  # the line above the insertion: context of hunk 1
    base = tmp_path / "other.py"
    base.write_bytes(b"\n".join(lines))
    out = tmp_path / "out.py"
    proc = fleetctl("patch", "apply", base, patch, "-o", out)
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert err.count("\n") == 1
    assert err.startswith(f"error: {base}: hunk 1 (@@ -{mid - 2},6 +{mid - 2},7 @@) does not apply: "
                          f"context at line {mid} differs")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.py", "p.diff"]  # no temp file left

    out.write_bytes(b"previous\n")  # an existing OUT is left alone
    assert fleetctl("patch", "apply", base, patch, "-o", out).returncode == 1
    assert out.read_bytes() == b"previous\n"


@pytest.mark.parametrize(("patch_text", "message"), [
    (b"not a patch\n", "not a unified diff"),
    (b"", "the patch is empty"),
    (b"--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n", "truncated"),
])
def test_apply_bad_patch_exits_2(tmp_path: Path, patch_text: bytes, message: str) -> None:
    (tmp_path / "base").write_bytes(b"a\nb\nc\n")
    (tmp_path / "p.diff").write_bytes(patch_text)
    proc = fleetctl("patch", "apply", tmp_path / "base", tmp_path / "p.diff", "-o", tmp_path / "out")
    assert proc.returncode == 2
    assert message in proc.stderr.decode()
    assert str(tmp_path / "p.diff") in proc.stderr.decode()
    assert not (tmp_path / "out").exists()


def test_apply_missing_base_exits_2(tmp_path: Path) -> None:
    (tmp_path / "p.diff").write_bytes(b"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    proc = fleetctl("patch", "apply", tmp_path / "nope", tmp_path / "p.diff", "-o", tmp_path / "out")
    assert proc.returncode == 2
    assert "cannot read base file" in proc.stderr.decode()


# ---------------------------------------------------------------- new


def test_new_then_apply_round_trip(tmp_path: Path, pristine: bytes) -> None:
    new = edited(pristine)
    (tmp_path / "edited.py").write_bytes(new)
    proc = fleetctl("patch", "new", "--sglang", VERSION, "--file", REL, tmp_path / "edited.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"--- a/{REL}\n+++ b/{REL}\n@@ ".encode())
    snippet = proc.stderr.decode()
    assert f"- path: {REL}" in snippet
    assert f"sha256: {wheels.sha256_bytes(pristine)}" in snippet
    assert f"patch: patches/{VERSION}/eagle_worker.py.diff" in snippet

    (tmp_path / "p.diff").write_bytes(proc.stdout)
    (tmp_path / "base.py").write_bytes(pristine)
    proc = fleetctl("patch", "apply", tmp_path / "base.py", tmp_path / "p.diff", "-o", tmp_path / "out.py")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.py").read_bytes() == new

    proc = fleetctl("patch", "new", "--sglang", VERSION, "--file", REL, tmp_path / "edited.py",
                    "-o", tmp_path / "q.diff")
    assert proc.returncode == 0 and proc.stdout == b""
    assert (tmp_path / "q.diff").read_bytes() == (tmp_path / "p.diff").read_bytes()
    assert f"patch: {tmp_path / 'q.diff'}" in proc.stderr.decode()


def test_new_refuses_unchanged_file_and_bad_paths(tmp_path: Path, pristine: bytes) -> None:
    (tmp_path / "same.py").write_bytes(pristine)
    proc = fleetctl("patch", "new", "--sglang", VERSION, "--file", REL, tmp_path / "same.py")
    assert proc.returncode == 2 and b"nothing to patch" in proc.stderr
    proc = fleetctl("patch", "new", "--sglang", VERSION, "--file", "../etc/passwd", tmp_path / "same.py")
    assert proc.returncode == 2 and b"escapes the package dir" in proc.stderr
    proc = fleetctl("patch", "new", "--sglang", VERSION, "--file", "srt/no_such.py", tmp_path / "same.py")
    assert proc.returncode == 2 and b"has no file srt/no_such.py" in proc.stderr


# ---------------------------------------------------------------- check


def write_playbook(d: Path, entries: dict[str, bytes], sha: dict[str, str]) -> Path:
    lines = ["name: test-playbook", "versions:"]
    for version, patch in entries.items():
        p = d / "patches" / version / "eagle_worker.py.diff"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(patch)
        lines += [f'  "{version}":', "    files:", f"      - path: {REL}",
                  f"        patch: patches/{version}/eagle_worker.py.diff", f"        sha256: {sha[version]}"]
    (d / "playbook.yaml").write_text("\n".join(lines) + "\n")
    return d


def test_check_good_playbook(tmp_path: Path, pristine: bytes) -> None:
    pb = write_playbook(tmp_path, {VERSION: make_patch(pristine, edited(pristine), REL)},
                        {VERSION: wheels.sha256_bytes(pristine)})
    proc = fleetctl("patch", "check", pb)
    assert proc.returncode == 0, proc.stderr
    assert VERSION.encode() in proc.stdout and b" ok " in proc.stdout
    proc = fleetctl("patch", "check", pb / "playbook.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    assert [(r["version"], r["path"], r["status"]) for r in doc["results"]] == [(VERSION, REL, "ok")]


def test_check_reports_each_failure_and_exits_1(tmp_path: Path, pristine: bytes) -> None:
    old_version, newer = "0.5.8.post1", "0.5.11"
    other, newest = wheels.pristine_bytes(OTHER, REL), wheels.pristine_bytes(newer, REL)
    broken = pristine.replace(b"import logging\n", b"import logging(\n", 1)
    assert broken != pristine

    def pad(data: bytes) -> bytes:  # two lines the release does not have, near the top
        return data.replace(b"\n", b"\n# not in the release\n", 2)

    lines = other.split(b"\n")
    lines[len(lines) // 2 - 1] += b"  # drift"  # context of edited()'s first hunk
    drifted = b"\n".join(lines)
    entries = {
        VERSION: make_patch(pristine, broken, REL),  # applies, does not compile
        OTHER: make_patch(drifted, edited(drifted), REL),  # made against a file that is not the release's
        old_version: make_patch(pristine, edited(pristine), REL),  # sha pinned wrong below
        newer: make_patch(pad(newest), edited(pad(newest)), REL),  # applies, with offsets
    }
    sha = {VERSION: wheels.sha256_bytes(pristine), OTHER: wheels.sha256_bytes(other),
           old_version: wheels.sha256_bytes(pristine), newer: wheels.sha256_bytes(newest)}
    pb = write_playbook(tmp_path, entries, sha)
    proc = fleetctl("patch", "check", pb, "--json")
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith("error: patch check: 3 of 4 file(s) failed")
    got = {r["version"]: r for r in json.loads(proc.stdout)["results"]}
    assert got[VERSION]["status"] == "does not compile"
    assert f"{REL}:" in got[VERSION]["detail"] and "SyntaxError" in got[VERSION]["detail"]
    assert got[OTHER]["status"] == "does not apply"
    assert got[OTHER]["detail"].startswith(f"{REL}: hunk 1 (@@ ")
    assert got[OTHER]["detail"].endswith(f"does not apply: context at line {len(lines) // 2} differs")
    assert got[old_version]["status"] == "sha mismatch"
    assert got[newer]["status"] == "offsets" and got[newer]["ok"] is True
    assert got[newer]["offsets"] and all(o == -2 for _, o in got[newer]["offsets"])

    assert [r["version"] for r in json.loads(proc.stdout)["results"]] == [old_version, VERSION, OTHER, newer]

    table = fleetctl("patch", "check", pb)  # the table names every status
    assert table.returncode == 1
    for status in (b"does not compile", b"does not apply", b"sha mismatch", b"offsets"):
        assert status in table.stdout

    only = fleetctl("patch", "check", pb, "--sglang", newer, "--json")
    assert only.returncode == 0, only.stderr
    assert [r["version"] for r in json.loads(only.stdout)["results"]] == [newer]

    unknown = fleetctl("patch", "check", pb, "--sglang", "0.4.0")
    assert unknown.returncode == 2 and b"no entry for SGLang 0.4.0" in unknown.stderr
