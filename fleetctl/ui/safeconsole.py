"""The rich side of fleetctl/ui/safetext.py: the console and table every command prints with.

Imported only when output is rendered for a terminal or a log (a --json run never imports rich);
fleetctl.ui.safetext hands these out by name. See safetext.py for what they guarantee.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderableType, RenderHook, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from fleetctl.ui.safetext import as_text, clean, needs_cleaning, safe


class SafeTable(Table):
    """A rich Table whose cells and title are never markup-parsed: str (or any value) cells are
    untrusted values shown on one line (newlines escaped: use lines_cell for one line per value),
    Text cells are ours."""

    def add_row(self, *renderables: Any, style: Any = None, end_section: bool = False) -> None:
        super().add_row(*(None if r is None else r if isinstance(r, ConsoleRenderable) and not isinstance(r, Text)
                          else as_text(r) for r in renderables), style=style, end_section=end_section)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        self._fit_headers(options.max_width)
        yield from super().__rich_console__(console, options)

    def _fit_headers(self, width: int) -> None:
        """No header word is cut in two ("runni / ng") where the table can avoid it: a column is at
        least as wide as its header's longest word, and a column whose cells are never wrapped (a path,
        an id) lets its header wrap at spaces instead of widening past its cells. Only when the
        widths that asks for fit `width`; otherwise the table is laid out as before (prose gives way)."""
        def words(c: Any) -> int:
            h = c.header.plain if isinstance(c.header, Text) else str(c.header)
            return max((len(w) for w in h.split()), default=0)

        def cells(c: Any) -> int:  # the widest line of a column's cells (all Text: see below)
            return max((Text(ln).cell_len for x in c._cells for ln in x.plain.split("\n")), default=0)

        plan = []
        for c in self.columns:
            if c.no_wrap and all(isinstance(x, Text) for x in c._cells):
                plan.append((c, False, max(cells(c), words(c))))
            else:
                plan.append((c, c.no_wrap, words(c) if words(c) <= 12 else None))
        edges = 3 * len(self.columns) + 1 if self.box else 0
        need = sum(mw if mw is not None else 1 for _c, _nw, mw in plan) + edges
        if need > width:
            return
        for c, no_wrap, mw in plan:
            c.no_wrap, c.min_width = no_wrap, mw


class Verbatim:
    """Text printed as it is, trailing spaces included (a unified diff's blank context line is one
    space: the diff stays appliable); still escaped like every other string."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield console.render_str(self.text)


_BLANKS = " \t"


def _bare(seg: Segment) -> bool:
    """A segment whose trailing blanks show nothing: text with no background."""
    return not seg.control and not (seg.style is not None and seg.style.bgcolor is not None)


def _rstripped(line: list[Segment]) -> list[Segment]:
    """One line's segments without the blanks at its end (a table pads its last column to its width)."""
    while line and _bare(line[-1]) and not line[-1].text.rstrip(_BLANKS):
        line.pop()
    if line and _bare(line[-1]) and line[-1].text != line[-1].text.rstrip(_BLANKS):
        last = line.pop()
        line.append(Segment(last.text.rstrip(_BLANKS), last.style))
    return line


def _without_trailing_blanks(segments: Any) -> RenderResult:
    """`segments` with no line ending in spaces or tabs (the last line, not ended yet, as it is)."""
    line: list[Segment] = []
    for seg in segments:
        if seg.control or "\n" not in seg.text:
            line.append(seg)
            continue
        parts = seg.text.split("\n")
        for i, part in enumerate(parts):
            if part:
                line.append(Segment(part, seg.style))
            if i < len(parts) - 1:
                yield from _rstripped(line)
                yield Segment("\n", seg.style)
                line = []
    yield from line


class _EscapeSegments:
    """Renders its renderable, escaping unsafe characters in every text segment (rich's own
    control segments — cursor moves of a live progress bar — pass unchanged), and ends no line with
    a blank (tables pad their cells; a person's copy of a line or a grep should not carry that),
    except in Verbatim text."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def _escaped(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for seg in console.render(self.renderable, options):
            if seg.control or not needs_cleaning(seg.text):
                yield seg
            else:
                yield Segment(clean(seg.text), seg.style)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if isinstance(self.renderable, Verbatim):
            yield from self._escaped(console, options)
        else:
            yield from _without_trailing_blanks(self._escaped(console, options))


class _EscapeHook(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_EscapeSegments(r) for r in renderables]  # type: ignore[misc]


class SafeConsole(Console):
    """A Console that never interprets markup or emoji codes in strings and never writes a
    control character it was not built to write."""

    wrap_prose = True  # prose lines (render.say) wrapped at spaces to the width; off for pipes

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw["markup"] = False
        kw["emoji"] = False
        kw.setdefault("highlight", False)
        super().__init__(*args, **kw)
        self.push_render_hook(_EscapeHook())

    def render_str(self, text: str, *, style: str | Style = "", justify: Any = None, overflow: Any = None,
                   emoji: bool | None = None, markup: bool | None = None, highlight: bool | None = None,
                   highlighter: Any = None) -> Text:
        return Text(clean(text), style=style, justify=justify, overflow=overflow)


def table(title: Any, columns: Iterable[str], **kw: Any) -> SafeTable:
    """A table whose title and headers are untrusted values (a playbook's verify markers), escaped."""
    kw.setdefault("show_lines", False)
    kw.setdefault("header_style", "bold")
    kw.setdefault("title_justify", "left")
    t = SafeTable(title=None if title is None else safe(title), **kw)
    for c in columns:  # headers may be playbook values (verify markers)
        t.add_column(safe(c), overflow="fold")
    return t
