"""Rendering results for people (rich) — JSON is built by the commands from the same data."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fleetctl.model.hostnames import host_ranges
from fleetctl.ui.safetext import clean, line, lines_cell, safe, styled

if TYPE_CHECKING:  # rich: imported by the first call that renders (a --json run never does)
    from rich.console import Console
    from rich.text import Text

    from fleetctl.ops.runner import HostOutcome
    from fleetctl.ui.safeconsole import SafeTable

STATUS_STYLE = {"ok": "green", "failed": "red", "unreachable": "red", "skipped": "yellow", "not-started": "yellow"}


@contextmanager
def host_progress(console: Console, total: int, what: str, enabled: bool = True) -> Iterator[callable]:  # type: ignore[valid-type]
    """A live 'hosts done / failed / remaining' bar on stderr (only on a terminal)."""
    counts = {"ok": 0, "bad": 0}
    lock = threading.Lock()
    if enabled and total > 1:  # the console (and rich) only when a bar may be drawn
        console = resolved(console)
    if not enabled or total <= 1 or not console.is_terminal:
        def tick(o: HostOutcome) -> None:
            return None

        yield tick
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # markup=False: the description and fields are shown as they are, never parsed
    with Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[failed]} failed", markup=False), TimeElapsedColumn(),
                  console=console, transient=True) as prog:
        # a live display is drawn outside the console's print path: its text is escaped here
        task = prog.add_task(clean(what, multiline=False, limit=80), total=total, failed=0)

        def tick(o: HostOutcome) -> None:
            with lock:
                counts["ok" if o.ok else "bad"] += 1
                prog.update(task, advance=1, failed=counts["bad"])

        yield tick


def resolved(console: Console) -> Console:
    """The console itself (commands.common's `out`/`err` make theirs on first use)."""
    get = getattr(type(console), "resolved", None)
    return get(console) if get is not None else console


def summary_line(what: str, outcomes: Sequence[HostOutcome], elapsed: float) -> str:
    n = len(outcomes)
    parts = []
    for st in ("ok", "failed", "unreachable", "not-started"):
        c = sum(1 for o in outcomes if o.status == st)
        if c or st == "ok":
            parts.append(f"{c} {st}")
    return f"{what}: {n} host{'s' if n != 1 else ''}: {', '.join(parts)} in {elapsed:.2f}s"


def table(title: str | None, columns: Sequence[str], whole: Sequence[str] = ()) -> SafeTable:
    """A results table: str cells (and the title) are untrusted values, shown as they are with
    control characters escaped; Text cells (status_cell, styled) are ours. The `whole` columns
    (file paths) are never wrapped: at 80 columns the prose columns give way, not a path."""
    from fleetctl.ui.safeconsole import table as safe_table

    t = safe_table(title, columns)
    for c, name in zip(t.columns, columns, strict=True):
        if name in whole:
            c.no_wrap = True
    return t


def hosts_cell(hosts: Sequence[str]) -> Text:
    """The host cell of a grouped row: "h01-h06" over "(6 hosts)" (one line for one host)."""
    if len(hosts) == 1:
        return safe(hosts[0])
    return lines_cell([host_ranges(hosts), f"({len(hosts)} hosts)"])


def status_cell(status: str) -> Text:
    return styled(status, STATUS_STYLE.get(status, "white"))


def print_failures(console: Console, outcomes: Sequence[HostOutcome]) -> None:
    """One line per failed host, under the table: host, status, what, the fix."""
    for o in outcomes:
        if not o.ok and o.status != "not-started":
            console.print(line(styled(o.status, "red"), " ", o.message))


def say(console: Console, *parts: object, indent: int = 0) -> None:
    """One line of prose, wrapped at spaces to the console's width (a path is never cut; only a word
    longer than the width is folded), continuation lines indented by `indent`. Off a terminal
    (wrap_prose False) one unwrapped line."""
    from rich.text import Text

    console = resolved(console)
    text = line(*parts)
    if not getattr(console, "wrap_prose", True):
        console.print(text, soft_wrap=True)
        return
    width = max(20, console.width - indent)
    for i, ln in enumerate(text.wrap(console, width, overflow="fold")):
        ln.rstrip()
        console.print(Text.assemble(" " * indent, ln) if i else ln, soft_wrap=True)
