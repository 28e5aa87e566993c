"""`fleetctl patch port` and `fleetctl patch import` against real release files, with `git merge-file`
as the reference for the three-way merge."""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetctl.config.playbook import load_playbook
from fleetctl.engines import wheels
from fleetctl.patching import apply_patch
from fleetctl.patching.merge import merge3

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = ROOT / "playbooks" / "dynamic-spec-disable"
SRC = "0.5.9"
REL = "srt/speculative/eagle_worker.py"


def fleetctl(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "fleetctl", *map(str, args)], capture_output=True, timeout=300)


def git(*args: str | Path, cwd: Path) -> bytes:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_NOSYSTEM": "1",
           "HOME": str(cwd)}
    return subprocess.run(["git", *map(str, args)], cwd=cwd, env=env, check=True, capture_output=True,
                          timeout=60).stdout


@pytest.fixture(scope="module")
def playbook():
    try:
        for v in (SRC, "0.5.7", "0.5.10", "0.5.12"):
            wheels.package_dir(v)
    except Exception as e:
        pytest.skip(f"SGLang wheels unavailable: {e}")
    return load_playbook(PLAYBOOK)


def git_merge_file(tmp: Path, base: bytes, ours: bytes, theirs: bytes) -> tuple[int, bytes]:
    for name, data in (("base", base), ("ours", ours), ("theirs", theirs)):
        (tmp / name).write_bytes(data)
    proc = subprocess.run(["git", "merge-file", "-p", tmp / "ours", tmp / "base", tmp / "theirs"],
                          capture_output=True, timeout=60)
    assert proc.returncode >= 0
    return proc.returncode, proc.stdout


def three(pb, src: str, dst: str, rel: str) -> tuple[bytes, bytes, bytes]:
    pf = next(f for f in pb.versions[src] if f.path == rel)
    base = wheels.pristine_bytes(src, rel)
    return base, apply_patch(base, pf.patch_text, name=rel).output, wheels.pristine_bytes(dst, rel)


# ---------------------------------------------------------------- the merge itself


@pytest.mark.parametrize("dst", ["0.5.10", "0.5.7", "0.5.12"])
def test_merge3_agrees_with_git_merge_file_on_real_files(tmp_path: Path, playbook, dst: str) -> None:
    """Clean merges are byte-identical to git merge-file; both see a conflict in the same files.
    0.5.9 -> 0.5.7 server_args.py: a deletion next to our insertion, which plain difflib alignment
    merged silently while git reports a conflict."""
    seen = {"clean": 0, "conflict": 0}
    for pf in playbook.versions[SRC]:
        base, ours, theirs = three(playbook, SRC, dst, pf.path)
        rc, expected = git_merge_file(tmp_path, base, ours, theirs)
        got = merge3(base, ours, theirs)
        assert got.clean == (rc == 0), f"{dst} {pf.path}: git says {rc} conflict(s), we say {len(got.conflicts)}"
        if got.clean:
            assert got.output == expected, f"{dst} {pf.path}: merged bytes differ from git merge-file"
            seen["clean"] += 1
        else:
            assert b"\n=======\n" in got.output and got.output.count(b"<<<<<<< ") == len(got.conflicts)
            seen["conflict"] += 1
    assert seen == {"0.5.10": {"clean": 3, "conflict": 0}, "0.5.7": {"clean": 2, "conflict": 1},
                    "0.5.12": {"clean": 1, "conflict": 2}}[dst]


def test_merge3_small_cases() -> None:
    base = b"a\nb\nc\nd\n"
    assert merge3(base, b"a\nB\nc\nd\n", b"a\nb\nc\nD\n").output == b"a\nB\nc\nD\n"
    assert merge3(base, b"a\nX\nc\nd\n", b"a\nX\nc\nd\n").output == b"a\nX\nc\nd\n"  # same change once
    r = merge3(base, b"a\nX\nc\nd\n", b"a\nY\nc\nd\n", ours_label="o", theirs_label="t")
    assert r.output == b"a\n<<<<<<< o\nX\n=======\nY\n>>>>>>> t\nc\nd\n"
    assert [(c.start, c.end) for c in r.conflicts] == [(2, 6)]
    # theirs deletes a block that ends in a blank line; ours adds after that blank line: git aligns
    # the deletion down (so it touches our insertion) and conflicts; so must we
    base = b"x\n\np\nq\n\nz\n"
    assert not merge3(base, b"x\n\np\nq\n\nnew\n\nz\n", b"x\n\nz\n").clean


# ---------------------------------------------------------------- fleetctl patch port


# the payload's hand-written releases; the shipped playbook also has the releases ported from them,
# which these tests port again from scratch
HAND_WRITTEN = ("0.5.5.post3", "0.5.9", "0.5.10.post1", "0.5.14")


def copy_playbook(tmp_path: Path) -> Path:
    """The payload playbook with only its hand-written entries (text otherwise as shipped)."""
    dst = tmp_path / "pb"
    shutil.copytree(PLAYBOOK, dst)
    text = (dst / "playbook.yaml").read_text()
    root = yaml.compose(text)
    vers = next(v for k, v in root.value if k.value == "versions")
    keys = [k for k, _ in vers.value]
    lines = text.splitlines(keepends=True)
    drop: set[int] = set()
    for i, k in enumerate(keys):
        if k.value not in HAND_WRITTEN:
            end = keys[i + 1].start_mark.line if i + 1 < len(keys) else vers.end_mark.line
            drop |= set(range(k.start_mark.line, end))
            shutil.rmtree(dst / "patches" / k.value)
    (dst / "playbook.yaml").write_text("".join(line for n, line in enumerate(lines) if n not in drop))
    assert sorted(load_playbook(dst).supported()) == sorted(HAND_WRITTEN)
    return dst


def test_port_clean_writes_patches_and_entry(tmp_path: Path, playbook) -> None:
    pb_dir = copy_playbook(tmp_path)
    before = (pb_dir / "playbook.yaml").read_text()
    proc = fleetctl("patch", "port", pb_dir, "--from", SRC, "--to", "0.5.10")
    assert proc.returncode == 0, proc.stderr
    after = (pb_dir / "playbook.yaml").read_text()
    ops = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False).get_opcodes()
    assert {op[0] for op in ops} == {"equal", "insert"}  # comments and everything else kept
    assert b"carried over from 0.5.9" in proc.stderr

    pb = load_playbook(pb_dir)
    assert [f.path for f in pb.versions["0.5.10"]] == [f.path for f in playbook.versions[SRC]]
    assert pb.unsupported_workers["0.5.10"] == playbook.unsupported_workers[SRC]
    for pf in pb.versions["0.5.10"]:
        base, ours, theirs = three(playbook, SRC, "0.5.10", pf.path)
        assert pf.sha256 == wheels.sha256_bytes(theirs)
        rc, expected = git_merge_file(tmp_path, base, ours, theirs)
        assert rc == 0
        assert apply_patch(theirs, pf.patch_text, name=pf.path).output == expected
        assert pf.patch_path == (pb_dir / "patches" / "0.5.10" / (Path(pf.path).name + ".diff")).resolve()
    check = fleetctl("patch", "check", pb_dir, "--sglang", "0.5.10")
    assert check.returncode == 0, check.stdout + check.stderr


def test_port_conflict_writes_the_clean_files_and_finishes_when_rerun(tmp_path: Path, playbook) -> None:
    """0.5.9 -> 0.5.12: eagle_worker_v2.py merges cleanly, server_args.py and eagle_worker.py conflict.
    Before: only the two .conflict files were written (the clean file's patch was thrown away), and the
    way forward was a `patch new` per conflicted file, after which the user still had to write 0.5.12's
    entry for all three files by hand. Now the clean file's patch is written where a clean port puts it,
    the playbook is left unchanged, and one printed command — the same port, run again once the
    .conflict files are resolved — takes the resolutions and adds the whole 0.5.12 entry."""
    pb_dir = copy_playbook(tmp_path)
    before = (pb_dir / "playbook.yaml").read_bytes()
    proc = fleetctl("patch", "port", pb_dir, "--from", SRC, "--to", "0.5.12")
    assert proc.returncode == 1, proc.stderr
    assert (pb_dir / "playbook.yaml").read_bytes() == before
    out = pb_dir / "patches" / "0.5.12"
    assert sorted(p.name for p in out.iterdir()) == ["eagle_worker.py.conflict", "eagle_worker_v2.py.diff",
                                                     "server_args.py.conflict"]
    base, ours, theirs = three(playbook, SRC, "0.5.12", "srt/speculative/eagle_worker_v2.py")
    rc, expected = git_merge_file(tmp_path, base, ours, theirs)
    assert rc == 0 and apply_patch(theirs, (out / "eagle_worker_v2.py.diff").read_bytes(),
                                   name="eagle_worker_v2.py").output == expected
    err = proc.stderr.decode()
    for name in ("server_args.py", "eagle_worker.py"):
        text = (out / f"{name}.conflict").read_bytes()
        assert text.count(b"<<<<<<< 0.5.9 patched\n") == text.count(b">>>>>>> 0.5.12 pristine\n") >= 1
        lines = text.split(b"\n")
        ranges = [line for line in err.splitlines() if "srt/" in line and f"{name}: conflict at lines" in line]
        assert ranges, err
        for line in ranges:  # every listed range starts and ends on the markers
            a, b = map(int, line.split("conflict at lines ")[1].split(" ")[0].split("-"))
            assert lines[a - 1].startswith(b"<<<<<<< ") and lines[b - 1].startswith(b">>>>>>> ")
    (last,) = [ln for ln in err.splitlines() if ln.startswith("0.5.12: not ported yet")]
    assert "playbook unchanged for 0.5.12" in last and "1 of 3 file(s) ready" in last, last
    assert str(out / "server_args.py.conflict") in last and str(out / "eagle_worker.py.conflict") in last, last
    assert "Traceback" not in err
    (cmd,) = re.findall(r"'(fleetctl [^']+)'", err)
    argv = shlex.split(cmd)
    assert argv[1:3] == ["patch", "port"], cmd

    def resolve(name: str, rel: str) -> None:  # (a resolution: the release's file plus one line)
        (out / f"{name}.conflict").write_bytes(
            wheels.pristine_bytes("0.5.12", rel).replace(b"\nimport ", b"\n# ported\nimport ", 1))

    # one of two resolved: still not ported, the other's .conflict is left as the user has it
    resolve("server_args.py", "srt/server_args.py")
    mine = (out / "eagle_worker.py.conflict").read_bytes() + b"# half done\n"
    (out / "eagle_worker.py.conflict").write_bytes(mine)
    again = fleetctl(*argv[1:])
    assert again.returncode == 1 and (pb_dir / "playbook.yaml").read_bytes() == before, again.stderr
    assert (out / "eagle_worker.py.conflict").read_bytes() == mine
    assert b"server_args.py: conflict" not in again.stderr and b"eagle_worker.py: conflict at lines" in again.stderr
    # both resolved: the command as printed finishes the port
    resolve("eagle_worker.py", "srt/speculative/eagle_worker.py")
    done = fleetctl(*argv[1:])
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["eagle_worker.py.diff", "eagle_worker_v2.py.diff",
                                                     "server_args.py.diff"]
    pb = load_playbook(pb_dir)
    assert [f.path for f in pb.versions["0.5.12"]] == [f.path for f in playbook.versions[SRC]]
    for pf in pb.versions["0.5.12"]:
        assert pf.sha256 == wheels.sha256_bytes(wheels.pristine_bytes("0.5.12", pf.path))
    check = fleetctl("patch", "check", pb_dir, "--sglang", "0.5.12")
    assert check.returncode == 0, check.stdout + check.stderr


def test_port_mixed_targets_writes_the_clean_one(tmp_path: Path, playbook) -> None:
    pb_dir = copy_playbook(tmp_path)
    proc = fleetctl("patch", "port", pb_dir, "--from", SRC, "--to", "0.5.12", "--to", "0.5.10")
    assert proc.returncode == 1
    pb = load_playbook(pb_dir)
    assert "0.5.10" in pb.versions and "0.5.12" not in pb.versions


@pytest.mark.parametrize("args, needle", [
    (["--from", "0.5.8", "--to", "0.5.10"], "no entry for SGLang 0.5.8"),
    (["--from", SRC, "--to", "0.5.14"], "already has an entry for SGLang 0.5.14"),
    (["--from", SRC, "--to", SRC], "is the --from release"),
    (["--from", SRC, "--to", "latest"], "latest"),
])
def test_port_bad_inputs_exit_2_with_one_line(tmp_path: Path, playbook, args: list[str], needle: str) -> None:
    pb_dir = copy_playbook(tmp_path)
    before = (pb_dir / "playbook.yaml").read_bytes()
    proc = fleetctl("patch", "port", pb_dir, *args)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert (pb_dir / "playbook.yaml").read_bytes() == before


# ---------------------------------------------------------------- fleetctl patch import


@pytest.fixture
def fork(tmp_path: Path, playbook) -> Path:
    """An SGLang-like checkout: python/sglang/<REL> as in 0.5.10, then two commits editing it."""
    repo = tmp_path / "sglang"
    target = repo / "python" / "sglang" / REL
    target.parent.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=repo)
    target.write_bytes(wheels.pristine_bytes("0.5.10", REL))
    (repo / "README.md").write_text("fork\n")
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "base", cwd=repo)
    git("tag", "base", cwd=repo)
    lines = target.read_bytes().split(b"\n")
    lines.insert(len(lines) // 2, b"# team fix 1")
    target.write_bytes(b"\n".join(lines))
    git("commit", "-qam", "fix 1", cwd=repo)
    lines.insert(len(lines) // 3, b"# team fix 2")
    target.write_bytes(b"\n".join(lines))
    (repo / "README.md").write_text("fork, edited\n")  # outside python/sglang: not imported
    git("commit", "-qam", "fix 2", cwd=repo)
    (repo / "README.md").write_text("fork, docs only\n")
    git("commit", "-qam", "docs", cwd=repo)
    return repo


def test_import_into_playbook_passes_patch_check(tmp_path: Path, fork: Path) -> None:
    pb_dir = copy_playbook(tmp_path)
    proc = fleetctl("patch", "import", "--git", fork, "base..main", "--version", "0.5.10", "--playbook", pb_dir)
    assert proc.returncode == 0, proc.stderr
    pb = load_playbook(pb_dir)
    [pf] = pb.versions["0.5.10"]
    assert pf.path == REL and pf.patch_text.startswith(f"--- a/{REL}\n".encode())
    out = apply_patch(wheels.pristine_bytes("0.5.10", REL), pf.patch_text, name=REL).output
    assert out == (fork / "python" / "sglang" / REL).read_bytes()
    check = fleetctl("patch", "check", pb_dir, "--sglang", "0.5.10")
    assert check.returncode == 0, check.stdout + check.stderr


def test_import_to_stdout_single_commit(fork: Path) -> None:
    proc = fleetctl("patch", "import", "--git", fork, "main~1", "--version", "0.5.10")
    assert proc.returncode == 0, proc.stderr
    assert b"+# team fix 2\n" in proc.stdout and b"+# team fix 1\n" not in proc.stdout
    assert f"path: {REL}".encode() in proc.stderr


def test_import_that_does_not_apply_names_file_and_hunk(fork: Path) -> None:
    """The range's context holds a line an earlier fork commit changed: it is not in 0.5.10's file,
    so the hunk does not apply exactly, and fuzz never places it."""
    target = fork / "python" / "sglang" / REL
    lines = target.read_bytes().split(b"\n")
    lines[40] += b"  # fork drift"
    target.write_bytes(b"\n".join(lines))
    git("commit", "-qam", "drift", cwd=fork)
    git("tag", "drifted", cwd=fork)
    lines.insert(41, b"# team fix 3")
    target.write_bytes(b"\n".join(lines))
    git("commit", "-qam", "fix 3", cwd=fork)
    proc = fleetctl("patch", "import", "--git", fork, "drifted..main", "--version", "0.5.10")
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and REL in err and "hunk 1" in err, err
    assert not proc.stdout


@pytest.mark.parametrize("rng, needle", [
    ("--output=/tmp/x", "is not A..B or a single commit"),
    ("base...main", "symmetric"),
    ("base..nosuch", "unknown revision nosuch"),
    ("main~1..main", "changes nothing under python/sglang/"),
])
def test_import_bad_inputs_exit_2(fork: Path, rng: str, needle: str) -> None:
    proc = fleetctl("patch", "import", "--git", fork, "--version", "0.5.10", "--", rng)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_import_not_a_repo_exit_2(tmp_path: Path) -> None:
    proc = fleetctl("patch", "import", "--git", tmp_path / "nope", "a..b", "--version", "0.5.10")
    assert proc.returncode == 2
    assert len(proc.stderr.decode().strip().splitlines()) == 1 and b"not a directory" in proc.stderr


# ---------------------------------------------------------------- the playbook edit


SMALL = """\
# top comment
name: x
versions:
  # the first release
  "0.5.9":
    files:
      - path: srt/a.py   # inline comment
        patch: patches/0.5.9/a.py.diff
        sha256: %s

# launch comment
launch: {}
""" % ("0" * 64)


@pytest.mark.parametrize("version, after", [("0.5.8", "name: x\nversions:\n"), ("0.5.10", "\n\n# launch comment")])
def test_add_version_keeps_the_rest_of_the_file(version: str, after: str) -> None:
    import yaml

    from fleetctl.patching.playbook_edit import NewFile, add_version

    new = add_version(SMALL, "pb.yaml", version, [NewFile("srt/a.py", f"patches/{version}/a.py.diff", "1" * 64)],
                      {"W": "why " * 40 + "end"}, note="carried over")
    ops = difflib.SequenceMatcher(None, SMALL.splitlines(), new.splitlines(), autojunk=False).get_opcodes()
    assert {op[0] for op in ops} == {"equal", "insert"}
    data = yaml.safe_load(new)
    assert list(data["versions"]) == sorted([version, "0.5.9"], key=lambda v: [int(n) for n in v.split(".")])
    assert data["versions"][version]["unsupported_workers"] == {"W": "why " * 40 + "end"}
    assert "  # the first release\n  \"0.5.9\"" in new  # a key's own comment stays above it
    assert f'"{version}"' in new.split(after)[0 if version == "0.5.10" else 1]
    with pytest.raises(Exception, match="already has an entry"):
        add_version(new, "pb.yaml", version, [NewFile("srt/a.py", "p", "1" * 64)], {})


def test_port_to_a_release_without_the_file_exits_1(tmp_path: Path, playbook) -> None:
    """0.5.13 has no srt/speculative/eagle_worker.py: named, nothing written for 0.5.13."""
    try:
        wheels.package_dir("0.5.13")
    except Exception as e:
        pytest.skip(f"SGLang wheel unavailable: {e}")
    pb_dir = copy_playbook(tmp_path)
    before = (pb_dir / "playbook.yaml").read_bytes()
    proc = fleetctl("patch", "port", pb_dir, "--from", SRC, "--to", "0.5.13")
    assert proc.returncode == 1
    assert b"0.5.13 srt/speculative/eagle_worker.py: sglang 0.5.13 has no file srt/speculative/eagle_worker.py" \
        in proc.stderr, proc.stderr
    assert (pb_dir / "playbook.yaml").read_bytes() == before
    assert not list((pb_dir / "patches").glob("0.5.13/*.diff"))


def _one_file_playbook(tmp_path: Path, src: str, rel: str, unsupported: dict[str, str]) -> Path:
    """A playbook for `src` patching `rel` (one comment line after its first line, on the real release
    file), with these unsupported_workers."""
    from fleetctl.patching.authoring import make_patch

    pristine = wheels.pristine_bytes(src, rel)
    first, rest = pristine.split(b"\n", 1)
    diff = make_patch(pristine, first + b"\n# team note\n" + rest, rel)
    pb_dir = tmp_path / "pb1"
    (pb_dir / "patches" / src).mkdir(parents=True)
    (pb_dir / "patches" / src / "p.diff").write_bytes(diff)
    (pb_dir / "playbook.yaml").write_text(yaml.safe_dump({
        "name": "one-file",
        "versions": {src: {"files": [{"path": rel, "patch": f"patches/{src}/p.diff",
                                      "sha256": wheels.sha256_bytes(pristine)}],
                           "unsupported_workers": unsupported}}}, sort_keys=False))
    return pb_dir


def test_port_keeps_only_worker_classes_the_target_release_has(tmp_path: Path, playbook) -> None:
    """0.5.9 lists StandaloneWorkerV2 and MultiLayerEagleWorker; 0.5.7 has MultiLayerEagleWorker but
    no StandaloneWorkerV2 (asked of the engine): only the class 0.5.7 has is carried, the other is
    named as dropped. 0.5.8 has both: both are carried, nothing is dropped."""
    from fleetctl.engines import engine

    assert "StandaloneWorkerV2" not in engine().worker_files("0.5.7")
    assert {"StandaloneWorkerV2", "MultiLayerEagleWorker"} <= set(engine().worker_files("0.5.8"))
    why = {"StandaloneWorkerV2": "standalone v2 is not covered", "MultiLayerEagleWorker": "multi-layer is not"}
    pb_dir = _one_file_playbook(tmp_path, SRC, REL, why)
    proc = fleetctl("patch", "port", pb_dir, "--from", SRC, "--to", "0.5.7", "--to", "0.5.8")
    assert proc.returncode == 0, proc.stderr
    pb = load_playbook(pb_dir)
    assert pb.unsupported_workers["0.5.7"] == {"MultiLayerEagleWorker": "multi-layer is not"}
    assert pb.unsupported_workers["0.5.8"] == why
    err = proc.stderr.decode()
    assert ("note: 0.5.7: unsupported_workers of 0.5.9 not carried to 0.5.7: StandaloneWorkerV2 "
            "(SGLang 0.5.7 has no such worker class)") in err, err
    assert "not carried to 0.5.8" not in err
    assert fleetctl("patch", "check", pb_dir, "--sglang", "0.5.7").returncode == 0


def test_port_drops_unsupported_workers_entirely_when_the_target_has_none_of_them(tmp_path: Path,
                                                                                 playbook) -> None:
    pb_dir = _one_file_playbook(tmp_path, SRC, REL, {"StandaloneWorkerV2": "not covered"})
    proc = fleetctl("patch", "port", pb_dir, "--from", SRC, "--to", "0.5.7")
    assert proc.returncode == 0, proc.stderr
    entry = yaml.safe_load((pb_dir / "playbook.yaml").read_text())["versions"]["0.5.7"]
    assert "unsupported_workers" not in entry, entry
    err = proc.stderr.decode()
    assert "carried over" not in err and "not carried to 0.5.7: StandaloneWorkerV2" in err, err


def test_port_bad_version_names_the_option(tmp_path: Path, playbook) -> None:
    pb_dir = copy_playbook(tmp_path)
    for args, needle in ((["--from", "v9", "--to", "0.5.10"], "--from 'v9'"),
                         (["--from", SRC, "--to", "latest"], "--to 'latest'")):
        proc = fleetctl("patch", "port", pb_dir, *args)
        assert proc.returncode == 2 and needle in proc.stderr.decode(), proc.stderr


def test_port_without_conflicts_does_not_ask_to_resolve_them(tmp_path: Path, playbook) -> None:
    """The only problem is a file 0.5.13 does not have: the last line points at it, not at conflicts."""
    pb_dir = _one_file_playbook(tmp_path, SRC, REL, {})
    proc = fleetctl("patch", "port", pb_dir, "--from", SRC, "--to", "0.5.13")
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert "0.5.13: not ported (playbook unchanged for 0.5.13): see the problems above" in err, err
    assert "conflict" not in err
