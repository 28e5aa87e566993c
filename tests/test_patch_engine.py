"""The strict patch engine: parsing, placement, refusals, and agreement with `git apply` on real
SGLang release diffs."""

from __future__ import annotations

import itertools
import os
import random
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetctl.engines import wheels
from fleetctl.errors import EXIT_BAD_INPUT, EXIT_FAILED, InputError
from fleetctl.patching import (
    PatchDoesNotApply,
    PatchError,
    apply_patch,
    is_applied,
    make_patch,
    parse_patch,
    reverse_apply,
)

# ---------------------------------------------------------------- git as the reference

_counter = itertools.count()


def _git_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
               GIT_CEILING_DIRECTORIES=str(home.parent), LC_ALL="C")
    env.pop("GIT_DIR", None)
    return env


def git_diff(tmp: Path, old: bytes, new: bytes, rel: str = "pkg/mod.py", context: int = 3) -> bytes:
    """`git diff --no-index` of two files at the same REL under o/ and n/ (apply it with -p2)."""
    d = tmp / f"diff{next(_counter)}"
    for sub, data in (("o", old), ("n", new)):
        p = d / sub / rel
        p.parent.mkdir(parents=True)
        p.write_bytes(data)
    proc = subprocess.run(
        ["git", "-c", "core.autocrlf=false", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
         "diff", "--no-index", "--no-color", "--no-ext-diff", f"-U{context}", f"o/{rel}", f"n/{rel}"],
        cwd=d, capture_output=True, env=_git_env(d))
    assert proc.returncode == 1, proc.stderr  # 1: the files differ
    return proc.stdout


@dataclass
class GitResult:
    ok: bool
    output: bytes | None
    offsets: list[tuple[int, int]]
    failed_at: int | None  # the stated line git names in "patch failed: FILE:LINE"


def git_apply(tmp: Path, target: bytes, patch: bytes, reverse: bool = False) -> GitResult:
    fp = parse_patch(patch)[0]
    assert fp.old_path is not None
    if fp.old_path.startswith("a/o/"):  # made by git_diff
        strip, rel = 2, fp.old_path[4:]
    else:
        strip, rel = 1, fp.path
    d = tmp / f"apply{next(_counter)}"
    (d / rel).parent.mkdir(parents=True)
    (d / rel).write_bytes(target)
    (d / "p.diff").write_bytes(patch)
    args = ["git", "-c", "core.autocrlf=false", "apply", f"-p{strip}"] + (["-R"] if reverse else [])
    check = subprocess.run([*args, "--check", "p.diff"], cwd=d, capture_output=True, env=_git_env(d))
    if check.returncode != 0:
        m = re.search(rb"patch failed: .*:(\d+)", check.stderr)
        return GitResult(False, None, [], int(m[1]) if m else None)
    proc = subprocess.run([*args, "-v", "p.diff"], cwd=d, capture_output=True, env=_git_env(d))
    assert proc.returncode == 0, proc.stderr
    offsets = [(int(n), int(o)) for n, o in
               re.findall(rb"Hunk #(\d+) succeeded at \d+ \(offset (-?\d+) lines?\)", proc.stderr)]
    return GitResult(True, (d / rel).read_bytes(), offsets, None)


def assert_same_as_git(tmp: Path, target: bytes, patch: bytes, *, reverse: bool = False) -> GitResult:
    """Our engine accepts exactly when git does, with git's output and offsets, and refuses at the
    same hunk git names."""
    git = git_apply(tmp, target, patch, reverse=reverse)
    run = reverse_apply if reverse else apply_patch
    try:
        ours = run(target, patch, name="pkg/mod.py")
    except PatchDoesNotApply as e:
        assert not git.ok, f"git applies it but we refuse: {e}"
        stated = e.hunk.new_start if reverse else e.hunk.old_start
        assert git.failed_at == stated, f"git fails at line {git.failed_at}, we at {e}"
        return git
    assert git.ok, f"we apply it but git refuses (at line {git.failed_at})"
    assert ours.output == git.output
    # git prints a reverse hunk's offset negated; ours is the reversed hunk's, like a forward one
    assert ours.offsets == [(n, -o if reverse else o) for n, o in git.offsets]
    return git


def lines(n: int, prefix: str = "line") -> bytes:
    return b"".join(f"{prefix} {i}\n".encode() for i in range(1, n + 1))


def edit(data: bytes, changes: dict[int, bytes | None], inserts: dict[int, bytes] | None = None) -> bytes:
    """Replace (or delete, with None) 1-based lines, and insert text before 1-based lines."""
    out = []
    for i, line in enumerate(data.split(b"\n")[:-1], start=1):
        if inserts and i in inserts:
            out.append(inserts[i])
        if i in changes:
            if changes[i] is not None:
                out.append(changes[i] + b"\n")
        else:
            out.append(line + b"\n")
    return b"".join(out)


# ---------------------------------------------------------------- parsing

PLAIN = b"""--- srt/mod.py.orig\t2025-01-02 10:00:00.000000000 +0000
+++ srt/mod.py\t2025-01-02 10:01:00.000000000 +0000
@@ -2,3 +2,4 @@
 b
-c
+C
+c2
 d
"""


def test_parse_plain_diff_u() -> None:
    [fp] = parse_patch(PLAIN)
    assert (fp.old_path, fp.new_path, fp.path) == ("srt/mod.py.orig", "srt/mod.py", "srt/mod.py")
    [h] = fp.hunks
    assert (h.number, h.header, h.old_start, h.old_count, h.new_start, h.new_count) == (1, "@@ -2,3 +2,4 @@", 2, 3, 2, 4)
    assert h.old_lines == [b"b\n", b"c\n", b"d\n"]
    assert h.new_lines == [b"b\n", b"C\n", b"c2\n", b"d\n"]
    assert apply_patch(b"a\nb\nc\nd\ne\n", PLAIN, name="m").output == b"a\nb\nC\nc2\nd\ne\n"


def test_parse_git_format_with_preamble_and_several_files(tmp_path: Path) -> None:
    one = git_diff(tmp_path, lines(10), edit(lines(10), {5: b"five"}), rel="srt/a.py")
    two = git_diff(tmp_path, lines(10), edit(lines(10), {1: b"one"}), rel="srt/b.py")
    text = b"From 123 Mon Sep 17 00:00:00 2001\nSubject: two files\n\n" + one + two + b"-- \n2.39.5\n"
    fps = parse_patch(text)
    assert [fp.path for fp in fps] == ["n/srt/a.py", "n/srt/b.py"]
    assert [fp.hunks[0].header for fp in fps] == ["@@ -2,7 +2,7 @@", "@@ -1,4 +1,4 @@"]
    with pytest.raises(PatchError, match=r"touches 2 files \(n/srt/a.py, n/srt/b.py\)"):
        apply_patch(lines(10), text, name="x")


def test_quoted_git_paths() -> None:
    patch = b'--- "a/srt/t\\303\\251st\\tx.py"\n+++ "b/srt/t\\303\\251st\\tx.py"\n@@ -1 +1 @@\n-a\n+b\n'
    [fp] = parse_patch(patch)
    assert fp.path == "srt/t\u00e9st\tx.py"


def test_omitted_counts_and_section_heading() -> None:
    patch = b"--- a/f\n+++ b/f\n@@ -3 +3 @@ def section():\n-line 3\n+LINE 3\n"
    [fp] = parse_patch(patch)
    h = fp.hunks[0]
    assert (h.old_count, h.new_count, h.header) == (1, 1, "@@ -3 +3 @@")
    # no context at all, in the middle of the file: nothing anchors it
    with pytest.raises(PatchError, match="no context lines"):
        apply_patch(lines(5), patch, name="f")
    one = b"--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+y\n"  # a whole one-line file is anchored at both ends
    assert apply_patch(b"x\n", one, name="f").output == b"y\n"
    with pytest.raises(PatchDoesNotApply):
        apply_patch(b"x\nmore\n", one, name="f")


@pytest.mark.parametrize(("data", "message"), [
    (b"", "the patch is empty"),
    (b"  \n\n\t\n", "the patch is empty"),
    (b"hello\nthis is not a diff\n", "not a unified diff"),
    (b"*** a/f\n--- b/f\n***************\n", "not a unified diff"),
    (b"@@ -1,2 +1,2 @@\n-a\n+b\n c\n", "hunk without a file header"),
    (b"--- a/f\n+++ b/f\nno hunk here\n", "not followed by a hunk"),
    (b"--- a/f\n+++ b/f\n@@ -1,x +1,2 @@\n a\n", "malformed hunk header"),
    (b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n", r"hunk 1 \(@@ -1,3 \+1,3 @@\) is truncated"),
    (b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c", "no line ending: the patch looks truncated"),
    (b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n@@ -9,2 +9,2 @@\n x\n-y\n+Y\n", "ends early at line 7"),
    (b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n+C\n", "has more lines than its header counts"),
    (b"--- a/f\n+++ b/f\n@@ -1,2 +1,3 @@\n a\n-b\n+B\n c\n", "more lines than its header counts"),
    (b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n b\n", "changes nothing"),
    (b"--- a/f\n+++ b/f\n@@ -0,2 +1,2 @@\n-a\n+b\n a\n", "line 0 with a non-zero count"),
    (b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n\\ No newline at end of file\n a\n-b\n+B\n", "misplaced"),
])
def test_refuses_bad_patches(data: bytes, message: str) -> None:
    with pytest.raises(PatchError, match=message) as info:
        apply_patch(lines(5), data, name="srt/f.py")
    assert info.value.exit_code == EXIT_BAD_INPUT
    assert str(info.value).startswith("srt/f.py: ")


@pytest.mark.parametrize(("data", "why"), [
    (b"diff --git a/f b/f\nnew file mode 100644\nindex 0000000..e69de29\n--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+x\n",
     "creates a new file"),
    (b"--- /dev/null\n+++ b/f\n@@ -0,0 +1,2 @@\n+x\n+y\n", "creates a new file"),
    (b"diff --git a/f b/f\ndeleted file mode 100644\n--- a/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n", "deletes the file"),
    (b"diff --git a/f b/g\nsimilarity index 100%\nrename from f\nrename to g\n", "renames the file"),
    (b"diff --git a/f b/f\nold mode 100644\nnew mode 100755\n", "changes the file mode"),
    (b"diff --git a/f b/f\nindex 1..2 100644\nBinary files a/f and b/f differ\n", "binary patch"),
    (b"--- a/f\n+++ b/f\n@@ -0,0 +1,2 @@\n+x\n+y\n", r"adds to an empty file \(a new-file hunk\)"),
])
def test_refuses_unsupported_patches(data: bytes, why: str) -> None:
    with pytest.raises(PatchError, match=why):
        apply_patch(b"", data, name="f")


# ---------------------------------------------------------------- placement and refusals


def test_exact_apply_has_no_offsets(tmp_path: Path) -> None:
    old = lines(60)
    new = edit(old, {10: b"ten", 40: None}, inserts={55: b"new before 55\n"})
    patch = git_diff(tmp_path, old, new)
    res = apply_patch(old, patch, name="m")
    assert res.output == new
    assert res.offsets == []
    assert len(parse_patch(patch)[0].hunks) == 3


def test_offsets_are_reported_per_hunk_and_match_git(tmp_path: Path) -> None:
    old = lines(80)
    new = edit(old, {20: b"twenty", 60: b"sixty"})
    patch = git_diff(tmp_path, old, new)
    shifted = edit(old, {}, inserts={5: b"pad 1\npad 2\npad 3\n", 40: b"pad 4\n"})
    res = apply_patch(shifted, patch, name="m")
    assert res.offsets == [(1, 3), (2, 4)]
    assert res.output == edit(new, {}, inserts={5: b"pad 1\npad 2\npad 3\n", 40: b"pad 4\n"})
    assert assert_same_as_git(tmp_path, shifted, patch).offsets == [(1, 3), (2, 4)]
    fewer = edit(old, {2: None, 3: None})
    assert apply_patch(fewer, patch, name="m").offsets == [(1, -2), (2, -2)]
    assert_same_as_git(tmp_path, fewer, patch)


def _with_blocks(at: list[int], total: int = 30) -> bytes:
    out = [f"filler {i}\n".encode() for i in range(total)]
    for i in at:
        out[i:i + 3] = [b"x\n", b"old\n", b"x\n"]
    return b"".join(out)


@pytest.mark.parametrize(("copies", "offset"), [
    ([9], 0),
    ([6, 17], -3),  # nearest wins
    ([7, 11], 2),  # equally near: forward first, like git
    ([8, 13], -1),
    ([2, 20], -7),
])
def test_search_is_nearest_first_forward_before_backward(tmp_path: Path, copies: list[int], offset: int) -> None:
    patch = b"--- a/f\n+++ b/f\n@@ -10,3 +10,3 @@\n x\n-old\n+new\n x\n"
    target = _with_blocks(copies)
    res = apply_patch(target, patch, name="f")
    assert res.offsets == ([(1, offset)] if offset else [])
    assert res.output.split(b"\n").index(b"new") == 9 + offset + 1
    assert_same_as_git(tmp_path, target, patch)


def test_no_fuzz_context_mismatch_names_file_hunk_and_line(tmp_path: Path) -> None:
    old = lines(40)
    new = edit(old, {5: b"five", 22: b"twenty-two", 23: b"extra 23"}, inserts={24: b"ins\n"})
    patch = git_diff(tmp_path, old, new)
    target = edit(old, {21: b"line 21 "})  # one trailing space in hunk 2's context
    with pytest.raises(PatchDoesNotApply) as info:
        apply_patch(target, patch, name="srt/speculative/eagle_worker.py")
    e = info.value
    assert str(e) == ("srt/speculative/eagle_worker.py: hunk 2 (@@ -19,8 +19,9 @@) does not apply: "
                      "context at line 21 differs")
    assert (e.hunk.number, e.lineno, e.exit_code) == (2, 21, EXIT_FAILED)
    assert isinstance(e, InputError)
    assert_same_as_git(tmp_path, target, patch)
    removed = edit(old, {22: b"line 22 changed"})
    with pytest.raises(PatchDoesNotApply, match=r"hunk 2 .* removed line at line 22 differs"):
        apply_patch(removed, patch, name="f")


def test_all_or_nothing_when_a_later_hunk_fails(tmp_path: Path) -> None:
    old = lines(100)
    new = edit(old, {10: b"ten", 50: b"fifty", 90: b"ninety"})
    patch = git_diff(tmp_path, old, new)
    target = edit(old, {90: b"someone else's ninety"})
    with pytest.raises(PatchDoesNotApply, match=r"hunk 3 \(@@ -87,7 \+87,7 @@\) does not apply: removed line at line 90"):
        apply_patch(target, patch, name="f")
    assert not is_applied(target, patch)


def test_hunk_at_line_1_must_match_at_the_start(tmp_path: Path) -> None:
    old = lines(20)
    new = edit(old, {1: b"first"})
    patch = git_diff(tmp_path, old, new)
    assert parse_patch(patch)[0].hunks[0].old_start == 1
    assert apply_patch(old, patch, name="f").output == new
    target = b"# header\n" + old
    with pytest.raises(PatchDoesNotApply, match="must match at the start of the file, and its lines are at line 2"):
        apply_patch(target, patch, name="f")
    assert_same_as_git(tmp_path, target, patch)


def test_hunk_without_trailing_context_must_match_at_the_end(tmp_path: Path) -> None:
    old = lines(20)
    new = old + b"appended\n"
    patch = git_diff(tmp_path, old, new)
    assert parse_patch(patch)[0].hunks[0].trailing == 0
    assert apply_patch(old, patch, name="f").output == new
    target = old + b"line 21\n"
    with pytest.raises(PatchDoesNotApply, match="must match at the end of the file, and its lines are at line 18"):
        apply_patch(target, patch, name="f")
    assert_same_as_git(tmp_path, target, patch)


def test_lines_written_by_an_earlier_hunk_are_not_matched_again(tmp_path: Path) -> None:
    base = b"a\nb\nc\nd\ne\nf\ng\nh\ni\n"
    patch = (b"--- a/f\n+++ b/f\n"
             b"@@ -2,3 +2,3 @@\n b\n-c\n+X\n d\n"
             b"@@ -2,3 +2,3 @@\n b\n-X\n+Y\n d\n")  # hunk 2 would need hunk 1's output
    with pytest.raises(PatchDoesNotApply, match="hunk 2"):
        apply_patch(base, patch, name="f")
    assert_same_as_git(tmp_path, base, patch)


def test_crlf_is_kept_and_lf_patch_on_crlf_file_is_refused(tmp_path: Path) -> None:
    old = lines(30).replace(b"\n", b"\r\n")
    new = edit(lines(30), {12: b"twelve"}).replace(b"\n", b"\r\n")
    patch = git_diff(tmp_path, old, new)
    assert b"-line 12\r\n+twelve\r\n" in patch
    res = apply_patch(old, patch, name="f")
    assert res.output == new
    assert reverse_apply(new, patch, name="f").output == old
    lf_patch = git_diff(tmp_path, lines(30), edit(lines(30), {12: b"twelve"}))
    with pytest.raises(PatchDoesNotApply, match=r"context at line 9 differs \(line endings: CRLF vs LF\)"):
        apply_patch(old, lf_patch, name="f")
    mixed = old.replace(b"line 20\r\n", b"line 20\n")  # a lone LF line inside a CRLF file survives
    assert apply_patch(mixed, patch, name="f").output == new.replace(b"line 20\r\n", b"line 20\n")
    assert_same_as_git(tmp_path, mixed, patch)


@pytest.mark.parametrize(("old", "new"), [
    (b"a\nb\nc\nd\nlast", b"a\nb\nc\nd\nLAST"),  # change a last line that has no newline
    (b"a\nb\nc\nd\nlast", b"a\nb\nc\nd\nlast\n"),  # add the final newline
    (b"a\nb\nc\nd\nlast\n", b"a\nb\nc\nd\nlast"),  # drop it
    (b"a\nb\nc\nd\nlast", b"a\nb\nc\nd\nlast\nmore"),  # append after it
    (b"a\r\nb\r\nc\r\nd\r\nlast\r", b"a\r\nb\r\nC\r\nd\r\nlast\r"),  # CR before a missing LF
])
def test_no_newline_at_end_of_file(tmp_path: Path, old: bytes, new: bytes) -> None:
    patch = git_diff(tmp_path, old, new)
    assert b"\\ No newline at end of file" in patch
    assert apply_patch(old, patch, name="f").output == new
    assert reverse_apply(new, patch, name="f").output == old
    assert is_applied(new, patch) and not is_applied(old, patch)
    ours = make_patch(old, new, "f")
    assert ours.count(b"\\ No newline") == patch.count(b"\\ No newline")
    assert apply_patch(old, ours, name="f").output == new


def test_missing_final_newline_is_a_difference() -> None:
    patch = b"--- a/f\n+++ b/f\n@@ -3,2 +3,2 @@\n c\n-d\n\\ No newline at end of file\n+D\n\\ No newline at end of file\n"
    assert apply_patch(b"a\nb\nc\nd", patch, name="f").output == b"a\nb\nc\nD"
    with pytest.raises(PatchDoesNotApply, match=r"removed line at line 4 differs \(newline at end of file\)"):
        apply_patch(b"a\nb\nc\nd\n", patch, name="f")


def test_non_ascii_and_non_utf8_bytes_pass_through(tmp_path: Path) -> None:
    old = ("# server args – “quoted” — dash\n" + "x = 1\n" * 5 + "y = 'é'\n" + "z\n" * 5).encode()
    old += b"latin1 \xe9\xff\xfe\n" + b"lone \r cr\n" + b"end\n"
    new = old.replace("y = 'é'".encode(), "y = 'ü' — ok".encode()).replace(b"\xe9\xff", b"\xff\xe9")
    patch = git_diff(tmp_path, old, new)
    assert apply_patch(old, patch, name="f").output == new
    assert apply_patch(old, make_patch(old, new, "f"), name="f").output == new
    assert_same_as_git(tmp_path, old, patch)


def test_a_bare_newline_is_an_empty_context_line() -> None:
    patch = b"--- a/f\n+++ b/f\n@@ -1,4 +1,4 @@\n a\n\n-b\n+B\n c\n"
    assert apply_patch(b"a\n\nb\nc\nd\n", patch, name="f").output == b"a\n\nB\nc\nd\n"


def test_many_hunks_are_fast(tmp_path: Path) -> None:
    old = lines(4000)
    new = edit(old, {i: f"changed {i}".encode() for i in range(10, 4000, 25)})
    patch = git_diff(tmp_path, old, new)
    assert len(parse_patch(patch)[0].hunks) >= 150
    started = time.thread_time()  # CPU time of this thread: what the patcher costs, not how loaded the machine is
    res = apply_patch(old, patch, name="f")
    assert time.thread_time() - started < 0.5  # (a quadratic patcher took seconds)
    assert res.output == new and res.offsets == []
    shifted = b"# pad\n" * 0 + old.replace(b"line 2\n", b"line 2\nextra\n", 1)
    assert apply_patch(shifted, patch, name="f").offsets[0] == (1, 1)
    assert reverse_apply(new, patch, name="f").output == old


def test_already_applied_detection(tmp_path: Path) -> None:
    old = lines(50)
    new = edit(old, {7: b"seven"}, inserts={30: b"inserted\n"})
    patch = git_diff(tmp_path, old, new)
    assert is_applied(new, patch)
    assert not is_applied(old, patch)
    with pytest.raises(PatchDoesNotApply, match=r"hunk 1 \(@@ -4,7 \+4,7 @@\) cannot be undone: added line at line 7"):
        reverse_apply(old, patch, name="f")
    with pytest.raises(PatchError, match="empty"):
        is_applied(new, b"")


# ---------------------------------------------------------------- make_patch


def test_make_patch_headers_and_equal_inputs() -> None:
    assert make_patch(b"a\n", b"a\n", "x.py") == b""
    patch = make_patch(lines(10), edit(lines(10), {5: b"five"}), "srt/x.py")
    assert patch.startswith(b"--- a/srt/x.py\n+++ b/srt/x.py\n@@ -2,7 +2,7 @@\n")
    assert parse_patch(patch)[0].path == "srt/x.py"
    with pytest.raises(ValueError):
        make_patch(b"a\n", b"b\n", "x.py", context=0)
    with pytest.raises(PatchError, match="empty"):
        make_patch(b"", b"b\n", "x.py")


def test_make_patch_round_trips_random_edits(tmp_path: Path) -> None:
    rng = random.Random(1234)
    vocab = [b"alpha", b"beta", b"gamma", b"\xe2\x80\x94 dash", b"", b"  indented", b"\xff raw"]
    for trial in range(150):
        eol = b"\r\n" if trial % 5 == 0 else b"\n"
        old_lines = [rng.choice(vocab) + eol for _ in range(rng.randint(1, 60))]
        new_lines = list(old_lines)
        for _ in range(rng.randint(1, 6)):
            op, at = rng.random(), rng.randint(0, len(new_lines))
            if op < 0.4:
                new_lines.insert(at, rng.choice(vocab) + eol)
            elif new_lines and op < 0.7:
                del new_lines[min(at, len(new_lines) - 1)]
            elif new_lines:
                new_lines[min(at, len(new_lines) - 1)] = b"edited %d" % trial + eol
        old, new = b"".join(old_lines), b"".join(new_lines)
        if trial % 3 == 0:
            old = old.rstrip(b"\r\n")
        if trial % 4 == 0:
            new = new.rstrip(b"\r\n")
        patch = make_patch(old, new, "f.py", context=1 + trial % 3)
        if old == new:
            assert patch == b""
            continue
        assert apply_patch(old, patch, name="f.py").output == new, trial
        assert reverse_apply(new, patch, name="f.py").output == old, trial
        if trial % 15 == 0:  # git agrees that our patches are what they claim
            assert git_apply(tmp_path, old, patch).output == new


# ---------------------------------------------------------------- real SGLang releases

VERSIONS = ["0.5.6.post2", "0.5.8.post1", "0.5.9", "0.5.10.post1", "0.5.11"]
PAIRS = [("0.5.8.post1", "0.5.9"), ("0.5.9", "0.5.10.post1"), ("0.5.10.post1", "0.5.11")]
FILES = ["srt/server_args.py", "srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py"]


@pytest.fixture(scope="module")
def release() -> dict[tuple[str, str], bytes]:
    try:
        return {(v, f): wheels.pristine_bytes(v, f) for v in VERSIONS for f in FILES}
    except Exception as e:  # no cached wheel and no registry
        pytest.skip(f"SGLang wheels unavailable: {e}")


@pytest.fixture(scope="module")
def release_diffs(release: dict[tuple[str, str], bytes], tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[tuple[str, str, str], bytes]:
    tmp = tmp_path_factory.mktemp("release-diffs")
    return {(a, b, f): git_diff(tmp, release[a, f], release[b, f], rel=f) for a, b in PAIRS for f in FILES}


def _ids(case: tuple[str, str, str]) -> str:
    return f"{case[0]}-{case[1]}-{Path(case[2]).name}"


CASES = [(a, b, f) for a, b in PAIRS for f in FILES]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_release_diff_applies_exactly_and_reverts(case: tuple[str, str, str], release: dict, release_diffs: dict) -> None:
    a, b, f = case
    patch = release_diffs[case]
    started = time.thread_time()  # CPU time of this thread, not wall time: the same on a loaded machine
    res = apply_patch(release[a, f], patch, name=f)
    assert time.thread_time() - started < 0.5
    assert res.output == release[b, f]
    assert res.offsets == []
    assert reverse_apply(release[b, f], patch, name=f).output == release[a, f]
    assert is_applied(release[b, f], patch)
    assert not is_applied(release[a, f], patch)


def test_server_args_diff_has_over_100_hunks(release_diffs: dict) -> None:
    assert len(parse_patch(release_diffs["0.5.9", "0.5.10.post1", "srt/server_args.py"])[0].hunks) > 100


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_release_diff_on_other_releases_agrees_with_git(case: tuple[str, str, str], release: dict,
                                                        release_diffs: dict, tmp_path: Path) -> None:
    a, _, f = case
    patch = release_diffs[case].replace(f"/{f}".encode(), b"/pkg/mod.py")
    for other in VERSIONS:
        if other != a:
            assert_same_as_git(tmp_path, release[other, f], patch)
            assert_same_as_git(tmp_path, release[other, f], patch, reverse=True)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_release_diff_on_locally_edited_file_agrees_with_git(case: tuple[str, str, str], release: dict,
                                                             release_diffs: dict, tmp_path: Path) -> None:
    """Insert and delete lines around the file: git and we agree on accepting (with the same
    output and offsets) or refusing (at the same hunk)."""
    a, _, f = case
    patch = release_diffs[case].replace(f"/{f}".encode(), b"/pkg/mod.py")
    hunks = parse_patch(patch)[0].hunks
    src = release[a, f].split(b"\n")
    rng = random.Random(f"{a}{f}")
    for _ in range(6):
        target = list(src)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(1, len(target) - 1)
            if rng.random() < 0.5:
                target.insert(at, b"# local edit")
            else:
                del target[at]
        assert_same_as_git(tmp_path, b"\n".join(target), patch)
    # three lines added after line 1 shift every hunk by +3 (a hunk at line 1 would be refused)
    pad = b"\n".join(src[:1] + [b"# pad"] * 3 + src[1:])
    git = assert_same_as_git(tmp_path, pad, patch)
    if hunks[0].old_start == 1:
        assert not git.ok
    else:
        assert git.offsets == [(h.number, 3) for h in hunks]
