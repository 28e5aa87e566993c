"""Wait for what a fleetctl subprocess signals (fleetctl/transport/events.py) instead of sleeping: the CLI
writes one line per event to the pipe this opens; `wait` blocks until a line arrives. The bound is
only a hang bound (a test that waits it out has failed), never a window anything depends on."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Any

HANG = 240.0  # seconds: only a stuck CLI waits this long


class EventPipe:
    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.w, False)  # a full pipe drops events: it never stalls the CLI
        self.seen: list[str] = []
        self._buf = b""

    def popen(self, args: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[str]:
        """Start `python -m fleetctl ARGS` with the pipe as its event fd (own session, text pipes)."""
        env = {**env, "FLEETCTL_EVENT_FD": str(self.w)}
        proc = subprocess.Popen([sys.executable, "-m", "fleetctl", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                                pass_fds=(self.w,), **kw)
        os.close(self.w)  # the child holds it: EOF here once the child is gone
        self.w = -1
        return proc

    def wait(self, line: str, bound: float = HANG) -> None:
        """Block until the event `line` (exact) has been written; fail if the CLI ends first."""
        end = time.monotonic() + bound
        while line not in self.seen:
            left = end - time.monotonic()
            assert left > 0, f"no event {line!r} (seen: {self.seen})"
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.r, 4096)
            assert chunk, f"the CLI ended without the event {line!r} (seen: {self.seen})"
            self._buf += chunk
            *done, self._buf = self._buf.split(b"\n")
            self.seen += [d.decode() for d in done]

    def close(self) -> None:
        for fd in (self.r, self.w):
            if fd >= 0:
                os.close(fd)
        self.r = self.w = -1
