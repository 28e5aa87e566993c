"""fleetctl patch apply|check|new: local tools for patch authors."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fleetctl.commands import common, validate
from fleetctl.errors import FleetctlError, InputError

if TYPE_CHECKING:  # the playbook (pydantic, yaml), the wheels and rich: imported by the command that
    # runs (issue 16.10: 'fleetctl patch --help' and option parsing never load them)
    from fleetctl.config.playbook_model import Playbook

patch_app = typer.Typer(help="Local tools for patch authors: apply, check, new, port, import.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(patch_app, name="patch")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror}", reference="file-not-found") from None


def _write_atomic(path: Path, data: bytes, *, like: Path | None = None) -> None:
    """Write `data` to `path` through a temp file in the same dir and a rename: all or nothing."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror}", reference="file-unwritable") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if like is not None:
            os.chmod(tmp, like.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@patch_app.command("apply", help="Apply PATCH to BASE strictly (exact context, offsets allowed, no fuzz) "
                                 "and write OUT. On refusal: exit 1, one-line reason, no OUT.")
def apply_cmd(
    base: Annotated[Path, typer.Argument(metavar="BASE", help="The file to patch.", show_default=False)],
    patch: Annotated[Path, typer.Argument(metavar="PATCH", help="A unified diff for one file.", show_default=False)],
    out: Annotated[Path, typer.Option("-o", "--output", metavar="OUT", help="Where to write the patched file.",
                                      show_default=False)],
) -> None:
    from fleetctl.patching import apply_patch, parse_patch

    original = _read(base, "base file")
    text = _read(patch, "patch")
    parse_patch(text, name=str(patch))  # syntax errors name the patch file; fit errors name the base
    result = apply_patch(original, text, name=str(base))
    _write_atomic(out, result.output, like=base)
    common.out.print(f"patched {base} -> {out}", markup=False, highlight=False)
    for hunk, offset in result.offsets:
        common.out.print(f"  hunk {hunk} applied at offset {offset:+d} line(s)", markup=False, highlight=False)


_STYLE = {"ok": "green", "offsets": "yellow"}


@patch_app.command("check", help="For each SGLang version of a playbook: fetch the pinned wheel, check the "
                                 "pristine files' sha256, apply the patches and compile the results.")
def check_cmd(
    playbook: Annotated[Path, typer.Argument(metavar="PLAYBOOK", help="Playbook dir or YAML file.", show_default=False)],
    sglang: Annotated[list[str] | None, typer.Option("--sglang", metavar="V", help="Only this version (repeatable).",
                                                     show_default=False)] = None,
    json_out: common.JsonOpt = False,
) -> None:
    from fleetctl.config.playbook import load_playbook
    from fleetctl.engines import engine
    from fleetctl.model import statefiles
    from fleetctl.patching.authoring import check_playbook

    pb = load_playbook(playbook)
    results = check_playbook(pb, sglang)
    versions = list(dict.fromkeys(sglang)) if sglang else pb.supported()
    shipped = statefiles.check_rows(pb, versions)
    failed = [r for r in results if not r.ok]
    failed_state = [r for r in shipped if not r.ok]
    good = [v for v in versions if v not in {r.version for r in [*failed, *failed_state]}]
    found = launch_coverage(pb, good) + marker_findings(pb, good)
    problems = [w for w in found if w["refused"]]
    warnings = [w for w in found if not w["refused"]]
    warnings += [{"version": None, "env": {}, "worker_class": None, "worker_file": None, "message": w}
                 for w in engine().playbook_warnings(pb, dict(pb.launch.flags))]
    from fleetctl.config.launch_ready import unfilled

    todo = unfilled(pb)
    verdict = _verdict(pb, versions, results, failed, shipped, failed_state, problems)
    if todo:
        verdict += f"; left to fill before launch: {', '.join(todo)}"
    ok = not failed and not failed_state and not problems
    if json_out:
        common.emit_json("patch check", ok=ok, message=verdict,
                         summary={"files": len(results), "files_failed": len(failed), "state_files": len(shipped),
                                  "state_files_failed": len(failed_state), "warnings": len(warnings),
                                  "problems": len(problems)},
                         playbook=str(pb.path), name=pb.name, results=[r.as_dict() for r in results],
                         state_files=[r.as_dict() for r in shipped], warnings=warnings, problems=problems,
                         to_fill=todo)
    else:
        from fleetctl.ui.safeconsole import table as safe_table
        from fleetctl.ui.safetext import styled

        table = safe_table(f"patch check: {pb.name}", ("version", "file", "status", "detail"))
        for r in sorted([*results, *shipped], key=lambda r: versions.index(r.version)):
            style = _STYLE.get(r.status, "red")
            table.add_row(r.version, r.path, styled(r.status, style), r.detail)
        common.out.print(table)
        for w in warnings:
            common.err.print(f"warning: {w['message']}", markup=False, highlight=False)
        for w in problems:
            common.err.print(f"error: {w['message']}", markup=False, highlight=False)
        for t in todo:
            common.err.print(f"to fill: {t} in {pb.path} (a placeholder: launch refuses it)", markup=False,
                             highlight=False)
        if ok:
            common.out.print(verdict, markup=False, highlight=False)
    if failed:
        raise FleetctlError(f"patch check: {len(failed)} of {len(results)} file(s) failed"
                            + (f"; {len(failed_state)} state file check(s) failed" if failed_state else ""),
                            reference="patch-check-failed")
    if failed_state or problems:
        raise FleetctlError(verdict, reference="patch-check-failed")


def _verdict(pb: Playbook, versions: list[str], results: list[Any], failed: list[Any], shipped: list[Any],
             failed_state: list[Any], problems: list[dict[str, Any]] | None = None) -> str:
    """The one line `patch check` ends with."""
    parts = [f"{len(results) - len(failed)} of {len(results)} package file(s) ok"]
    if pb.state_files:
        parts.append(f"{len(shipped) - len(failed_state)} of {len(shipped)} state file check(s) ok "
                     f"({len(pb.state_files)} file(s) shipped as-is on every release)")
    bad = sorted({r.version for r in [*failed, *failed_state]}, key=versions.index)
    where = f"failed on {', '.join(bad)}" if bad else "passes"
    if problems:
        parts.append(f"{len(problems)} problem(s) with what the launch runs or the markers prove "
                     f"(on {', '.join(sorted({str(p['version']) for p in problems}))})")
        where = "failed" if not bad else where
    return f"patch check: {pb.name} {where} on {len(versions)} release(s): {'; '.join(parts)}"


def launch_coverage(pb: Playbook, versions: list[str]) -> list[dict[str, Any]]:
    """Per release, offline: does the playbook's own launch (its flags and env) run the member of each
    family of alternatives that the playbook patches (the speculative worker, the model
    implementation, the attention/grammar/sampling backend)? The origin mistake, caught before any
    host: `refused` rows fail the check, the others are warnings (an answer the host decides)."""
    from fleetctl.model.instances import env_string
    from fleetctl.plan.patched_worker import coverage

    env = {k: env_string(v) for k, v in pb.launch.env.items()}
    label = "the launch's env" if env else "no env"
    out: list[dict[str, Any]] = []
    unsure: dict[str, list[str]] = {}
    for version in versions:
        if pb.files_for(version) is None:
            continue
        cov = coverage(version, dict(pb.launch.flags), env, pb)
        base = {"version": version, "env": env, "worker_class": cov.worker_class, "worker_file": cov.worker_file,
                "families": cov.families}
        if cov.refused:
            # a run of code the playbook does not patch fails the check; a worker the playbook itself
            # declares unsupported on this release (unsupported_workers) is its documented limit: a warning
            # (a playbook with no launch flags says nothing of how it is launched: a warning only)
            miss = cov.covered is False and bool(pb.launch.flags)
            how = (f"the playbook's launch ({label})" if pb.launch.flags else
                   "the playbook names no launch flags, so launched as written")
            out.append({**base, "refused": miss,
                        "message": f"{version}: {how} "
                                   + ("does not run what it patches: " if cov.covered is False else "is refused: ")
                                   + f"{cov.refused}; deploy and launch refuse such hosts"})
        if cov.uncertain:
            unsure.setdefault(cov.uncertain, []).append(version)
    for why, vs in unsure.items():
        out.append({"version": vs[0], "versions": vs, "env": env, "worker_class": None, "worker_file": None,
                    "families": [], "refused": False,
                    "message": f"{', '.join(vs)}: {why} (decided on each host: explain and deploy say what "
                                   "they can tell there)"})
    return out


def marker_findings(pb: Playbook, versions: list[str]) -> list[dict[str, Any]]:
    """What the playbook's verify markers can and cannot prove: none at all (one line saying what is
    proven without one), or a marker no added line of a release's patch can print."""
    from fleetctl.patching.markers import marker_in_patch

    if not pb.verify.markers:
        return [{"version": None, "refused": False, "kind": "no-marker", "message":
                 "no verify.markers: verify-logs can prove that the server started on the patched files and that "
                 "the launch runs the files the playbook patches, but not that the patched code ran; add a log line "
                 "to your patch and list its text under verify.markers"}]
    out: list[dict[str, Any]] = []
    for marker in pb.verify.markers:
        lacking = [v for v in pb.supported() if pb.files_for(v)
                   and not any(marker_in_patch(marker, f.patch_text) for f in pb.files_for(v) or [])]
        absent = [v for v in versions if v in lacking]
        if absent:  # on every release: a failure; on some (e.g. where the playbook refuses its feature): a warning
            every = len(lacking) == len([v for v in pb.supported() if pb.files_for(v)])
            out.append({"version": absent[0], "versions": absent, "refused": every, "kind": "marker-not-in-patch",
                        "message": f"verify marker {marker!r} appears in no line the patch adds on "
                                   f"{', '.join(absent)}: the patched code cannot log it, so verify-logs will never "
                                   "see it; make it the text of a log line your patch adds"})
    return out


@patch_app.command("new", help="Diff an edited copy against the pristine file of an SGLang release: print "
                               "the patch (or write OUT) and, on stderr, the playbook entry to paste.")
def new_cmd(
    edited: Annotated[Path, typer.Argument(metavar="EDITED", help="Your edited copy of the file.", show_default=False)],
    sglang: Annotated[str, typer.Option("--sglang", metavar="V", help="The exact SGLang release (e.g. 0.5.9).",
                                        show_default=False)],
    rel: Annotated[str, typer.Option("--file", metavar="REL", help="Path inside the sglang package, e.g. "
                                     "srt/speculative/eagle_worker.py.", show_default=False)],
    out: Annotated[Path | None, typer.Option("-o", "--output", metavar="OUT", help="Write the patch here instead of stdout.",
                                             show_default=False)] = None,
) -> None:
    from fleetctl.config.playbook import check_relpath
    from fleetctl.engines import wheels
    from fleetctl.patching import apply_patch, make_patch
    from fleetctl.patching.authoring import playbook_snippet

    sglang = validate.sglang_version(sglang)
    try:
        rel = check_relpath(rel)
    except ValueError as e:
        raise InputError(f"--file: {e}", reference="option-invalid") from None
    new = _read(edited, "edited file")
    pristine = wheels.pristine_bytes(sglang, rel)
    patch = make_patch(pristine, new, rel)
    if not patch:
        raise InputError(f"{edited} is identical to sglang {sglang} {rel}: nothing to patch",
                         reference="option-invalid")
    if apply_patch(pristine, patch, name=rel).output != new:  # never hand out a patch that lies
        raise FleetctlError(f"internal error: the patch for {rel} does not reproduce {edited}",
                            reference="internal-error")
    if out is None:
        sys.stdout.buffer.write(patch)
        sys.stdout.buffer.flush()
        ref = f"patches/{sglang}/{Path(rel).name}.diff"
        where = f"# save the patch (stdout) as {ref}, relative to the playbook file"
    else:
        _write_atomic(out, patch)
        ref = str(out)
        where = f"# wrote {out}; make the patch path relative to the playbook file"
    common.err.print(f"# playbook entry (under versions:)\n{where}\n"
                     + playbook_snippet(sglang, rel, ref, wheels.sha256_bytes(pristine)).rstrip("\n"),
                     markup=False, highlight=False)


@patch_app.command("init", help="Make a complete playbook directory NAME from your edits of release V: the "
                               "uncommitted changes of an SGLang source checkout (--git), a git range of it "
                               "(--git with --range) or a unified diff (--diff). Writes the patches, pins, a "
                               "commented launch: section, the marker from the log line you added, and a README "
                               "block; `patch check NAME` then names what is left to fill.")
def init_cmd(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The playbook's name (and directory).", show_default=False)],
    release: Annotated[str, typer.Option("--release", metavar="V", help="The exact release the edits were made on.",
                                         show_default=False)],
    repo: Annotated[Path | None, typer.Option("--git", metavar="REPO", help="A source checkout with your edits.",
                                              show_default=False)] = None,
    rev_range: Annotated[str | None, typer.Option("--range", metavar="A..B", help="With --git: committed edits.",
                                                  show_default=False)] = None,
    diff: Annotated[Path | None, typer.Option("--diff", metavar="FILE", help="A unified diff of your edits.",
                                              show_default=False)] = None,
    out_dir: Annotated[Path | None, typer.Option("--dir", metavar="DIR", help="Where to make it (default: ./NAME).",
                                                 show_default=False)] = None,
    launch_cmd: Annotated[str | None, typer.Option("--launch", metavar="CMD", help="The launch command line you "
                                                   "run (NAME=value words first for its env): kept as launch:, "
                                                   "and checked against the files you edited.",
                                                   show_default=False)] = None,
) -> None:
    import re

    from fleetctl.patching.scaffold import checkout_diff, edited_files, scaffold

    release = validate.known_release(release, "--release")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", name):
        raise InputError(f"NAME {name!r}: use letters, digits and _ . - (it names a directory)",
                         reference="option-invalid")
    if (repo is None) == (diff is None):
        raise InputError("patch init needs one source of edits: --git REPO or --diff FILE", reference="option-invalid")
    if rev_range and repo is None:
        raise InputError("--range needs --git REPO", reference="option-invalid")
    if repo is not None:
        text = checkout_diff(repo, rev_range)
        source = f"{repo} {rev_range}" if rev_range else f"the uncommitted edits in {repo}"
    else:
        assert diff is not None
        text, source = _read(diff, "diff"), str(diff)
    files = edited_files(text, release, name=source)
    if launch_cmd is not None:
        import shlex

        try:
            shlex.split(launch_cmd)
        except ValueError as e:
            raise InputError(f"--launch: {e}", reference="option-invalid") from None
    target, todo, warnings = scaffold(name, release, files, source, out_dir if out_dir is not None else Path(name),
                            command=launch_cmd)
    common.out.print(f"made {target} ({len(files)} file(s) for {release}: "
                     f"{', '.join(f.rel for f in files)})", markup=False, highlight=False)
    for w in warnings:
        common.err.print(w.replace("WARNING: ", "warning: ", 1), markup=False, highlight=False)
    for t in todo:
        common.err.print(f"to fill: {t}", markup=False, highlight=False)
    common.err.print(f"next: fleetctl patch check {target.parent}", markup=False, highlight=False)


@patch_app.command("dockerfile", help="Write a playbook's patched files for one SGLang release into a build "
                                      "context dir and print the Dockerfile lines that apply them to an image "
                                      "(for a read-only container, or a patch that must survive re-creation).")
def dockerfile_cmd(
    playbook: Annotated[Path, typer.Argument(metavar="PLAYBOOK", help="Playbook dir or YAML file.", show_default=False)],
    sglang: Annotated[str, typer.Option("--sglang", metavar="V", help="The image's SGLang release (e.g. 0.5.9).",
                                        show_default=False)],
    out: Annotated[Path, typer.Option("-o", "--output", metavar="DIR", help="The build context dir to write "
                                      "(its fleetctl-patch/ and Dockerfile.fleetctl).", show_default=False)],
    package_dir: Annotated[str | None, typer.Option("--package-dir", metavar="PKG", help="The sglang package dir "
                                                    "in the image (default: where the lmsysorg/sglang images "
                                                    "install it).", show_default=False)] = None,
) -> None:
    from fleetctl.config.playbook import load_playbook
    from fleetctl.engines import engine
    from fleetctl.plan.dockerfile import build, write_context
    from fleetctl.plan.intended import intended_for

    sglang = validate.sglang_version(sglang)
    image_dir = engine().image_package_dir
    if package_dir is None:
        package_dir = image_dir
    if not package_dir.startswith("/") or any(c in package_dir for c in "\n\r\0"):
        raise InputError(f"--package-dir {package_dir!r}: an absolute path in the image is needed",
                         hint=f"e.g. --package-dir {image_dir}", reference="option-invalid")
    pb = load_playbook(playbook)
    it = intended_for(pb, sglang)
    if it is None:
        raise InputError(f"{pb.path}: the playbook has no patches for sglang {sglang}",
                         hint=f"it has: {', '.join(pb.supported()) or 'none'}", reference="playbook-version-missing")
    if not it:
        raise InputError(f"{pb.path}: the playbook patches no file of sglang {sglang}: nothing to build into an image",
                         hint="its state files are shipped to the host's state dir by 'fleetctl deploy'",
                         reference="option-invalid")
    dp = build(pb, sglang, it, package_dir)
    try:
        snippet = write_context(out, dp)
    except OSError as e:
        raise InputError(f"-o {out}: cannot write the build context: {e.strerror}",
                         reference="file-unwritable") from None
    common.out.print("\n".join(dp.lines), markup=False, highlight=False)
    common.err.print(f"# wrote {len(dp.files)} patched file(s) under {out}/fleetctl-patch/ and these lines as "
                     f"{snippet}; put them in your Dockerfile after the FROM of the sglang {sglang} image and "
                     f"build with {out} as the context"
                     + (f" (the playbook's state files are not in the image: {', '.join(sf.name for sf in pb.state_files)}"
                        f" are shipped by 'fleetctl deploy')" if pb.state_files else ""),
                     markup=False, highlight=False)


@patch_app.command("port", help="Carry a playbook's patches from release V1 to V2 (and more) by a three-way "
                                "merge on the real release files (git merge-file semantics, no fuzz). Clean: "
                                "writes patches/<V2>/ and V2's entry. Conflict: writes the clean files' patches "
                                "and <file>.conflict to resolve, lists the hunks, exit 1, playbook unchanged for "
                                "V2; the same command run again with each .conflict resolved adds V2's entry.")
def port_cmd(
    playbook: Annotated[Path, typer.Argument(metavar="PLAYBOOK", help="Playbook dir or YAML file.", show_default=False)],
    src: Annotated[str, typer.Option("--from", metavar="V1", help="The release whose patches to port.",
                                     show_default=False)],
    dst: Annotated[list[str], typer.Option("--to", metavar="V2", help="The release to port to (repeatable).",
                                           show_default=False)],
) -> None:
    from fleetctl.config.playbook import load_playbook
    from fleetctl.model.suggest import quote
    from fleetctl.patching.port import (
        carried_note,
        carry_unsupported,
        conflict_path,
        dropped_note,
        marker_ranges,
        patch_ref,
        port_file,
        resolved_file,
        write_version,
    )

    src = validate.sglang_version(src, "--from")
    targets = list(dict.fromkeys(validate.sglang_version(v, "--to") for v in dst))
    pb = load_playbook(playbook)
    if src not in pb.versions:
        raise InputError(f"{pb.path}: no entry for SGLang {src}", hint=f"the playbook covers {', '.join(pb.supported())}",
                         reference="playbook-version-missing")
    for v in targets:
        if v == src:
            raise InputError(f"--to {v} is the --from release", reference="option-invalid")
        if v in pb.versions:
            raise InputError(f"{pb.path}: the playbook already has an entry for SGLang {v}",
                             hint=f"remove the {v} entry first to port again", reference="playbook-version-exists")
    base = pb.path.resolve().parent
    failed: list[str] = []
    rels = [f.path for f in pb.versions[src]]
    for v in targets:
        ports = []
        for f in pb.versions[src]:
            ref = patch_ref(v, f.path, rels)
            where = conflict_path(base, ref)
            mine = where.read_bytes() if where.is_file() else None
            if mine is not None and not marker_ranges(mine):  # resolved by hand: it is the file's port
                ports.append(resolved_file(v, f.path, mine, where))
                continue
            p = port_file(src, v, f.path, f.patch_text, f.sha256)
            if p.conflicts and mine is not None:  # still being resolved: kept as it is, its markers listed
                p.merged, p.conflicts = mine, marker_ranges(mine)
            ports.append(p)
        bad = [p for p in ports if not p.ok]
        if bad:
            failed.append(v)
            for p in bad:
                if not p.conflicts:
                    common.err.print(f"{v} {p.path}: {p.problem}", markup=False, highlight=False)
                    continue
                where = conflict_path(base, patch_ref(v, p.path, rels))
                where.parent.mkdir(parents=True, exist_ok=True)
                if not where.is_file() or where.read_bytes() != p.merged:
                    _write_atomic(where, p.merged)
                for a, b in p.conflicts:
                    common.err.print(f"{v} {p.path}: conflict at lines {a}-{b} of {where}",
                                     markup=False, highlight=False)
            if any(not p.conflicts for p in bad):
                common.err.print(f"{v}: not ported (playbook unchanged for {v}): see the problems above",
                                 markup=False, highlight=False)
                continue
            # only conflicts: the files that merged cleanly are written now, where the port puts them
            clean = [(p, patch_ref(v, p.path, rels)) for p in ports if p.ok]
            for p, ref in clean:
                out = base / ref
                if not out.exists():
                    out.parent.mkdir(parents=True, exist_ok=True)
                    _write_atomic(out, p.patch)
            names = ", ".join(str(conflict_path(base, patch_ref(v, p.path, rels))) for p in bad)
            wrote = (f"{len(clean)} of {len(ports)} file(s) ready, written: {', '.join(r for _, r in clean)}; "
                     if clean else "")
            again = (f"'fleetctl patch port {quote(str(playbook))} --from {src} --to {v}'")
            common.err.print(f"{v}: not ported yet (playbook unchanged for {v}): {wrote}resolve the conflicts in "
                             f"{names} (edit out every <<<<<<< ... >>>>>>> block), then run {again}: it takes the "
                             f"resolved file(s) and adds the {v} entry", markup=False, highlight=False)
            continue
        carried, dropped = carry_unsupported(pb.unsupported_workers.get(src, {}), v)
        note = carried_note(src) if carried else None
        refs = write_version(pb, v, ports, carried, note, _write_atomic)
        pb = load_playbook(pb.path)  # the next target edits the file as now written
        common.out.print(f"{v}: ported {len(refs)} file(s) from {src}: {', '.join(refs)}", markup=False,
                         highlight=False)
        if carried:
            common.err.print(f"note: {v}: {note}", markup=False, highlight=False)
        if dropped:
            common.err.print(f"note: {v}: {dropped_note(src, v, dropped)}", markup=False, highlight=False)
    if failed:
        raise FleetctlError(f"patch port: {len(failed)} of {len(targets)} release(s) not ported: {', '.join(failed)}",
                            reference="patch-port-failed")


@patch_app.command("import", help="Turn a git range of an SGLang source checkout (python/sglang/...) into "
                                  "patches for release V: each must apply exactly to V's pristine file. With "
                                  "--playbook, write them into it; else print them and the playbook entry.")
def import_cmd(
    rev_range: Annotated[str, typer.Argument(metavar="REV_RANGE", help="A..B, or one commit.", show_default=False)],
    repo: Annotated[Path, typer.Option("--git", metavar="REPO", help="The SGLang source checkout.",
                                       show_default=False)],
    sglang: Annotated[str, typer.Option("--version", metavar="V", help="The exact SGLang release (e.g. 0.5.9).",
                                        show_default=False)],
    playbook: Annotated[Path | None, typer.Option("--playbook", metavar="PB", help="Add V's entry and patches "
                                                  "to this playbook.", show_default=False)] = None,
) -> None:
    from fleetctl.config.playbook import load_playbook
    from fleetctl.patching.authoring import playbook_snippet
    from fleetctl.patching.port import git_range_diff, import_diff, patch_ref

    sglang = validate.sglang_version(sglang, "--version")
    pb = load_playbook(playbook) if playbook is not None else None
    if pb is not None and sglang in pb.versions:
        raise InputError(f"{pb.path}: the playbook already has an entry for SGLang {sglang}",
                         hint=f"remove the {sglang} entry first to import again", reference="playbook-version-exists")
    diff = git_range_diff(repo, rev_range)
    files = import_diff(diff, sglang, name=f"{repo} {rev_range}")
    rels = [f.path for f in files]
    if pb is None:
        for f in files:
            sys.stdout.buffer.write(f.patch)
        sys.stdout.buffer.flush()
        parts = [playbook_snippet(sglang, f.path, patch_ref(sglang, f.path, rels), f.sha256) for f in files]
        snippet = parts[0] + "".join(p.split("\n", 2)[2] for p in parts[1:])  # one version header
        common.err.print("# playbook entry (under versions:); save each file's patch (stdout) as named\n"
                         + snippet.rstrip("\n"), markup=False, highlight=False)
        return
    from fleetctl.patching.port import FilePort, write_version

    ports = [FilePort(f.path, patch=f.patch, sha256=f.sha256) for f in files]
    refs = write_version(pb, sglang, ports, {}, None, _write_atomic)
    common.out.print(f"{sglang}: imported {len(refs)} file(s) into {pb.path}: {', '.join(refs)}",
                     markup=False, highlight=False)
