"""Dockerfile lines that apply a playbook's patch set to an image: for containers whose root is
read-only, or whose patch must survive being re-created (`fleetctl patch dockerfile`).

The patched files (the release's pristine bytes with the playbook's patches applied, the same bytes
deploy writes) go into a build context dir; the lines check that the image holds the pristine
release files first (sha256), copy the patched ones over them, check them again, and drop their
stale bytecode. The RUN lines need only a POSIX sh, printf, sha256sum and rm in the image.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.config.playbook_model import Playbook
    from fleetctl.plan.deploy import Intended

CONTEXT_SUBDIR = "fleetctl-patch"  # under the build context: the patched files, by their package paths


@dataclass
class DockerfilePatch:
    lines: list[str]
    files: dict[str, bytes]  # package-relative path -> patched bytes


def _check(pkg: str, pairs: list[tuple[str, str]], what: str) -> list[str]:
    lines = [f"RUN cd {shlex.quote(pkg)} && printf '%s  %s\\n' \\"]
    lines += [f"      {sha} {shlex.quote(rel)} \\" for sha, rel in pairs]
    lines.append(f"    | sha256sum -c --quiet - || {{ echo 'fleetctl: {what}' >&2; exit 1; }}")
    return lines


def build(playbook: Playbook, version: str, intended: dict[str, Intended], package_dir: str) -> DockerfilePatch:
    rels = sorted(intended)
    pkg = package_dir.rstrip("/") or "/"
    lines = [f"# fleetctl: playbook {playbook.name} for sglang {version} ({len(rels)} file(s)) into {pkg}",
             "# 1. the image must hold the pristine release files the patches were made against"]
    lines += _check(pkg, [(intended[r].sha_pristine, r) for r in rels],
                    f"the image does not hold pristine sglang {version} files")
    lines.append("# 2. the patched files (written by fleetctl into the build context)")
    lines.append(f"COPY {CONTEXT_SUBDIR}/ {pkg}/")
    lines.append("# 3. the patched bytes are in place; their bytecode from the image is stale")
    lines += _check(pkg, [(intended[r].sha_intended, r) for r in rels], "the patched files did not land")
    pycs = []
    for r in rels:
        p = Path(r)
        pycs.append(shlex.quote(str(p.parent / "__pycache__")) + "/" + shlex.quote(p.stem) + ".*.pyc")
    lines.append(f"RUN cd {shlex.quote(pkg)} && rm -f {' '.join(pycs)}")
    return DockerfilePatch(lines, {r: intended[r].data for r in rels})


def write_context(out: Path, dp: DockerfilePatch) -> Path:
    """The patched files under out/fleetctl-patch/ and the lines as out/Dockerfile.fleetctl."""
    base = out / CONTEXT_SUBDIR
    for rel, data in dp.files.items():
        f = base / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    snippet = out / "Dockerfile.fleetctl"
    snippet.write_text("\n".join(dp.lines) + "\n")
    return snippet
