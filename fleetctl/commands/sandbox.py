"""fleetctl sandbox up|down|status: a local fleet of real sshd hosts for trying fleetctl."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleetctl.commands import common
from fleetctl.errors import FleetctlError
from fleetctl.model.hostnames import plural

if TYPE_CHECKING:  # rich: imported when a table is shown (issue 16.10)
    from fleetctl.ui.safeconsole import SafeTable

sandbox_app = typer.Typer(help="A local fleet of real OpenSSH hosts on loopback: up, down, status.", no_args_is_help=True)

DirOpt = Annotated[
    Path,
    typer.Option("--dir", "-d", help="The sandbox directory (created by 'up'; holds keys, configs, hosts).",
                 show_default=False),
]


def _table(*cols: str) -> SafeTable:
    from fleetctl.ui.safeconsole import SafeTable

    t = SafeTable(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for c in cols:
        t.add_column(c)
    return t


@sandbox_app.command("up", help=(
    "Start HOSTS real sshd hosts (h01, h02, ...) plus a jump host on 127.0.0.1, each with its own "
    "copy of the pristine SGLang tree (versions cycle through --versions), and write "
    "DIR/inventory.yaml, DIR/inventory-jump.yaml and DIR/ssh_config. torch and nvidia-smi on the "
    "hosts are labelled stand-ins."))
def up(
    dir: DirOpt,
    hosts: Annotated[int, typer.Option("--hosts", "-n", help="How many fleet hosts.")] = 3,
    versions: Annotated[str, typer.Option("--versions", help="SGLang versions, comma list; hosts cycle through them.")]
    = "0.5.9,0.5.14",
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs per host (served by the stand-in nvidia-smi).")] = 2,
    busy_gpus: Annotated[str, typer.Option("--busy-gpus", help="Hosts whose GPUs start busy, comma list.")] = "",
    cpu_sglang: Annotated[bool, typer.Option("--cpu-sglang", help=(
        "Run the hosts on the cached CPU SGLang venv (real torch CPU build, SGLang's pure-Python "
        "requirements, a labelled GPU stand-in; built once, minutes) so `explain --probe` works."))] = False,
    bare_shell: Annotated[bool, typer.Option(
        "--bare-shell", help="Each host's sessions get their own empty HOME: a login shell with no rc files.")] = False,
    host_python: Annotated[str, typer.Option(
        "--host-python", help="The interpreter the hosts run (CPython 3.8 or later; default: this one's).",
        show_default=False)] = "",
    json_out: common.JsonOpt = False,
) -> None:
    from fleetctl.sandbox import lifecycle

    def progress(msg: str) -> None:
        if not json_out:
            common.err.print(f"sandbox: {msg}", markup=False, highlight=False)

    sb = lifecycle.up(dir, hosts=hosts, versions=versions.split(","), gpus=gpus,
                      busy_gpus=[b for b in busy_gpus.split(",") if b.strip()], progress=progress,
                      cpu_sglang=cpu_sglang, bare_shell=bare_shell, host_python=host_python)
    if json_out:
        from fleetctl.ui.jsonout import host_row

        doc = sb.to_json()
        rows = [host_row({**j, "pid": h.pid}, ok=True, state="running", message="", host=h.name)
                for h, j in zip(sb.all_hosts(), doc.pop("hosts"), strict=True)]
        common.emit_json("sandbox up", ok=True, hosts=rows,
                         message=f"sandbox up: {plural(len(sb.hosts), 'host')} + jump in {sb.dir}",
                         **doc, inventory=str(sb.inventory_path), inventory_jump=str(sb.jump_inventory_path),
                         ssh_config=str(sb.ssh_config_path), timings=sb.timings)
        return
    t = _table("HOST", "VERSION", "TORCH*", "PORT", "PID", "GPUS")
    for h in sb.all_hosts():
        gpu = "" if h.role == "jump" else f"{sb.gpus} {h.gpu_state_file.read_text().strip()}"
        t.add_row(h.name, h.version or "(jump host)", h.torch_version or "", str(h.port), str(h.pid or "-"), gpu)
    common.out.print(t)
    common.out.print(
        f"sandbox up: {plural(len(sb.hosts), 'host')} + jump in {sb.dir} ({sb.timings.get('total', 0):.1f}s)\n"
        f"  inventory:  {sb.inventory_path}\n"
        f"  via jump:   {sb.jump_inventory_path}\n"
        f"  ssh:        ssh -F {sb.ssh_config_path} h01\n"
        "  * torch and nvidia-smi on these hosts are stand-ins (see README.txt)",
        markup=False, highlight=False)


def _restart_hint(dir: Path, names: list[str]) -> str:
    from fleetctl.model.suggest import quote

    return f"'fleetctl sandbox restart --dir {quote(str(dir))} {' '.join(names)}' starts {'it' if len(names) == 1 else 'them'} again"


@sandbox_app.command("status", help=(
    "Per host: version, port, sshd pid, alive (and answering on its port). Exit 1 if a host is down "
    "(the line names the restart command)."))
def status(dir: DirOpt, json_out: common.JsonOpt = False) -> None:
    from fleetctl.sandbox import lifecycle

    rows = lifecycle.status(dir)
    down = [r.name for r in rows if not (r.alive and r.listening)]
    up_n = len(rows) - len(down)
    msg = f"{up_n}/{len(rows)} sshd running" + (f"; down: {', '.join(down)}: {_restart_hint(dir, down)}"
                                                if down else "")
    if json_out:
        from fleetctl.ui.jsonout import host_row

        hosts = [host_row(r.to_json(), ok=bool(r.alive and r.listening), host=r.name,
                          message="running" if r.alive and r.listening else _restart_hint(dir, [r.name]),
                          state="running" if r.alive and r.listening else ("not answering" if r.alive else "stopped"))
                 for r in rows]
        common.emit_json("sandbox status", ok=not down, hosts=hosts, dir=str(Path(dir).resolve()), message=msg)
    else:
        t = _table("HOST", "VERSION", "PORT", "PID", "ALIVE", "GPUS")
        for r in rows:
            alive = "yes" if r.alive and r.listening else ("not answering" if r.alive else "no")
            t.add_row(r.name, r.version or "(jump host)", str(r.port), str(r.pid or "-"), alive, r.gpu_state or "")
        common.out.print(t)
        common.out.print(msg, markup=False, highlight=False)
    if down:
        raise typer.Exit(1)


@sandbox_app.command("restart", help=(
    "Start the sshd of the named hosts again (default: every host that is down), on the same port; "
    "a host whose sshd runs but does not answer is stopped first."))
def restart(
    dir: DirOpt,
    hosts: Annotated[list[str] | None, typer.Argument(metavar="[HOST]...", help="Hosts (default: those down).")] = None,
    json_out: common.JsonOpt = False,
) -> None:
    from fleetctl.sandbox import lifecycle

    sb = lifecycle.load(dir)
    rows = {r.name: r for r in lifecycle.status(dir)}
    names = list(hosts) if hosts else [n for n, r in rows.items() if not (r.alive and r.listening)]
    for n in names:
        sb.host(n)  # an unknown name: one line naming the hosts (exit 2)
    done = []
    for n in names:
        r = rows.get(n)
        if r is not None and r.alive and not r.listening:
            sb.stop_host(n)
        done.append((n, sb.start_host(n)))
    msg = (f"sandbox restart: {', '.join(f'{n} (pid {p})' for n, p in done)}" if done
           else "sandbox restart: every host is running")
    if json_out:
        from fleetctl.ui.jsonout import host_row

        common.emit_json("sandbox restart", ok=True, message=msg, dir=str(Path(dir).resolve()),
                         hosts=[host_row({"pid": p}, ok=True, state="running", message=f"sshd pid {p}", host=n)
                                for n, p in done])
    else:
        common.out.print(msg, markup=False, highlight=False)


@sandbox_app.command("down", help=(
    "Stop every process of the sandbox in DIR: sshd listeners, their ssh sessions, and servers whose "
    "pid files are in the hosts' state dirs (each confirmed to belong to DIR; SIGKILL after --timeout). "
    "Idempotent; keeps DIR unless --purge."))
def down(
    dir: DirOpt,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait after SIGTERM before SIGKILL.")]
    = 5.0,
    purge: Annotated[bool, typer.Option("--purge", help="Remove DIR once everything stopped.")] = False,
    json_out: common.JsonOpt = False,
) -> None:
    from fleetctl.sandbox import lifecycle

    report = lifecycle.down(dir, timeout=timeout, purge=purge)
    if json_out:
        doc = report.to_json()
        common.emit_json("sandbox down", ok=not report.survivors,
                         message=f"sandbox down: stopped {len(report.stopped)} process(es) in {report.dir}",
                         summary={"stopped": len(report.stopped), "survivors": len(report.survivors)}, **doc)
    else:
        if report.stopped:
            t = _table("PID", "SIGNAL", "WHAT")
            for s in report.stopped:
                t.add_row(str(s.pid), s.signal, s.what)
            common.out.print(t)
        common.out.print(
            f"sandbox down: stopped {len(report.stopped)} process(es) in {report.dir}"
            + (" (nothing was running)" if not report.stopped else "")
            + ("; removed the dir" if report.purged else ""),
            markup=False, highlight=False)
    if report.survivors:
        raise FleetctlError(
            f"{len(report.survivors)} process(es) outlived SIGKILL: "
            + ", ".join(f"{s.pid} ({s.what})" for s in report.survivors), reference="sandbox-failed")


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
