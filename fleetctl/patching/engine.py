"""A small strict unified-diff engine with `git apply` semantics.

Everything is bytes: files and patches are split on b"\\n" only, line endings are kept, nothing is
ever decoded (CRLF, a lone CR, a missing final newline and non-UTF-8 bytes all survive untouched).

Placement follows `git apply`: hunks are applied in order to an in-memory image of the file; each
hunk's old lines must match exactly, searched outward from the line the header names (that line,
then +1, -1, +2, -2, ...); lines already written by an earlier hunk are never matched again; a hunk
starting at line 1 must match at the start of the file and a hunk without trailing context at the
end. There is no fuzz. One stricter rule than git: a hunk with no context lines at all (diff -U0)
is refused unless it covers the whole file, because nothing anchors it.

Any failure raises and nothing is produced: the output is all hunks or an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetctl.errors import EXIT_FAILED, InputError

CONTEXT, REMOVED, ADDED = " ", "-", "+"

_HUNK_RE = re.compile(rb"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)", re.DOTALL)
_GIT_EXTENDED = (
    b"old mode ", b"new mode ", b"deleted file mode ", b"new file mode ", b"copy from ", b"copy to ",
    b"rename from ", b"rename to ", b"rename old ", b"rename new ", b"similarity index ",
    b"dissimilarity index ", b"index ", b"Binary files ", b"GIT binary patch",
)
_UNSUPPORTED = (
    (b"new file mode ", "creates a new file"),
    (b"deleted file mode ", "deletes the file"),
    (b"rename from ", "renames the file"),
    (b"copy from ", "copies the file"),
    (b"old mode ", "changes the file mode"),
    (b"Binary files ", "is a binary patch"),
    (b"GIT binary patch", "is a binary patch"),
)


class PatchError(InputError):
    """A patch that cannot be parsed or is not supported (exit 2)."""

    reference = "patch-invalid"


class PatchDoesNotApply(PatchError):
    """A well-formed patch that does not fit the file (exit 1). Carries the failing hunk."""

    reference = "patch-does-not-apply"

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, hunk: Hunk, line: int | None) -> None:
        super().__init__(message)
        self.hunk = hunk
        self.lineno = line


@dataclass(frozen=True)
class Hunk:
    number: int  # 1-based, in patch order
    header: str  # "@@ -a,b +c,d @@" as written in the patch
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[tuple[str, bytes], ...]  # (CONTEXT | REMOVED | ADDED, text with its line ending)

    @property
    def old_lines(self) -> list[bytes]:
        return [t for k, t in self.lines if k != ADDED]

    @property
    def new_lines(self) -> list[bytes]:
        return [t for k, t in self.lines if k != REMOVED]

    @property
    def leading(self) -> int:
        """Context lines before the first change."""
        n = 0
        for k, _ in self.lines:
            if k != CONTEXT:
                break
            n += 1
        return n

    @property
    def trailing(self) -> int:
        """Context lines after the last change."""
        n = 0
        for k, _ in reversed(self.lines):
            if k != CONTEXT:
                break
            n += 1
        return n

    def reversed(self) -> Hunk:
        swap = {CONTEXT: CONTEXT, REMOVED: ADDED, ADDED: REMOVED}
        return Hunk(self.number, self.header, self.new_start, self.new_count, self.old_start, self.old_count,
                    tuple((swap[k], t) for k, t in self.lines))


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # as written after '---' (None for /dev/null)
    new_path: str | None  # as written after '+++'
    hunks: tuple[Hunk, ...]
    unsupported: str | None = None  # why the engine will not apply it (new file, rename, ...)

    @property
    def path(self) -> str:
        """The file's path without git's a/ b/ prefixes."""
        raw = self.new_path or self.old_path or "?"
        both = [p for p in (self.old_path, self.new_path) if p is not None]
        if both and all(p[:2] in ("a/", "b/") for p in both):
            return raw[2:]
        return raw


@dataclass(frozen=True)
class ApplyResult:
    output: bytes
    offsets: list[tuple[int, int]]  # (hunk number, offset in lines) for hunks not at their stated line


def split_lines(data: bytes) -> list[bytes]:
    """Split on b"\\n" only, keeping line endings; a last line without one is kept as is."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


# ---------------------------------------------------------------- parsing


def parse_patch(data: bytes, *, name: str = "<patch>") -> list[FilePatch]:
    """Parse a unified diff (plain `diff -u` or git format) into one FilePatch per file."""
    if not data.strip():
        raise PatchError(f"{name}: the patch is empty")
    lines = split_lines(data)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"diff --git "):
            fp, i = _parse_git_file(lines, i, name)
            files.append(fp)
        elif line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            old, new = _name(lines[i]), _name(lines[i + 1])
            hunks, i = _parse_hunks(lines, i + 2, name)
            files.append(FilePatch(old, new, hunks, _new_or_deleted(old, new)))
        elif line.startswith(b"@@ -"):
            raise PatchError(f"{name}: line {i + 1}: hunk without a file header ('---' and '+++' lines)")
        else:
            i += 1  # preamble, commit message, `diff -u` command lines, text between files
    if not files:
        raise PatchError(f"{name}: not a unified diff: no '---'/'+++' file header found",
                         hint="make it with `diff -u OLD NEW` or `git diff`")
    return files


def _parse_git_file(lines: list[bytes], i: int, name: str) -> tuple[FilePatch, int]:
    start = i
    i += 1
    unsupported: str | None = None
    while i < len(lines) and lines[i].startswith(_GIT_EXTENDED):
        for prefix, why in _UNSUPPORTED:
            if lines[i].startswith(prefix) and unsupported is None:
                unsupported = why
        i += 1
    if i + 1 < len(lines) and lines[i].startswith(b"--- ") and lines[i + 1].startswith(b"+++ "):
        old, new = _name(lines[i]), _name(lines[i + 1])
        hunks, i = _parse_hunks(lines, i + 2, name)
        return FilePatch(old, new, hunks, unsupported or _new_or_deleted(old, new)), i
    if unsupported is None:
        raise PatchError(f"{name}: line {start + 1}: git file header without '---'/'+++' lines or hunks")
    words = lines[start].rstrip(b"\r\n").split(b" ")
    path = words[-1].decode("utf-8", "replace") if len(words) >= 4 else "?"
    return FilePatch(path, path, (), unsupported), i


def _new_or_deleted(old: str | None, new: str | None) -> str | None:
    if old is None:
        return "creates a new file"
    if new is None:
        return "deletes the file"
    return None


def _name(line: bytes) -> str | None:
    raw = line[4:].rstrip(b"\r\n")
    if raw.startswith(b'"'):
        raw = _unquote(raw)
    else:
        raw = raw.split(b"\t", 1)[0]  # diff -u puts a timestamp after a tab
    text = raw.decode("utf-8", "replace")
    return None if text == "/dev/null" else text


def _unquote(raw: bytes) -> bytes:
    """git's C-style quoted path: "a/t\\303\\251st\\tx"."""
    out = bytearray()
    escapes = {ord("n"): 10, ord("t"): 9, ord('"'): 34, ord("\\"): 92, ord("a"): 7, ord("b"): 8,
               ord("f"): 12, ord("r"): 13, ord("v"): 11}
    i, end = 1, raw.rfind(b'"')
    while i < end:
        c = raw[i]
        if c == 92 and i + 1 < end:
            nxt = raw[i + 1]
            if 48 <= nxt <= 55 and i + 3 < end + 1:
                out.append(int(raw[i + 1:i + 4], 8) & 0xFF)
                i += 4
                continue
            out.append(escapes.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


def _parse_hunks(lines: list[bytes], i: int, name: str) -> tuple[tuple[Hunk, ...], int]:
    hunks: list[Hunk] = []
    while i < len(lines) and lines[i].startswith(b"@@ -"):
        hunk, i = _parse_hunk(lines, i, len(hunks) + 1, name)
        hunks.append(hunk)
        if i < len(lines) and _looks_like_body(lines, i):
            raise PatchError(f"{name}: line {i + 1}: hunk {hunk.number} ({hunk.header}) has more lines "
                             f"than its header counts (corrupt or hand-edited patch)")
    if not hunks:
        raise PatchError(f"{name}: line {i}: file header is not followed by a hunk ('@@ -a,b +c,d @@')")
    return tuple(hunks), i


def _looks_like_body(lines: list[bytes], i: int) -> bool:
    line = lines[i]
    if line.startswith((b" ", b"+", b"\\")):
        return True
    if line.startswith(b"-"):
        next_is_new = i + 1 < len(lines) and lines[i + 1].startswith(b"+++ ")
        is_header = line.startswith(b"--- ") and next_is_new
        return not is_header and line.rstrip(b"\r\n") not in (b"--", b"-- ")  # "-- " opens a mail signature
    return False


def _parse_hunk(lines: list[bytes], i: int, number: int, name: str) -> tuple[Hunk, int]:
    m = _HUNK_RE.fullmatch(lines[i].rstrip(b"\r\n"))
    if not m:
        raise PatchError(f"{name}: line {i + 1}: malformed hunk header {lines[i].rstrip()!r}")
    header = lines[i][: lines[i].index(b" @@", 3) + 3].decode("ascii")
    old_start, new_start = int(m[1]), int(m[3])
    old_count = 1 if m[2] is None else int(m[2])
    new_count = 1 if m[4] is None else int(m[4])
    if (old_count and not old_start) or (new_count and not new_start):
        raise PatchError(f"{name}: line {i + 1}: hunk {number} ({header}): line 0 with a non-zero count")
    where = f"{name}: hunk {number} ({header})"
    body: list[tuple[str, bytes]] = []
    left_old, left_new = old_count, new_count
    j = i + 1
    while left_old > 0 or left_new > 0:
        if j >= len(lines):
            raise PatchError(f"{where} is truncated: the patch ends with {left_old} old and {left_new} "
                             f"new line(s) still expected")
        line = lines[j]
        if not line.endswith(b"\n"):
            raise PatchError(f"{where}: line {j + 1} has no line ending: the patch looks truncated")
        kind = line[:1]
        if kind == b"\\":
            _strip_newline(body, where, j)
            j += 1
            continue
        if kind == b" " or line == b"\n":  # a bare newline is an empty context line (some mailers)
            body.append((CONTEXT, line[1:] if kind == b" " else line))
            left_old -= 1
            left_new -= 1
        elif kind == b"-":
            body.append((REMOVED, line[1:]))
            left_old -= 1
        elif kind == b"+":
            body.append((ADDED, line[1:]))
            left_new -= 1
        else:
            raise PatchError(f"{where} ends early at line {j + 1}: {left_old} old and {left_new} new "
                             f"line(s) still expected, found {line.rstrip()[:40]!r}")
        if left_old < 0 or left_new < 0:
            raise PatchError(f"{where}: line {j + 1}: the hunk has more lines than its header counts")
        j += 1
    if j < len(lines) and lines[j].startswith(b"\\ "):
        _strip_newline(body, where, j)
        j += 1
    if all(k == CONTEXT for k, _ in body):
        raise PatchError(f"{where} changes nothing")
    hunk = Hunk(number, header, old_start, old_count, new_start, new_count, tuple(body))
    return hunk, j


def _strip_newline(body: list[tuple[str, bytes]], where: str, j: int) -> None:
    """Handle "\\ No newline at end of file": the line before it has no line ending."""
    if not body or not body[-1][1].endswith(b"\n"):
        raise PatchError(f"{where}: line {j + 1}: misplaced '\\ No newline at end of file'")
    kind, text = body[-1]
    body[-1] = (kind, text[:-1])


# ---------------------------------------------------------------- applying


def apply_patch(original: bytes, patch: bytes, *, name: str) -> ApplyResult:
    """Apply a one-file patch to `original`; raise PatchError (or PatchDoesNotApply) otherwise."""
    return _apply(original, _one_file(patch, name), name, reverse=False)


def reverse_apply(patched: bytes, patch: bytes, *, name: str) -> ApplyResult:
    """Undo a one-file patch: apply it in reverse. Offsets are those of the reversed hunks."""
    return _apply(patched, _one_file(patch, name), name, reverse=True)


def is_applied(current: bytes, patch: bytes) -> bool:
    """True when the reverse patch applies cleanly, i.e. `current` already carries the patch."""
    try:
        reverse_apply(current, patch, name="<current>")
    except PatchDoesNotApply:
        return False
    return True


def _one_file(patch: bytes, name: str) -> FilePatch:
    files = parse_patch(patch, name=name)
    if len(files) != 1:
        paths = ", ".join(f.path for f in files)
        raise PatchError(f"{name}: the patch touches {len(files)} files ({paths}); give one file's patch")
    fp = files[0]
    if fp.unsupported:
        raise PatchError(f"{name}: the patch {fp.unsupported}: not supported (fleetctl patches the "
                         f"content of existing files only)")
    return fp


def _apply(original: bytes, fp: FilePatch, name: str, *, reverse: bool) -> ApplyResult:
    img = split_lines(original)
    taken = bytearray(len(img))  # 1 where an earlier hunk wrote the line: never matched again
    offsets: list[tuple[int, int]] = []
    last_offset = 0
    for stated in fp.hunks:
        hunk = stated.reversed() if reverse else stated
        if hunk.old_start == 0 and hunk.old_count == 0:
            raise PatchError(f"{name}: hunk {hunk.number} ({hunk.header}) adds to an empty file "
                             f"(a new-file hunk): not supported")
        at_start = hunk.old_start <= 1
        at_end = hunk.trailing == 0
        if hunk.leading == 0 and at_end and not at_start:
            raise PatchError(f"{name}: hunk {hunk.number} ({hunk.header}) has no context lines, so nothing "
                             f"anchors it", hint="make the patch with context: diff -u / git diff")
        pre, post = hunk.old_lines, hunk.new_lines
        pos = hunk.new_start - 1 if hunk.new_start else 0  # where it belongs once earlier hunks are in
        at = _find(img, taken, pre, pos, at_start, at_end)
        if at < 0:
            raise _does_not_apply(name, stated, hunk, split_lines(original), last_offset,
                                  at_start, at_end, reverse)
        img[at:at + len(pre)] = post
        taken[at:at + len(pre)] = b"\x01" * len(post)
        last_offset = at - pos
        if last_offset:
            offsets.append((hunk.number, last_offset))
    return ApplyResult(b"".join(img), offsets)


def _fits(img: list[bytes], taken: bytearray, pre: list[bytes], at: int, at_start: bool, at_end: bool) -> bool:
    end = at + len(pre)
    if at < 0 or end > len(img) or (at_end and end != len(img)) or (at_start and at != 0):
        return False
    if pre and img[at] != pre[0]:
        return False
    return taken.find(1, at, end) < 0 and img[at:end] == pre


def _find(img: list[bytes], taken: bytearray, pre: list[bytes], pos: int, at_start: bool, at_end: bool) -> int:
    """Index where `pre` matches, searched outward from `pos` (pos, +1, -1, +2, -2, ...); -1 if none."""
    if at_start or at_end:  # anchored: exactly one candidate
        at = 0 if at_start else len(img) - len(pre)
        return at if _fits(img, taken, pre, at, at_start, at_end) else -1
    n = len(img)
    pos = min(max(pos, 0), n)
    if _fits(img, taken, pre, pos, False, False):
        return pos
    lo = hi = pos
    first = pre[0] if pre else None
    while lo > 0 or hi < n:
        if hi < n:
            hi += 1
            if hi < n and img[hi] == first and _fits(img, taken, pre, hi, False, False):
                return hi
        if lo > 0:
            lo -= 1
            if img[lo] == first and _fits(img, taken, pre, lo, False, False):
                return lo
    return -1


def _does_not_apply(name: str, stated: Hunk, hunk: Hunk, orig: list[bytes], last_offset: int,
                    at_start: bool, at_end: bool, reverse: bool) -> PatchDoesNotApply:
    """Explain the first difference where the hunk should have gone: its stated line moved by the
    offset the hunk before it needed (or the start/end of the file for an anchored hunk).
    Line numbers are those of the file given."""
    pre = hunk.old_lines
    kinds = [k for k, _ in hunk.lines if k != ADDED]
    near = min(max(hunk.old_start - 1 + last_offset, 0), len(orig))
    at = 0 if at_start else max(len(orig) - len(pre), 0) if at_end else near
    head = f"{name}: hunk {stated.number} ({stated.header}) {'cannot be undone' if reverse else 'does not apply'}"

    def fail(why: str, line: int) -> PatchDoesNotApply:
        return PatchDoesNotApply(f"{head}: {why}", hunk=stated, line=line)

    def first_difference(where: int) -> PatchDoesNotApply | None:
        for k, want in enumerate(pre):
            if where + k >= len(orig):
                return fail(f"the file ends at line {len(orig)}, inside the hunk", where + k + 1)
            got = orig[where + k]
            if got != want:
                what = "context" if kinds[k] == CONTEXT else "added line" if reverse else "removed line"
                return fail(f"{what} at line {where + k + 1} differs{_why(want, got)}", where + k + 1)
        return None

    problem = first_difference(at)
    if problem is None:
        return fail("its lines overlap lines an earlier hunk changed", at + 1)
    if at_start or at_end:  # is it elsewhere, just not where it must be?
        found = _find(orig, bytearray(len(orig)), pre, near, False, False)
        if found >= 0:
            where = "start" if at_start else "end"
            rule = "a hunk at line 1" if at_start else "a hunk without trailing context"
            return fail(f"{rule} must match at the {where} of the file, and its lines are at line {found + 1}",
                        found + 1)
    return problem


def _why(want: bytes, got: bytes) -> str:
    if want.rstrip(b"\r\n") != got.rstrip(b"\r\n"):
        return ""
    if want.endswith(b"\n") != got.endswith(b"\n"):
        return " (newline at end of file)"
    return " (line endings: CRLF vs LF)"
