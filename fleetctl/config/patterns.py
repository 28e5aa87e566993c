"""`--limit` as Ansible reads it: patterns separated by `,` or `:`; a plain pattern adds hosts, `&P`
keeps only hosts also in P, `!P` removes hosts in P (all plain ones first, then every `&`, then
every `!`; no plain pattern means `all`). One pattern is a host or group name, a glob (`gpu*`,
`web?`), `~REGEX` (matched from the start of the name; a glob or regex never matches the implicit
groups `all` and `ungrouped`, which Ansible's does), optionally with a subscript `[N]`, `[N:M]`
(both ends included) or `[N:]` taken from the hosts it matched; `@FILE` reads patterns from a file,
one a line (a retry file). Stdlib only; tests/test_ansible_patterns.py holds it to Ansible's own
InventoryManager.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from fleetctl.errors import InputError

MAX_LIMIT_FILE = 1 << 20  # bytes of an @file

_TERM = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")
_ENDS_IN_BRACKETS = re.compile(r"^(.+)\[([^\]]*)\]$")
_GLOB = (".", "?", "*", "[")
IMPLICIT = ("all", "ungrouped")


def split_patterns(text: str) -> list[str]:
    """'a:b,!c' -> terms. With a comma, commas separate (so an IPv6 name keeps its colons); else ':'
    separates, outside [...] (so 'web[0:3]' stays one term)."""
    if "," in text:
        parts = text.split(",")
    else:
        parts = _TERM.findall(text) if ":" in text else [text]
    return [p.strip() for p in parts if p.strip()]


def expand_files(terms: list[str], where: str) -> list[str]:
    """`@FILE` terms replaced by the patterns in the file, one a line."""
    out: list[str] = []
    for t in terms:
        if not t.startswith("@"):
            out.append(t)
            continue
        path = Path(t[1:]).expanduser()
        try:
            if path.stat().st_size > MAX_LIMIT_FILE:
                raise InputError(f"{where} {t}: the file is larger than {MAX_LIMIT_FILE >> 10} KiB",
                                 reference="limit-invalid")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{where} {t}: cannot read {path}: {e.__class__.__name__}: {getattr(e, 'strerror', e)}",
                             hint="give the path of a file with one host or pattern a line",
                             reference="limit-invalid") from None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if not lines:
            raise InputError(f"{where} {t}: {path} names no host", hint="a retry file lists one host a line",
                             reference="limit-matches-nothing")
        out += lines
    return out


def subscript(pattern: str, where: str) -> tuple[str, tuple[int, int | None] | None]:
    """'web[0:3]' -> ('web', (0, 3)); 'web[2]' -> ('web', (2, None)); '[N:]' -> (N, -1)."""
    if pattern.startswith("~"):
        return pattern, None
    m = _SUBSCRIPT.match(pattern)
    if m is None:
        bad = _ENDS_IN_BRACKETS.match(pattern)
        if bad and (":" in bad.group(2) or "-" in bad.group(2)) and not re.fullmatch(r"[A-Za-z0-9!^]-[A-Za-z0-9]",
                                                                                       bad.group(2)):
            raise InputError(f"{where}: '{pattern}': unsupported subscript [{bad.group(2)}]",
                             hint="write NAME[N] (one host), NAME[N:M] (N to M, both included) or NAME[N:]",
                             reference="limit-invalid")
        return pattern, None
    expr, idx, start, sep, end = m.groups()
    if sep == "-":
        raise InputError(f"{where}: '{pattern}': the [x-y] subscript was removed from Ansible",
                         hint=f"write {expr}[{start}:{end}] (both ends included)", reference="limit-invalid")
    if idx is not None:
        return expr, (int(idx), None)
    return expr, (int(start), int(end) if end else -1)


def _matcher(pattern: str, where: str) -> Callable[[str], bool]:
    try:
        rx = re.compile(pattern[1:]) if pattern.startswith("~") else re.compile(fnmatch.translate(pattern))
    except re.error as e:
        raise InputError(f"{where}: '{pattern}': not a valid {'regular expression' if pattern[0] == '~' else 'glob'}"
                         f": {e}", hint="'~REGEX' is a Python regular expression matched from the start",
                         reference="limit-invalid") from None
    return lambda s: rx.match(s) is not None


def select(limit: str, hosts: Sequence[str], groups: dict[str, list[str]], where: str = "--limit",
           missing: Callable[[str], InputError] | None = None) -> list[str]:
    """The host names `limit` selects, in `hosts` order. `groups`: each group's hosts (in the order a
    subscript indexes; `all` included). A pattern that matches nothing raises missing(pattern)."""
    terms = expand_files(split_patterns(limit), where)
    if not terms:
        raise InputError(f"{where} {limit!r} names no host", hint="give host names, groups, patterns or 'all'",
                         reference="limit-matches-nothing")
    plain = [t for t in terms if t[0] not in "&!"]
    ands = [t for t in terms if t[0] == "&"]
    nots = [t for t in terms if t[0] == "!"]
    chosen: list[str] = []
    for t in plain or ["all"]:
        chosen += [h for h in match_one(t, hosts, groups, where, missing) if h not in chosen]
    for t in ands:
        keep = set(match_one(t[1:], hosts, groups, where, missing))
        chosen = [h for h in chosen if h in keep]
    for t in nots:
        drop = set(match_one(t[1:], hosts, groups, where, missing))
        chosen = [h for h in chosen if h not in drop]
    order = {h: i for i, h in enumerate(hosts)}
    return sorted(chosen, key=order.__getitem__)


def match_one(pattern: str, hosts: Sequence[str], groups: dict[str, list[str]], where: str,
              missing: Callable[[str], InputError] | None = None) -> list[str]:
    pattern = pattern.strip()
    if not pattern:
        raise InputError(f"{where}: an empty pattern after '!' or '&'",
                         hint="write '!NAME' or '&GROUP' with a host, group or pattern", reference="limit-invalid")
    if pattern.startswith("@"):
        raise InputError(f"{where}: '{pattern}': an @file cannot follow '&' or '!'",
                         hint="put the hosts in the file, or name them in --limit", reference="limit-invalid")
    expr, sub = subscript(pattern, where)
    if expr in ("all", "*") and sub is None:
        return list(hosts)
    match = _matcher(expr, where)
    found: list[str] = []
    # (unlike Ansible, a glob or regex never matches the implicit groups `all` and `ungrouped`:
    # 'a*' would be every host there; they are matched by their exact names only)
    wild = expr.startswith("~") or any(c in expr for c in "?*[")
    named = [g for g in groups if (g == expr if wild and g in IMPLICIT else match(g))]
    for g in named:
        found += [h for h in groups[g] if h not in found]
    if not named or expr.startswith("~") or any(c in expr for c in _GLOB):
        found += [h for h in hosts if match(h) and h not in found]
    if not found:
        raise missing(expr) if missing else InputError(f"{where}: '{expr}' matches no host or group",
                                                       reference="limit-matches-nothing")
    if sub is None:
        return found
    start, end = sub
    if end is None or end == 0:
        if not -len(found) <= start < len(found):
            raise InputError(f"{where}: '{pattern}': '{expr}' has {len(found)} host(s), so [{start}] is past "
                             "its end", hint=f"index from 0 to {len(found) - 1}", reference="limit-matches-nothing")
        return [found[start]]
    if end == -1:
        end = len(found) - 1
    picked = found[start:end + 1]
    if not picked:
        raise InputError(f"{where}: '{pattern}': '{expr}' has {len(found)} host(s): [{start}:{end}] picks none",
                         hint=f"index from 0 to {len(found) - 1}", reference="limit-matches-nothing")
    return picked
