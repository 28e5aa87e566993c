"""Slots: at most N of something at once in this process (SSH handshakes: transport/ssh.py), where a
waiter sleeps until a slot is released or it is told its wait is over (its host cut off), never on a
timer. (A semaphore polled every 0.2 s to notice a cut: at `-f 1000`, ~870 hosts waiting for 128
handshake slots woke ~4,000 times a second, 32 us of controller CPU each.)"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Slots:
    def __init__(self, n: int) -> None:
        self._free = n
        self._cond = threading.Condition()

    def acquire(self, cancelled: Callable[[], bool]) -> bool:
        """Take a slot (True), or give up waiting for one when `cancelled()` holds (False), which is
        looked at when waiting starts and at every wake(). A free slot is taken even then: the caller
        meets its own cut at its next step, and releases the slot."""
        with self._cond:
            while self._free <= 0:
                if cancelled():
                    return False
                self._cond.wait()
            self._free -= 1
            return True

    def release(self) -> None:
        """Give a slot back: one waiter takes it (a waiter woken with a free slot always takes it, so
        no release is lost on a waiter that was cut meanwhile)."""
        with self._cond:
            self._free += 1
            self._cond.notify()

    def wake(self) -> None:
        """Every waiter looks at its `cancelled()` again (call after making one of them hold)."""
        with self._cond:
            self._cond.notify_all()
