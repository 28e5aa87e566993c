"""Issue 11, defect 2: no text from a host (or an inventory/playbook value) is ever parsed as rich
markup or emoji codes, and control characters reach the terminal only escaped.

Unit part: the helper (fleetctl/ui/safetext.py) on every corpus item, the SafeConsole/SafeTable, the
CLI's error lines and `history` (local ledger). Fleet part, with a playbook whose name and markers
are corpus strings: hosts whose pythons print the corpus (on stdout before the hello, on stderr)
on the real sshd sandbox, and an in-process host (tests/fakehost.py) that holds a lock written with
the corpus, has it in a drifted file and runs a launch command that logs it; every command's table
output is checked (and its JSON for the raw strings).
"""

from __future__ import annotations

import io
import json
import os
import re
import unicodedata
from pathlib import Path

import pytest
from rich.text import Text

from fleetctl.cli import main
from fleetctl.ui.safeconsole import SafeConsole, table
from fleetctl.ui.safetext import CELL_LIMIT, clean, line, safe, styled, unsafe_char

ESC = "\x1b"
LONG = "L" * 20000 + "[/x]" + ESC + "[31m"
CORPUS = [
    "[/x]",
    "[bold red]x",
    "[link=file:///etc]x[/link]",
    ESC + "[31mred" + ESC + "[0m",
    ESC + "]0;title\x07",
    ESC + "]8;;http://x" + ESC + "\\link" + ESC + "]8;;" + ESC + "\\",
    "over\rwrite",
    "\u202eevil",
    "scratch [/dev/nvme0n1] mounted",
    ":smile:",
    "%s %d",
    "{x} {0}",
    "zero\u200bwidth\u2066iso\u2069",
    "c1\x9bcsi\x85nel",
    "del\x7f bell\x07 bs\x08",
    "sep\u2028line\u2029para",
    "bom\ufeff",
]
# the escaped forms that must appear in output, per control in the corpus
ESCAPED = ["\\x1b[31m", "\\x1b]0;title\\x07", "\\r", "\\u202e", "\\u200b", "\\x9b", "\\x7f", "\\u2028"]


def visible_controls(s: str, *, multiline: bool = True) -> list[str]:
    return [c for c in s if unsafe_char(c) and not (multiline and c in "\n\t")]


# ---------------------------------------------------------------------------------------- helper

@pytest.mark.parametrize("s", [*CORPUS, LONG], ids=lambda s: repr(s[:30]))
def test_clean_escapes_every_control_and_keeps_the_rest(s: str) -> None:
    got = clean(s)
    assert visible_controls(got) == []
    assert visible_controls(clean(s, multiline=False), multiline=False) == []
    # printable text is kept as it is, markup and emoji codes included
    for c in s:
        if not unsafe_char(c):
            assert c in got
    for c in s:
        if unsafe_char(c):
            assert c not in got and (f"\\x{ord(c):02x}" in got or f"\\u{ord(c):04x}" in got or c == "\r")
    t = safe(s)
    assert isinstance(t, Text) and t.spans == [] and ESC not in t.plain and "\n" not in t.plain


def test_clean_specific_forms_newlines_and_limit() -> None:
    assert clean(ESC + "[31mx") == "\\x1b[31mx"
    assert clean("a\rb\u202ec") == "a\\rb\\u202ec"
    assert clean("a\nb\tc") == "a\nb\tc"
    assert clean("a\nb\tc", multiline=False) == "a\\nb\\tc"
    assert clean("\U000e0041") == "\\U000e0041"  # a tag character (format, invisible)
    assert clean("\ud800") == "\\ud800"  # a lone surrogate would crash the write to stdout
    assert clean("é ü 中文 ✓") == "é ü 中文 ✓"
    assert clean(None) == "" and clean(42) == "42"
    cut = clean("x" * 100, limit=10)
    assert cut == "x" * 10 + "... (+90 characters)"
    assert len(safe(LONG).plain) < CELL_LIMIT + 100


def test_unsafe_char_covers_the_classes() -> None:
    for o in [*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A),
              0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, 0x2028, 0x2029]:
        assert unsafe_char(chr(o)), hex(o)
    for c in "aZ09 [](){}%:/\\é中✓":
        assert not unsafe_char(c), c
    assert unicodedata.category("\u202e") == "Cf"


def _render(*renderables: object, terminal: bool = False) -> str:
    buf = io.StringIO()
    c = SafeConsole(file=buf, width=200, force_terminal=terminal, color_system="standard" if terminal else None)
    for r in renderables:
        c.print(r)
    return buf.getvalue()


def test_safe_console_never_parses_markup_nor_writes_controls() -> None:
    t = table("title " + CORPUS[0] + CORPUS[3], ["host", "what"])
    for s in CORPUS:
        t.add_row(s, s)
    t.add_row(styled("ok", "green"), LONG)
    # plain strings, explicit markup=True, a Text built raw from host bytes by mistake
    out = _render(t, *CORPUS, Text(CORPUS[3] + CORPUS[4]), line(styled("failed", "green"), " ", "a\nforged"))
    assert ESC not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out
    for s in ("[/x]", "[bold red]x", "[link=file:///etc]x[/link]", "[/dev/nvme0n1]", ":smile:", "%s %d", "{x} {0}"):
        assert s in out
    for e in ESCAPED:
        assert e in out
    assert "a\\nforged" in out  # a line() stays one line
    assert "(+" in out and "characters)" in out  # the long value is cut in its cell


def test_safe_console_on_a_terminal_writes_only_its_own_styles() -> None:
    t = table(None, ["host", "status"])
    for s in CORPUS:
        t.add_row(s, styled("ok", "green"))
    out = _render(t, *CORPUS, terminal=True)
    # every ESC is the start of an SGR sequence rich wrote for bold/green; none came from the corpus
    assert ESC in out
    assert re.sub(r"\x1b\[[0-9;]*m", "", out).count(ESC) == 0
    assert "\x1b[31m" not in out and "\x1b]" not in out and "\x07" not in out
    assert "\\x1b[31m" in out and "\\x1b]0;title\\x07" in out


def test_table_cells_keep_one_value_on_one_line() -> None:
    from fleetctl.ui.safetext import lines_cell

    t = table(None, ["a", "b", "c"])
    t.add_row("host\nforged row", lines_cell(["one\ntwo", "three"]), Text("ours\nmeant"))
    out = _render(t)
    assert "host\\nforged row" in out and "one\\ntwo" in out
    rows = [r for r in out.splitlines() if "│" in r]
    assert len(rows) == 2 and "three" in rows[1] and "meant" in rows[1]


def test_markup_passed_explicitly_is_still_literal() -> None:
    buf = io.StringIO()
    c = SafeConsole(file=buf, width=100)
    c.print("[bold red]x [/x]", markup=True, emoji=True)
    c.print(":smile:", emoji=True)
    assert buf.getvalue() == "[bold red]x [/x]\n:smile:\n"


def test_progress_bar_with_hostile_description() -> None:
    from fleetctl.ui.render import host_progress

    buf = io.StringIO()
    c = SafeConsole(file=buf, width=100, force_terminal=True)
    with host_progress(c, 3, "facts [/x] " + ESC + "]0;t\x07") as tick:
        tick(type("O", (), {"ok": True})())
    assert "\x1b]0;t" not in buf.getvalue()


# ------------------------------------------------------------------------------- CLI, no hosts

def test_error_line_is_one_escaped_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / ("inv [/x] " + ESC + "[31m\u202e\nforged.yaml")
    code = main(["facts", "-i", str(bad)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert ESC not in err and "\u202e" not in err and "\\x1b[31m" in err and "\\u202e" in err and "[/x]" in err
    code = main(["facts", "-i", str(bad), "--debug"])  # the traceback is escaped too
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and ESC not in err and "\u202e" not in err and "\\x1b[31m" in err


@pytest.mark.usefixtures("ledger_dir")
def test_history_shows_hostile_ledger_entries_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from fleetctl.ops.ledger import Ledger

    led = Ledger()
    evil = " | ".join(CORPUS) + " lone surrogate \udcff"
    led.start("d-evil", "deploy", inventory=Path("/x/" + CORPUS[8]), playbook=Path(CORPUS[3]), args={})
    led.finish("d-evil", "failed", [{"host": "h01", "status": "failed", "message": evil},
                                    {"host": "h02", "status": CORPUS[1], "message": LONG}])
    led.close()
    for args in (["history"], ["history", "d-evil"]):
        code = main(args)
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "internal error" not in err and ESC not in out + err
    assert "[/dev/nvme0n1]" in out and "\\x1b[31m" in out and "\\u202e" in out
    code = main(["history", "d-evil", "--json"])
    doc = json.loads(capsys.readouterr().out)
    # JSON keeps the raw string (a lone surrogate, which SQLite cannot store, is kept as its escape)
    assert code == 0 and doc["hosts"][0]["message"] == evil.replace("\udcff", "\\udcff")


# ------------------------------------------------------------------------------- a hostile fleet

# what a host's login script prints on stderr last (no line separators, so it is the reported line)
STDERR_LINE = ("scratch [/dev/nvme0n1] mounted [/x] [bold red]x " + ESC + "[31mred " + ESC + "]0;title\x07 "
               "\u202eevil :smile: %s {x} zero\u200bwidth c1\x9bcsi del\x7f")
RAW_CONTROLS = [ESC, "\x07", "\u202e", "\u200b", "\x9b", "\x7f", "\u2066", "\ufeff"]


def _hostile_playbook(d: Path) -> Path:
    """A playbook whose name and markers are corpus strings."""
    import yaml
    from test_faults import EW2, SA, make_playbook

    pb = make_playbook(d / "pb", files=(EW2, SA), tag="hostile")
    pdoc = yaml.safe_load(pb.read_text())
    pdoc["name"] = "hostile " + CORPUS[0] + " " + CORPUS[3] + CORPUS[7]
    pdoc["verify"] = {"markers": [CORPUS[1], CORPUS[3]], "forbidden": ["scratch"], "require_ready": False}
    pdoc["launch"] = {"ready_timeout": 30, "stop_timeout": 5, "flags": {"--model-path": "m"}}
    pb.write_text(yaml.safe_dump(pdoc, sort_keys=False))
    return pb


def _hostile_pythons(sb, d: Path) -> Path:  # type: ignore[no-untyped-def]
    """The inventory of h01 and h02 only, whose pythons (in `d`, the hosts' files untouched) are
    hostile processes: h01's prints the corpus on stdout first, past what a login script may print
    before the hello; h02's, in a directory named with the corpus, prints it on stderr and fails."""
    import yaml
    from test_faults import write_inventory

    noise = d / "corpus.txt"
    noise.write_bytes(("\n".join(CORPUS) + "\n").encode())
    errline = d / "stderr.txt"
    errline.write_bytes(("\n".join(CORPUS) + "\n" + STDERR_LINE + "\n").encode())
    # more than the LOGIN_NOISE_MAX bytes a login script may print before the hello (those are skipped)
    from fleetctl.transport.session import LOGIN_NOISE_MAX

    noise.write_bytes(noise.read_bytes() * (LOGIN_NOISE_MAX // noise.stat().st_size + 2))
    noisy = d / "noisy-python"
    noisy.write_text(f"#!/bin/sh\ncat '{noise}'\nexec '{sb.hosts['h01'].python}' \"$@\"\n")
    noisy.chmod(0o755)
    evil_dir = d / ("py [bold red]x " + ESC + "[31m \u202e :smile:")
    evil_dir.mkdir()
    failing = evil_dir / "python"
    failing.write_text(f"#!/bin/sh\ncat '{errline}' >&2\nexit 1\n")  # exit 127 after the first facts
    failing.chmod(0o755)

    inv = write_inventory(sb, d / "inventory.yaml", command_timeout=60)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"] = {n: doc["hosts"][n] for n in ("h01", "h02")}
    doc["hosts"]["h01"]["python"] = str(noisy)
    doc["hosts"]["h02"]["python"] = str(failing)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def _hostile_host(sb, d: Path) -> Path:  # type: ignore[no-untyped-def]
    """The inventory of h01, healthy, but its lock is held with corpus strings, a playbook file
    carries the corpus (drifted), its launch command logs the corpus and exits, and its env has a
    corpus value."""
    import socket

    import yaml
    from test_faults import EW2, write_inventory

    noise = d / "corpus.txt"
    noise.write_bytes(("\n".join(CORPUS) + "\n").encode())
    h = sb.hosts["h01"]
    last = d / "last.txt"
    last.write_bytes((CORPUS[8] + "\n").encode())
    # a python script (fleetctl locates sglang with the launch's own python: a shell script's is unknown)
    server = h.host_dir / "evil_server.py"
    server.write_text(f"import sys\nfor p in ({str(noise)!r}, {str(last)!r}):\n"
                      f"    sys.stdout.buffer.write(open(p, 'rb').read())\nsys.exit(3)\n")
    (h.state_dir / "lock").write_text(json.dumps({
        "pid": 1, "start": None, "op": CORPUS[1], "id": "d-" + CORPUS[3], "since": 0,
        "by": CORPUS[8] + " " + CORPUS[4] + CORPUS[7] + " surrogate\udcff " + LONG, "host": socket.gethostname()}))
    (h.state_dir / "lock").chmod(0o600)
    ew2 = h.sglang_dir / EW2
    ew2.write_bytes(ew2.read_bytes() + ("\n# " + "\n# ".join(CORPUS) + "\n").encode())

    inv = write_inventory(sb, d / "inventory.yaml", command_timeout=60)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["h01"]["launch_command"] = "{python} " + str(server)
    doc["hosts"]["h01"]["env"]["EVIL_NOTE"] = " ".join(CORPUS)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def _check(code: int, out: str, err: str, what: str) -> None:
    both = out + err
    assert "internal error" not in err and "MarkupError" not in both and "Traceback" not in both, f"{what}: {err}"
    assert code in (0, 1), f"{what}: exit {code}: {err}"
    for c in RAW_CONTROLS:
        assert c not in both, f"{what}: raw {c!r} in output"


class Cli:
    """Runs a command; checks its output (_check) and keeps it (`seen`, by what it was)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.seen: dict[str, str] = {}

    def __call__(self, what: str, *args: str) -> tuple[int, str]:
        from test_faults import run

        code, out, err = run(self.capsys, *args)
        _check(code, out, err, what)
        self.seen[what] = out + err
        return code, out + err

    def json(self, what: str, *args: str) -> dict:
        from test_faults import run

        code, out, err = run(self.capsys, *args, "--json")
        _check(code, out, err, what)
        return json.loads(out)

    def everything(self) -> str:
        if os.environ.get("MARKUP_DUMP"):
            Path(os.environ["MARKUP_DUMP"]).write_text(json.dumps(self.seen, indent=1))
        return "".join(self.seen.values())


# the hostile host processes (what their pythons print before the hello, or instead of it) are what
# the transport reads: on the session's sshd sandbox (h01, h02: their hosts' files untouched); what
# a healthy host answers with hostile text in it, on an in-process host (tests/fakehost.py)


@pytest.mark.usefixtures("ledger_dir")
def test_every_command_shows_hostile_host_process_text_escaped(sandbox, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    inv = _hostile_pythons(sandbox, tmp_path)
    pb = _hostile_playbook(tmp_path)
    i = ["-i", str(inv)]
    cli = Cli(capsys)

    code, text = cli("facts --debug", "facts", *i, "--debug")  # h02's whole stderr is its detail
    assert "--- h02 detail ---" in text and "\\x1b]8;;http://x\\x1b\\link" in text and "over\\rwrite" in text
    failing = next(tmp_path.glob("py */python"))
    failing.write_text(failing.read_text().replace("exit 1", "exit 127"))  # now: 'cannot run', names the path
    code, text = cli("facts", "facts", *i)
    assert "h01: the agent's start answered something that is not its hello: b" in text, text
    cli("explain", "explain", *i, str(pb))
    cli("deploy --check", "deploy", *i, str(pb), "--check")
    cli("deploy", "deploy", *i, str(pb), "--allow-uncovered")
    cli("rollback --check", "rollback", *i, "--check")
    cli("rollback", "rollback", *i)
    code, text = cli("status", "status", *i, str(pb))
    assert code == 1 and "scratch [/dev/nvme0n1] mounted" in text

    # the JSON documents keep the raw strings (json.dumps escapes them itself)
    problems = " ".join(p for h in cli.json("status --json", "status", *i)["hosts"] for p in h["problems"])
    assert STDERR_LINE in problems
    msgs = " ".join(h["message"] or "" for h in cli.json("facts --json", "facts", *i)["hosts"])
    assert STDERR_LINE in msgs and "[/x]" in msgs

    cli("launch", "launch", *i, str(pb), "--timeout", "300")
    cli("servers", "servers", *i)
    cli("verify-logs", "verify-logs", *i, str(pb))
    cli("stop", "stop", *i, str(pb))
    cli("history", "history")  # (the ledger keeps the hosts' messages)
    op = cli.json("history --json", "history")["operations"][0]["id"]
    cli("history ID", "history", op)

    everything = cli.everything()
    for e in ESCAPED[:4]:
        assert e in everything, e
    assert "[/dev/nvme0n1]" in cli.seen["facts"] and "[bold red]x" in cli.seen["facts"]


@pytest.mark.usefixtures("ledger_dir")
def test_every_command_shows_hostile_host_text_escaped(fake_sandbox, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    sb = fake_sandbox(hosts=1, versions=("0.5.9",), gpus=1)
    inv = _hostile_host(sb, tmp_path)
    pb = _hostile_playbook(tmp_path)
    i = ["-i", str(inv)]
    cli = Cli(capsys)

    cli("facts --debug", "facts", *i, "--debug")
    cli("facts", "facts", *i)
    cli.json("facts --json", "facts", *i)
    cli("explain", "explain", *i, str(pb))
    cli("deploy --check", "deploy", *i, str(pb), "--check")
    code, text = cli("deploy --check --diff", "deploy", *i, str(pb), "--check", "--diff", "--limit", "h01")
    assert "# \\x1b[31mred" in text and "# [link=file:///etc]x[/link]" in text  # the drifted bytes, escaped
    from test_faults import EW2

    from fleetctl.engines import wheels

    (sb.hosts["h01"].sglang_dir / EW2).write_bytes(wheels.pristine_bytes("0.5.9", EW2))  # no longer drifted
    code, text = cli("deploy", "deploy", *i, str(pb), "--allow-uncovered")
    # h01's agent refuses: its lock (with the corpus and a lone surrogate) is held; the ledger keeps it
    assert code == 1 and "locked: [bold red]x d-\\x1b[31mred" in text and "surrogate\\udcff" in text
    cli("rollback --check", "rollback", *i, "--check")
    cli("rollback", "rollback", *i)
    code, text = cli("status", "status", *i, str(pb))
    assert code == 1 and "scratch [/dev/nvme0n1] mounted" in text and "d-\\x1b[31mred" in text
    assert "surrogate\\udcff" in text and "characters)" in text  # a lone surrogate; the long value cut

    # the JSON documents keep the raw strings (json.dumps escapes them itself)
    problems = " ".join(p for h in cli.json("status --json", "status", *i)["hosts"] for p in h["problems"])
    assert "d-" + CORPUS[3] in problems

    (sb.hosts["h01"].state_dir / "lock").unlink()
    cli("launch", "launch", *i, str(pb), "--timeout", "300")
    cli("servers", "servers", *i)
    cli("verify-logs", "verify-logs", *i, str(pb))
    cli("stop", "stop", *i, str(pb))
    cli("history", "history")
    op = cli.json("history --json", "history")["operations"][0]["id"]
    cli("history ID", "history", op)
    code, text = cli("patch check", "patch", "check", str(pb))
    # exit 1: the corpus markers are in no line the patch adds (patch check says so, escaped)
    assert code == 1 and "hostile [/x] \\x1b[31mred" in text
    assert "verify marker '[bold red]x' appears in no line the patch adds" in text, text

    everything = cli.everything()
    for e in ESCAPED[:4]:
        assert e in everything, e
    assert "\\x1b[31mred" in cli.seen["launch"] and "\\x1b[31mred" in cli.seen["verify-logs"]


def test_sources_print_only_through_the_safe_console() -> None:
    """A guard for new code: no rich markup in string literals (it would now print literally), and
    no Console/Table/Progress text column built outside fleetctl/ui/safetext.py and ui/render.py."""
    root = Path(__file__).resolve().parent.parent / "fleetctl"
    markup = re.compile(r"\[/?(bold|red|green|yellow|cyan|white|dim|italic|link)[^\]\n]*\]|\[/\]")
    raw = re.compile(r"\b(Console|Table|Progress)\(")
    bad = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith("remote/") or rel in ("ui/safetext.py", "ui/render.py"):
            continue
        for n, ln in enumerate(p.read_text().splitlines(), 1):
            if markup.search(ln) or raw.search(ln):
                bad.append(f"{rel}:{n}: {ln.strip()}")
    assert bad == []
