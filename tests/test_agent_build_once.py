"""What the controller builds of the agent (its parts' stripped text, keys, compressed and compiled
forms, the actions a part registers) is built once per command however many host threads ask for it
at the same moment (issue 34.2: a 64-host deploy's first facts built the servers part in every host
thread: ~3 s of CPU, ~1 GB). Counts the builds, never times them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from fleetctl import remote
from fleetctl.transport import session

THREADS = 24


def _together(fn: Callable[[], Any]) -> list[Any]:
    gate = threading.Barrier(THREADS)
    got: list[Any] = []

    def one() -> None:
        gate.wait()
        got.append(fn())

    ts = [threading.Thread(target=one) for _ in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return got


@pytest.mark.parametrize("build", ["actions_of", "part_code_key", "part_packed"])
def test_a_part_is_built_once_for_threads_asking_at_once(monkeypatch: pytest.MonkeyPatch, build: str) -> None:
    part = next(iter(remote.ON_DEMAND))
    for f in (remote.actions_of, remote.part_text, remote.part_packed, remote.part_key, session.part_code_key):
        f.cache_clear()  # type: ignore[attr-defined]
    parses, compiles, packs = [0], [0], [0]
    parse, compile_locked, pack = remote._parse, remote.compile_locked, remote._pack

    def counting_parse(text: str) -> Any:
        parses[0] += 1
        return parse(text)

    def counting_compile(text: bytes | str, name: str) -> Any:
        compiles[0] += 1
        return compile_locked(text, name)

    def counting_pack(data: bytes, kind: str) -> bytes:
        packs[0] += 1
        return pack(data, kind)

    monkeypatch.setattr(remote, "_parse", counting_parse)
    monkeypatch.setattr(remote, "compile_locked", counting_compile)
    monkeypatch.setattr(remote, "_pack", counting_pack)
    fn = {"actions_of": lambda: remote.actions_of(part), "part_code_key": lambda: session.part_code_key(part),
          "part_packed": lambda: remote.part_packed(part, "Z")}[build]
    got = _together(fn)
    assert len(set(got)) == 1
    if build == "actions_of":  # one parse per file of the part
        assert parses[0] == len(remote.ON_DEMAND[part]), parses[0]
    elif build == "part_code_key":
        assert compiles[0] == 1, compiles[0]
    else:
        assert packs[0] == 1, packs[0]
