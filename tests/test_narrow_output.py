"""Output an operator can read at 80-100 columns (issue 16.7), on a 6-host sandbox (in-process hosts,
tests/fakehost.py): hosts alike grouped ("h01-h06 (6 hosts)"), no path or id cut across lines, one
summary line per command, identical diffs and explain answers said once, refusals counted as
refusals."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.cli import main
from fleetctl.commands import common
from fleetctl.model.hostnames import group, host_ranges, hosts_label

ROOT = Path(__file__).resolve().parents[1]
PB = ROOT / "playbooks" / "dynamic-spec-disable"
WRONG = ROOT / "playbooks" / "origin-wrong-file"
ID = re.compile(r"[dlr]\d{8}-\d{6}-[0-9a-f]{4}")

pytestmark = pytest.mark.usefixtures("ledger_dir")


# ----------------------------------------------------------------------------- host ranges


def test_host_ranges_compress_numbered_names() -> None:
    assert host_ranges([f"h{i:02d}" for i in range(64, 0, -1)]) == "h01-h64"
    assert hosts_label([f"h{i:02d}" for i in range(1, 65)]) == "h01-h64 (64 hosts)"
    assert host_ranges(["h07", "h02", "h01", "h03", "web", "h05", "h06"]) == "h01-h03, h05-h07, web"
    assert host_ranges(["h01", "h02"]) == "h01, h02"  # two neighbours: a comma list
    assert host_ranges(["gpu9", "gpu10", "gpu11"]) == "gpu9, gpu10, gpu11"  # digit counts differ
    assert host_ranges(["a", "b"]) == "a, b"
    assert hosts_label(["h01"]) == "h01"
    assert group([("h01", "x"), ("h02", "y"), ("h03", "x")]) == [(["h01", "h03"], "x"), (["h02"], "y")]


# ----------------------------------------------------------------------------- the sandbox fleet


@pytest.fixture
def six(fake_sandbox: Any) -> Iterator[Any]:
    """Six in-process hosts (tests/fakehost.py): the subject is what the commands print of what
    the hosts answer, not how they are reached."""
    yield fake_sandbox(hosts=6, versions=("0.5.9",), gpus=1)


def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, width: int,
        *args: Any) -> tuple[int, str, str]:
    """A command as a terminal of `width` columns shows it (tables fitted, prose wrapped)."""
    for c in (common.out.resolved(), common.err.resolved()):  # the consoles (made on first use)
        monkeypatch.setattr(c, "width", width)
        monkeypatch.setattr(c, "wrap_prose", True)
    capsys.readouterr()
    code = main([str(a) for a in args])
    got = capsys.readouterr()
    return code, got.out, got.err


def readable(out: str, width: int, paths: list[str]) -> None:
    """Every stdout line fits; every path and id printed is whole on its line."""
    for ln in out.splitlines():
        assert len(ln) <= width, f"wider than {width}: {ln!r}"
        for tok in re.findall(r"[A-Za-z0-9_./-]+", ln):
            if "srt/" in tok or tok.startswith("speculative/"):
                assert any(tok == p or tok.endswith("/" + p) for p in paths), f"path cut: {tok!r} in {ln!r}"
            if re.match(r"[dlr]\d{8}", tok):  # an id, or a file named for one (a launch's log: l....log)
                assert re.match(ID.pattern + r"(?![0-9a-f])", tok), f"id cut: {tok!r} in {ln!r}"


def summaries(err: str, head: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(head)]


def flat(text: str) -> str:
    return " ".join(text.split())


def test_every_command_reads_at_80_and_100_columns(six: Any, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetctl.config.playbook import load_playbook

    inv = six.inventory_path
    paths = [f.path for f in load_playbook(PB).versions["0.5.9"]]
    site = six.dir / "hosts"

    for w in (80, 100):
        code, out, err = run(capsys, monkeypatch, w, "deploy", PB, "-i", inv, "--check")
        assert code == 0
        readable(out, w, paths)
        assert "h01-h06 (6 hosts): SGLang 0.5.9: change" in out and "h01 " not in out
        for p in paths:  # one line per file, the whole path on it
            assert sum(1 for ln in out.splitlines() if ln.split()[-1:] == [p]) == 1
        (s,) = summaries(err, "deploy --check:")
        assert "6 would change" in s and "nothing was changed" in s

        code, out, err = run(capsys, monkeypatch, w, "explain", PB, "-i", inv)
        assert code == 0
        readable(out, w, paths)
        assert out.startswith("h01-h06 (6 hosts): ") and flat(out).count("the playbook patches it") == 1
        (s,) = summaries(err, "explain:")
        assert "6 ok" in s

    # identical diffs once, with the hosts they apply to
    code, out, err = run(capsys, monkeypatch, 100, "deploy", PB, "-i", inv, "--check", "--diff")
    assert code == 0
    for p in paths:
        assert out.count(f"+++ {p} (intended)") == 1 and f"diff {p} on h01-h06 (6 hosts):" in out

    # --allow-uncovered: the plan says what will happen
    code, out, err = run(capsys, monkeypatch, 80, "deploy", WRONG, "-i", inv, "--check", "--allow-uncovered")
    assert code == 0
    assert "NOT covered, deployed anyway" in flat(out)
    assert "the patched code will not run there" in flat(out)
    code, out, err = run(capsys, monkeypatch, 80, "deploy", WRONG, "-i", inv, "--check")
    assert code == 1 and "NOT covered, refused" in flat(out)
    (s,) = summaries(err, "deploy --check:")
    assert "6 refused" in s and "failed" not in s

    # deploy h01-h03, then drift a file on h06: refused is counted as refused
    code, out, err = run(capsys, monkeypatch, 80, "deploy", PB, "-i", inv, "-l", "h01,h02,h03")
    assert code == 0
    readable(out, 80, paths)
    assert "h01-h03 (3 hosts)" in out
    (s,) = summaries(err, "deploy d")
    assert re.search(r": 3 hosts: 3 changed, 0 failed in ", s)
    deploy_id = ID.search(s).group()
    # launch and verify-logs: the launch and each distinct failure said once, with their hosts
    code, out, err = run(capsys, monkeypatch, 80, "launch", PB, "-i", inv, "-l", "h01,h02,h03")
    assert code == 0
    readable(out, 80, paths)
    assert flat(out).count("ready line seen") == 1 and "h01-h03 (3 hosts)" in flat(out)
    (s,) = summaries(err, "launch l")
    assert "3 hosts, 3 instances: 3 ready" in s
    for w in (80, 100):
        code, out, err = run(capsys, monkeypatch, w, "verify-logs", PB, "-i", inv)
        assert code == 1
        readable(out, w, paths)
        assert re.search(r"launch l\d{8}-\d{6}-[0-9a-f]{4} \(running\) on h01-h03 \(3 hosts\): ", flat(out))
        assert "no launch record (NOT running) on h04-h06 (3 hosts)" in flat(out)
        assert flat(out).count("never launched by fleetctl here") == 1
        assert flat(out).count("FAIL h04-h06 (3 hosts) ") == 1
        (s,) = summaries(err, "verify-logs:")
        assert "6 hosts, 6 instances: 3 passed, 3 failed" in s

    for w in (80, 100):
        code, out, err = run(capsys, monkeypatch, w, "servers", "-i", inv, "--discover")
        assert code == 0
        readable(out, w, paths)
        assert "h04-h06 (3 hosts): no SGLang server process" in out and flat(out).count("started by fleetctl") == 3
        (s,) = summaries(err, "servers --discover:")
        assert "6 hosts: 3 server process(es)" in s

    args6 = site / "h06" / "site-packages" / "sglang" / paths[0]
    args6.write_bytes(args6.read_bytes() + b"# edited by hand\n")
    code, out, err = run(capsys, monkeypatch, 100, "deploy", PB, "-i", inv, "--check")
    assert code == 1
    readable(out, 100, paths)
    assert "h01-h03 (3 hosts): SGLang 0.5.9: noop" in out and "h04, h05 (2 hosts): SGLang 0.5.9: change" in out
    assert f"refused h06: {paths[0]} is drifted" in flat(out)
    (s,) = summaries(err, "deploy --check:")
    assert "2 would change, 3 as intended, 1 refused;" in s

    # status: hosts alike share a row, the state says "problems" where there are some
    for w in (80, 100):
        code, out, err = run(capsys, monkeypatch, w, "status", PB, "-i", inv)
        assert code == 1
        readable(out, w, paths)
        rows = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.startswith("│ h0") and "0.5.9" in ln}
        assert set(rows) == {"h01-h03", "h04, h05", "h06"}, rows
        assert "problems" in rows["h06"] and all("│ ok " in rows[h] for h in ("h01-h03", "h04, h05"))
        assert deploy_id in rows["h01-h03"]
        assert f"problem h06: {paths[0]} is drifted" in flat(out) and "problem h0" not in flat(out).replace(
            "problem h06", "")
        (s,) = summaries(err, "status:")
        assert "6 hosts, 1 with problems" in s

    # a rollback refusal is said on the file that drifted (not the first file of the host)
    eagle2 = site / "h02" / "site-packages" / "sglang" / paths[-1]
    eagle2.write_bytes(eagle2.read_bytes() + b"# edited by hand\n")
    code, out, err = run(capsys, monkeypatch, 80, "rollback", "-i", inv, "--check")
    assert code == 1
    readable(out, 80, paths)
    assert f"drifted refuse {paths[-1]}: changed since deploy {deploy_id}" in flat(out)
    assert f"{paths[0]}: changed" not in flat(out)
    assert f"h01, h03 (2 hosts): undo {deploy_id}: change" in out
    (s,) = summaries(err, "rollback --check:")
    assert "2 would be restored" in s and "refused" in s and s.endswith(")") and "nothing was changed" in s

    code, out, err = run(capsys, monkeypatch, 100, "rollback", "-i", inv, "-l", "h01,h03")
    assert code == 0
    readable(out, 100, paths)
    assert "h01, h03" in out
    (s,) = summaries(err, "rollback r")
    assert ": 2 hosts: 2 restored" in s

    for w in (80, 100):
        code, out, err = run(capsys, monkeypatch, w, "history")
        assert code == 0
        readable(out, w, paths)
        (s,) = summaries(err, "history:")
        assert "3 operation(s) shown (--last 30): 3 ok;" in s  # deploy, launch, rollback

        code, out, err = run(capsys, monkeypatch, w, "history", deploy_id)
        assert code == 0
        assert "h01-h03 (3 hosts)" in flat(out.replace("│", " ")) or "h01-h03" in out
        (s,) = summaries(err, f"history {deploy_id}:")
        assert "3 hosts: 3 changed" in s

        code, out, err = run(capsys, monkeypatch, w, "servers", "-i", inv)
        assert code == 0
        readable(out, w, paths)
        (s,) = summaries(err, "servers:")
        assert "6 hosts: 3 server(s) launched by fleetctl" in s

        code, out, err = run(capsys, monkeypatch, w, "stop", "-i", inv)
        assert code == 0
        readable(out, w, paths)
        assert "h04-h06" in out and "(3 hosts)" in out and out.count("nothing launched") == 1
        assert len(summaries(err, "stop:")) == 1

        code, out, err = run(capsys, monkeypatch, w, "facts", "-i", inv)
        assert code == 0
        readable(out, w, paths)
        assert all(f"h0{i}" in out for i in range(1, 7)) and "│" not in out  # blocks, not a 7-column table
        assert len(summaries(err, "facts:")) == 1


def test_a_padded_state_keeps_its_style() -> None:
    from fleetctl.commands import deploys_view

    assert deploys_view._s("drifted", 11).plain == "drifted    " and str(deploys_view._s("drifted", 11).style) == "red"
    assert str(deploys_view._s("as-intended", 11).style) == "green"
