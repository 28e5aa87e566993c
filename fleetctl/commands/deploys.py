"""deploy, rollback, status, history, explain: their options and help, declared here and nothing else.

Thin on purpose (issue 12.5) and light (issue 16.10): this module imports typer and the shared
option types only, so `fleetctl deploy --help` and option parsing cost no rich, pydantic or transport.
Each command hands its parsed options to `run(name, ...)` (the command table, commands/__init__.py),
which imports deploys_impl.py then: it runs the op, records it and renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fleetctl.commands import run
from fleetctl.commands.common import (
    JsonOpt,
    PlaybookArg,
    fleet_options,
)


def register(app: typer.Typer) -> None:
    @app.command("deploy", help="Patch every host to the playbook's intended files: plan, backup, atomic swap, verify.")
    @fleet_options
    def deploy(
        playbook: PlaybookArg,
        check: bool = typer.Option(False, "--check", help="Show the plan and change nothing."),
        diff: bool = typer.Option(False, "--diff", help="Print unified diffs (remote vs intended; drifted: also vs pristine)."),
        force: bool = typer.Option(False, "--force", help="Replace drifted files too (their bytes are backed up)."),
        port_onto_host: bool = typer.Option(False, "--port-onto-host", help="Where files the playbook patches are not the release's (a between-release checkout): merge the release's patch onto the host's own bytes (three-way) and deploy that, recorded against the tree's own hashes."),
        allow_uncovered: bool = typer.Option(False, "--allow-uncovered", help="Deploy even where the worker that will run is not patched."),
        strict: bool = typer.Option(False, "--strict", help="Refuse hosts where the worker that will run is not certain (the model's config.json cannot be read there)."),
        restart: bool = typer.Option(False, "--restart", help="Rolling restart: per batch patch -> restart -> ready -> verify-logs."),
        serial: str | None = typer.Option(None, "--serial", help="With --restart: hosts per batch, N or P% (default: all at once)."),
        canary: str | None = typer.Option(None, "--canary", help="With --restart: size of the first batch, N or P%."),
        max_fail: str | None = typer.Option(None, "--max-fail", help="With --restart: failed hosts a batch may have (P%) before the rollout stops and that batch is rolled back (default 0%)."),
        any_errors_fatal: bool = typer.Option(False, "--any-errors-fatal", help="Change no host at all if any selected host is unreachable or refused at plan time."),
        ready_timeout: float | None = typer.Option(None, "--timeout", min=0.1, help="With --restart: seconds to wait for each server to be ready."),
        break_lock: str | None = typer.Option(None, "--break-lock", help="Comma list of hosts whose lock, held by another machine sharing their state dir, may be taken over."),
        recheck: bool = typer.Option(False, "--recheck", help="Ask every host's python again even where nothing changed since the last deploy sealed it (see docs/reliability.md, seals)."),
        **shared: Any,
    ) -> None:
        run("deploy", playbook=playbook, check=check, diff=diff, force=force, port_onto_host=port_onto_host,
            allow_uncovered=allow_uncovered, strict=strict, restart=restart, serial=serial, canary=canary, max_fail=max_fail,
            any_errors_fatal=any_errors_fatal, ready_timeout=ready_timeout, break_lock=break_lock, recheck=recheck,
            **shared)

    @app.command("rollback", help="Restore each host's files to their bytes before its last (or a named) deploy.")
    @fleet_options
    def rollback(
        to: str | None = typer.Option(None, "--to", help="Undo this deploy id and every later one on each host."),
        check: bool = typer.Option(False, "--check", help="Show what would be restored and change nothing."),
        force: bool = typer.Option(False, "--force", help="Restore files changed since the deploy too (a copy is kept)."),
        any_errors_fatal: bool = typer.Option(False, "--any-errors-fatal", help="Change no host at all if any selected host is unreachable or refused at plan time."),
        from_pristine: bool = typer.Option(False, "--from-pristine", help="Restore the release's pristine bytes (controller's wheel cache, checked against the wheel's RECORD) into files that differ from them with no deploy record."),
        playbook: Path | None = typer.Option(None, "--playbook", "-p", help="With --from-pristine: also check its files, and the pristine bytes against its sha256."),
        old_tree: bool = typer.Option(False, "--old-tree", help="Restore a deploy in the tree it patched even though this python now imports another one."),
        break_lock: str | None = typer.Option(None, "--break-lock", help="Comma list of hosts whose lock, held by another machine sharing their state dir, may be taken over."),
        **shared: Any,
    ) -> None:
        run("rollback", to=to, check=check, force=force, any_errors_fatal=any_errors_fatal,
            from_pristine=from_pristine, playbook=playbook, old_tree=old_tree, break_lock=break_lock, **shared)

    @app.command("status", help="Per host: deploy state of the playbook's files, interrupted deploys, lock, servers.")
    @fleet_options
    def status(
        playbook: Annotated[Path | None, typer.Argument(metavar="PLAYBOOK",
                                                        help="Optional playbook: also classify its files.")] = None,
        **shared: Any,
    ) -> None:
        run("status", playbook=playbook, **shared)

    @app.command("history", help="The local ledger of deploys, rollbacks and launches; 'history ID' shows one; "
                 "'history show ID' also its run log (plan, per-host start/end, result, timings).")
    def history(
        op_id: Annotated[str | None, typer.Argument(metavar="[show] ID", help="An operation id (or a run id) to "
                                                    "show in full; after 'show', with its run log's events.")] = None,
        run_id: Annotated[str | None, typer.Argument(metavar="", hidden=True)] = None,
        limit_rows: int = typer.Option(30, "--last", min=1, help="How many operations to list."),
        log_file: str | None = typer.Option(None, "--log-file", help="The run log to read (a command's "
                                            "--log-file); default: the controller's run log.", show_default=False),
        json_out: JsonOpt = False,
    ) -> None:
        run("history", op_id=op_id, run_id=run_id, limit_rows=limit_rows, log_file=log_file, json_out=json_out)

    @app.command("explain", help="Say per host which SGLang worker class and file will run, and whether the playbook patches it.")
    @fleet_options
    def explain(
        playbook: PlaybookArg,
        probe: bool = typer.Option(False, "--probe", help="Also ask each host's own SGLang (its argument "
                                   "processing and worker selection, run on the CPU with no GPU visible) and "
                                   "fail when it disagrees with fleetctl's table."),
        **shared: Any,
    ) -> None:
        run("explain", playbook=playbook, probe=probe, **shared)
