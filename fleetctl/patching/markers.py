"""Can a patch print a verify marker? Its text must appear in a line the patch adds.

A marker is the text of a log line the patched code writes. It is found in an added line either
literally, or through a string literal of that line whose `{...}` / `%s`-style placeholders stand
for any text (an f-string or %-format that prints the marker with values in it).
"""

from __future__ import annotations

import re

from fleetctl.patching.engine import ADDED, parse_patch

_STRING = re.compile(r"""[rbfuRBFU]{0,2}("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
_PLACEHOLDER = re.compile(r"\{[^{}]*\}|%[-+ #0-9.]*[sdifrxXeEgGc]")


def added_lines(patch: bytes) -> list[str]:
    return [text.decode("utf-8", "replace") for fp in parse_patch(patch) for h in fp.hunks
            for kind, text in h.lines if kind == ADDED]


def _literal_pattern(literal: str) -> re.Pattern[str]:
    body = literal[1:-1]
    parts = _PLACEHOLDER.split(body)
    return re.compile(".*".join(re.escape(p) for p in parts), re.DOTALL)


def marker_in_patch(marker: str, patch: bytes) -> bool:
    """Does a line the patch adds print `marker` (literally, or as the fixed part of a formatted string)?"""
    for line in added_lines(patch):
        if marker in line:
            return True
        for m in _STRING.finditer(line):
            lit = m.group(1)
            if "{" not in lit and "%" not in lit:
                continue
            if _literal_pattern(lit).search(marker):
                return True
            # the marker is the fixed text before or after a placeholder
            fixed = [p for p in _PLACEHOLDER.split(lit[1:-1]) if p.strip()]
            if any(marker in p for p in fixed):
                return True
    return False
