"""Host names for people: "h01-h64 (64 hosts)" instead of 64 rows (issue 16.7). Stdlib only, no rich."""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable
from typing import TypeVar

_NUMBERED = re.compile(r"^(.*?)(\d+)$")

K = TypeVar("K", bound=Hashable)


def _sort_key(name: str) -> tuple[str, int, int, str]:
    m = _NUMBERED.match(name)
    if m is None:
        return (name, -1, 0, name)
    return (m.group(1), int(m.group(2)), len(m.group(2)), name)


def host_ranges(names: Iterable[str], sep: str = ", ") -> str:
    """Sorted names with numeric suffixes compressed: h01,h02,h03,h07 -> "h01-h03, h07".
    A run is only formed by names with the same prefix and the same number of digits; two
    neighbours are written as a comma list; names without a number stay as they are."""
    ordered = sorted(dict.fromkeys(names), key=_sort_key)
    parts: list[str] = []
    run: list[str] = []
    last: tuple[str, int, int] | None = None

    def flush() -> None:
        if len(run) > 2:
            parts.append(f"{run[0]}-{run[-1]}")
        else:
            parts.extend(run)
        run.clear()

    for n in ordered:
        m = _NUMBERED.match(n)
        if m is None:
            flush()
            last = None
            parts.append(n)
            continue
        cur = (m.group(1), int(m.group(2)), len(m.group(2)))
        if last is not None and (cur[0], cur[2]) == (last[0], last[2]) and cur[1] == last[1] + 1:
            run.append(n)
        else:
            flush()
            run.append(n)
        last = cur
    flush()
    return sep.join(parts)


def hosts_label(names: Iterable[str]) -> str:
    """One host: its name; several: "h01-h06 (6 hosts)"."""
    ns = list(dict.fromkeys(names))
    return ns[0] if len(ns) == 1 else f"{host_ranges(ns)} ({len(ns)} hosts)"


def group(items: Iterable[tuple[str, K]]) -> list[tuple[list[str], K]]:
    """(host, key) pairs -> the hosts of each distinct key, keys in order of first appearance."""
    out: dict[K, list[str]] = {}
    for host, key in items:
        out.setdefault(key, []).append(host)
    return [(hosts, key) for key, hosts in out.items()]


def strip_host(host: str, text: str) -> str:
    """A message without its leading "host: " (the grouped row names the hosts)."""
    return text[len(host) + 2:] if text.startswith(f"{host}: ") else text


def plural(n: int, word: str) -> str:
    """'1 host', '2 hosts': a count and its noun, in the summary lines."""
    return f"{n} {word}{'' if n == 1 else 's'}"
