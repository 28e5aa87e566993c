"""verify-logs on the sandbox fleet: the origin story end to end, and every way a proof can fail.

On in-process hosts (tests/fakehost.py: the session sandbox's hosts without sshd, module-scoped; the
servers are real processes of the host's python, their logs real files): what verify-logs proves
is ops logic; verify-logs over real sshd is in test_payload_fleet's sshd smoke
(deploy -> launch -> verify-logs -> rollback)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_ports
from waiting import until

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.remote import servers as srv

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "playbooks" / "dynamic-spec-disable"
WRONG = ROOT / "playbooks" / "origin-wrong-file"
MARKER = "Dynamic speculation disable enabled"


# ----------------------------------------------------------------------------- helpers (as in test_launch)




def make_inventory(sb: Any, path: Path, *, hosts: list[str] | None = None,
                   env: dict[str, dict] | None = None) -> Path:
    doc = yaml.safe_load(sb.inventory_path.read_text())
    base = sb.inventory_path.parent
    doc["ssh_config"] = str(base / doc["ssh_config"])
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(base / doc["defaults"][k])
    for name, port in zip(list(doc["hosts"]), free_ports(len(doc["hosts"])), strict=True):
        h = doc["hosts"][name]
        h["flags"] = {"--port": port}
        h["env"] = {**h.get("env", {}), **((env or {}).get(name) or {})}
    if hosts is not None:
        doc["hosts"] = {n: doc["hosts"][n] for n in hosts}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def fake_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session sandbox's hosts (h01 0.5.9, h02 0.5.14, h03 0.5.9, 2 GPUs each), in-process."""
    import fakehost

    with fakehost.sandbox(tmp_path_factory.mktemp("verify-fake") / "sb", hosts=3, versions=["0.5.9", "0.5.14"],
                          gpus=2) as fsb:
        yield fsb


@pytest.fixture
def sb(fake_fleet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The in-process fleet, left as found: servers stopped (by pid), files pristine, no deploys."""
    import fakehost

    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    try:
        with fakehost.installed(fake_fleet.fake):
            yield fake_fleet
    finally:
        for h in fake_fleet.hosts.values():
            for name in srv.list_instances(str(h.state_dir)):
                rec = srv.current_record(str(h.state_dir), name)
                if rec and srv.record_alive(rec):
                    srv.stop_record(rec, 5.0)
            shutil.rmtree(h.state_dir / "servers", ignore_errors=True)
            for sub in ("srt/speculative", "srt"):
                for f in (wheels.package_dir(h.version) / sub).iterdir():
                    dst = h.sglang_dir / sub / f.name
                    if f.is_file() and (not dst.exists() or dst.read_bytes() != f.read_bytes()):
                        dst.write_bytes(f.read_bytes())
            shutil.rmtree(h.state_dir / "deploys", ignore_errors=True)
            (h.state_dir / "lock").unlink(missing_ok=True)


def cli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, Any]:
    capsys.readouterr()
    code = main([*map(str, args), "--json"])
    o = capsys.readouterr().out
    return code, json.loads(o) if o.strip() else None


def ok(capsys: pytest.CaptureFixture[str], *args: Any) -> Any:
    code, doc = cli(capsys, *args)
    assert code == 0, json.dumps(doc, indent=1)[:3000]
    return doc


def instances(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["host"]: i for h in doc["hosts"] for i in h["instances"]}


def text(iv: dict[str, Any]) -> str:
    return "\n".join(iv["problems"] + iv["explanation"])


# ----------------------------------------------------------------------------- the origin story


def test_origin_story_wrong_file_then_full_playbook(sb: Any, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01", "h02"])
    # only eagle_worker_v2.py (+ server_args.py) patched on 0.5.9; SGLANG_ENABLE_SPEC_V2 unset
    ok(capsys, "deploy", "-i", inv, WRONG, "--limit", "h01", "--allow-uncovered")
    code, refused = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, WRONG, "--limit", "h01", "--timeout", "300")
    assert code == 1 and refused["hosts"][0]["status"] == "refused"
    assert "the playbook patches it: no; your patch changes only eagle_worker_v2.py; fix: patch " \
        "srt/speculative/eagle_worker.py too (fleetctl patch new / patch port) (--allow-uncovered to launch " \
        "it anyway)" in refused["hosts"][0]["instances"][0]["message"]
    launched = ok(capsys, "launch", "--drop-unknown-flags", "--allow-uncovered", "-i", inv, WRONG, "--limit", "h01",
                  "--timeout", "300")
    notes = " ".join(instances(launched)["h01"]["notes"])
    assert "warning" in notes and "EAGLEWorker" in notes and "patches it: no" in notes
    t0 = time.monotonic()
    code, doc = cli(capsys, "verify-logs", "-i", inv, WRONG, "--limit", "h01")
    print(f"verify-logs (1 host, failing): {time.monotonic() - t0:.2f}s")
    assert code == 1 and doc["ok"] is False
    iv = instances(doc)["h01"]
    assert not iv["ok"] and iv["running"]
    assert [r["rank"] for r in iv["ranks"]] == ["TP0", "TP1"] and not any(r["ok"] for r in iv["ranks"])
    assert iv["worker"]["class"] == "EAGLEWorker" and iv["worker"]["file"] == "srt/speculative/eagle_worker.py"
    assert iv["args"]["disable_overlap_schedule"] is True and iv["args"]["speculative_algorithm"] == "EAGLE3"
    t = text(iv)
    assert "the server ran EAGLEWorker from srt/speculative/eagle_worker.py" in t
    assert "disable_overlap_schedule=True because SGLANG_ENABLE_SPEC_V2 was not in the launch env" in t
    assert "does NOT carry" in t and "EAGLEWorker.__init__" in t
    # the human rendering names the same things
    capsys.readouterr()
    assert main(["verify-logs", "-i", str(inv), str(WRONG), "--limit", "h01"]) == 1
    human = capsys.readouterr().out
    assert "MISSING" in human and "EAGLEWorker" in human and "eagle_worker.py" in human

    # the fix: the full playbook (both worker files), relaunched; passes on 0.5.9 and 0.5.14
    ok(capsys, "rollback", "-i", inv, "--limit", "h01")
    ok(capsys, "deploy", "-i", inv, FULL)
    ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--replace", "--timeout", "300")
    t0 = time.monotonic()
    doc = ok(capsys, "verify-logs", "-i", inv, FULL)
    print(f"verify-logs (2 hosts, passing): {time.monotonic() - t0:.2f}s")
    ivs = instances(doc)
    assert ivs["h01"]["version"] == "0.5.9" and ivs["h02"]["version"] == "0.5.14"
    for iv in ivs.values():
        assert iv["ok"] and [r["rank"] for r in iv["ranks"]] == ["TP0", "TP1"]
        assert all(r["markers"][MARKER] for r in iv["ranks"])
        assert iv["args"]["speculative_disable_batch_threshold"] == 16
        assert iv["args"]["speculative_eagle_topk"] == 1
    assert ivs["h01"]["args"]["disable_overlap_schedule"] is True  # 0.5.9: EAGLEWorker, now patched
    assert ivs["h02"]["args"]["disable_overlap_schedule"] is False  # 0.5.14: EAGLEWorkerV2


def test_stale_lines_of_an_earlier_launch_are_ignored(sb: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"])
    ok(capsys, "deploy", "-i", inv, FULL)
    first = ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    ok(capsys, "verify-logs", "-i", inv, FULL)
    old_log = Path(instances(first)["h01"]["log"])
    # back to the original files, relaunched: the old log (with markers) stays on disk, unread
    ok(capsys, "rollback", "-i", inv)
    second = ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--replace", "--timeout", "300")
    assert MARKER in old_log.read_text() and instances(second)["h01"]["log"] != str(old_log)
    code, doc = cli(capsys, "verify-logs", "-i", inv, FULL)
    iv = instances(doc)["h01"]
    assert code == 1 and iv["launch_id"] == second["op_id"]
    assert not any(r["markers"][MARKER] for r in iv["ranks"])
    assert "does NOT carry" in text(iv)
    assert "no deploy of 'dynamic-spec-disable' is on disk here" in text(iv)


def test_redeploy_without_restart_says_restart_needed(sb: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h02"])
    ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")  # pristine 0.5.14: no marker
    time.sleep(0.05)
    ok(capsys, "deploy", "-i", inv, FULL)  # files patched under the running server
    code, doc = cli(capsys, "verify-logs", "-i", inv, FULL)
    iv = instances(doc)["h02"]
    assert code == 1
    t = text(iv)
    assert "restart needed" in t and "srt/speculative/eagle_worker_v2.py" in t
    assert "log is from before the deploy" in t
    assert "DOES carry" in t  # the file on disk is right; the process predates it
    ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--replace", "--timeout", "300")
    ok(capsys, "verify-logs", "-i", inv, FULL)


def test_one_rank_missing_and_server_not_running(sb: Any, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"],
                         env={"h01": {"FLEETCTL_SIM_DROP_MARKER_RANK": "1"}})
    ok(capsys, "deploy", "-i", inv, FULL)
    ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    code, doc = cli(capsys, "verify-logs", "-i", inv, FULL)
    iv = instances(doc)["h01"]
    assert code == 1
    assert [(r["rank"], r["ok"]) for r in iv["ranks"]] == [("TP0", True), ("TP1", False)]
    assert f"marker '{MARKER}' missing on TP1 (present on the other 1 rank(s))" in iv["problems"]
    ok(capsys, "stop", "-i", inv)
    code, doc = cli(capsys, "verify-logs", "-i", inv, FULL)
    assert code == 1 and any("server not running" in p for p in instances(doc)["h01"]["problems"])
    # a host where nothing was ever launched
    inv3 = make_inventory(sb, tmp_path / "inv3.yaml", hosts=["h03"])
    code, doc = cli(capsys, "verify-logs", "-i", inv3, FULL)
    assert code == 1 and "never launched" in instances(doc)["h03"]["problems"][0]


def test_two_instances_per_host_tp1_has_no_rank_prefix(sb: Any, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h02"])
    doc = yaml.safe_load((FULL / "playbook.yaml").read_text())
    for files in doc["versions"].values():
        for f in files["files"]:
            f["patch"] = str((FULL / f["patch"]).resolve())
    doc["launch"]["layout"] = {"gpus_per_instance": 1, "port_stride": 1}
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump(doc))
    ok(capsys, "deploy", "-i", inv, pb)
    launched = ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, pb, "--timeout", "300")
    its = launched["hosts"][0]["instances"]
    assert [i["gpus"] for i in its] == [[0], [1]] and its[1]["port"] == its[0]["port"] + 1
    doc = ok(capsys, "verify-logs", "-i", inv, pb)
    ivs = doc["hosts"][0]["instances"]
    assert len(ivs) == 2 and all(iv["ok"] for iv in ivs)
    assert [r["ranks"] for iv in ivs for r in iv["ranks"]] == [{}, {}]  # tp=1: no TP0 prefix


def test_grep_on_the_host_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"".join(b"[2026-01-01 00:00:00 TP0] %s line %d\n" % (MARKER.encode(), i) for i in range(2000))
                    + b"no match\n" + b"server_args=" + b"x" * 200_000 + b"\n")
    found, size = srv.grep_log(str(log), [MARKER, "server_args="], max_per_pattern=10, max_line=1000)
    assert size == log.stat().st_size
    assert found[MARKER]["count"] == 2000 and len(found[MARKER]["lines"]) == 10 and found[MARKER]["truncated"]
    assert len(found["server_args="]["lines"][0]) == 1000
    found, _ = srv.grep_log(str(log), [MARKER], max_per_pattern=10_000, max_total=5_000)
    assert sum(len(x) for x in found[MARKER]["lines"]) <= 5_000 and found[MARKER]["truncated"]


# ----------------------------------------------------------------------------- a server that ended on its own


def test_crash_before_ready_is_named_as_a_crash_not_a_missing_marker(sb: Any, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"], env={"h01": {"FLEETCTL_SIM_CRASH": "startup"}})
    ok(capsys, "deploy", "-i", inv, FULL)
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    assert code == 1
    msg = doc["hosts"][0]["instances"][0]["message"]
    assert msg.startswith("the server exited (status 1) before ready: RuntimeError: simulated crash"), msg
    code, doc = cli(capsys, "verify-logs", "-i", inv, FULL)
    iv = instances(doc)["h01"]
    assert code == 1 and not iv["running"]
    assert iv["problems"][0].startswith("the server exited (status 1) before ready: RuntimeError: simulated crash")
    assert iv["exited"]["returncode"] == 1
    assert not any("missing on" in p for p in iv["problems"]), iv["problems"]
    assert not any("was the flag given" in e for e in iv["explanation"]), iv["explanation"]
    assert any("Traceback (most recent call last)" in ln for ln in iv["tail"]) and len(iv["tail"]) <= 30
    # the table says it too, with the log's last lines
    capsys.readouterr()
    assert main(["verify-logs", "-i", str(inv), str(FULL)]) == 1
    out = capsys.readouterr().out
    assert "the server exited (status 1) before ready" in out and "| Traceback (most recent call last):" in out


def test_crash_after_ready_and_a_stop_are_told_apart(sb: Any, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01", "h02"],
                         env={"h01": {"FLEETCTL_SIM_CRASH": "after-ready:1"}})
    ok(capsys, "deploy", "-i", inv, FULL)
    launched = ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    name = next(i["instance"] for h in launched["hosts"] if h["host"] == "h01" for i in h["instances"])
    rec = srv.current_record(str(sb.hosts["h01"].state_dir), name)
    until(lambda: not srv.record_alive(rec), "h01's server to crash after ready")
    ok(capsys, "stop", "-i", inv, "--limit", "h02")
    code, doc = cli(capsys, "verify-logs", "-i", inv, FULL)
    assert code == 1
    crashed, stopped = instances(doc)["h01"], instances(doc)["h02"]
    assert crashed["problems"][0].startswith("the server exited (status 1) after ready: RuntimeError: simulated "
                                             "crash after ready"), crashed["problems"]
    assert all(r["ok"] for r in crashed["ranks"])  # the marker was logged before it died
    assert stopped["exited"] is None and stopped["problems"][0].endswith("(stopped)"), stopped["problems"]
    assert not any("exited" in p for p in stopped["problems"])


# ----------------------------------------------------------------------------- log provenance


def test_a_launch_command_that_replays_an_old_log_cannot_pass(sb: Any, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"])
    ok(capsys, "deploy", "-i", inv, FULL)
    first = ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    old_log = tmp_path / "sglang-earlier.log"
    old_log.write_text(Path(instances(first)["h01"]["log"]).read_text())
    assert MARKER in old_log.read_text()
    ok(capsys, "stop", "-i", inv)
    # the origin mistake on disk (EAGLEWorker unpatched on 0.5.9), launched through a command that first
    # replays the earlier run's log (the `tail`/journal pattern) and then execs the server (a python
    # script: fleetctl must see which python a launch runs, so no `sh -c`)
    ok(capsys, "rollback", "-i", inv)
    ok(capsys, "deploy", "-i", inv, WRONG, "--allow-uncovered")
    time.sleep(2.5)  # the replayed lines are older than the new process by more than the clock slack
    replay = tmp_path / "replay_then_serve.py"
    replay.write_text(f"import os, sys\nsys.stderr.buffer.write(open({str(old_log)!r}, 'rb').read())\n"
                      "sys.stderr.flush()\n"
                      "os.execv(sys.executable, [sys.executable, '-m', 'fleetctl.sandbox.simulator', *sys.argv[1:]])\n")
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["h01"]["launch_command"] = f"{{python}} {replay}"
    inv.write_text(yaml.safe_dump(doc))
    launched = ok(capsys, "launch", "--drop-unknown-flags", "--allow-uncovered", "-i", inv, WRONG, "--timeout", "300")
    assert MARKER in Path(instances(launched)["h01"]["log"]).read_text()  # the replayed lines are in the log
    code, doc = cli(capsys, "verify-logs", "-i", inv, WRONG)
    iv = instances(doc)["h01"]
    assert code == 1 and not iv["ok"]
    assert not any(r["markers"][MARKER] for r in iv["ranks"]), iv["ranks"]
    assert any("carry a time before its server process started" in p and "replayed" in p for p in iv["problems"])
    assert iv["worker"]["class"] == "EAGLEWorker" and "does NOT carry" in text(iv)


def test_provenance_helpers() -> None:
    from fleetctl.engines.sglang import parse_line
    from fleetctl.ops.verify import _dump_mismatches, _written_since

    lines = {"m": [parse_line("[2026-11-30 10:00:00 TP0] m"), parse_line("[2026-11-30 10:00:09 TP0] m"),
                   parse_line("m without a time")]}
    import calendar
    started = calendar.timegm((2026, 11, 30, 9, 0, 5, 0, 0, 0))  # 10:00:05 at UTC+1
    kept, dropped = _written_since(lines, started, 3600)
    assert dropped == 1 and [ln.raw for ln in kept["m"]] == ["[2026-11-30 10:00:09 TP0] m", "m without a time"]
    assert _written_since(lines, None, 3600) == (lines, 0)
    resolved = {"port": 31000, "tp_size": 2, "speculative_algorithm": "EAGLE3", "x": None}
    dump = {"port": 30000, "tp_size": 2, "speculative_algorithm": "EAGLE3"}
    assert _dump_mismatches(dump, resolved, {"--port": 31000, "--tp-size": 2, "--x": 1}) == [
        "port=30000 in the log, launched with 31000"]
    assert _dump_mismatches({**dump, "port": 31000}, resolved, {"--port": "31000"}) == []


def test_report_lines_are_counted_and_shown_never_judged(sb: Any, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The playbook's verify.report lines (the payload's switch lines) of this launch: counted, the
    latest shown, in --json and in the table's notes; the instance still passes on its markers."""
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"])
    version = sb.hosts["h01"].version
    ok(capsys, "deploy", "-i", inv, FULL)
    # a launch command that logs the payload's own lines as the real 0.5.12 server wrote them on the H200
    # (tests/data/sglang/0.5.12_dsd_switch_lines.log: marker, graph capture, three switch lines, decode
    # lines), re-stamped now in this release's format, then runs the server
    real = (ROOT / "tests" / "data" / "sglang" / "0.5.12_dsd_switch_lines.log").read_text().splitlines()
    messages = [ln.split("] ", 1)[1] for ln in real if "Dynamic speculation disable:" in ln]
    assert len(messages) == 4 and "speculation off: 33 running > 4" in messages[1]
    wrap = tmp_path / "switch_then_serve.py"
    wrap.write_text(
        "import os, sys\nfrom datetime import datetime\nfrom fleetctl.engines.sglang.logs import format_line\n"
        f"for m in {messages!r}:\n"
        f"    sys.stderr.write(format_line({version!r}, {{}}, m, datetime.now()) + '\\n')\n"
        "sys.stderr.flush()\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'fleetctl.sandbox.simulator', *sys.argv[1:]])\n")
    doc = yaml.safe_load(inv.read_text())
    plain = doc["hosts"]["h01"].get("launch_command")
    doc["hosts"]["h01"]["launch_command"] = f"{{python}} {wrap}"
    inv.write_text(yaml.safe_dump(doc))
    ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    iv = instances(ok(capsys, "verify-logs", "-i", inv, FULL))["h01"]
    assert iv["ok"], text(iv)
    (rep,) = iv["reports"].values()
    assert rep["count"] == 3  # the capture line is not a switch line
    assert rep["latest"][-1].endswith("speculation off: 5 running > 4 (3 switches since the last line)")
    capsys.readouterr()
    assert main(["verify-logs", "-i", str(inv), str(FULL)]) == 0
    human = capsys.readouterr().out
    assert "3 line(s) with 'Dynamic speculation disable: speculation o'" in human and "1 running <= 4" in human
    # a launch without such lines reports nothing
    if plain is None:
        doc["hosts"]["h01"].pop("launch_command")
    else:
        doc["hosts"]["h01"]["launch_command"] = plain
    inv.write_text(yaml.safe_dump(doc))
    ok(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--replace", "--timeout", "300")
    iv = instances(ok(capsys, "verify-logs", "-i", inv, FULL))["h01"]
    assert iv["ok"] and iv["reports"] == {}
