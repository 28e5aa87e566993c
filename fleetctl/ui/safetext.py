"""Untrusted text for the terminal: never parsed as rich markup, control characters shown escaped.

Everything a host sends (and every inventory or playbook value) is data. Before it reaches a
terminal it goes through `clean`: C0 controls (ESC included), DEL, C1 controls, Unicode format
characters (bidi overrides and isolates, zero-width characters, BOM), line/paragraph separators
and lone surrogates are replaced by their escaped form (`\\x1b`, `\\u202e`, `\\r`); newlines and tabs
are kept only where the caller allows several lines. `safe` wraps the result in a rich `Text`,
which rich never parses as markup or emoji codes.

`SafeConsole` is the only console the commands print with: any plain string it is given (print
arguments, table cells and titles) becomes such a `Text` — markup and emoji codes are never
interpreted, whatever the call site passes — and a render hook escapes control characters in
every segment it writes, so a `Text` built by mistake from raw host bytes cannot reach the
terminal raw either. Our own styling is written as `Text` objects (`styled`, `line`).

rich itself is imported on first use (a --json run never does): SafeConsole, SafeTable and `table`
live in fleetctl/ui/safeconsole.py, which imports rich and this module (never the other way).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported on the first call that builds output for a terminal (issue 17)
    from rich.style import Style
    from rich.text import Text


CELL_LIMIT = 4096  # characters of one untrusted value shown in a table cell or line
DETAIL_LIMIT = 1 << 16  # --debug details (remote tracebacks, stderr)

# Candidates: everything outside printable ASCII; `unsafe_char` decides per character.
_CANDIDATE = re.compile(r"[^\x20-\x7e]")
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def unsafe_char(c: str) -> bool:
    """True for a character that must not reach a terminal raw (newline and tab included)."""
    o = ord(c)
    if o < 0x20 or 0x7F <= o <= 0x9F:
        return True
    if o < 0xA0:
        return False
    return unicodedata.category(c) in _UNSAFE_CATEGORIES


def _escaped(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    o = ord(c)
    if o <= 0xFF:
        return f"\\x{o:02x}"
    if o <= 0xFFFF:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def _sub_multi(m: re.Match[str]) -> str:
    c = m.group()
    return c if c in "\n\t" or not unsafe_char(c) else _escaped(c)


def _sub_one(m: re.Match[str]) -> str:
    c = m.group()
    return _escaped(c) if unsafe_char(c) else c


def clean(value: Any, *, multiline: bool = True, limit: int | None = None) -> str:
    """`value` as text safe for a terminal: unsafe characters escaped; with multiline=False also
    newlines and tabs (one line stays one line). `limit` cuts long values, saying how much was cut."""
    s = "" if value is None else value if isinstance(value, str) else str(value)
    if "'fleetctl " in s:  # a suggested command: made runnable as printed (suggest.py)
        from fleetctl.model.suggest import complete

        s = complete(s)
    cut = ""
    if limit is not None and len(s) > limit:
        cut = f"... (+{len(s) - limit} characters)"
        s = s[:limit]
    return _CANDIDATE.sub(_sub_multi if multiline else _sub_one, s) + cut


def needs_cleaning(s: str, *, multiline: bool = True) -> bool:
    for m in _CANDIDATE.finditer(s):
        c = m.group()
        if unsafe_char(c) and not (multiline and c in "\n\t"):
            return True
    return False


def safe(value: Any, style: str | Style = "", *, multiline: bool = False, limit: int | None = CELL_LIMIT) -> Text:
    """An untrusted value as a rich Text: never markup-parsed, unsafe characters escaped (newlines
    and tabs too unless `multiline`)."""
    from rich.text import Text

    return Text(clean(value, multiline=multiline, limit=limit), style=style)


def styled(word: str, style: str | Style) -> Text:
    """One of our own words (a status, a marker) in a style."""
    from rich.text import Text

    return Text(clean(word, multiline=False), style=style)


def as_text(part: Any, *, multiline: bool = False, limit: int | None = CELL_LIMIT) -> Text:
    """A cell or line part: a Text is ours (its newlines are meant; it is re-escaped only if it
    carries other unsafe characters, keeping its base style); anything else is an untrusted value,
    escaped, on one line unless `multiline`."""
    from rich.text import Text

    if isinstance(part, Text):
        if needs_cleaning(part.plain):
            return Text(clean(part.plain), style=part.style)
        return part
    return safe(part, multiline=multiline, limit=limit)


def line(*parts: Any, limit: int | None = CELL_LIMIT) -> Text:
    """One output line from parts: our styled Texts and untrusted values; newlines inside the
    values are escaped, so a host cannot forge further lines."""
    from rich.text import Text

    return Text.assemble(*(as_text(p, limit=limit) for p in parts))


def lines_cell(values: Iterable[Any]) -> Text:
    """A cell of one line per untrusted value (each escaped and cut on its own)."""
    from rich.text import Text

    return Text("\n").join(safe(v) for v in values)
