"""A three-way line merge (diff3) with `git merge-file` semantics, written on difflib.

merge3(base, ours, theirs) walks the base file; where ours and theirs both keep a base line in
step, the line is stable. Between stable runs lies a chunk: if only one side changed it, that
side wins; if both made the same change, it is taken once; otherwise it is a conflict. As git's
default (zealous) level does, lines common to the start and end of both sides of a conflict are
moved out of it. Conflicts are written with git's markers (7 characters, labels after them).
Bytes only: nothing is decoded, line endings are kept.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from fleetctl.patching.engine import split_lines


@dataclass(frozen=True)
class Conflict:
    start: int  # 1-based first line of the conflict block (the '<<<<<<<' line) in the merged output
    end: int  # 1-based last line (the '>>>>>>>' line)
    base_start: int  # 1-based line in the base file where the conflicting region starts
    base_count: int


@dataclass
class MergeResult:
    output: bytes
    conflicts: list[Conflict] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.conflicts


def _matches(base: list[bytes], other: list[bytes]) -> dict[int, int]:
    """base line index -> other line index for the lines kept in step (monotonic).

    difflib finds the common lines; then, as git's xdiff does, each run of changed lines is slid
    down as far as equal lines allow (a deleted or added block of repeated lines sits at its last
    possible place), so that chunks line up with git's and no change is split differently."""
    sm = difflib.SequenceMatcher(None, base, other, autojunk=False)
    ro, rx = [True] * len(base), [True] * len(other)
    for i, j, n in sm.get_matching_blocks():
        ro[i:i + n] = [False] * n
        rx[j:j + n] = [False] * n
    _slide_down(base, ro)
    _slide_down(other, rx)
    out: dict[int, int] = {}
    j = 0
    for i, changed in enumerate(ro):
        if changed:
            continue
        while rx[j]:
            j += 1
        out[i] = j
        j += 1
    return out


def _slide_down(lines: list[bytes], changed: list[bool]) -> None:
    i, n = 0, len(lines)
    while i < n:
        if not changed[i]:
            i += 1
            continue
        start = i
        end = i
        while end < n and changed[end]:
            end += 1
        while end < n and lines[start] == lines[end]:
            changed[start], changed[end] = False, True
            start, end = start + 1, end + 1
            while end < n and changed[end]:
                end += 1
        i = end


def _eol(lines: list[bytes]) -> list[bytes]:
    """Conflict sides end with a newline so that the next marker starts a line."""
    if lines and not lines[-1].endswith(b"\n"):
        return [*lines[:-1], lines[-1] + b"\n"]
    return lines


def merge3(base: bytes, ours: bytes, theirs: bytes, *, ours_label: str = "ours",
           theirs_label: str = "theirs") -> MergeResult:
    o, a, b = split_lines(base), split_lines(ours), split_lines(theirs)
    ma, mb = _matches(o, a), _matches(o, b)
    out: list[bytes] = []
    conflicts: list[Conflict] = []
    io = ia = ib = 0

    def chunk(o_end: int, a_end: int, b_end: int) -> None:
        co, ca, cb = o[io:o_end], a[ia:a_end], b[ib:b_end]
        if ca == co:
            out.extend(cb)
        elif cb == co or ca == cb:
            out.extend(ca)
        else:
            head = 0
            while head < min(len(ca), len(cb)) and ca[head] == cb[head]:
                head += 1
            tail = 0
            while tail < min(len(ca), len(cb)) - head and ca[-1 - tail] == cb[-1 - tail]:
                tail += 1
            out.extend(ca[:head])
            start = len(out) + 1
            out.append(b"<<<<<<< " + ours_label.encode() + b"\n")
            out.extend(_eol(ca[head:len(ca) - tail]))
            out.append(b"=======\n")
            out.extend(_eol(cb[head:len(cb) - tail]))
            out.append(b">>>>>>> " + theirs_label.encode() + b"\n")
            conflicts.append(Conflict(start, len(out), io + 1, len(co)))
            if tail:
                out.extend(ca[len(ca) - tail:])

    while io < len(o) or ia < len(a) or ib < len(b):
        n = 0
        while (io + n < len(o) and ma.get(io + n) == ia + n and mb.get(io + n) == ib + n):
            n += 1
        if n:
            out.extend(o[io:io + n])
            io, ia, ib = io + n, ia + n, ib + n
            continue
        j = io
        while j < len(o) and not (j in ma and j in mb):
            j += 1
        if j == len(o):
            chunk(len(o), len(a), len(b))
            break
        chunk(j, ma[j], mb[j])
        io, ia, ib = j, ma[j], mb[j]
    return MergeResult(b"".join(out), conflicts)
