"""The agent protocol's one boundary (fleetctl/protocol): every action's answer, as the REAL agent
code produces it locally, parses into its type; each broken variant (a key missing, a wrong type,
an unknown state, not JSON) is refused with one bounded line saying where and what."""

from __future__ import annotations

import copy
import hashlib
import json
import marshal
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from waiting import until

from fleetctl.engines import engine
from fleetctl.engines.sglang.probe import host_probe_source
from fleetctl.protocol import ANSWERS, InvalidAnswer, names, parse_reply
from fleetctl.protocol import answers as a
from fleetctl.protocol.schema import Invalid, parse
from fleetctl.remote import core as rcore
from fleetctl.remote import engine_probe, gpucheck, servers
from fleetctl.remote import hostfacts as rfacts
from fleetctl.remote import records as rrecords
from fleetctl.remote import transaction as rtx


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def frame(result: Any) -> bytes:
    return json.dumps({"ok": True, "result": result}).encode()


def refused(action: str, result: Any) -> InvalidAnswer:
    with pytest.raises(InvalidAnswer) as e:
        parse_reply("h03", action, frame(result))
    line = e.value.line()
    assert line.startswith(f"h03: host answered an invalid {action!r} answer: ") and len(line) <= 300, line
    assert "\n" not in line
    return e.value


def real(action: str, payload: dict[str, Any]) -> Any:
    """The agent's own answer to one request (run here, as on a host), as the wire carries it."""
    doc = json.loads(rcore.handle_request(marshal.dumps({"action": action, **payload}, 4)))
    assert doc["ok"], doc
    return doc["result"]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A package dir with one deployed file, a state dir, and one short-lived launched server."""
    tmp_path = tmp_path_factory.mktemp("host")
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text("__version__ = '0.5.9'\n")
    (pkg / "srt" / "server_args.py").write_text("parser.add_argument('--port')\n")
    (pkg / "srt" / "a.py").write_bytes(b"class W:\n    def __init__(self):\n        print('MARK')\n")
    sd = str(tmp_path / "state")
    old = (pkg / "srt" / "a.py").read_bytes()
    new = old + b"# patched\n"
    dep = real(names.DEPLOY, {"state_dir": sd, "deploy_id": "d1", "package_dir": str(pkg), "version": "0.5.9",
                              "files": [{"path": "srt/a.py", "sha_before": sha(old), "sha_after": sha(new),
                                         "content": new}],
                              "verify_paths": ["srt/a.py"]})
    rec = real(names.SERVER_START, {"state_dir": sd, "instance": "port-1", "launch_id": "l1", "argv": ["true"],
                                    "inherit_env": ["PATH"], "package_dir": str(pkg), "hash_files": ["srt/a.py"],
                                    "extra": {"version": "0.5.9", "port": 1, "gpus": [0], "flags": {"--port": 1},
                                              "worker": {"class": "W", "file": "srt/a.py", "reason": "r"}}})
    # `true` has exited before the server answers are taken (the same answers on any machine)
    until(lambda: not servers.record_alive(servers.current_record(sd, "port-1")), "'true' to exit")
    h = {"pkg": str(pkg), "sd": sd, "deploy": dep, "record": rec}
    h["answers"] = _answers(h)
    return h


def answers_of(h: dict[str, Any]) -> dict[str, Any]:
    return h["answers"]  # type: ignore[no-any-return]


def _answers(h: dict[str, Any]) -> dict[str, Any]:
    sd, pkg = h["sd"], h["pkg"]
    # gpu-check's work dir, its model script under a launch's python (this one: no torch here), its cleanup
    prep = real(names.GPUCHECK_PREPARE, {"by": "test"})
    launch = {"interpreter": sys.executable, "options": [], "target_kind": "module", "target": "x", "env": {},
              "inherit": ["PATH"], "command_env": {}, "unset": [], "clear": False, "cwd": None, "problem": None}
    script = real(names.GPUCHECK_SCRIPT, {"script": engine().gpu_check().model_script(), "launch": launch,
                                          "dir": prep["dir"], "request": {"make": False}, "timeout": 120})
    cleanup = real(names.GPUCHECK_CLEANUP, {"dir": prep["dir"]})
    return {
        names.GPUCHECK_PREPARE: prep, names.GPUCHECK_SCRIPT: script, names.GPUCHECK_CLEANUP: cleanup,
        names.FACTS: real(names.FACTS, {"engine": engine().agent_facts(), "package_dir": pkg, "hash_dirs": ["srt"], "hash_files": [], "gpus": False,
                                        "with": [names.WITH_STATE, names.WITH_SERVERS], "state_dir": sd,
                                        "check_flags": ["--port"], "server_ports": [1]}),
        names.PING: real(names.PING, {}),
        names.DEPLOY: h["deploy"],
        names.READ_FILES: real(names.READ_FILES, {"package_dir": pkg, "paths": ["srt/a.py", "srt/none.py"]}),
        names.SERVER_START: h["record"],
        names.SERVER_WAIT: real(names.SERVER_WAIT, {"state_dir": sd, "instances": ["port-1"], "ready_line": "x",
                                                    "timeout": 5, "grace": 0}),
        names.SERVER_GREP: real(names.SERVER_GREP, {"state_dir": sd, "instances": ["port-1", "port-2"],
                                                    "patterns": ["x"], "tail": 3}),
        names.WORKER_CHECK: real(names.WORKER_CHECK, {"package_dir": pkg, "checks": [
            {"file": "srt/a.py", "class": "W", "marker": "MARK"}, {"file": "srt/b.py", "class": "W", "marker": "M"}]}),
        names.SERVER_STOP: real(names.SERVER_STOP, {"state_dir": sd, "instances": ["port-1", "port-9"], "timeout": 5}),
        names.ROLLBACK: real(names.ROLLBACK, {"state_dir": sd, "deploy_ids": ["d1"]}),
        # the probe under a launch's python: this interpreter, with the package's site dir on PYTHONPATH
        names.LOCATE: real(names.LOCATE, {"launch": {
            "interpreter": sys.executable, "options": [], "target_kind": "module", "target": "x",
            "env": {"PYTHONPATH": str(Path(pkg).parent)}, "inherit": ["PATH"], "command_env": {}, "unset": [],
            "clear": False, "cwd": None, "problem": None},
            "engine": engine().agent_facts(), "files": ["srt/a.py"],
            "checks": [{"file": "srt/a.py", "class": "W", "marker": "MARK"}]}),
        # the host's engine asked (the engine's host probe script): this package has no server_args
        names.ENGINE_PROBE: real(names.ENGINE_PROBE, {"script": host_probe_source(), "launch": {
            "interpreter": sys.executable, "options": [], "target_kind": "module", "target": "x",
            "env": {"PYTHONPATH": str(Path(pkg).parent)}, "inherit": ["PATH"], "command_env": {}, "unset": [],
            "clear": False, "cwd": None, "problem": None},
            "argv": ["--model-path", "m"], "timeout": 60,
            "hardware": {"count": 1, "name": "NVIDIA H200", "capability": [9, 0], "memory_mib": 143771}}),
    }


def test_every_real_answer_parses_into_its_type(host: dict[str, Any]) -> None:
    got = {action: parse_reply("h01", action, frame(res)).result for action, res in answers_of(host).items()}
    assert set(got) == set(ANSWERS)
    f: a.FactsAnswer = got[names.FACTS]
    assert f.package.found and f.package.version == "0.5.9" and f.files["srt/a.py"].exists
    assert f.state is not None and [m.id for m in f.state.deploys] == ["d1"] and f.state.deploys[0].state == "complete"
    assert f.servers is not None and f.servers.instances[0].instance == "port-1"
    assert f.servers.instances[0].record is not None and f.servers.instances[0].record.worker.class_ == "W"
    assert f.registered_flags == {"--port": True} and f.servers.ports == {"1": True}
    assert got[names.DEPLOY].deploy_id == "d1" and got[names.DEPLOY].files[0].path == "srt/a.py"
    assert got[names.ROLLBACK].rollbacks[0].files[0].action == "restored"
    assert got[names.READ_FILES]["srt/none.py"] is None
    assert got[names.SERVER_START].gpus == [0] and got[names.SERVER_START].flags == {"--port": 1}
    assert got[names.SERVER_WAIT]["port-1"].status in ("exited", "timeout")
    assert [s.action for s in got[names.SERVER_STOP]] == ["not running", "never launched"]
    assert got[names.SERVER_GREP].instances["port-2"].record is None
    wc = got[names.WORKER_CHECK]
    assert wc[0].check is not None and wc[0].check.marker and not wc[1].exists
    assert got[names.PING].pong
    assert got[names.GPUCHECK_PREPARE].port > 0 and got[names.GPUCHECK_CLEANUP].removed
    assert got[names.GPUCHECK_SCRIPT].ok and "torch_error" in got[names.GPUCHECK_SCRIPT].answer
    assert not Path(got[names.GPUCHECK_PREPARE].dir).exists()
    loc: a.LocateAnswer = got[names.LOCATE]
    assert loc.package_dir == host["pkg"] and loc.files["srt/a.py"].loader == "source"
    assert loc.checks[0].view.loader == "source" and loc.checks[0].check is not None and loc.checks[0].check.marker
    sp: a.EngineProbeAnswer = got[names.ENGINE_PROBE]
    assert sp.stage == "import_failed" and sp.error and sp.worker_class is None, sp
    assert engine_probe.action_engine_probe is rcore.ACTIONS[names.ENGINE_PROBE]
    assert gpucheck.action_gpucheck_script is rcore.ACTIONS[names.GPUCHECK_SCRIPT]


# one broken variant per action: (action, how to break the real answer, where, problem)
def _set(path: str | tuple[str, ...], value: Any) -> Callable[[Any], Any]:
    def go(doc: Any) -> Any:
        *head, last = path.split("/") if isinstance(path, str) else path
        d = doc
        for k in head:
            d = d[int(k)] if isinstance(d, list) else d[k]
        if value is KeyError:
            del d[int(last) if isinstance(d, list) else last]
        else:
            d[int(last) if isinstance(d, list) else last] = value
        return doc
    return go


BROKEN = [
    (names.FACTS, _set("servers/instances/0/instance", KeyError), "servers.instances[0].instance", "missing"),
    (names.FACTS, _set("python/executable", 42), "python.executable", "expected a string, got a number"),
    (names.FACTS, _set("package/found", "yes"), "package.found", "expected true or false, got a string"),
    (names.FACTS, _set("state/deploys/0/state", "exploded"), "state.deploys[0].state", "unknown value 'exploded'"),
    (names.FACTS, _set("state/deploys/0/id", KeyError), "state.deploys[0].id", "missing"),
    (names.FACTS, _set("state/deploys/0/files/0/sha_now", "zz"), "state.deploys[0].files[0].sha_now",
     "expected a sha256"),
    (names.FACTS, _set("files/srt\x1b[31ma.py", {"exists": True}), "files['srt\\x1b[31ma.py'].path", "missing"),
    (names.FACTS, _set("servers/ports/1", 1), "servers.ports['1']", "expected true or false, got a number"),
    (names.FACTS, _set("state/lock", {"stale": True, "pid": True}), "state.lock.pid",
     "expected a whole number, got a boolean"),
    (names.FACTS, _set("servers/instances/0/record/gpus", {"0": 1}), "servers.instances[0].record.gpus",
     "expected a list, got an object"),
    (names.FACTS, _set("elapsed", "1s"), "elapsed", "expected a number, got a string"),
    (names.PING, _set("pid", 1.5), "pid", "expected a whole number, got a number"),
    (names.DEPLOY, _set("final", []), "final", "expected an object, got a list"),
    (names.DEPLOY, _set("files/0/sha_after", None), "files[0].sha_after", "expected a string, got null"),
    (names.ROLLBACK, _set("rollbacks/0/files/0/action", "burned"), "rollbacks[0].files[0].action", "unknown value"),
    (names.ROLLBACK, _set("notes", "x"), "notes", "expected a list, got a string"),
    (names.READ_FILES, _set(("srt/a.py",), "not base64!"), "['srt/a.py']", "expected base64"),
    (names.SERVER_START, _set("instance", KeyError), "instance", "missing"),
    (names.SERVER_START, _set("flags", {"--port": [1]}), "flags['--port']", "unexpected a list"),
    (names.SERVER_WAIT, _set("port-1/status", None), "['port-1'].status", "unknown value null"),
    (names.SERVER_STOP, _set("0/action", "vanished"), "[0].action", "unknown value 'vanished'"),
    (names.SERVER_GREP, _set("instances/port-1/matches/x/count", "3"), "instances['port-1'].matches['x'].count",
     "expected a whole number, got a string"),
    (names.SERVER_GREP, _set("instances/port-2/running", KeyError), "instances['port-2'].running", "missing"),
    (names.WORKER_CHECK, _set("0/class", KeyError), "[0].class", "missing"),
    (names.LOCATE, _set("checks/0/view/loader", "magic"), "checks[0].view.loader", "unknown value 'magic'"),
    (names.LOCATE, _set(("files", "srt/a.py", "stale"), "yes"), "files['srt/a.py'].stale",
     "expected true or false, got a string"),
    (names.LOCATE, _set("checks/0/check/marker", 1), "checks[0].check.marker", "expected true or false"),
    (names.FACTS, _set("package/notes", "x"), "package.notes", "expected a list, got a string"),
    (names.ENGINE_PROBE, _set("stage", "guessed"), "stage", "unknown value 'guessed'"),
    (names.ENGINE_PROBE, _set("warnings", [1]), "warnings[0]", "expected a string, got a number"),
]


@pytest.mark.parametrize(("action", "brk", "where", "problem"), BROKEN,
                         ids=[f"{b[0]}:{b[2]}" for b in BROKEN])
def test_each_schema_refuses_a_broken_answer(host: dict[str, Any], action: str, brk: Callable[[Any], Any],
                                             where: str, problem: str) -> None:
    good = answers_of(host)[action]
    e = refused(action, brk(copy.deepcopy(good)))
    assert e.where == where and e.problem.startswith(problem), (e.where, e.problem)


@pytest.mark.parametrize("action", list(ANSWERS))
def test_every_action_refuses_null_and_a_wrong_container(action: str) -> None:
    assert refused(action, None).problem.startswith("expected ")
    assert refused(action, "text").problem.startswith("expected ")


def test_unknown_keys_are_tolerated() -> None:
    got = parse(a.PingAnswer, {"pong": True, "pid": 3, "python": "3.8", "from_the_future": {"x": [1]}})
    assert got == a.PingAnswer(pong=True, pid=3, python="3.8")


def test_envelope() -> None:
    ok = parse_reply("h01", "ping", b'{"ok": false, "error": "locked: deploy d1", "kind": "locked"}')
    assert ok.error == "locked: deploy d1" and ok.kind == "locked" and ok.result is None
    cases = {b"null": ("(the whole answer)", "expected an object, got null"),
             b"[]": ("(the whole answer)", "expected an object, got a list"),
             b"{}": ("ok", "missing"),
             b'{"ok": 1, "result": {}}': ("ok", "expected true or false, got a number"),
             b'{"ok": true}': ("result", "missing"),
             b'{"ok": false, "error": ["x"]}': ("error", "expected a string, got a list"),
             b'{"ok": false, "error": "x", "kind": 3}': ("kind", "expected a string, got a number"),
             b"\x1b]0;pwned\x07" + b"A" * 5000: ("(the whole answer)", "not JSON: '\\x1b]0;pwned\\x07AAA"),
             b"[" * 100000: ("(the whole answer)", "not JSON")}
    for raw, (where, problem) in cases.items():
        with pytest.raises(InvalidAnswer) as e:
            parse_reply("h01", "ping", raw)
        assert (e.value.where, e.value.problem[:len(problem)]) == (where, problem), raw[:40]
        assert len(e.value.line()) <= 300 and "\x1b" not in e.value.line() and "\x07" not in e.value.line()
    long = parse_reply("h01", "ping", json.dumps({"ok": False, "error": "E" * 10**6}).encode())
    assert long.error is not None and len(long.error) <= 4000


def test_a_huge_hostile_key_or_value_is_shown_short_and_escaped() -> None:
    key = "\u202e\x1b[2J" + "k" * 10**6
    with pytest.raises(InvalidAnswer) as e:
        parse_reply("h01", "read_files", frame({key: 5}))
    line = e.value.line()
    assert len(line) <= 300 and "\x1b" not in line and "\u202e" not in line and "\\u202e\\x1b[2J" in line
    with pytest.raises(InvalidAnswer) as e:
        parse_reply("h01", "server_stop", frame([{"instance": "i", "action": "x" * 10**6}]))
    assert len(e.value.line()) <= 300


def test_scalars_are_strict() -> None:
    assert parse(int, 3) == 3 and parse(float, 3) == 3.0 and parse(bool, False) is False
    for tp, bad in ((int, True), (int, 1.0), (float, True), (str, 1), (bool, 0), (bool, "true"),
                    (Literal["a"], "b"), (list[int], (1,)), (dict[str, int], [["a", 1]])):
        with pytest.raises(Invalid):
            parse(tp, bad)


def test_the_agent_speaks_the_same_words() -> None:
    """names.py and the agent (which cannot import it: stdlib-only, runs on the host) agree."""
    actions = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and not k.startswith("WITH_")}
    assert actions == set(ANSWERS) and actions <= set(rcore.ACTIONS)
    assert {names.WITH_STATE, names.WITH_SERVERS, names.WITH_DISCOVER} <= set(rfacts.EXTRA_FACTS)
    assert rrecords.OPEN_STATES == names.OPEN_STATES
    assert servers.OPEN_STATES is rrecords.OPEN_STATES
    src = Path(rrecords.__file__).read_text() + Path(rtx.__file__).read_text()
    written = set(re.findall(r"""\["state"\] = "([a-z-]+)"|"state": "([a-z-]+)\"""", src))
    states = {x for pair in written for x in pair if x}
    assert states and states <= set(names.MANIFEST_STATES), states - set(names.MANIFEST_STATES)


@pytest.mark.parametrize("csv_text", ["index, uuid\n" + "9" * 400 + ", GPU-1\n",
                                      'index, name\n0, "' + "x" * 200000 + '"\n'])
def test_bad_nvidia_smi_csv_fails_the_host_not_the_fleet(host: dict[str, Any], csv_text: str) -> None:
    from fleetctl.model.facts import parse_facts

    raw = copy.deepcopy(answers_of(host)[names.FACTS])
    raw["gpus"] = {"available": True, "gpus": csv_text, "apps": ""}
    with pytest.raises(InvalidAnswer) as e:
        parse_facts("h03", parse_reply("h03", names.FACTS, frame(raw)).result)
    assert e.value.where == "gpus" and e.value.line().startswith("h03: host answered an invalid 'facts' answer: gpus:")
    assert len(e.value.line()) <= 300
