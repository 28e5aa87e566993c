"""Rendering results for people (rich) — JSON is built by the commands from the same data."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fleetctl.fleet import HostOutcome

STATUS_STYLE = {"ok": "green", "failed": "red", "unreachable": "red", "skipped": "yellow"}


@contextmanager
def host_progress(console: Console, total: int, what: str, enabled: bool = True) -> Iterator[callable]:  # type: ignore[valid-type]
    """A live 'hosts done / failed / remaining' bar on stderr (only on a terminal)."""
    counts = {"ok": 0, "bad": 0}
    lock = threading.Lock()
    if not enabled or not console.is_terminal or total <= 1:
        def tick(o: HostOutcome) -> None:
            return None

        yield tick
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                  console=console, transient=True) as prog:
        task = prog.add_task(what, total=total, failed=0)

        def tick(o: HostOutcome) -> None:
            with lock:
                counts["ok" if o.ok else "bad"] += 1
                prog.update(task, advance=1, failed=counts["bad"])

        yield tick


def summary_line(what: str, outcomes: Sequence[HostOutcome], elapsed: float) -> str:
    n = len(outcomes)
    parts = []
    for st in ("ok", "failed", "unreachable", "skipped"):
        c = sum(1 for o in outcomes if o.status == st)
        if c or st == "ok":
            parts.append(f"{c} {st}")
    return f"{what}: {n} host{'s' if n != 1 else ''}: {', '.join(parts)} in {elapsed:.2f}s"


def table(title: str | None, columns: Sequence[str]) -> Table:
    t = Table(title=title, show_lines=False, header_style="bold", title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def status_cell(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def print_failures(console: Console, outcomes: Sequence[HostOutcome]) -> None:
    """One line per failed host, under the table: host, status, what, the fix."""
    for o in outcomes:
        if not o.ok and o.status != "skipped":
            console.print(f"[red]{o.status}[/] {o.message}")
