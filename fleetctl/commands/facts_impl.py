"""fleetctl facts once its options are parsed (declared in facts.py): what each host is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fleetctl.commands.common import (
    emit_json,
    err,
    out,
)
from fleetctl.commands.context import fleet_context, print_debug_details
from fleetctl.engines import engine
from fleetctl.errors import EXIT_FAILED, EXIT_OK
from fleetctl.model.facts import HostFacts, read_facts
from fleetctl.model.hostnames import group, hosts_label, strip_host
from fleetctl.ui.jsonout import host_row
from fleetctl.ui.render import host_progress, say, status_cell, summary_line
from fleetctl.ui.safetext import line, lines_cell, safe, styled

if TYPE_CHECKING:  # rich: imported when the table is rendered (a --json run never does)
    from fleetctl.ui.safetext import Text


def _gpu_cell(f: HostFacts) -> str:
    if f.gpus is None:
        return f.gpu_note
    if not f.gpus:
        return "no GPUs listed"
    names = {g.name for g in f.gpus}
    busy = [g for g in f.gpus if g.busy()]
    s = f"{len(f.gpus)}× {', '.join(sorted(names))}"
    if busy:
        procs = sum(len(g.processes) for g in busy)
        s += f"; busy: GPU {','.join(str(g.index) for g in busy)} ({procs} proc)"
    else:
        s += "; idle"
    return s


def _files_cell(f: HostFacts, all_files: bool) -> Text:
    lines = []
    for p, ff in sorted(f.files.items()):
        if not all_files and p not in engine().key_files:
            continue
        short = engine().short_path(p)
        lines.append(f"{short} {ff.sha256[:12] if ff.sha256 else ('absent' if not ff.exists else ff.error or '?')}")
    rest = len(f.files) - len(lines)
    if rest > 0:
        lines.append(f"(+{rest} more hashed; --files lists all)")
    return lines_cell(lines)


def _facts_lines(f: HostFacts, all_files: bool) -> tuple[tuple[str, Text], ...]:
    """(label, value) lines of one host's facts: a block an 80-column terminal shows whole."""
    sg = (line(safe(f"{f.package_version or '?'} ({f.package_install}) in "), safe(f.package_dir))
          if f.package_found else line(styled("not found", "red"), " by the launch's python"))
    if not f.package_found and f.package_error:
        sg.append_text(line(": ", safe(f.package_error)))
    from fleetctl.model.facts import locate_notes

    notes = [*f.package_notes, *locate_notes(f), *f.hook_notes(),
             *[p for p in map(f.bytecode_problem, f.bytecode) if p]]
    if f.git is not None and f.git.describe:
        notes.append(f"a git checkout ({f.checkout}) at {f.git.describe}")
    unwritable = [ff for ff in f.files.values() if ff.unwritable]
    if unwritable:
        notes.append(f"{len(unwritable)} of the {len(f.files)} hashed files cannot be replaced by {f.user}: "
                     f"{unwritable[0].unwritable} (deploy refuses to patch them)")
    tc = f.torch
    torch = (styled("missing", "red") if tc.installed is None else
             line(safe(tc.installed), " ",
                           {True: styled("ok", "green"), False: styled("mismatch", "red"),
                            None: "(unchecked)"}[tc.satisfied]))
    if tc.required:
        torch.append_text(safe(f" (needs {', '.join(tc.required)})"))
    py = [("python", safe(f"{f.python} ({f.python_version})"))]
    if f.launch_python and f.launch_python != f.python:
        py.append(("launch", safe(f"{f.launch_python} ({f.launch_python_version})")))
    return (("OS", safe(f.os)), *py, (engine().display_name, sg), *[("note", line(styled(n, "yellow"))) for n in notes],  # (the label says "note": not again)
            ("torch", torch), ("files", line("; ").join(_files_cell(f, all_files).split("\n"))),
            ("GPUs", safe(_gpu_cell(f))), *_model_line(f), *_container_line(f))


def _container_line(f: HostFacts) -> tuple[tuple[str, Text], ...]:
    """The container SGLang runs in (absent: none): runtime, name, image, id, start; read-only root."""
    c = f.container
    if c is None:
        return ()
    text = line(safe(f"{c.runtime} {c.name}: image {c.image}, id {c.short_id}"),
                         safe(f", started {c.started_at}" if c.started_at else ""))
    if c.read_only:
        text.append_text(line(", ", styled("read-only root", "yellow")))
    return (("in", text),)


def _model_line(f: HostFacts) -> tuple[tuple[str, Text], ...]:
    """The launch's target model config.json as read on the host (absent: the launch names no model)."""
    out: list[tuple[str, Text]] = []
    for label, m in (("model", f.model), ("draft model", f.draft_model)):
        if m is None:
            continue
        if m.arch:
            out.append((label, line(safe(m.arch), " (", safe(m.path or "?"), ")")))
        else:
            out.append((label, line(styled("config.json not readable", "yellow"), ": ",
                                             safe(m.error or "?"))))
    return tuple(out)


def render_facts(outcomes: list, all_files: bool) -> None:
    """One block per distinct set of facts, with the hosts it describes; failures once per message."""
    keyed: list[tuple[str, tuple[object, ...]]] = []
    for o in outcomes:
        if o.ok:
            lines = _facts_lines(o.detail, all_files)
            keyed.append((o.host, ("ok", tuple((k, v.plain) for k, v in lines))))
        else:
            keyed.append((o.host, (o.status, strip_host(o.host, o.message))))
    shown: dict[str, tuple[tuple[str, Text], ...]] = {o.host: _facts_lines(o.detail, all_files)
                                                       for o in outcomes if o.ok}
    for hosts, (st, _) in group(keyed):
        if st != "ok":
            continue
        data = next(o.detail for o in outcomes if o.host == hosts[0])
        say(out, styled(hosts_label(hosts), "bold"), ": ",
            styled("MISMATCH", "red") if data.package_dir_mismatch else status_cell("ok"))
        for label, value in shown[hosts[0]]:
            say(out, f"  {label:<7} ", value, indent=10)
    for hosts, (st, what) in group(keyed):
        if st != "ok":
            say(out, status_cell(str(st)), " ", hosts_label(hosts), ": ", str(what), indent=4)


def facts(*, inventory: Path | None, limit: str | None, forks: int, files: bool, json_out: bool, debug: bool,
        accept_new_host_keys: bool) -> None:
    with fleet_context(inventory, limit, forks, command="facts", json=json_out, debug=debug,
                       accept_new_host_keys=accept_new_host_keys) as ctx:
        with host_progress(err, len(ctx.fleet.hosts), "facts", enabled=not json_out) as tick:
            ctx.fleet.progress = tick
            outcomes = ctx.fleet.run(lambda c: read_facts(c))
        elapsed = ctx.elapsed()
        summary = summary_line("facts", outcomes, elapsed)
        # a package dir the inventory pins that the launch does not import: deploy would patch files the
        # server never loads (with a playbook, explain and deploy refuse it): the host fails here too
        mismatch = [o for o in outcomes if o.ok and o.detail.package_dir_mismatch]
        if mismatch:
            summary += f"; {len(mismatch)} host(s) whose {engine().dir_key} is not what the launch imports"
        ok = all(o.ok for o in outcomes) and not mismatch
        if json_out:
            emit_json("facts", ok=ok, message=summary,
                      hosts=[host_row({**o.head(), "facts": o.detail.to_json() if o.ok else None,
                                       **({"message": o.detail.package_dir_mismatch} if o in mismatch else {})},
                                      ok=o.ok and o not in mismatch,
                                      **({"state": "mismatch"} if o in mismatch else {}))
                             for o in outcomes],
                      inventory=str(ctx.inventory.path), elapsed=round(elapsed, 3))
        else:
            render_facts(outcomes, files)
            err.print(summary, markup=False, highlight=False)
        print_debug_details(ctx, outcomes)
        raise typer.Exit(EXIT_OK if ok else EXIT_FAILED)
