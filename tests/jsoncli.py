"""Shared by the sandbox tests: run a fleetctl command in-process with --json and read its document."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetctl.cli import main


def cli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, Any]:
    """Exit code and the JSON document (None when the command printed none)."""
    capsys.readouterr()
    code = main([*map(str, args), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def ok(capsys: pytest.CaptureFixture[str], *args: Any) -> Any:
    """The document of a command that must exit 0 (the document is shown when it does not)."""
    code, doc = cli(capsys, *args)
    assert code == 0, json.dumps(doc, indent=1)[:4000]
    return doc
