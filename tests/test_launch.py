"""launch / stop / status of servers on the sandbox fleet (real sshd hosts, the server simulator)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_ports
from waiting import until

from fleetctl.cli import main
from fleetctl.config.inventory import load_inventory
from fleetctl.config.playbook import LaunchProfile, load_playbook
from fleetctl.config.playbook_model import InstanceLayout
from fleetctl.engines import wheels
from fleetctl.engines.sglang import READY_LINE
from fleetctl.errors import InputError
from fleetctl.model.facts import read_facts
from fleetctl.model.instances import plan_instances
from fleetctl.ops.launch import server_status_facts
from fleetctl.ops.runner import Fleet
from fleetctl.remote import core as rcore
from fleetctl.remote import servers as srv

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "playbooks" / "dynamic-spec-disable"
# launch / stop / status decide on in-process hosts (`sb`, tests/fakehost.py: the servers are real
# processes of the host's python); the launch smoke, the servers started by hand over ssh and the
# Ctrl-C of a fleetctl process keep the session's sshd sandbox (`ssb`: the fleet marker comes with it)


# ----------------------------------------------------------------------------- helpers (also in test_verify_logs)


def make_inventory(sb: Any, path: Path, *, hosts: list[str] | None = None, env: dict[str, dict] | None = None,
                   flags: dict[str, dict] | None = None, extra: dict[str, dict] | None = None) -> Path:
    """The sandbox inventory with a distinct --port per host (all hosts share 127.0.0.1)."""
    doc = yaml.safe_load(sb.inventory_path.read_text())
    base = sb.inventory_path.parent
    doc["ssh_config"] = str(base / doc["ssh_config"])
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(base / doc["defaults"][k])
    names = list(doc["hosts"])
    ports = free_ports(len(names))
    for name, port in zip(names, ports, strict=True):
        h = doc["hosts"][name]
        h["flags"] = {"--port": port, **((flags or {}).get(name) or {})}
        h["env"] = {**h.get("env", {}), **((env or {}).get(name) or {})}
        h.update((extra or {}).get(name) or {})
    if hosts is not None:
        doc["hosts"] = {n: doc["hosts"][n] for n in hosts}
    path.write_text(yaml.safe_dump(doc))
    return path


def stop_all_local(sb: Any) -> None:
    """Stop every server any launch left on the sandbox hosts, by pid + start time (finalizer)."""
    for h in sb.hosts.values():
        root = h.state_dir / "servers"
        for name in srv.list_instances(str(h.state_dir)):
            rec = srv.current_record(str(h.state_dir), name)
            if rec and srv.record_alive(rec):
                srv.stop_record(rec, 5.0)
        shutil.rmtree(root, ignore_errors=True)


def reset_host_files(sb: Any) -> None:
    for h in sb.hosts.values():
        for sub in ("srt/speculative", "srt"):
            src = wheels.package_dir(h.version) / sub
            for f in src.iterdir():
                dst = h.sglang_dir / sub / f.name
                if f.is_file() and (not dst.exists() or dst.read_bytes() != f.read_bytes()):
                    dst.write_bytes(f.read_bytes())
        shutil.rmtree(h.state_dir / "deploys", ignore_errors=True)
        (h.state_dir / "lock").unlink(missing_ok=True)
        if h.gpu_state_file.read_text().strip() != "idle":
            sb.set_gpu_state(h.name, "idle")


@pytest.fixture(scope="module")
def fake_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session sandbox's hosts (h01 0.5.9, h02 0.5.14, h03 0.5.9, 2 GPUs each), in-process."""
    import fakehost

    with fakehost.sandbox(tmp_path_factory.mktemp("launch-fake") / "sb", hosts=3, versions=["0.5.9", "0.5.14"],
                          gpus=2) as fsb:
        yield fsb


@pytest.fixture
def sb(fake_fleet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The in-process fleet, left as found: servers stopped, files pristine, GPUs idle."""
    import fakehost

    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    try:
        with fakehost.installed(fake_fleet.fake):
            yield fake_fleet
    finally:
        stop_all_local(fake_fleet)
        reset_host_files(fake_fleet)


@pytest.fixture
def ssb(sandbox: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The session sandbox, left as found: servers stopped, files pristine, GPUs idle."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "ledger"))
    try:
        yield sandbox
    finally:
        stop_all_local(sandbox)
        reset_host_files(sandbox)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main([*map(str, args), "--json"])
    o = capsys.readouterr().out
    return code, json.loads(o) if o.strip() else None


def playbook_with(tmp_path: Path, launch: dict[str, Any], base: Path = FULL) -> Path:
    """A copy of a payload playbook with its launch profile changed (patches referenced in place)."""
    doc = yaml.safe_load((base / "playbook.yaml").read_text())
    for files in doc["versions"].values():
        for f in files["files"]:
            f["patch"] = str((base / f["patch"]).resolve())
    doc["launch"] = {**doc.get("launch", {}), **launch}
    p = tmp_path / "pb" / "playbook.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(doc))
    return p


# ----------------------------------------------------------------------------- instance layout (no hosts)


def _host(tmp_path: Path, host: dict[str, Any]) -> Any:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"g1": {"address": "127.0.0.9", **host}}}))
    return load_inventory(inv).hosts[0]


def test_layout_split_gpus_ports_env_and_overrides(tmp_path: Path) -> None:
    h = _host(tmp_path, {"gpus": 4, "python": "/opt/my python/bin/python3",
                         "env": {"TOKEN": {"value": "s3cret"}, "SGLANG_LOG_MS": True},
                         "flags": {"--speculative-num-steps": 5, "--api-key": "s3cret"}})
    prof = LaunchProfile(flags={"--speculative-num-steps": 3, "--model-path": "m", "--enable-x": True,
                                "--off": False}, env={"SGLANG_ENABLE_SPEC_V2": True, "A": "b c; rm -rf /"},
                         port=31000, layout=InstanceLayout(gpus_per_instance=2, port_stride=10))
    insts = plan_instances(h, prof)
    assert [(i.name, i.gpus, i.port) for i in insts] == [("port-31000", (0, 1), 31000), ("port-31010", (2, 3), 31010)]
    a = insts[1]
    assert a.argv[:3] == ["/opt/my python/bin/python3", "-m", "sglang.launch_server"]  # a list: no shell
    assert a.flags["--speculative-num-steps"] == 5  # inventory beats playbook
    assert a.argv[a.argv.index("--tp-size") + 1] == "2" and a.argv[a.argv.index("--port") + 1] == "31010"
    assert "--enable-x" in a.argv and "--off" not in a.argv
    assert a.env == {"SGLANG_ENABLE_SPEC_V2": "1", "A": "b c; rm -rf /", "TOKEN": "s3cret", "SGLANG_LOG_MS": "1",
                     "CUDA_VISIBLE_DEVICES": "2,3"}
    assert a.public_env["TOKEN"] == "***" and "s3cret" not in " ".join(a.public_argv)
    one = plan_instances(h, LaunchProfile(flags={"--tp": 2}))
    assert len(one) == 1 and one[0].gpus == (0, 1, 2, 3) and "--tp-size" not in one[0].argv  # user tp kept
    with pytest.raises(InputError):
        plan_instances(h, LaunchProfile(layout=InstanceLayout(gpus_per_instance=3)))


# ----------------------------------------------------------------------------- on the fleet


def test_launch_ready_env_exact_status_and_stop(ssb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    weird = "a b; echo pwned $(id) `id` 'q' \"dq\" \\ *"
    inv = make_inventory(ssb, tmp_path / "inv.yaml", hosts=["h01", "h02"],
                         env={"h01": {"FROM_INVENTORY": "yes", "WEIRD": weird}})
    pb = playbook_with(tmp_path, {"env": {"FROM_PROFILE": "1"}})
    # set in the controller's shell only: must never reach a server
    monkeypatch.setenv("FLEETCTL_LEAK_PROBE", "controller")
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")
    # launch --check: the plan (the same facts and decisions), and nothing started
    code, plan = cli(capsys, "launch", "--check", "--drop-unknown-flags", "-i", inv, pb)
    assert code == 0 and plan["check"] is True, plan
    assert [(h["host"], h["state"]) for h in plan["hosts"]] == [("h01", "start"), ("h02", "start")]
    (p1,) = plan["hosts"][0]["instances"]
    port = yaml.safe_load(inv.read_text())["hosts"]["h01"]["flags"]["--port"]
    assert p1["port"] == port and p1["gpus"] == [0, 1] and str(port) in p1["argv"]
    assert p1["env"]["FROM_PROFILE"] == "1" and p1["env"]["WEIRD"] == weird and p1["cwd"]
    assert p1["worker"]["class"] == "EAGLEWorker" and plan["hosts"][0]["stop"] == []
    assert "srt/speculative/eagle_worker.py" in plan["hosts"][0]["hash_files"]
    assert srv.list_instances(str(ssb.hosts["h01"].state_dir)) == []
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, pb, "--timeout", "300")
    assert code == 0, doc
    insts = {i["host"]: i for h in doc["hosts"] for i in h["instances"]}
    assert {i["status"] for i in insts.values()} == {"ready"} and {i["health"] for i in insts.values()} == {200}
    assert insts["h01"]["worker"]["class"] == "EAGLEWorker"  # 0.5.9, env unset on the host
    print(f"launch-to-ready per instance: {[i['seconds'] for i in insts.values()]}s")
    h01 = ssb.hosts["h01"]
    rec = srv.current_record(str(h01.state_dir), insts["h01"]["instance"])
    environ = dict(x.split("=", 1) for x in Path(f"/proc/{rec['pid']}/environ").read_text().split("\0") if "=" in x)
    assert "FLEETCTL_LEAK_PROBE" not in environ and "SGLANG_ENABLE_SPEC_V2" not in environ
    assert environ["FROM_PROFILE"] == "1" and environ["FROM_INVENTORY"] == "yes"
    assert environ["WEIRD"] == weird  # passed as data, never through a shell
    assert environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert set(rec["env"]) == {"FROM_PROFILE", "FROM_INVENTORY", "WEIRD", "PATH", "CUDA_VISIBLE_DEVICES"}
    assert rec["worker_hashes"]["srt/speculative/eagle_worker.py"] and rec["process_started"]
    assert rec["log"].endswith(f"/logs/{doc['op_id']}.log") and rec["deploy"] is None

    # status rows (what `fleetctl status` shows), then a file changes on disk: restart needed
    inventory = load_inventory(inv)
    fleet = Fleet(inventory, inventory.hosts[:1])
    try:
        (h01.sglang_dir / "srt/speculative/eagle_worker.py").write_bytes(
            (h01.sglang_dir / "srt/speculative/eagle_worker.py").read_bytes() + b"# edited\n")
        facts = read_facts(fleet.connection(inventory.hosts[0]), gpus=False, with_=["servers"])
        rows = server_status_facts(inventory.hosts[0], facts)
    finally:
        fleet.close()
    assert len(rows) == 1 and rows[0]["running"] and rows[0]["restart_needed"]
    assert rows[0]["changed_files"] == ["srt/speculative/eagle_worker.py"] and rows[0]["flags"]["--tp-size"] == 2

    # a second launch without --replace is refused; with --replace the old server is stopped first
    code, doc2 = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, pb, "--limit", "h01", "--timeout", "300")
    assert code == 1 and "already running" in doc2["hosts"][0]["instances"][0]["message"]
    code, plan2 = cli(capsys, "launch", "--check", "--drop-unknown-flags", "-i", inv, pb, "--limit", "h01")
    assert code == 1 and plan2["hosts"][0]["state"] == "refused"
    assert "already running" in plan2["hosts"][0]["instances"][0]["problems"][0]
    code, plan3 = cli(capsys, "launch", "--check", "--replace", "--drop-unknown-flags", "-i", inv, pb, "--limit", "h01")
    assert code == 0 and plan3["hosts"][0]["stop"] == [insts["h01"]["instance"]] and plan3["hosts"][0]["recheck"]
    assert srv.record_alive(rec)  # --check stopped nothing
    code, doc3 = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, pb, "--limit", "h01", "--replace", "--timeout", "300")
    assert code == 0 and "replaced" in " ".join(doc3["hosts"][0]["instances"][0]["notes"])
    assert not srv.record_alive(rec)

    code, listing = cli(capsys, "servers", "-i", inv)
    assert code == 0 and [(h["host"], [s["running"] for s in h["servers"]]) for h in listing["hosts"]] == [
        ("h01", [True]), ("h02", [True])]
    code, one = cli(capsys, "stop", "-i", inv, "--limit", "h02", "--instance", insts["h02"]["instance"])
    assert code == 0 and [s["action"] for s in one["hosts"][0]["instances"]] == ["stopped"]
    code, stopped = cli(capsys, "stop", "-i", inv)
    assert code == 0
    assert sorted(s["action"] for h in stopped["hosts"] for s in h["instances"]) == ["not running", "stopped"]
    assert all(not srv.record_alive(srv.current_record(str(ssb.hosts[n].state_dir), i["instance"]))
               for n, i in insts.items())


def test_startup_crash_fails_fast_with_log_tail(sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"], env={"h01": {"FLEETCTL_SIM_CRASH": "startup"}})
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    assert code == 1
    it = doc["hosts"][0]["instances"][0]
    assert it["status"] == "failed"
    # fast: the crash itself ends the wait (not "not ready after 300s", the timeout's outcome)
    assert "forbidden" in it["message"] or "exited" in it["message"], it["message"]
    assert "not ready after" not in it["message"]
    assert any("Traceback (most recent call last)" in ln for ln in it["tail"])
    assert any("simulated crash" in ln for ln in it["tail"]) and len(it["tail"]) <= 30


def test_refuses_busy_gpu_and_port_in_use(sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"])
    sb.set_gpu_state("h01", "busy")  # the busy capture: one foreign compute process per GPU
    code, plan = cli(capsys, "launch", "--check", "--drop-unknown-flags", "-i", inv, FULL)
    assert code == 1 and plan["hosts"][0]["state"] == "refused"
    assert "GPU 0 is in use" in " ".join(plan["hosts"][0]["instances"][0]["problems"])
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    assert code == 1 and doc["hosts"][0]["status"] == "refused"
    msg = doc["hosts"][0]["instances"][0]["message"]
    assert "GPU 0 is in use" in msg and "pid 423" in msg and "GPU 1 is in use" in msg
    assert srv.list_instances(str(sb.hosts["h01"].state_dir)) == []  # nothing was started
    sb.set_gpu_state("h01", "idle")
    port = yaml.safe_load(inv.read_text())["hosts"]["h01"]["flags"]["--port"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    assert code == 1 and f"port {port} is in use" in doc["hosts"][0]["instances"][0]["message"]


def test_stop_escalates_to_sigkill(sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that ignores SIGTERM is killed (its whole process group) after stop_timeout."""
    script = ("import signal,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f'print("{READY_LINE}", file=sys.stderr, flush=True); time.sleep(120)')
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"],
                         extra={"h01": {"launch_command": f"{{python}} -c '{script}'"}})
    pb = playbook_with(tmp_path, {"stop_timeout": 1.0, "flags": {}})
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, pb, "--timeout", "300")
    it = doc["hosts"][0]["instances"][0]
    # ready line seen, but nothing answers GET /health: a failed launch, whose server fleetctl stops
    assert code == 1 and it["status"] == "failed" and "GET /health" in it["message"]
    assert any("SIGKILL" in n for n in it["notes"])
    rec = srv.current_record(str(sb.hosts["h01"].state_dir), it["instance"])
    assert rec["state"] == "stopped" and not srv.record_alive(rec)
    assert srv.group_members(rec["pgid"]) == []  # (a zombie awaiting its reaper may remain)


def test_payload_playbook_profile_loads() -> None:
    pb = load_playbook(FULL)
    assert pb.launch.flags["--speculative-disable-batch-threshold"] == 16


def test_refuses_interrupted_deploy_and_waits_for_no_lock(sb: Any, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"])
    sd = sb.hosts["h01"].state_dir
    m = sd / "deploys" / "d-cut" / "manifest.json"
    m.parent.mkdir(parents=True)
    m.write_text(json.dumps({"id": "d-cut", "state": "applying", "created": time.time(), "files": []}))
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    assert code == 1 and "d-cut was interrupted" in doc["hosts"][0]["message"]
    shutil.rmtree(sd / "deploys")
    # a deploy holds the host lock (a live pid): the launch does not start anything under it
    (sd / "lock").write_text(json.dumps({"pid": os.getpid(), "op": "deploy", "id": "d-busy", "by": "test"}))
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    it = doc["hosts"][0]["instances"][0]
    assert code == 1 and it["status"] == "failed" and "locked: deploy d-busy" in it["message"]
    assert srv.list_instances(str(sd)) == []


# ----------------------------------------------------------------------------- the agent's server actions, locally


def test_agent_server_actions_locally(tmp_path: Path) -> None:
    import sys

    sd = str(tmp_path / "state")
    (tmp_path / "state").mkdir()
    script = f'import sys,time; print("{READY_LINE}", file=sys.stderr, flush=True); time.sleep(60)'
    base = {"state_dir": sd, "instance": "port-1", "env": {"A": "1"}, "public_env": {"A": "1"},
            "package_dir": str(tmp_path), "hash_files": ["nope.py"]}
    try:
        rec = srv.action_server_start({**base, "launch_id": "l1", "argv": [sys.executable, "-c", script]})
        assert rec["pid"] and rec["state"] == "started" and rec["worker_hashes"] == {"nope.py": None}
        w = srv.action_server_wait({"state_dir": sd, "instances": ["port-1"], "ready_line": READY_LINE,
                                    "forbidden": ["Traceback"], "timeout": 20})
        assert w["port-1"]["status"] == "ready" and w["port-1"]["running"]
        with pytest.raises(rcore.AgentError, match="already running"):
            srv.action_server_start({**base, "launch_id": "l2", "argv": [sys.executable, "-c", script]})
        st = srv.instance_state(sd, "port-1", srv.deploy_on_disk(sd))
        assert st["running"] is True
        stopped = srv.action_server_stop({"state_dir": sd, "instances": ["port-1"], "timeout": 5})
        assert stopped[0]["action"] == "stopped" and stopped[0]["how"] == "SIGTERM"
        assert srv.current_record(sd, "port-1")["state"] == "stopped"
        # a command that cannot start: a record saying so, and an error naming it
        with pytest.raises(rcore.AgentError, match="cannot start"):
            srv.action_server_start({**base, "launch_id": "l3", "argv": [str(tmp_path / "no-such-python")]})
        assert srv.current_record(sd, "port-1")["state"] == "failed-to-start"
        with pytest.raises(rcore.AgentError, match="bad instance name"):
            srv.action_server_stop({"state_dir": sd, "instances": ["../x"]})
    finally:
        for name in srv.list_instances(sd):
            r = srv.current_record(sd, name)
            if r and srv.record_alive(r):
                srv.stop_record(r, 2.0)


def test_agent_servers_part_parses_as_python_38() -> None:
    import ast

    ast.parse(Path(srv.__file__).read_text(), feature_version=(3, 8))


def test_launch_refuses_a_flag_the_installed_sglang_does_not_register(sb: Any,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The payload's own flag on a pristine host: refused before anything starts, with the fix."""
    code, doc = cli(capsys, "launch", "-i", str(sb.inventory_path), str(FULL), "--limit", "h01",
                    "--timeout", "300")
    assert code == 1
    (h,) = doc["hosts"]
    assert h["status"] == "refused"
    assert "--speculative-disable-batch-threshold is not a flag of SGLang 0.5.9 as installed on h01" in h["message"]
    assert "--drop-unknown-flags" in h["message"]
    assert all(i["status"] != "ready" for i in h["instances"])


# ----------------------------------------------------------------------------- servers fleetctl did not start

SIM_FLAGS = ("--model-path m --speculative-algorithm EAGLE3 --speculative-num-steps 3 "
             "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 2")


def test_servers_started_by_hand_are_discovered_and_named_after_deploy_and_rollback(
        ssb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(ssb, tmp_path / "inv.yaml", hosts=["h01", "h02"])
    h01 = ssb.hosts["h01"]
    port = free_ports(1)[0]
    log = tmp_path / "by-hand.log"
    # an operator's own start over ssh, in the background, no fleetctl involved (0.5.9, env unset)
    r = ssb.ssh("h01", f"cd / ; nohup {h01.python} -m fleetctl.sandbox.simulator {SIM_FLAGS} --port {port} "
                      f"> {log} 2>&1 < /dev/null & echo $!")
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.split()[-1])
    try:
        until(lambda: READY_LINE in log.read_text(), "the by-hand server's ready line")
        time.sleep(1.1)  # a file changed in the same second as the start is not called newer
        code, doc = cli(capsys, "servers", "--discover", "-i", inv)
        assert code == 0, doc
        by_host = {h["host"]: h["servers"] for h in doc["hosts"]}
        assert by_host["h02"] == []  # another (sandbox) host does not see h01's processes
        (s,) = by_host["h01"]
        assert s["pid"] == pid and s["instance"] is None and s["launched_by"] == "not fleetctl"
        assert s["ports"] == [port] and s["log"] == str(log) and s["cwd"] == "/"
        assert s["worker"]["class"] == "EAGLEWorker" and s["version"] == "0.5.9"
        assert s["stale"] is False and "--speculative-algorithm" in s["argv"]
        # deploy: the by-hand server now runs older code than the files on disk, and deploy says so
        code, doc = cli(capsys, "deploy", "-i", inv, FULL)
        assert code == 0, doc
        rn = doc["restart_needed"]
        assert rn["servers"] == 1 and rn["hosts"] == 1 and rn["by_hand"] == [{"host": "h01", "pid": pid}]
        capsys.readouterr()
        assert main(["status", "-i", str(inv)]) == 1  # a server runs old code: a problem
        cap = capsys.readouterr()
        assert f"pid {pid} (not started by fleetctl) runs code older than the files on disk" in cap.out
        assert "1 server on 1 host still runs the old code" in cap.err and f"h01 pid {pid}" in cap.err
        # a fleetctl launch on h02 after the deploy is current; rollback makes both old
        code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--limit", "h02", "--timeout", "300")
        assert code == 0, doc
        time.sleep(1.1)
        capsys.readouterr()
        assert main(["rollback", "-i", str(inv)]) == 0
        cap = capsys.readouterr()
        assert "2 servers on 2 hosts still run the old code" in cap.err, cap.err
        # the real command: the playbook the h02 launch used (from the ledger), never a placeholder
        assert (f"restart them: 'fleetctl launch --replace --drop-unknown-flags -i {inv} {FULL / 'playbook.yaml'} "
                "--limit h02'") in cap.err, cap.err
        assert "PLAYBOOK" not in cap.err
        assert f"restart by hand (not started by fleetctl): h01 pid {pid}" in cap.err
    finally:
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass


def test_discovery_reads_flags_and_entry_points() -> None:
    from fleetctl.engines.sglang.processes import match_rules, server_flags
    from fleetctl.remote.serverfacts import server_argv_matches

    rules = match_rules("{python} -m my.wrapper --x")
    assert "my.wrapper" in rules["modules"] and "sglang.launch_server" in rules["modules"]
    yes = [["python3", "-m", "sglang.launch_server", "--tp", "2"], ["/v/bin/sglang", "serve", "--port", "1"],
           ["python", "-m", "sglang.cli.main", "serve"], ["python", "/x/sglang/launch_server.py"],
           ["python", "-msglang.launch_server"], ["python", "-m", "my.wrapper"]]
    no = [["python", "-m", "sglang.cli.main", "version"], ["sglang", "version"], ["bash", "-c", "python -m sglang.launch_server"],
          ["python", "-m", "sglang.bench_serving"], ["grep", "sglang.launch_server"]]
    assert all(server_argv_matches(a, rules) for a in yes)
    assert not any(server_argv_matches(a, rules) for a in no)
    assert server_flags(["python", "-m", "sglang.launch_server", "--model-path", "m", "--disable-overlap-schedule",
                         "--tp-size=2", "--speculative-algorithm", "EAGLE3", "--enable-x"]) == {
        "--model-path": "m", "--disable-overlap-schedule": True, "--tp-size": "2",
        "--speculative-algorithm": "EAGLE3", "--enable-x": True}
    assert server_flags(["/v/bin/sglang", "serve", "--port", "3"]) == {"--port": "3"}


def test_discovery_skips_only_command_lines_no_rule_can_match() -> None:
    """discover_facts decodes and matches only command lines holding a rule's word (argv_needles):
    every command line the rules accept holds one in its raw bytes, also beside bytes that are not
    UTF-8; a rule word that cannot be searched for as bytes turns the shortcut off."""
    import itertools

    from fleetctl.engines.sglang.processes import match_rules
    from fleetctl.remote.serverfacts import MAX_ARG, argv_needles, server_argv_matches

    rules = match_rules("{python} -m my.wrapper --x")
    needles = argv_needles(rules)
    assert needles is not None and b"my.wrapper" in needles
    words = [b"python3", b"-m", b"-msglang.launch_server", b"sglang.launch_server", b"sglang.cli.main", b"serve",
             b"/v/bin/sglang", b"sglang", b"/x/sglang/launch_server.py", b"sglang/launch_server.py", b"my.wrapper",
             b"-mmy.wrapper", b"\xff\xfe", b"sglang\xff", b"\xe2sglang", b"--tp", b"version", b"x" * (MAX_ARG + 5)]
    matched = skipped = 0
    for n in (1, 2, 3):
        for argv in itertools.product(words, repeat=n):
            raw = b"\0".join(argv) + b"\0"
            decoded = [a.decode("utf-8", "replace")[:MAX_ARG] for a in raw.split(b"\0")[:-1]]
            if server_argv_matches(decoded, rules):
                matched += 1
                assert any(w in raw for w in needles), argv
            elif not any(w in raw for w in needles):
                skipped += 1
    assert matched > 100 and skipped > 0
    assert argv_needles({"modules": ["sglang.launch_server"], "paths": [""]}) is None
    assert argv_needles({"scripts": ["\ud800 serve"]}) is None  # (not encodable)
    assert argv_needles({"modules": ["a\ufffdb"]}) is None


# ----------------------------------------------------------------------------- settings that hide or defeat the proof


def _ok(capsys: pytest.CaptureFixture[str], *args: Any) -> Any:
    code, doc = cli(capsys, *args)
    assert code == 0, json.dumps(doc, indent=1)[:3000]
    return doc


def test_a_threshold_at_or_above_max_running_requests_can_never_fire(sb: Any, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01", "h02"],
                         flags={"h01": {"--speculative-disable-batch-threshold": 64},
                                "h02": {"--speculative-disable-batch-threshold": 64, "--max-running-requests": 128}})
    _ok(capsys, "deploy", "-i", inv, FULL)
    code, doc = cli(capsys, "explain", "-i", inv, FULL)
    notes = {h["host"]: h["instances"][0]["never_fires"] for h in doc["hosts"]}
    assert notes["h02"] == [] and len(notes["h01"]) == 1
    assert notes["h01"][0].startswith("speculative_disable_batch_threshold=64 >= max_running_requests=48: "
                                      "the feature can never act")
    _ok(capsys, "launch", "-i", inv, FULL, "--timeout", "300")
    code, doc = cli(capsys, "verify-logs", "-i", inv, FULL)
    by = {h["host"]: h["instances"][0] for h in doc["hosts"]}
    assert code == 1 and not by["h01"]["ok"] and by["h02"]["ok"], by["h02"]["problems"]
    assert any("=64 >= max_running_requests=48: the feature can never act" in p for p in by["h01"]["problems"])
    assert all(r["ok"] for r in by["h01"]["ranks"])  # the patched code does run: only the setting is inert


def test_launch_refuses_settings_that_hide_info_lines(sb: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01", "h02"],
                         flags={"h01": {"--log-level": "warning"}},
                         env={"h02": {"SGLANG_LOGGING_CONFIG_PATH": "/etc/sglang/logging.json"}})
    code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
    assert code == 1
    msg = {h["host"]: h["instances"][0]["message"] for h in doc["hosts"]}
    assert {h["status"] for h in doc["hosts"]} == {"refused"}
    assert "--log-level warning hides INFO lines" in msg["h01"]
    assert "SGLANG_LOGGING_CONFIG_PATH replaces SGLang's log format" in msg["h02"]
    assert all(not i["pid"] for h in doc["hosts"] for i in h["instances"])  # nothing was started


def test_multi_node_each_node_proves_its_own_ranks(sb: Any, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # node 1 of 2 with --tp-size 2 runs (and logs) only TP1
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"],
                         flags={"h01": {"--nnodes": 2, "--node-rank": 1, "--dist-init-addr": "127.0.0.1:5000"}})
    _ok(capsys, "deploy", "-i", inv, FULL)
    _ok(capsys, "launch", "-i", inv, FULL, "--timeout", "300")
    doc = _ok(capsys, "verify-logs", "-i", inv, FULL)
    (iv,) = doc["hosts"][0]["instances"]
    assert [r["rank"] for r in iv["ranks"]] == ["TP1"] and iv["ok"]


@pytest.mark.parametrize("side", ["agent", "engine"])
def test_flag_pre_check_accepts_unambiguous_abbreviations(side: str) -> None:
    """The host agent's check (remote/hostfacts.py) and the controller's own (the engine's, for a
    restart on the original code: ops/rolling.py) give the same answers."""
    from fleetctl.engines import engine
    from fleetctl.remote.hostfacts import flag_registered as on_host

    flag_registered = on_host if side == "agent" else engine().flag_registered
    text = (wheels.package_dir("0.5.9") / "srt" / "server_args.py").read_text()
    assert flag_registered(text, "--speculative-num-steps")
    assert flag_registered(text, "--speculative-num-ste")  # argparse takes a unique prefix
    assert not flag_registered(text, "--speculative")  # a prefix of many: argparse refuses it
    assert not flag_registered(text, "--no-such-flag")
    assert flag_registered("class ServerArgs:\n    model_path: str\n", "--model-path")  # a field
    assert not flag_registered("class ServerArgs:\n    model_path: str\n", "--model")


def test_status_rechecks_which_worker_will_run(sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = ROOT / "playbooks" / "origin-wrong-file"
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"])
    code, doc = cli(capsys, "status", "-i", inv, wrong)
    assert code == 1
    (row,) = doc["hosts"]
    assert any(p.startswith("uncovered: ") and "EAGLEWorker" in p and "the playbook patches it: no" in p
               for p in row["problems"]), row["problems"]
    code, doc = cli(capsys, "status", "-i", inv, FULL)
    assert code == 0 and not any(p.startswith("uncovered") for p in doc["hosts"][0]["problems"])


# ----------------------------------------------------------------------------- a traceback survived (issue 35.3)

# real SGLang 0.5.12 start-up lines (one H200, 2026-12-01; /work/shared/fixtures/sglang-logs/0.5.12):
# a handled `Can not initialize OpenAIServingResponses ... Traceback` (openai_harmony absent), then ready
REAL_0512 = Path(__file__).parent / "data" / "sglang" / "0.5.12_handled_traceback.log"


def test_a_traceback_the_real_server_logs_and_survives_is_reported_not_failed(tmp_path: Path) -> None:
    """The agent's wait, on the real 0.5.12 lines written by a live process: ready, the traceback
    reported (before: status 'forbidden', and launch stopped the healthy server)."""
    import sys

    from fleetctl.config.playbook_model import CRASH_SIGNS

    text = REAL_0512.read_text()
    assert "Traceback (most recent call last)" in text and READY_LINE in text
    sd = str(tmp_path / "state")
    (tmp_path / "state").mkdir()
    script = (f"import sys; sys.stderr.write(open({str(REAL_0512)!r}).read()); sys.stderr.flush(); "
              "import threading; threading.Event().wait()")  # then serves until the test stops it
    rec = srv.action_server_start({"state_dir": sd, "instance": "port-1", "env": {}, "public_env": {},
                                   "package_dir": str(tmp_path), "hash_files": [], "launch_id": "l1",
                                   "argv": [sys.executable, "-c", script]})
    try:
        w = srv.action_server_wait({"state_dir": sd, "instances": ["port-1"], "ready_line": READY_LINE,
                                    "forbidden": [], "survivable": list(CRASH_SIGNS), "timeout": 120})
        got = w["port-1"]
        assert got["status"] == "ready" and got["running"], got
        assert len(got["logged"]) == 1 and "Can not initialize OpenAIServingResponses" in got["logged"][0]
        # a playbook's own forbidden line still fails the launch when seen
        w = srv.action_server_wait({"state_dir": sd, "instances": ["port-1"], "ready_line": READY_LINE,
                                    "forbidden": ["OpenAIServingResponses"], "timeout": 120})
        assert w["port-1"]["status"] == "forbidden"
    finally:
        srv.action_server_stop({"state_dir": sd, "instances": ["port-1"], "timeout": 5})
    assert rec["pid"]


def test_launch_and_verify_logs_pass_a_server_that_survived_a_logged_traceback(
        sb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(sb, tmp_path / "inv.yaml", hosts=["h01"],
                         env={"h01": {"FLEETCTL_SIM_HANDLED_TRACEBACK": "1"}})
    try:
        assert cli(capsys, "deploy", "-i", inv, FULL)[0] == 0
        code, doc = cli(capsys, "launch", "--drop-unknown-flags", "-i", inv, FULL, "--timeout", "300")
        assert code == 0, json.dumps(doc)[:3000]
        (it,) = doc["hosts"][0]["instances"]
        assert it["status"] == "ready"
        assert any("logged 1 error line(s) during start-up and is ready and healthy (reported, not a failure)" in n
                   and "OpenAIServingResponses" in n for n in it["notes"]), it
        code, doc = cli(capsys, "verify-logs", "-i", inv, FULL)
        assert code == 0, json.dumps(doc)[:3000]
        (iv,) = doc["hosts"][0]["instances"]
        assert iv["ok"] and any("OpenAIServingResponses" in ln for ln in iv["forbidden"])
        assert any("(reported, not a failure)" in e for e in iv["explanation"])
        capsys.readouterr()
        assert main(["verify-logs", "-i", str(inv), str(FULL)]) == 0
        assert "(reported, not a failure)" in capsys.readouterr().out
    finally:
        main(["stop", "-i", str(inv)])
        main(["rollback", "-i", str(inv)])


# ----------------------------------------------------------------------------- Ctrl-C while a model loads (issue 30.7)


def test_ctrl_c_during_launch_stops_waiting_at_once_and_says_what_runs(ssb: Any, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The server takes 10 minutes to "load" (FLEETCTL_SIM_START_DELAY=600). One Ctrl-C while launch
    waits for it: launch stops waiting at once (before: it waited for the model), exits 130, and says
    the server was left starting and the command that stops it; that command, run as printed, stops it."""
    import shlex
    import signal

    from eventpipe import EventPipe

    inv = make_inventory(ssb, tmp_path / "inv.yaml", hosts=["h01"], env={"h01": {"FLEETCTL_SIM_START_DELAY": "600"}})
    assert cli(capsys, "deploy", "-i", inv, FULL)[0] == 0
    pipe = EventPipe()
    proc = pipe.popen(["launch", "--drop-unknown-flags", "-i", str(inv), str(FULL), "--timeout", "900", "--json"],
                      dict(os.environ))
    try:
        pipe.wait("launch-waiting h01")
        proc.send_signal(signal.SIGINT)  # the CLI subprocess this test started
        out, err = proc.communicate(timeout=120)  # a hang bound: the model would take 600 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        pipe.close()
    assert proc.returncode == 130, (out, err)
    doc = json.loads(out)
    assert doc["ok"] is False and doc["interrupted"] is True
    (it,) = doc["hosts"][0]["instances"]
    assert it["status"] == "interrupted", it
    assert it["message"].startswith("interrupted (Ctrl-C) while it was starting: left running"), it
    name = it["instance"]
    rec = srv.current_record(str(ssb.hosts["h01"].state_dir), name)
    assert srv.record_alive(rec)  # left running, as said
    cmd = it["message"][it["message"].index("'fleetctl stop"):].split("'")[1]
    assert cmd == f"fleetctl stop -i {inv} --limit h01 --instance {name}", cmd
    assert main(shlex.split(cmd)[1:]) == 0
    assert not srv.record_alive(srv.current_record(str(ssb.hosts["h01"].state_dir), name))
