"""The stripped agent source is kept in the controller's cache dir (issue 34.3: ~0.1 s of CPU on every
command that starts an agent) and taken only from a private file of ours that names its key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetctl import remote

SOURCE = 'def f():\n    """doc"""\n    return 1  # comment\n'


def _no_strip(text: str) -> str:
    raise AssertionError("stripped again: the kept copy was not taken")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    from fleetctl.transport import session  # hands the builder the cache dir (keep_stripped_in)

    monkeypatch.setattr(remote, "_keep_dir", [session.agent_cache_dir])
    return tmp_path / "cache" / "agent"


def test_a_kept_stripped_text_is_taken(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = remote.stripped(SOURCE)
    assert first == remote._strip(SOURCE) and "doc" not in first and "comment" not in first
    monkeypatch.setattr(remote, "_strip", _no_strip)
    assert remote.stripped(SOURCE) == first


@pytest.mark.parametrize("damage", ["mode", "trailer", "body-with-other-key"])
def test_a_damaged_or_open_copy_is_not_taken(cache: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    want = remote.stripped(SOURCE)
    (kept,) = cache.glob("stripped-*.py")
    if damage == "mode":
        os.chmod(kept, 0o644)
    elif damage == "trailer":
        kept.write_bytes(kept.read_bytes().replace(b"# fleetctl-stripped ", b"# fleetctl-strippe "))
    else:
        kept.write_text("import os\nos.system('x')\n# fleetctl-stripped 0123\n")
        os.chmod(kept, 0o600)
    calls = []

    def strip(text: str) -> str:
        calls.append(text)
        return want

    monkeypatch.setattr(remote, "_strip", strip)
    assert remote.stripped(SOURCE) == want
    assert calls == [SOURCE]


def test_nothing_is_kept_where_no_dir_was_handed_in(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "_keep_dir", [])
    assert remote.stripped(SOURCE) == remote._strip(SOURCE)
    assert not cache.exists()
