"""Errors a user can cause, with the exit code the CLI maps them to.

Deep code raises these; only the CLI turns them into a line on stderr and an exit code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a host failed, or a check failed
EXIT_BAD_INPUT = 2  # the user's input (files, flags) is wrong


class FleetctlError(Exception):
    """Base class: carries one human line and an exit code."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def line(self) -> str:
        return f"{self.message}" + (f" ({self.hint})" if self.hint else "")


class InputError(FleetctlError):
    """Bad input: a file that does not parse or validate, a bad flag value. Exit 2."""

    exit_code = EXIT_BAD_INPUT


EXIT_INTERRUPTED = 130


class Interrupted(FleetctlError):
    """The command was interrupted (Ctrl-C) after the hosts in flight finished or timed out."""

    exit_code = EXIT_INTERRUPTED


class ProbeInputError(Exception):
    """The engine's host probe cannot be asked for this host (its facts do not say what it must answer)."""
