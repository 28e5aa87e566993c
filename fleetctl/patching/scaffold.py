"""`fleetctl patch init`: a complete playbook directory from a user's edits.

The edits come from a source checkout (its uncommitted changes under the package, or a git range)
or from a unified diff. Each file's patch must apply exactly to the release's pristine file; the
directory gets patches/<V>/<file>.diff, and a playbook.yaml with:
* a README comment block: what was made from what, what is left to fill, the commands to run next;
* `versions:` with the pins (sha256 of each pristine file);
* `launch:` pre-filled by the engine (the flags and env under which the release runs a patched
  worker, the flags the patch adds), each commented; values the user must give are placeholders;
* `verify.markers` from the log line the patch adds, and `covers:` saying where it is logged.

`config/launch_ready.unfilled(pb)` names the placeholders left: `patch check` prints them, `launch` refuses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.config.launch_ready import PLACEHOLDER
from fleetctl.engines import engine, wheels
from fleetctl.errors import InputError
from fleetctl.patching.authoring import compile_error, make_patch
from fleetctl.patching.engine import PatchError, apply_patch, parse_patch


@dataclass
class EditedFile:
    rel: str
    pristine: bytes
    patched: bytes
    patch: bytes
    sha256: str


def _package_rel(path: str) -> str | None:
    """A diff's path as a path inside the package: from a source checkout (python/<pkg>/...), a
    package-rooted tree (<pkg>/...), or already package-relative."""
    from fleetctl.config.playbook_model import check_relpath

    src_prefix, pkg = engine().source_prefix, engine().package + "/"
    for prefix in (src_prefix, pkg, ""):
        if path.startswith(prefix):
            try:
                return check_relpath(path[len(prefix):])
            except ValueError:
                return None
    return None


def edited_files(diff: bytes, version: str, *, name: str) -> list[EditedFile]:
    """Per file of `diff`: its patch against `version`'s pristine file (it must apply exactly and compile)."""
    from fleetctl.patching.port import _one_file_patch

    if not diff.strip():
        raise InputError(f"{name}: no change to any file of the package", reference="patch-init-invalid")
    out: list[EditedFile] = []
    for fp in parse_patch(diff, name=name):
        rel = _package_rel(fp.path)
        if rel is None:
            raise InputError(f"{name}: {fp.path} is not a path inside the {engine().package} package",
                             reference="patch-init-invalid")
        if fp.unsupported:
            raise InputError(f"{name}: {fp.path}: the change {fp.unsupported}: not supported "
                             "(fleetctl patches the content of existing files only)", reference="patch-init-invalid")
        pristine = wheels.pristine_bytes(version, rel)
        try:
            patched = apply_patch(pristine, _one_file_patch(fp.hunks, rel), name=f"{engine().package} {version} {rel}").output
        except PatchError as e:
            raise InputError(f"{e.line()} (were the edits made on a checkout of {version}?)",
                             hint=f"make the edits on the {version} release's files, or pass the release they "
                                  "were made on with --release", reference="patch-init-invalid") from None
        problem = compile_error(patched, rel)
        if problem:
            raise InputError(f"{name}: {rel}: the edited file does not compile: {problem}",
                             reference="patch-init-invalid")
        out.append(EditedFile(rel, pristine, patched, make_patch(pristine, patched, rel), wheels.sha256_bytes(pristine)))
    if not out:
        raise InputError(f"{name}: no change to any file of the package", reference="patch-init-invalid")
    return out


def checkout_diff(repo: Path, rev_range: str | None) -> bytes:
    """The edits of a source checkout: its uncommitted changes (staged or not) under the package, or
    the commits of `rev_range`."""
    from fleetctl.patching.port import PREFIX, _git, git_range_diff

    if not repo.is_dir():
        raise InputError(f"--git {repo}: not a directory", reference="patch-init-invalid")
    if rev_range:
        return git_range_diff(repo, rev_range)
    diff = _git(repo, "diff", "--no-color", "--no-ext-diff", "--no-renames", "--no-textconv", "-U3", "HEAD",
                "--", PREFIX)
    if not diff.strip():
        raise InputError(f"--git {repo}: no uncommitted change under {PREFIX}",
                         hint="edit the files first, or name committed edits with --range A..B",
                         reference="patch-init-invalid")
    return diff


def _q(value: Any) -> str:
    """A YAML scalar (JSON is YAML: strings quoted, numbers and booleans as they are)."""
    return json.dumps(value)


def _comment(text: str) -> str:
    return f"  # {text}" if text else ""


def render(name: str, version: str, source: str, files: list[EditedFile], refs: list[str], *,
           where: str | None = None, command: str | None = None) -> tuple[str, list[str], list[str]]:
    """playbook.yaml's text and what is left to fill (`where`: the directory as the commands name it)."""
    import shlex

    d = shlex.quote(where or name)
    draft, markers = engine().scaffold(version, {f.rel: (f.pristine, f.patched) for f in files}, command)
    todo = [f"launch.flags.{s.name}" for s in draft.flags if isinstance(s.value, str) and PLACEHOLDER in s.value]
    todo += [f"launch.env.{s.name}" for s in draft.env if isinstance(s.value, str) and PLACEHOLDER in s.value]
    marker = markers[0] if markers else None
    if marker is None:
        todo.append("verify.markers (no log line added by the patch: add one, INFO or above)")
    head = [
        f"# {name}: made by `fleetctl patch init` from {source}, for {engine().display_name} {version}.",
        "#",
        "# README",
        f"# Patches: {', '.join(f.rel for f in files)} (pinned to the pristine files' sha256 below).",
    ]
    if draft.worker_class:
        head.append(f"# launch: is {'your launch command' if command else 'pre-filled'}: {version} runs "
                    f"{draft.worker_class} with it, the worker the patch changes; each value is commented.")
    head += [f"# {n}" if n.startswith("WARNING: ") else f"# Note: {n}" for n in draft.notes]
    if marker is not None:
        site = f"{marker.cls}.{marker.function}" if marker.cls else (marker.function or "module level")
        head.append(f"# Marker: {marker.text!r}, the log line the patch adds in {marker.file} ({site}); "
                    "verify-logs proves from it that the patched code ran.")
    if todo:
        head.append("# Left to fill (patch check names them, launch refuses them): " + ", ".join(todo))
    head += [
        "# Next:",
        f"#   fleetctl patch check {d}",
        f"#   fleetctl explain -i INVENTORY {d}",
        f"#   fleetctl deploy -i INVENTORY {d}",
        f"#   fleetctl launch -i INVENTORY {d}",
        f"#   fleetctl verify-logs -i INVENTORY {d}",
        f"# More releases: fleetctl patch port {d} --from {version} --to V2",
        "",
    ]
    body = [f"name: {_q(name)}", f"description: {_q(f'made by fleetctl patch init from {source}')}",
            f"package: {_q(engine().package)}", "", "versions:", f"  {_q(version)}:", "    files:"]
    for f, ref in zip(files, refs, strict=True):
        body += [f"      - path: {_q(f.rel)}", f"        patch: {_q(ref)}", f"        sha256: {f.sha256}"]
    body += ["", "launch:", f"  command: {_q(engine().launch_command)}", "  port: 30000", "  flags:"]
    body += [f"    {s.name}: {_q(s.value)}{_comment(s.comment)}" for s in draft.flags]
    if draft.env:
        body.append("  env:")
        body += [f"    {s.name}: {_q(s.value)}{_comment(s.comment)}" for s in draft.env]
    body += ["", "verify:"]
    if marker is not None:
        body += ["  markers:", f"    - {_q(marker.text)}"]
    else:
        body += ["  markers: []  # add the text of a log line your patch writes"]
    covers: list[str] = []
    if draft.worker_class:
        covers.append("  worker: true  # the worker the launch runs must be in a file this playbook patches")
    if marker is not None:
        covers += ["  markers:", f"    - text: {_q(marker.text)}", f"      where: {marker.where}"]
        if marker.where == "file":
            covers += [f"      file: {_q(marker.file)}", f"      class: {_q(marker.cls)}"]
        if marker.function and marker.where != "anywhere":
            covers.append(f"      function: {_q(marker.function)}")
        covers.append(f"      per_rank: {'true' if marker.per_rank else 'false'}")
    if covers:
        body += ["", "covers:", *covers]
    return "\n".join(head + body) + "\n", todo, [n for n in draft.notes if n.startswith("WARNING")]


def scaffold(name: str, version: str, files: list[EditedFile], source: str, out_dir: Path,
             command: str | None = None) -> tuple[Path, list[str], list[str]]:
    """Write the playbook directory; returns its playbook.yaml, what is left to fill, the warnings."""
    from fleetctl.patching.port import patch_ref

    target = out_dir / "playbook.yaml"
    if target.exists():
        raise InputError(f"{target} already exists", hint="choose another --dir, or remove it to make it again",
                         reference="patch-init-invalid")
    rels = [f.rel for f in files]
    refs = [patch_ref(version, f.rel, rels) for f in files]
    text, todo, warnings = render(name, version, source, files, refs, where=str(out_dir), command=command)
    try:
        for f, ref in zip(files, refs, strict=True):
            (out_dir / ref).parent.mkdir(parents=True, exist_ok=True)
            (out_dir / ref).write_bytes(f.patch)
        target.write_text(text, encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot write {out_dir}: {e.strerror}", reference="patch-init-invalid") from None
    return target, todo, warnings
