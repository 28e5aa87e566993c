"""The new user's papercuts (issue 30.7), each as the class: what a first user met, held here.

- --json with bad input printed nothing on stdout: now the error envelope, always.
- `message: ""` in --json envelopes: a document and each host row always say something.
- history filled up with no-op deploys/rollbacks and had no playbook column.
- "started by not fleetctl".
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_launch import ssb  # noqa: F401  (the fixture: the session sandbox on sshd, left as found)

from fleetctl.cli import main

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "playbooks" / "dynamic-spec-disable"


@pytest.fixture
def sb(ssb: Any) -> Any:  # noqa: F811
    """test_launch's session sandbox on sshd, left as found (its `sb` is the in-process fleet)."""
    return ssb


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    c = capsys.readouterr()
    return code, c.out, c.err


# ---------------------------------------------------------------------------- --json: always one document


@pytest.mark.parametrize("args", [
    ["status", "--json", "--no-such-option"],  # a usage error (click's)
    ["status", "--json", "-i", "/nonexistent/inventory.yaml"],  # a file that is not there
    ["deploy", "--json", "-i", "/nonexistent/inventory.yaml"],  # a missing argument
    ["history", "nosuchid", "--json"],  # a bad id
    ["patch", "check", "--json", "/nonexistent/pb"],
])
def test_json_with_bad_input_prints_the_error_envelope(args: list[str], capsys: pytest.CaptureFixture[str],
                                                       ledger_dir: Path) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    doc = json.loads(out)  # before: stdout was empty
    assert doc["ok"] is False and doc["error"] == {"exit_code": 2, "bad_input": True,
                                                  "reference": doc["error"]["reference"]}
    assert doc["error"]["reference"] not in ("bad-input", "failed")  # a narrower one (docs/errors.md)
    assert doc["command"] == " ".join(a for a in args if not a.startswith("-"))[:len(doc["command"])]
    assert doc["message"] and doc["message"] in err, (doc["message"], err)
    assert doc["hosts"] == [] and doc["summary"]["hosts"] == 0


def test_no_envelope_message_is_empty() -> None:
    from fleetctl.ui.jsonout import envelope, host_row

    rows = [host_row({"host": "h01", "status": "unchanged", "message": ""}, ok=True),
            host_row({"host": "h02", "status": "changed"}, ok=True)]
    assert [r["message"] for r in rows] == ["unchanged", "changed"]
    doc = envelope("stop", ok=True, hosts=rows)
    assert doc["message"] == "stop: 2 host(s): 2 ok, 0 not"
    assert envelope("sandbox down", ok=True)["message"] == "sandbox down: ok"


# ---------------------------------------------------------------------------- history


def test_history_collapses_no_op_runs_and_names_the_playbook(ledger_dir: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from fleetctl.ops.ledger import Ledger

    lg = Ledger(ledger_dir / "ledger.sqlite")
    pb = FULL / "playbook.yaml"
    ops = [("d20260101-000000-0001", "deploy", "changed"), ("d20260101-000001-0002", "deploy", "unchanged"),
           ("d20260101-000002-0003", "deploy", "unchanged"), ("d20260101-000003-0004", "deploy", "unchanged"),
           ("r20260101-000004-0005", "rollback", "changed")]
    for op_id, kind, st in ops:
        lg.start(op_id, kind, inventory=None, playbook=pb, args={}, hosts=["h01", "h02"])
        lg.finish(op_id, "ok", [{"host": h, "status": st} for h in ("h01", "h02")])
        time.sleep(0.01)  # (distinct start times order the list; not synchronisation)
    lg.close()
    code, out, err = run(capsys, "history")
    assert code == 0, err
    assert "playbook" in out and out.count("dynamic-spec-disable") == 3, out  # 5 operations, 3 rows
    assert "no-op x3" in out and "d20260101-000001-0002..0004" in out, out
    assert "d20260101-000002-0003" not in out  # inside the collapsed row only
    code, out, _ = run(capsys, "history", "--json")
    ops_json = json.loads(out)["operations"]  # nothing collapsed in --json
    assert [o["noop"] for o in ops_json] == [False, True, True, True, False]
    assert all(o["playbook"] == str(pb) for o in ops_json)


# ---------------------------------------------------------------------------- the docs of stop


def test_the_stop_docs_say_what_stop_does() -> None:
    """docs/user-guide.md's stop section names every result the agent's stop can return, each way
    it stops (the code's own words), the process group and the default timeout of the command's
    own help (before: SIGTERM/SIGKILL of "the servers" only; no supervisorctl, no results, no group)."""
    import inspect
    import typing

    from fleetctl.commands import servers
    from fleetctl.protocol.names import StopAction
    from fleetctl.remote import servers as rservers

    text = (ROOT / "docs" / "user-guide.md").read_text()
    sec = text[text.index("\n## stop\n"):]
    sec = sec[:sec.index("\n## ", 1)]
    for action in typing.get_args(StopAction):
        assert f"`{action}`" in sec, action
    code = inspect.getsource(rservers.stop_record)
    for how in ("supervisorctl", "systemctl", "SIGTERM", "SIGKILL after"):
        assert how in code and how in sec, how
    assert "killpg" in code and "process group" in sec
    assert "else 30" in sec and "launch.stop_timeout, 30" in inspect.getsource(servers)
    assert "nothing launched" in sec and "nothing launched" in inspect.getsource(
        __import__("fleetctl.commands.servers_impl", fromlist=["x"]))


# ---------------------------------------------------------------------------- verify-logs: noise once


def test_a_line_every_rank_logged_is_shown_once() -> None:
    """The real 0.5.9 TP=2 log's own line format (tests/data/sglang/launch_0.5.9_tp2_eagle3.log):
    the same warning on TP0..TP3 reads as one line naming the other ranks; lines that differ stay."""
    from fleetctl.ops.verify import collapse_ranks

    lines = [f"[2026-12-01 10:00:0{i} TP{i}] CUDA out of memory. Tried to allocate 2.00 GiB" for i in range(4)]
    lines.insert(2, "[2026-12-01 10:00:01 TP1] Address already in use")
    lines.append("Traceback (most recent call last):")
    got = collapse_ranks(lines)
    assert got == ["[2026-12-01 10:00:00 TP0] CUDA out of memory. Tried to allocate 2.00 GiB  (also TP1, TP2, TP3)",
                   "[2026-12-01 10:00:01 TP1] Address already in use",
                   "Traceback (most recent call last):"], got


# ---------------------------------------------------------------------------- sandbox status / restart


@pytest.mark.fleet
def test_sandbox_status_fails_on_a_dead_host_and_its_restart_runs(fresh_sandbox: Any,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `sandbox status` exited 0 with a host down and had no way to start one host again."""
    import shlex

    box = fresh_sandbox(hosts=2)
    assert run(capsys, "sandbox", "status", "--dir", box.dir)[0] == 0
    box.stop_host("h02")
    code, out, _ = run(capsys, "sandbox", "status", "--dir", box.dir)
    assert code == 1 and "2/3 sshd running; down: h02" in out, out
    hint = out[out.index("'fleetctl sandbox restart"):].split("'")[1]
    code, out, _ = run(capsys, "sandbox", "status", "--dir", box.dir, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False
    assert {h["host"]: h["state"] for h in doc["hosts"]}["h02"] == "stopped"
    code, out, err = run(capsys, *shlex.split(hint)[1:])  # the printed command, as printed
    assert code == 0 and "h02 (pid " in out, (out, err)
    assert run(capsys, "sandbox", "status", "--dir", box.dir)[0] == 0
    assert run(capsys, "sandbox", "restart", "--dir", box.dir, "h09")[0] == 2


# ---------------------------------------------------------------------------- status: the records' own hashes


@pytest.mark.fleet
def test_status_without_a_playbook_sees_a_deployed_file_edited_by_hand(sb: Any, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `status` without a playbook said ok after a deployed file was edited by hand (a live
    record 'explained' the path whatever it held), and the wording guessed a state-dir problem."""
    from test_launch import make_inventory

    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"])
    try:
        code, out, err = run(capsys, "deploy", "-i", inv, FULL, "--json")
        assert code == 0, err
        did = json.loads(out)["op_id"]
        assert run(capsys, "status", "-i", inv)[0] == 0
        rel = "srt/speculative/eagle_worker.py"
        f = sb.hosts["h01"].sglang_dir / rel
        f.write_bytes(f.read_bytes() + b"# a hand edit\n")
        code, out, err = run(capsys, "status", "-i", inv, "--json")
        assert code == 1, out
        (h,) = json.loads(out)["hosts"]
        said = " ".join(h["problems"])
        assert f"{rel} was changed after deploy {did} wrote it (not by fleetctl" in said, said
        assert "state dir" not in said and "state_dir" not in said, said
    finally:
        main(["rollback", "-i", str(inv), "--force"])


# ---------------------------------------------------------------------------- tables off a terminal


def test_tables_off_a_terminal_fit_80_columns_and_json_keeps_everything(
        ledger_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Piped (not a tty, no COLUMNS): tables are fitted to 80 columns (before: 160, and the user saw
    170-column lines); ids stay whole on their line; --json has every field whole."""
    from fleetctl.commands import common
    from fleetctl.ops.ledger import Ledger

    monkeypatch.delenv("COLUMNS", raising=False)
    for c in (common.out, common.err):
        monkeypatch.setattr(c, "_console", None)  # made again, for this (non-tty) stdout
    lg = Ledger(ledger_dir / "ledger.sqlite")
    pb = ROOT / "playbooks" / "a-playbook-with-a-rather-long-name-for-its-directory" / "playbook.yaml"
    ids = [f"d20260101-00000{i}-000{i}" for i in range(1, 4)]
    for i, op_id in enumerate(ids):
        lg.start(op_id, "deploy", inventory=None, playbook=pb, args={}, hosts=[f"gpu-node-{n:03d}" for n in range(40)])
        lg.finish(op_id, "failed" if i == 1 else "ok",
                  [{"host": f"gpu-node-{n:03d}", "status": "failed" if i == 1 and n < 7 else "changed"}
                   for n in range(40)])
        time.sleep(0.01)  # (distinct start times order the list; not synchronisation)
    lg.close()
    code, out, _ = run(capsys, "history")
    assert code == 0
    assert common.out.resolved().width == 80
    assert max(len(ln) for ln in out.splitlines()) <= 80, out
    for op_id in ids:
        assert op_id in out, out  # whole on one line
    code, out, _ = run(capsys, "history", "--json")
    rows = json.loads(out)["operations"]
    assert {r["id"] for r in rows} == set(ids) and all(r["playbook"] == str(pb) for r in rows)
    assert [r["hosts_failed"] for r in rows] == [0, 7, 0]


# ---------------------------------------------------------------------------- suggested restarts


def test_the_restart_reminder_names_each_hosts_own_playbook() -> None:
    """Servers launched with two playbooks (h01 one, h03 another) both run old code after a rollback:
    one runnable command per playbook (it said "the playbook they were launched with (not in this
    controller's ledger)" although the ledger had both); a launch the ledger lacks is said for its
    host alone."""
    from fleetctl.ops.discover import RestartReminder

    r = RestartReminder(3, 3, [("h01", "port-1"), ("h03", "port-3"), ("h04", "port-4")], [],
                        launch_ids=["l1", "l3", "l4"], launch_of={"h01": ["l1"], "h03": ["l3"], "h04": ["l4"]})
    got = r.line("/inv/x.yaml", None, {"l1": "/pbs/probe2/playbook.yaml", "l3": "/pbs/qwen ok/playbook.yaml"})
    assert "'fleetctl launch --replace --drop-unknown-flags -i /inv/x.yaml /pbs/probe2/playbook.yaml --limit h01'" in got
    assert "-i /inv/x.yaml \"/pbs/qwen ok/playbook.yaml\" --limit h03'" in got
    assert got.endswith("the others with fleetctl launch --replace and the playbook they were launched with "
                        "(not in this controller's ledger), --limit h04"), got
    assert "h01,h03" not in got
    # the command's own playbook (rollback -p, status PLAYBOOK) is used for every host
    mine = r.line("/inv/x.yaml", "pb", {"l1": "/pbs/probe2/playbook.yaml"})
    assert "-i /inv/x.yaml pb --limit h01,h03,h04'" in mine and "ledger" not in mine


def test_the_ledger_records_absolute_paths(ledger_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command suggested from the ledger (a rollback's restart) runs from any directory: the playbook
    and inventory given as relative paths are recorded absolute (they were kept as typed)."""
    from fleetctl.ops.ledger import Ledger

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pb").mkdir()
    lg = Ledger(ledger_dir / "ledger.sqlite")
    try:
        lg.start("l20260101-000000-0001", "launch", inventory=Path("inv.yaml"), playbook=Path("pb/playbook.yaml"),
                 args={}, hosts=["h01"])
        op = lg.get("l20260101-000000-0001")
    finally:
        lg.close()
    assert op["playbook"] == str(tmp_path / "pb" / "playbook.yaml") and op["inventory"] == str(tmp_path / "inv.yaml")


def test_no_header_word_is_cut_in_two_at_80_columns() -> None:
    """status's servers table at 80 columns printed "runni/ng" and "resta/rt": the whole (never wrapped)
    column kept its 26-character header on one line and the short columns were cut mid-word. Now the
    whole column's header wraps at a space (its cells still whole) and no header word is cut."""
    import io

    from rich.console import Console

    from fleetctl.ui.render import lines_cell, table

    cols = ["host", "instance", "running", "worker", "deploy at launch / on disk", "restart"]
    t = table("servers", cols, whole=("instance", "worker", "deploy at launch / on disk"))
    t.add_row("h01", "port-12458", "yes", "EAGLEWorker", lines_cell(["d20261202-184301-ffe9", "(same on disk)"]), "no")
    buf = io.StringIO()
    Console(file=buf, width=80).print(t)
    out = buf.getvalue()
    assert max(len(ln) for ln in out.splitlines()) <= 80, out
    header = " ".join(out.split("┡")[0].split())
    for word in ("host", "instance", "running", "worker", "restart"):
        assert f" {word} " in header, out
    assert "d20261202-184301-ffe9 " in out and "(same on disk)" in out, out


def test_a_facts_note_does_not_say_note_twice(fake_sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """facts printed "note    note: a git checkout ...": the row's label and then the word again."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    sb = fake_sandbox(hosts=1, versions=("0.5.9",))
    # a start-up hook that sets an SGLANG_ variable: facts notes it
    (sb.hosts["h01"].site_packages / "sitecustomize.py").write_text(
        'import os\nos.environ["SGLANG_ENABLE_SPEC_V2"] = "1"\n')
    code, out, err = run(capsys, "facts", "-i", sb.inventory_path)
    notes = [ln for ln in out.splitlines() if ln.strip().startswith("note")]
    assert code == 0 and any("sitecustomize.py" in ln for ln in notes), out + err
    assert not any(ln.split(None, 1)[1].startswith("note") for ln in notes), notes


def test_summaries_count_one_host_in_the_singular() -> None:
    """'explain: 1 hosts: 1 ok', 'launch ...: 1 hosts, 1 instances': every summary line that counts
    hosts or instances spells the count with its noun (fleetctl.model.hostnames.plural)."""
    import re

    from fleetctl.model.hostnames import plural

    assert (plural(1, "host"), plural(2, "host"), plural(0, "instance")) == ("1 host", "2 hosts", "0 instances")
    root = Path(__file__).resolve().parents[1] / "fleetctl" / "commands"
    left = [f"{f.name}: {m.group(0)}" for f in root.glob("*.py")
            for m in re.finditer(r"\{[^{}]+\} (hosts|instances)\b", f.read_text())]
    assert not left, left


def test_a_file_the_release_lacks_names_the_files_it_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`patch new --file srt/layers/triton_backend.py` (one directory short): the error said "check the
    path in the playbook" (there is no playbook in patch new); it names the release's files of that name."""
    mine = tmp_path / "mine.py"
    mine.write_text("x = 1\n")
    code, _, err = run(capsys, "patch", "new", "--sglang", "0.5.12", "--file", "srt/layers/triton_backend.py", mine)
    assert code == 2 and "did you mean srt/layers/attention/triton_backend.py" in err, err
    assert "playbook" not in err, err


# ---------------------------------------------------------------------------- --json: a host's entry does not name it again


def _own_host_prefixes(value: Any, host: str | None = None, at: str = "") -> list[str]:
    """Every string of a host's own entry (an object with "host", and what it holds) that starts with
    "HOST: " naming that host."""
    if isinstance(value, dict):
        here = value["host"] if isinstance(value.get("host"), str) else host
        return [p for k, v in value.items() if k != "host" for p in _own_host_prefixes(v, here, f"{at}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _own_host_prefixes(v, host, f"{at}[{i}]")]
    return [f"{at}: {value[:80]}"] if host and isinstance(value, str) and value.startswith(f"{host}: ") else []


def test_no_json_host_entry_repeats_its_host_name(fake_sandbox: Any, ledger_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`deploy --json` said {"host": "h01", "message": "h01: 0.5.9 with ..."} (and the same in the plan's
    reason, status's problems, launch's instances, servers' unchecked `why`): every command's document,
    refused and unreachable hosts included, now says the host once, in `host`; the text output keeps
    its "h01: " where the line stands alone."""
    import yaml

    from tests import ports

    sb = fake_sandbox(hosts=2, versions=("0.5.9",))
    sb.fake.down.add("dead")
    doc = yaml.safe_load(sb.inventory_path.read_text())
    doc["hosts"]["dead"] = {"address": "127.0.0.1", "port": ports.free_port(), "connect_timeout": 5}
    inv = sb.dir / "with-dead.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    wrong = ROOT / "playbooks" / "origin-wrong-file"
    runs = [["facts"], ["explain", wrong], ["deploy", wrong], ["deploy", wrong, "--check"],
            ["deploy", wrong, "--any-errors-fatal"], ["launch", wrong], ["launch", FULL, "--check"],
            ["gpu-check", FULL, "--check"], ["deploy", FULL], ["verify-logs", FULL], ["status"],
            ["servers", "--discover"], ["stop"], ["rollback", "--check"], ["rollback"]]
    bad = []
    for args in runs:
        code, out, _ = run(capsys, *args, "-i", inv, "--json")
        assert code == 1, (args, out[-2000:])
        got = json.loads(out)
        assert {h["host"] for h in got["hosts"]} >= {"dead"}, args
        bad += [f"{args[0]}: {p}" for p in _own_host_prefixes(got)]
    assert not bad, "\n".join(bad)
    code, out, err = run(capsys, "deploy", wrong, "-i", inv, "--limit", "h01,dead")
    assert "dead: cannot connect to" in out + err  # (the text keeps the host's name on its own line)


# ---------------------------------------------------------------------------- no line ends in a blank


def test_no_printed_line_ends_in_a_blank(fake_sandbox: Any, ledger_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`sandbox up` / `sandbox status` printed "HOST ... GPUS  " and "jump  (jump host) ...        ":
    a table padded its last column with spaces. Off a terminal, no line any command prints (stdout and
    stderr, tables, prose, refusals, errors) ends in a space or tab; a diff (`deploy --diff`) keeps its
    blank context lines (" "), as an appliable diff must."""
    from fleetctl.commands import common

    monkeypatch.delenv("COLUMNS", raising=False)
    for c in (common.out, common.err):
        monkeypatch.setattr(c, "_console", None)  # made again, for this (non-tty) stdout
    sb = fake_sandbox(hosts=2, versions=("0.5.9", "0.5.14"))
    inv = sb.inventory_path
    wrong = ROOT / "playbooks" / "origin-wrong-file"
    runs = [["sandbox", "status", "--dir", sb.dir], ["facts", "-i", inv], ["explain", "-i", inv, FULL],
            ["deploy", "-i", inv, FULL, "--check"], ["deploy", "-i", inv, wrong], ["deploy", "-i", inv, FULL],
            ["status", "-i", inv, FULL], ["launch", "-i", inv, FULL, "--check"], ["launch", "-i", inv, FULL],
            ["verify-logs", "-i", inv, FULL], ["servers", "-i", inv, "--discover"], ["rollback", "-i", inv, "--check"],
            ["rollback", "-i", inv], ["stop", "-i", inv], ["history"], ["patch", "check", FULL, "--sglang", "0.5.9"],
            ["patch", "check", wrong], ["deploy", "-i", inv, FULL, "--limit", "nosuchhost"], ["--help"]]
    bad = []
    for args in runs:
        code, out, err = run(capsys, *args)
        for stream, text in (("stdout", out), ("stderr", err)):
            bad += [f"{' '.join(map(str, args[:3]))} ({stream}): {ln!r}" for ln in text.splitlines()
                    if ln != ln.rstrip(" \t")]
        assert out.strip() or err.strip(), args
    assert not bad, "\n".join(bad[:40])
    code, out, err = run(capsys, "deploy", "-i", inv, FULL, "--check", "--diff", "--limit", "h01")
    assert code == 0 and "\n \n" in out, err  # a blank context line of the diff, kept


def test_a_refused_worker_is_said_once_in_the_plan(fake_sandbox: Any, ledger_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """deploy of the origin mistake printed its refusal three times: on the plan's "worker that will
    run" line, again as a "refused h01: ..." line under the plan, and in the result table. The plan
    says it once; the result table (the outcome per host) keeps it."""
    sb = fake_sandbox(hosts=1, versions=("0.5.9",))
    pb = Path(__file__).resolve().parents[1] / "playbooks" / "origin-wrong-file"
    code, out, err = run(capsys, "deploy", "-i", sb.inventory_path, pb)
    plan = out.split("result")[0]
    assert code == 1 and "worker that will run: NOT covered, refused: " in plan, out + err
    reason = plan.split("NOT covered, refused: ", 1)[1].splitlines()[0]
    assert "EAGLEWorker" in reason and " ".join(plan.split()).count(" ".join(reason.split())) == 1, plan
    assert "refused" in out.split("result", 1)[1], out  # the result table still says so
