"""Waiting in tests for a state nothing signals (a process gone, a file written by a host, a log line),
the one place in tests/ that polls. A test never waits for time to pass: it waits for the state, and
the bound is only a hang bound (a test that waits it out has failed, on any machine). Where the code
under test can signal the point instead, use tests/eventpipe.py. tests/test_no_timing.py keeps every
other `time.sleep` out of tests/."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# seconds: far longer than any state a test waits for takes to come about on a loaded 2-core machine
HANG = 240.0


def until(cond: Callable[[], T], what: str, bound: float = HANG, every: float = 0.05) -> T:
    """cond()'s first truthy value; fails naming `what` if there is none after `bound` seconds."""
    end = time.monotonic() + bound
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < end, f"timed out after {bound:g}s (a hang bound) waiting for {what}"
        time.sleep(every)  # polling a state nothing signals: the one allowed sleep (test_no_timing.py)
