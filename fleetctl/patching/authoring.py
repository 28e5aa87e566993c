"""Tools for patch authors: make a patch from an edited copy, check a playbook's patches against
the real release files."""

from __future__ import annotations

import difflib
import re
import warnings
from dataclasses import dataclass, field

from fleetctl.config.playbook_model import PatchFile, Playbook
from fleetctl.engines import wheels
from fleetctl.errors import FleetctlError, InputError
from fleetctl.patching.engine import PatchDoesNotApply, PatchError, apply_patch, split_lines

NO_NEWLINE = b"\\ No newline at end of file\n"


def make_patch(old: bytes, new: bytes, rel: str, *, context: int = 3) -> bytes:
    """A `diff -u`-style patch from `old` to `new` with a/REL b/REL headers; b"" when they are equal.

    The result applies to `old` with `apply_patch` and yields `new` byte for byte.
    """
    if context < 1:
        raise ValueError("context must be at least 1: hunks without context cannot be placed")
    if any(c in rel for c in "\t\n\r\"\\") or not rel:
        raise ValueError(f"unsupported path for a patch header: {rel!r}")
    a, b = split_lines(old), split_lines(new)
    if a == b:
        return b""
    if not a:
        raise PatchError(f"{rel}: the original file is empty: new-file patches are not supported")
    path = rel.encode()
    out = [b"--- a/" + path + b"\n", b"+++ b/" + path + b"\n"]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n".encode())
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out.extend(_body(b" ", a[a1:a2]))
                continue
            out.extend(_body(b"-", a[a1:a2]))
            out.extend(_body(b"+", b[b1:b2]))
    return b"".join(out)


def _range(start: int, stop: int) -> str:
    """GNU diff's hunk range: 1-based start, count omitted when 1, start is the line before when 0."""
    count = stop - start
    if count == 1:
        return str(start + 1)
    return f"{start + 1 if count else start},{count}"


def _body(mark: bytes, lines: list[bytes]) -> list[bytes]:
    out = []
    for line in lines:
        out.append(mark + line)
        if not line.endswith(b"\n"):
            out.append(b"\n" + NO_NEWLINE)
    return out


def playbook_snippet(version: str, rel: str, patch_ref: str, sha256: str) -> str:
    """The YAML to paste under `versions:` in a playbook."""
    return (f'  "{version}":\n'
            f"    files:\n"
            f"      - path: {rel}\n"
            f"        patch: {patch_ref}\n"
            f"        sha256: {sha256}\n")


# ---------------------------------------------------------------- fleetctl patch check

OK, OFFSETS = "ok", "offsets"
SHA_MISMATCH, MISSING, NO_WHEEL = "sha mismatch", "missing file", "no wheel"
BAD_PATCH, DOES_NOT_APPLY, DOES_NOT_COMPILE = "bad patch", "does not apply", "does not compile"


@dataclass
class FileCheck:
    version: str
    path: str
    status: str
    detail: str = ""
    offsets: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Offsets are a warning: the patch applies, but was not made against this exact file."""
        return self.status in (OK, OFFSETS)

    def as_dict(self) -> dict[str, object]:
        return {"version": self.version, "path": self.path, "status": self.status, "ok": self.ok,
                "detail": self.detail, "offsets": [list(o) for o in self.offsets]}


def check_playbook(pb: Playbook, versions: list[str] | None = None) -> list[FileCheck]:
    """Check every (version, file) of the playbook, or only `versions`, against the real wheels."""
    wanted = list(versions) if versions else sorted(pb.versions, key=_version_key)
    unknown = [v for v in wanted if v not in pb.versions]
    if unknown:
        raise InputError(f"{pb.path}: no entry for SGLang {', '.join(unknown)}",
                         hint=f"the playbook covers {', '.join(pb.supported())}", reference="playbook-version-missing")
    results: list[FileCheck] = []
    for version in dict.fromkeys(wanted):
        files = pb.versions[version]
        try:
            wheels.package_dir(version)
        except FleetctlError as e:
            results.extend(FileCheck(version, f.path, NO_WHEEL, e.line()) for f in files)
            continue
        results.extend(check_file(version, f) for f in files)
    return results


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version))


def check_file(version: str, pf: PatchFile) -> FileCheck:
    try:
        pristine = wheels.pristine_bytes(version, pf.path)
    except InputError as e:
        return FileCheck(version, pf.path, MISSING, e.message)
    sha = wheels.sha256_bytes(pristine)
    try:
        result = apply_patch(pristine, pf.patch_text, name=pf.path)
    except PatchDoesNotApply as e:
        failed: FileCheck | None = FileCheck(version, pf.path, DOES_NOT_APPLY, e.message)
    except PatchError as e:
        failed = FileCheck(version, pf.path, BAD_PATCH, e.line())
    else:
        failed = None
    if sha != pf.sha256:
        also = "the patch does not apply either" if failed else "the patch would apply"
        return FileCheck(version, pf.path, SHA_MISMATCH,
                         f"pristine file is {sha}, playbook says {pf.sha256}; {also}")
    if failed:
        return failed
    problem = compile_error(result.output, pf.path)
    if problem:
        return FileCheck(version, pf.path, DOES_NOT_COMPILE, problem)
    if result.offsets:
        where = ", ".join(f"hunk {h} at {o:+d}" for h, o in result.offsets)
        return FileCheck(version, pf.path, OFFSETS, f"applies with offsets: {where}", result.offsets)
    return FileCheck(version, pf.path, OK)


def compile_error(source: bytes, filename: str) -> str | None:
    """None if `source` compiles as Python (non-.py files are not compiled), else the reason."""
    if not filename.endswith(".py"):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings from the release's own code are not ours
            compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"{filename}:{e.lineno}: {e.__class__.__name__}: {e.msg}"
    except ValueError as e:  # e.g. a NUL byte
        return f"{filename}: {e}"
    return None
