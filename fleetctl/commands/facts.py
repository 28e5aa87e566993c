"""fleetctl facts: what each host is."""

from __future__ import annotations

import typer
from rich.text import Text

from fleetctl.commands.common import (
    DEFAULT_FORKS,
    AcceptNewOpt,
    DebugOpt,
    ForksOpt,
    InventoryOpt,
    JsonOpt,
    LimitOpt,
    emit_json,
    err,
    out,
)
from fleetctl.commands.context import fleet_context, print_debug_details
from fleetctl.errors import EXIT_FAILED, EXIT_OK
from fleetctl.facts import HostFacts, read_facts
from fleetctl.render import host_progress, print_failures, status_cell, summary_line, table
from fleetctl.safetext import line, lines_cell, safe, styled

KEY_FILES = ("srt/server_args.py", "srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py")


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
        if not all_files and p not in KEY_FILES:
            continue
        short = p.replace("srt/speculative/", "spec/").replace("srt/", "")
        lines.append(f"{short} {ff.sha256[:12] if ff.sha256 else ('absent' if not ff.exists else ff.error or '?')}")
    rest = len(f.files) - len(lines)
    if rest > 0:
        lines.append(f"(+{rest} more hashed; --files lists all)")
    return lines_cell(lines)


def register(app: typer.Typer) -> None:
    @app.command("facts", help="Per host: reachable, OS, python, SGLang version and dir, torch, file hashes, GPUs.")
    def facts(
        inventory: InventoryOpt = None,
        limit: LimitOpt = None,
        forks: ForksOpt = DEFAULT_FORKS,
        files: bool = typer.Option(False, "--files", help="List the sha256 of every hashed file."),
        json_out: JsonOpt = False,
        debug: DebugOpt = False,
        accept_new_host_keys: AcceptNewOpt = False,
    ) -> None:
        with fleet_context(inventory, limit, forks, json=json_out, debug=debug,
                           accept_new_host_keys=accept_new_host_keys) as ctx:
            with host_progress(err, len(ctx.fleet.hosts), "facts", enabled=not json_out) as tick:
                ctx.fleet.progress = tick
                outcomes = ctx.fleet.run(lambda c: read_facts(c))
            elapsed = ctx.elapsed()
            summary = summary_line("facts", outcomes, elapsed)
            if json_out:
                emit_json({
                    "command": "facts",
                    "inventory": str(ctx.inventory.path),
                    "elapsed": round(elapsed, 3),
                    "hosts": [{**o.to_json(), "facts": o.data.to_json() if o.ok else None} for o in outcomes],
                    "summary": summary,
                })
            else:
                t = table(None, ["host", "status", "OS / python", "SGLang", "torch", "files (sha256)", "GPUs"])
                for o in outcomes:
                    if not o.ok:
                        t.add_row(o.host, status_cell(o.status), "(see below)", "", "", "", "")
                        continue
                    f: HostFacts = o.data
                    sg = (lines_cell([f"{f.sglang_version or '?'} ({f.sglang_install})", f.sglang_dir])
                          if f.sglang_found else Text.assemble(styled("not found", "red"), " by the launch's python"))
                    if not f.sglang_found and f.sglang_error:
                        sg.append("\n")
                        sg.append_text(safe(f.sglang_error))
                    for n in f.sglang_notes + [p for p in map(f.bytecode_problem, f.bytecode) if p]:
                        sg.append("\n")
                        sg.append_text(line(styled("note:", "yellow"), " ", n))
                    tc = f.torch
                    torch = (styled("missing", "red") if tc.installed is None else
                             Text.assemble(safe(tc.installed), " ",
                                           {True: styled("ok", "green"), False: styled("mismatch", "red"),
                                            None: "(unchecked)"}[tc.satisfied]))
                    if tc.required:
                        torch.append("\n")
                        torch.append_text(safe(f"needs {', '.join(tc.required)}"))
                    py = [f.os, f"{f.python} ({f.python_version})"]
                    if f.launch_python and f.launch_python != f.python:
                        py.append(f"launch: {f.launch_python} ({f.launch_python_version})")
                    t.add_row(o.host, status_cell(o.status), lines_cell(py),
                              sg, torch, _files_cell(f, files), _gpu_cell(f))
                out.print(t)
                print_failures(out, outcomes)
                err.print(summary, markup=False, highlight=False)
            print_debug_details(ctx, outcomes)
            raise typer.Exit(EXIT_OK if all(o.ok for o in outcomes) else EXIT_FAILED)
