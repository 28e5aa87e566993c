"""Every command fleetctl suggests runs as printed (issue 30.6).

The sandbox story (deploy, launch, verify-logs, a deploy under running servers, rollback, status,
stop, and failure paths: launch before deploy, a crashed server, a host --limit does not know, bad
input with --json) is played on in-process hosts (tests/fakehost.py; the session sandbox's h01, h02:
the subject is what fleetctl prints, not the transport); every command its outputs suggest (the
recognisable form: 'fleetctl ...' in single quotes, in text and in --json) is collected, and each is
then run, as printed, against the same hosts: none may be a usage error (exit 2). Before: the
restart command rollback printed failed (the pristine release does not know the payload's flag: it
needs --drop-unknown-flags), and `'fleetctl rollback'` / `'fleetctl deploy'` hints had no inventory.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_launch import FULL, make_inventory
from waiting import until

from fleetctl.cli import main
from fleetctl.remote import servers as srv

SUGGESTED = re.compile(r"'(fleetctl [^']+)'")


@pytest.fixture
def sb(fake_sandbox: Any, ledger_dir: Path) -> Any:
    """The session sandbox's h01 (0.5.9) and h02 (0.5.14), 2 GPUs each, the hosts the story uses,
    in-process, with a ledger of this test's own."""
    return fake_sandbox(hosts=2, versions=("0.5.9", "0.5.14"), gpus=2)


def suggestions(text: str) -> list[str]:
    return [m.group(1) for m in SUGGESTED.finditer(text)]


class Story:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.said: list[tuple[str, str]] = []  # (the step, the command it suggested)

    def run(self, *args: Any) -> tuple[int, str]:
        self.capsys.readouterr()
        code = main([str(a) for a in args])
        c = self.capsys.readouterr()
        text = c.out + c.err
        step = " ".join(str(a) for a in args)
        self.said += [(step, s) for s in suggestions(text)]
        if "--json" in args and c.out.strip():
            doc = json.loads(c.out)
            self.said += [(step, s) for s in suggestions(json.dumps(doc, ensure_ascii=False).replace('\\"', '"'))]
        return code, text


def test_every_suggested_command_runs_as_printed(sb: Any, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01", "h02"],
                         env={"h02": {"FLEETCTL_SIM_CRASH": "after-ready:0.5"}})
    s = Story(capsys)
    inv2 = tmp_path / "inv-moved.yaml"
    try:
        _story(sb, s, inv, inv2, tmp_path)
    finally:  # every server the story or a suggestion started, under either state dir
        for i in (inv2, inv):
            if i.exists():
                main(["stop", "-i", str(i)])
        main(["rollback", "-i", str(inv)])
    elsewhere = tmp_path / "elsewhere"  # (the moved state dir: a suggested launch started a server there)
    for name in srv.list_instances(str(elsewhere)) if elsewhere.exists() else []:
        rec = srv.current_record(str(elsewhere), name)
        assert rec is None or not srv.record_alive(rec), f"left running: {rec}"


def _story(sb: Any, s: Story, inv: Path, inv2: Path, tmp_path: Path) -> None:
    # failure paths first: a launch before any deploy, a host the inventory does not have, bad input
    assert s.run("launch", "-i", inv, FULL, "--limit", "h01")[0] == 1
    assert s.run("facts", "-i", inv, "--limit", "nosuchhost")[0] == 2
    assert s.run("deploy", "-i", inv, FULL, "--limit", "nosuchhost", "--json")[0] == 2
    # the story
    assert s.run("deploy", "-i", inv, FULL)[0] == 0
    assert s.run("launch", "-i", inv, FULL, "--timeout", "300")[0] in (0, 1)
    rec = srv.current_record(str(sb.hosts["h02"].state_dir), srv.list_instances(str(sb.hosts["h02"].state_dir))[0])
    until(lambda: not srv.record_alive(rec), "h02's server to die after ready")
    s.run("verify-logs", "-i", inv, FULL)
    s.run("status", "-i", inv)
    s.run("status", "-i", inv, FULL)
    s.run("servers", "--discover", "-i", inv)
    assert s.run("rollback", "-i", inv)[0] == 0  # h01's server now runs older code than the files
    s.run("status", "-i", inv)
    s.run("stop", "-i", inv)
    s.run("history")
    # a deploy, then the inventory points h01 at another state dir (the deploy's record is not there)
    assert s.run("deploy", "-i", inv, FULL, "--limit", "h01")[0] == 0
    moved = yaml.safe_load(inv.read_text())
    moved["hosts"]["h01"]["state_dir"] = str(tmp_path / "elsewhere")
    inv2.write_text(yaml.safe_dump(moved))
    s.run("status", "-i", inv2, "--limit", "h01")
    s.run("status", "-i", inv2, FULL, "--limit", "h01")
    s.run("deploy", "-i", inv2, FULL, "--limit", "h01", "--json")
    s.run("launch", "-i", inv2, FULL, "--limit", "h01", "--json")
    said = list(dict.fromkeys(cmd for _, cmd in s.said))
    assert any(c.startswith("fleetctl launch --replace") for c in said), s.said  # rollback's restart
    assert len(said) >= 4, s.said
    bad = []
    for cmd in said:
        argv = shlex.split(cmd)
        assert argv[0] == "fleetctl"
        code, text = s.run(*argv[1:])
        if code == 2 or "Usage:" in text or "no inventory given" in text:
            step = next(st for st, c in s.said if c == cmd)
            bad.append(f"{cmd!r} (suggested by 'fleetctl {step}'): exit {code}: {text.strip()[-300:]}")
    print(f"{len(said)} suggested commands run:", *said, sep="\n  ")
    assert not bad, "\n".join(bad)


def test_every_suggestion_written_in_the_code_parses_once_completed(tmp_path: Path) -> None:
    """Each `'fleetctl ...'` suggestion literal in fleetctl's source (placeholders filled with
    sample values), completed as it is when printed (suggest.complete with the command's -i and
    playbook), is accepted by fleetctl's own command-line parser: no missing argument, no unknown
    option."""
    import typer
    import typer.main
    from typer import _click as click  # typer's own click (typer 0.29 vendors it)

    from fleetctl.cli import app
    from fleetctl.model import suggest

    root = Path(__file__).resolve().parents[1] / "fleetctl"
    found = set()
    for f in root.rglob("*.py"):
        if "sandbox" in f.parts or f.name == "suggest.py":  # (its own docs and pattern)
            continue
        for m in re.finditer(r"'(fleetctl [^'\n]+)'", f.read_text()):
            found.add(re.sub(r"\{[^}]*\}", "x1", m.group(1)))
    assert len(found) >= 10, found
    inv = tmp_path / "inv.yaml"
    suggest.inventory, suggest.playbook = str(inv), str(FULL)
    group = typer.main.get_command(app)
    bad = []
    try:
        for raw in sorted(found):
            done = suggest.complete(f"'{raw}'")
            if not done.startswith("'"):
                bad.append(f"{raw!r}: not completed ({done})")
                continue
            argv = shlex.split(done.strip("'"))[1:]
            ctx = click.Context(group, info_name="fleetctl")
            cmd = group.get_command(ctx, argv[0])  # type: ignore[attr-defined]
            if cmd is None:
                bad.append(f"{raw!r}: no command {argv[0]!r}")
                continue
            try:
                cmd.make_context(argv[0], argv[1:], parent=ctx)
            except typer.Exit:  # --help
                pass
            except click.exceptions.UsageError as e:
                bad.append(f"{raw!r} -> {done}: {e}")
    finally:
        suggest.inventory = suggest.playbook = None
    assert not bad, "\n".join(bad)
