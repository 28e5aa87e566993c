"""fleetctl/transport/slots.py: the handshake slots. Waiters sleep until a release or a wake (no timer
wakes them: every wait here ends only by the event the test makes)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.transport.slots import Slots

JOIN = 60  # a hang guard only: each thread ends on an event the test made


def waiter(slots: Slots, cut: threading.Event) -> tuple[threading.Thread, threading.Event, list[bool]]:
    """A thread taking a slot; `waiting` is set when it finds none free (its first look at `cut`)."""
    waiting = threading.Event()
    got: list[bool] = []

    def cancelled() -> bool:
        waiting.set()
        return cut.is_set()

    t = threading.Thread(target=lambda: got.append(slots.acquire(cancelled)), daemon=True)
    t.start()
    return t, waiting, got


def test_a_waiter_takes_the_released_slot() -> None:
    slots = Slots(1)
    assert slots.acquire(lambda: False)
    t, waiting, got = waiter(slots, threading.Event())
    assert waiting.wait(JOIN)
    assert got == []  # it looked while holding the lock, then waits: only a release ends that
    slots.release()
    t.join(JOIN)
    assert got == [True]


def test_a_cut_waiter_stops_waiting_and_takes_nothing() -> None:
    slots = Slots(1)
    assert slots.acquire(lambda: False)
    cut = threading.Event()
    t, waiting, got = waiter(slots, cut)
    assert waiting.wait(JOIN)
    cut.set()
    slots.wake()
    t.join(JOIN)
    assert got == [False]
    slots.release()  # the one slot is free again: a new taker gets it at once
    assert slots.acquire(lambda: True)


def test_no_release_is_lost_among_many_waiters() -> None:
    """Twenty waiters, each giving its slot back once it has it: the two slots reach all twenty."""
    slots = Slots(2)
    assert slots.acquire(lambda: False) and slots.acquire(lambda: False)
    waiting = [threading.Event() for _ in range(20)]
    got: list[int] = []

    def one(k: int) -> None:
        def cancelled() -> bool:
            waiting[k].set()
            return False

        if slots.acquire(cancelled):
            got.append(k)
            slots.release()

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(20)]
    for t in threads:
        t.start()
    for w in waiting:
        assert w.wait(JOIN)  # every one of them waits (no slot is free)
    slots.release()
    slots.release()
    for t in threads:
        t.join(JOIN)
    assert sorted(got) == list(range(20))


def test_a_host_cut_off_while_it_waits_for_a_handshake_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HostConnection.connect waiting for a slot (all taken) ends when the host is aborted, with the
    abort's line, having opened nothing (the address is never dialled: no slot is ever free)."""
    from fleetctl.config.inventory import load_inventory
    from fleetctl.transport import ssh
    from fleetctl.transport.base import RemoteError

    slots = Slots(1)
    assert slots.acquire(lambda: False)
    monkeypatch.setattr(ssh, "_handshakes", slots)
    inv_file = tmp_path / "inventory.yaml"
    inv_file.write_text("hosts:\n  h01: {address: 127.0.0.1, port: 9, user: root}\n")
    inv = load_inventory(inv_file)
    conn = ssh.HostConnection(inv.hosts[0], inv)
    waiting = threading.Event()
    real = slots.acquire

    def acquire(cancelled: Callable[[], bool]) -> bool:
        def look() -> bool:
            waiting.set()
            return cancelled()

        return real(look)

    monkeypatch.setattr(slots, "acquire", acquire)
    raised: list[BaseException] = []

    def connect() -> None:
        try:
            conn._connect_once()
        except BaseException as e:  # (kept for the assertion)
            raised.append(e)

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    assert waiting.wait(JOIN)
    conn.abort("h01: cut off by the test")
    t.join(JOIN)
    assert len(raised) == 1 and isinstance(raised[0], RemoteError), raised
    assert "cut off by the test" in str(raised[0])
    assert slots.acquire(lambda: True) is False  # the one slot is still the test's: nothing took it
