"""`fleetctl patch port`: carry a playbook's patch set from one SGLang release to others by a
three-way merge on the real release files, and `fleetctl patch import`: a git range of an SGLang
source checkout as a playbook's patches for one release."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.config.playbook_model import Playbook, check_relpath
from fleetctl.engines import engine, wheels
from fleetctl.errors import EXIT_FAILED, FleetctlError, InputError
from fleetctl.patching.authoring import compile_error, make_patch
from fleetctl.patching.engine import PatchError, apply_patch, parse_patch
from fleetctl.patching.merge import merge3
from fleetctl.patching.playbook_edit import NewFile, add_version


class PortFailed(FleetctlError):
    exit_code = EXIT_FAILED
    reference = "patch-port-failed"


@dataclass
class FilePort:
    path: str
    patch: bytes = b""  # the new patch against the target's pristine file (when clean)
    sha256: str = ""
    conflicts: list[tuple[int, int]] = field(default_factory=list)  # line ranges in the .conflict file
    merged: bytes = b""
    problem: str = ""  # why this file could not be ported (missing file, does not compile, ...)

    @property
    def ok(self) -> bool:
        return not self.conflicts and not self.problem


def patch_ref(version: str, rel: str, others: list[str]) -> str:
    """patches/<V>/<file name>.diff, or the path with '/' as '__' when two files share a name."""
    name = Path(rel).name
    if sum(Path(o).name == name for o in others) > 1:
        name = rel.replace("/", "__")
    return f"patches/{version}/{name}.diff"


def port_file(src: str, dst: str, rel: str, patch_text: bytes, sha256: str) -> FilePort:
    base = wheels.verified_pristine(src, rel, sha256)
    intended = apply_patch(base, patch_text, name=f"{src} {rel}").output
    try:
        target = wheels.pristine_bytes(dst, rel)
    except InputError as e:
        return FilePort(rel, problem=e.message)
    result = merge3(base, intended, target, ours_label=f"{src} patched", theirs_label=f"{dst} pristine")
    if not result.clean:
        return FilePort(rel, merged=result.output, conflicts=[(c.start, c.end) for c in result.conflicts])
    problem = compile_error(result.output, rel)
    if problem:
        return FilePort(rel, merged=result.output, problem=f"the merged file does not compile: {problem}")
    new = make_patch(target, result.output, rel)
    if not new:
        return FilePort(rel, problem=f"{dst} already has {src}'s change (the merge equals the pristine file)")
    if apply_patch(target, new, name=rel).output != result.output:
        raise FleetctlError(f"internal error: the ported patch for {rel} does not reproduce the merge",
                            reference="internal-error")
    return FilePort(rel, patch=new, sha256=wheels.sha256_bytes(target), merged=result.output)


def conflict_path(base: Path, ref: str) -> Path:
    """Where a file's merge with conflict markers is written: its patch's path, `.conflict` for `.diff`."""
    return base / (ref[: -len(".diff")] + ".conflict")


def marker_ranges(data: bytes) -> list[tuple[int, int]]:
    """The line ranges (1-based) from each `<<<<<<< ` line to its `>>>>>>> ` line: the conflicts
    still in a .conflict file."""
    out: list[tuple[int, int]] = []
    start: int | None = None
    for n, line in enumerate(data.split(b"\n"), 1):
        if line.startswith(b"<<<<<<< "):
            start = n
        elif line.startswith(b">>>>>>> ") and start is not None:
            out.append((start, n))
            start = None
    return out


def resolved_file(dst: str, rel: str, data: bytes, where: Path) -> FilePort:
    """A .conflict file the user resolved (no markers left) as the file's port: the patch from
    `dst`'s pristine file to it (it must compile, and change something)."""
    try:
        target = wheels.pristine_bytes(dst, rel)
    except InputError as e:
        return FilePort(rel, problem=e.message)
    problem = compile_error(data, rel)
    if problem:
        return FilePort(rel, merged=data, problem=f"the resolved {where} does not compile: {problem}")
    new = make_patch(target, data, rel)
    if not new:
        return FilePort(rel, problem=f"the resolved {where} is {dst}'s pristine file: it patches nothing")
    return FilePort(rel, patch=new, sha256=wheels.sha256_bytes(target), merged=data)


def carried_note(src: str) -> str:
    return f"unsupported_workers carried over from {src} by `fleetctl patch port`: review for this release"


def carry_unsupported(unsupported: dict[str, str], dst: str) -> tuple[dict[str, str], list[str]]:
    """The source release's unsupported_workers that name a worker class release `dst` has, and the
    classes dropped because `dst` has no such worker. A release the engine does not know keeps all."""
    eng = engine()
    if not eng.is_known(dst):
        return dict(unsupported), []
    have = eng.worker_files(dst)
    kept = {cls: why for cls, why in unsupported.items() if cls in have}
    return kept, [cls for cls in unsupported if cls not in have]


def dropped_note(src: str, dst: str, dropped: list[str]) -> str:
    return (f"unsupported_workers of {src} not carried to {dst}: {', '.join(dropped)} "
            f"({engine().display_name} {dst} has no such worker class)")


def write_version(pb: Playbook, version: str, ports: list[FilePort], unsupported: dict[str, str],
                  note: str | None, write: Callable[[Path, bytes], None]) -> list[str]:
    """Write the patches and add the entry to the playbook YAML. Returns the patch paths written."""
    base = pb.path.resolve().parent
    rels = [p.path for p in ports]
    refs = [patch_ref(version, p.path, rels) for p in ports]
    for p, ref in zip(ports, refs, strict=True):
        # the same bytes are no clash: the clean files an earlier run with conflicts wrote
        if (base / ref).exists() and (base / ref).read_bytes() != p.patch:
            raise InputError(f"{base / ref} already exists", hint="move it away or remove it to port again",
                             reference="file-exists")
    text = pb.path.read_text(encoding="utf-8")
    new_text = add_version(text, str(pb.path), version,
                           [NewFile(p.path, ref, p.sha256) for p, ref in zip(ports, refs, strict=True)], unsupported, note=note)
    (base / f"patches/{version}").mkdir(parents=True, exist_ok=True)
    for p, ref in zip(ports, refs, strict=True):
        write(base / ref, p.patch)
        conflict_path(base, ref).unlink(missing_ok=True)
    write(pb.path, new_text.encode("utf-8"))
    return refs


# ---------------------------------------------------------------- import from git

PREFIX = engine().source_prefix  # where the package lives in a source checkout
_REV_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/@{}^~+-]*")
GIT_TIMEOUT = 60.0
MAX_DIFF = 64 * 1024 * 1024


def _git(repo: Path, *args: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    cmd = ["git", "-c", "core.quotePath=true", "-C", str(repo), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=GIT_TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise InputError("git is not installed", hint="install git to import commits",
                         reference="git-unavailable") from None
    except subprocess.TimeoutExpired:
        raise FleetctlError(f"git {args[0]} in {repo} did not finish within {GIT_TIMEOUT:.0f}s",
                            reference="patch-port-failed") from None
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        why = tail[-1][:300] if tail else f"exit {proc.returncode}"
        raise InputError(f"{repo}: git {args[0]} failed: {why}", reference="patch-port-invalid")
    if len(proc.stdout) > MAX_DIFF:
        raise InputError(f"{repo}: the diff is larger than {MAX_DIFF // (1024 * 1024)} MiB",
                         reference="patch-port-invalid")
    return proc.stdout


def split_range(rev_range: str) -> tuple[str, str]:
    """'A..B' -> (A, B); a single commit C -> (C^, C). Anything else is refused."""
    if "..." in rev_range:
        raise InputError(f"revision range {rev_range!r}: use A..B (the symmetric A...B is not supported)",
                         reference="patch-port-invalid")
    parts = rev_range.split("..") if ".." in rev_range else [f"{rev_range}^", rev_range]
    if len(parts) != 2 or not all(_REV_RE.fullmatch(p) for p in parts):
        raise InputError(f"revision range {rev_range!r} is not A..B or a single commit",
                         hint="e.g. v0.5.9..my-fix or a commit id", reference="patch-port-invalid")
    return parts[0], parts[1]


def git_range_diff(repo: Path, rev_range: str) -> bytes:
    if not repo.is_dir():
        raise InputError(f"--git {repo}: not a directory", reference="patch-port-invalid")
    old, new = split_range(rev_range)
    ids = []
    for r in (old, new):
        try:
            ids.append(_git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{r}^{{commit}}")
                       .decode("ascii", "replace").strip())
        except InputError:
            raise InputError(f"--git {repo}: unknown revision {r}", hint="check the range with git log",
                             reference="patch-port-invalid") from None
    return _git(repo, "diff", "--no-color", "--no-ext-diff", "--no-renames", "--no-textconv", "-U3",
                ids[0], ids[1], "--", PREFIX)


@dataclass
class Imported:
    path: str
    patch: bytes
    sha256: str


def import_diff(diff: bytes, version: str, *, name: str) -> list[Imported]:
    """Per file of `diff` (paths under python/sglang/): the patch against `version`'s pristine file.
    It must apply exactly; the result must compile."""
    if not diff.strip():
        raise InputError(f"{name}: the range changes nothing under {PREFIX}", reference="patch-port-invalid")
    out: list[Imported] = []
    for fp in parse_patch(diff, name=name):
        src = fp.path
        if not src.startswith(PREFIX):
            raise InputError(f"{name}: {src} is not under {PREFIX}", reference="patch-port-invalid")
        if fp.unsupported:
            raise InputError(f"{name}: {src}: the change {fp.unsupported}: not supported "
                             f"(fleetctl patches the content of existing files only)", reference="patch-port-invalid")
        try:
            rel = check_relpath(src[len(PREFIX):])
        except ValueError as e:
            raise InputError(f"{name}: {e}", reference="patch-port-invalid") from None
        pristine = wheels.pristine_bytes(version, rel)
        one = _one_file_patch(fp.hunks, rel)
        try:
            result = apply_patch(pristine, one, name=f"sglang {version} {rel}")
        except PatchError as e:
            e.exit_code = EXIT_FAILED
            raise
        problem = compile_error(result.output, rel)
        if problem:
            raise PortFailed(f"sglang {version} {rel}: the patched file does not compile: {problem}")
        out.append(Imported(rel, make_patch(pristine, result.output, rel), wheels.sha256_bytes(pristine)))
    return out


def _one_file_patch(hunks: tuple, rel: str) -> bytes:  # type: ignore[type-arg]
    from fleetctl.patching.engine import ADDED, CONTEXT, REMOVED

    marks = {CONTEXT: b" ", REMOVED: b"-", ADDED: b"+"}
    out = [b"--- a/" + rel.encode() + b"\n", b"+++ b/" + rel.encode() + b"\n"]
    for h in hunks:
        out.append(h.header.encode() + b"\n" if not h.header.endswith("\n") else h.header.encode())
        for kind, text in h.lines:
            out.append(marks[kind] + text)
            if not text.endswith(b"\n"):
                out.append(b"\n\\ No newline at end of file\n")
    return b"".join(out)
