"""Errors a user can cause, with the exit code the CLI maps them to and a stable reference.

Deep code raises these; only the CLI turns them into a line on stderr and an exit code. Each error
carries a `reference`: a kebab-case name that stays the same when its message is reworded, shown in
the --json error envelope and listed in docs/errors.md, so a script matches the reference, never the
text. A class names its default; a raise site names a narrower one (`reference="inventory-not-found"`).
tests/test_errors_doc.py checks that every reference in the code is in the doc and back.
"""

from __future__ import annotations

import re

REFERENCE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")

EXIT_OK = 0
EXIT_FAILED = 1  # a host failed, or a check failed
EXIT_BAD_INPUT = 2  # the user's input (files, flags) is wrong


class FleetctlError(Exception):
    """Base class: carries one human line and an exit code."""

    exit_code = EXIT_FAILED
    reference = "failed"

    def __init__(self, message: str, *, hint: str | None = None, reference: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if reference is not None:
            if not REFERENCE.fullmatch(reference):
                raise ValueError(f"error reference {reference!r} is not kebab-case")
            self.reference = reference

    def line(self) -> str:
        return f"{self.message}" + (f" ({self.hint})" if self.hint else "")


class InputError(FleetctlError):
    """Bad input: a file that does not parse or validate, a bad flag value. Exit 2."""

    exit_code = EXIT_BAD_INPUT
    reference = "bad-input"


EXIT_INTERRUPTED = 130


class Interrupted(FleetctlError):
    """The command was interrupted (Ctrl-C) after the hosts in flight finished or timed out."""

    exit_code = EXIT_INTERRUPTED
    reference = "interrupted"


class ProbeInputError(Exception):
    """The engine's host probe cannot be asked for this host (its facts do not say what it must answer)."""
