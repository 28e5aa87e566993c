"""The sandbox SGLang server SIMULATOR, run locally against tiny fake `sglang` trees."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from waiting import HANG, until

from fleetctl.engines.sglang import READY_LINE, parse_line
from fleetctl.remote.servers import marker_in_init

MARKER = "Dynamic speculation disable enabled"
EAGLE_FLAGS = ["--model-path", "m", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]

WORKER_WITH = f'''
import logging
logger = logging.getLogger(__name__)

class {{cls}}:
    def __init__(self, server_args):
        self.t = server_args.speculative_disable_batch_threshold
        if self.t is not None:
            logger.info(f"{MARKER} (worker={{{{type(self).__name__}}}}, threshold={{{{self.t}}}})")

    def forward(self):
        return None
'''
WORKER_ELSEWHERE = f'''
class {{cls}}:
    def __init__(self, server_args):
        # {MARKER}: only a comment here
        self.t = None

    def forward(self):
        print("{MARKER}")
'''


def fake_tree(root: Path, version: str, workers: dict[str, str]) -> Path:
    pkg = root / "sglang"
    (pkg / "srt" / "speculative").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the simulator must not import sglang')\n")
    (pkg / "_version.py").write_text(f"__version__ = version = {version!r}\n")
    for fname, src in workers.items():
        (pkg / "srt" / "speculative" / fname).write_text(src)
    return root


class Sim:
    def __init__(self, site: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
             "PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).resolve().parents[1])])}
        e.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetctl.sandbox.simulator", *args,
                                      "--port", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, text=True)

    def wait_for(self, text: str = READY_LINE, timeout: float = HANG) -> list[str]:
        """The server's stderr lines up to the first holding `text` (a hang bound: the lines are the events)."""
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            ln = self.proc.stderr.readline()
            if not ln:
                break
            lines.append(ln.rstrip("\n"))
            if text in ln:
                return lines
        raise AssertionError(f"no {text!r}:\n" + "\n".join(lines))

    def wait_ready(self) -> list[str]:
        return self.wait_for(READY_LINE)

    def finish(self, timeout: float = HANG) -> tuple[int, str]:
        _, errs = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, errs

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def sims() -> Iterator[list[Sim]]:
    started: list[Sim] = []
    yield started
    for s in started:  # every simulator a test starts is stopped, even when the test fails
        s.stop()


def run(sims: list[Sim], site: Path, args: list[str], env: dict[str, str] | None = None) -> Sim:
    s = Sim(site, args, env)
    sims.append(s)
    return s


def test_marker_in_init_is_an_ast_check() -> None:
    assert marker_in_init(WORKER_WITH.format(cls="EAGLEWorker"), "EAGLEWorker", MARKER)["marker"]
    r = marker_in_init(WORKER_ELSEWHERE.format(cls="EAGLEWorker"), "EAGLEWorker", MARKER)
    assert r["class"] and r["init"] and not r["marker"]  # a comment or another method does not count
    assert not marker_in_init(WORKER_WITH.format(cls="EAGLEWorker"), "EAGLEWorkerV2", MARKER)["class"]
    assert marker_in_init("def (", "X", MARKER)["error"]


def test_patched_v1_worker_tp2_marker_per_rank_and_endpoints(tmp_path: Path, sims: list[Sim]) -> None:
    site = fake_tree(tmp_path, "0.5.9", {"eagle_worker.py": WORKER_WITH.format(cls="EAGLEWorker"),
                                         "eagle_worker_v2.py": WORKER_ELSEWHERE.format(cls="EAGLEWorkerV2")})
    s = run(sims, site, [*EAGLE_FLAGS, "--tp-size", "2", "--speculative-disable-batch-threshold", "16",
                         "--some-unknown-flag", "x", "--another-bool"])
    lines = s.wait_ready()
    assert "SIMULATOR" in lines[0]
    parsed = [parse_line(x) for x in lines]
    marks = [p for p in parsed if MARKER in p.message]
    assert [p.ranks for p in marks] == [{"TP": 0}, {"TP": 1}]
    assert all("worker=EAGLEWorker, threshold=16" in p.message for p in marks)
    # before 0.5.11 ServerArgs warnings print bare, without a timestamp
    assert any(p.timestamp is None and "Overlap scheduler is disabled" in p.raw for p in parsed)
    dump = next(p for p in parsed if p.message.startswith("server_args=ServerArgs("))
    assert "disable_overlap_schedule=True" in dump.message and "speculative_disable_batch_threshold" in dump.message
    assert parsed[-1].message == READY_LINE and parsed[-1].ranks == {}
    with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/health", timeout=HANG) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/get_server_info", timeout=HANG) as r:
        info = json.loads(r.read())
    assert info["disable_overlap_schedule"] is True and info["simulator"] is True
    assert info["worker_class"] == "EAGLEWorker"
    s.proc.send_signal(signal.SIGTERM)
    code, _ = s.finish()
    assert code == 0


def test_origin_story_env_unset_runs_unpatched_v1(tmp_path: Path, sims: list[Sim]) -> None:
    site = fake_tree(tmp_path, "0.5.9", {"eagle_worker.py": WORKER_ELSEWHERE.format(cls="EAGLEWorker"),
                                         "eagle_worker_v2.py": WORKER_WITH.format(cls="EAGLEWorkerV2")})
    s = run(sims, site, [*EAGLE_FLAGS, "--speculative-disable-batch-threshold", "16"])
    lines = s.wait_ready()
    assert not any(MARKER in ln for ln in lines)
    s.stop()
    # the same tree with SGLANG_ENABLE_SPEC_V2=1 runs EAGLEWorkerV2, which carries the marker; tp=1: no TP0
    s2 = run(sims, site, [*EAGLE_FLAGS, "--speculative-disable-batch-threshold", "16"],
             {"SGLANG_ENABLE_SPEC_V2": "1"})
    marks = [parse_line(x) for x in s2.wait_ready() if MARKER in x]
    assert [m.ranks for m in marks] == [{}]
    assert "worker=EAGLEWorkerV2" in marks[0].message


def test_no_threshold_flag_no_marker_and_timestamped_warnings(tmp_path: Path, sims: list[Sim]) -> None:
    site = fake_tree(tmp_path, "0.5.14", {"eagle_worker_v2.py": WORKER_WITH.format(cls="EAGLEWorkerV2")})
    s = run(sims, site, EAGLE_FLAGS, {"SGLANG_ENABLE_SPEC_V2": "1"})
    lines = s.wait_ready()
    assert not any(MARKER in ln for ln in lines)
    removed = [parse_line(x) for x in lines if "has been removed" in x]
    assert removed and removed[0].timestamp is not None  # from 0.5.11 startup warnings are timestamped


def test_startup_error_is_a_traceback(tmp_path: Path, sims: list[Sim]) -> None:
    site = fake_tree(tmp_path, "0.5.9", {"eagle_worker.py": "", "eagle_worker_v2.py": ""})
    args = [a if a != "1" else "4" for a in EAGLE_FLAGS]  # topk 4 explicitly, with spec v2 on: ValueError
    s = run(sims, site, args, {"SGLANG_ENABLE_SPEC_V2": "1"})
    code, errs = s.finish()
    assert code == 1
    assert "Traceback (most recent call last)" in errs
    assert errs.strip().splitlines()[-1].startswith("ValueError: Spec v2 currently only supports topk = 1")


def test_port_in_use_crash_knob_and_drop_rank(tmp_path: Path, sims: list[Sim]) -> None:
    site = fake_tree(tmp_path, "0.5.9", {"eagle_worker.py": WORKER_WITH.format(cls="EAGLEWorker"),
                                         "eagle_worker_v2.py": ""})
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        e = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(
            [str(site), str(Path(__file__).resolve().parents[1])])}
        p = subprocess.run([sys.executable, "-m", "fleetctl.sandbox.simulator", *EAGLE_FLAGS, "--port", str(port)],
                           capture_output=True, text=True, env=e, timeout=HANG)
    assert p.returncode == 1 and "Address already in use" in p.stderr
    crash = run(sims, site, EAGLE_FLAGS, {"FLEETCTL_SIM_CRASH": "startup"})
    code, errs = crash.finish()
    assert code == 1 and "Traceback (most recent call last)" in errs and READY_LINE not in errs
    drop = run(sims, site, [*EAGLE_FLAGS, "--tp-size", "4", "--speculative-disable-batch-threshold", "8"],
               {"FLEETCTL_SIM_DROP_MARKER_RANK": "2"})
    marks = [parse_line(x).ranks for x in drop.wait_ready() if MARKER in x]
    assert marks == [{"TP": 0}, {"TP": 1}, {"TP": 3}]


def test_worker_file_is_read_at_start(tmp_path: Path, sims: list[Sim]) -> None:
    """Patching the file while the server runs changes nothing in that server (restart needed)."""
    site = fake_tree(tmp_path, "0.5.9", {"eagle_worker.py": WORKER_ELSEWHERE.format(cls="EAGLEWorker"),
                                         "eagle_worker_v2.py": ""})
    s = run(sims, site, [*EAGLE_FLAGS, "--speculative-disable-batch-threshold", "16"],
            {"FLEETCTL_SIM_START_DELAY": "1.0"})
    s.wait_for("Load weight begin")  # the worker file has been read by now
    (site / "sglang/srt/speculative/eagle_worker.py").write_text(WORKER_WITH.format(cls="EAGLEWorker"))
    assert not any(MARKER in ln for ln in s.wait_ready())


def test_unregistered_flag_is_refused_like_argparse(tmp_path: Path, sims: list[Sim]) -> None:
    """A flag neither the release knows nor the server_args.py on disk registers: exit 2, as the real
    server would (the payload's flag on a host whose patch is not deployed, or was rolled back)."""
    site = fake_tree(tmp_path, "0.5.9", {})
    sa = site / "sglang" / "srt" / "server_args.py"
    sa.write_text('class ServerArgs:\n    port: int = 30000\n    model_path: str = ""\n')
    args = ["--model-path", "m", "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
            "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4",
            "--speculative-disable-batch-threshold", "16"]
    s = Sim(site, args)
    sims.append(s)
    code, errs = s.finish()
    assert code == 2
    assert "unrecognized arguments: --speculative-disable-batch-threshold 16" in errs
    assert "--port" not in errs.split("unrecognized arguments:")[1]  # a field of ServerArgs: registered
    # once the file registers it (as the deployed patch does), the same launch starts
    sa.write_text(sa.read_text() + "    speculative_disable_batch_threshold: int | None = None\n")
    s2 = Sim(site, args)
    sims.append(s2)
    s2.wait_ready()


# --- releases newer than 0.5.14: their log format, dump form and refusals ------------------------------

def test_new_release_dict_dump_and_silent_env(tmp_path: Path, sims: list[Sim]) -> None:
    """0.5.23: the startup dump is `server_args={...}` (a dict, from 0.5.19) and SGLANG_ENABLE_SPEC_V2 is
    ignored without a word (from 0.5.21); the worker is EAGLEWorkerV2 with TP ranks in the prefix."""
    from fleetctl.engines.sglang import parse_server_args_dump

    site = fake_tree(tmp_path, "0.5.23", {"eagle_worker_v2.py": WORKER_WITH.format(cls="EAGLEWorkerV2")})
    s = run(sims, site, [*EAGLE_FLAGS, "--tp-size", "2", "--speculative-disable-batch-threshold", "8"],
            {"SGLANG_ENABLE_SPEC_V2": "0", "SGLANG_LOG_MS": "1"})
    lines = s.wait_ready()
    parsed = [parse_line(x) for x in lines]
    dump = next(p for p in parsed if "server_args=" in p.message)
    assert dump.message.startswith("server_args={'model_path': 'm'")
    fields = parse_server_args_dump(dump.message)
    assert fields is not None and fields["disable_overlap_schedule"] is False and fields["tp_size"] == 2
    sglang_lines = [x for x in lines if "fleetctl simulator" not in x and "SIMULATOR" not in x]
    assert not any("SGLANG_ENABLE_SPEC_V2" in x for x in sglang_lines)  # no removal warning any more
    marks = [p for p in parsed if MARKER in p.message]
    assert [p.ranks for p in marks] == [{"TP": 0}, {"TP": 1}]
    assert all("worker=EAGLEWorkerV2" in p.message and p.timestamp and "." in p.timestamp for p in marks)


@pytest.mark.parametrize(("version", "flag", "error"), [
    ("0.5.23", "--cuda-graph-max-bs", "ambiguous option: --cuda-graph-max-bs could match"),
    ("0.5.20", "--cuda-graph-bs", "ambiguous option: --cuda-graph-bs could match"),
    ("0.5.13", "--cuda-graph-max-bs-decode", "unrecognized arguments: --cuda-graph-max-bs-decode"),
])
def test_flag_refusals_of_a_release(tmp_path: Path, sims: list[Sim], version: str, flag: str, error: str) -> None:
    site = fake_tree(tmp_path, version, {"eagle_worker_v2.py": ""})
    s = run(sims, site, [*EAGLE_FLAGS, flag, "32"])
    code, errs = s.finish()
    assert code == 2, errs  # argparse's exit status, with its usage line
    assert errs.strip().splitlines()[-1].startswith(f"launch_server.py: error: {error}"), errs
    # the same value under the release's own spelling starts
    if version != "0.5.13":
        ok = run(sims, site, [*EAGLE_FLAGS, "--cuda-graph-max-bs-decode", "32"])
        ok.wait_ready()


def test_pp_with_speculation_refused_on_every_release(tmp_path: Path, sims: list[Sim]) -> None:
    site = fake_tree(tmp_path, "0.5.14", {"eagle_worker_v2.py": ""})
    s = run(sims, site, [*EAGLE_FLAGS, "--pp-size", "2"])
    code, errs = s.finish()
    assert code == 1
    assert errs.strip().splitlines()[-1] == ("AssertionError: Pipeline parallelism is not compatible with "
                                             "overlap schedule, speculative decoding")


def test_release_registered_flag_not_refused_on_new_layout(tmp_path: Path, sims: list[Sim]) -> None:
    """0.5.20+ declare most options outside srt/server_args.py: a flag the release registers (here
    --mem-fraction-static) must start, even though that file does not spell it."""
    site = fake_tree(tmp_path, "0.5.23", {"eagle_worker_v2.py": ""})
    (site / "sglang" / "srt" / "server_args.py").write_text("class ServerArgs:\n    port: int = 30000\n")
    s = run(sims, site, [*EAGLE_FLAGS, "--mem-fraction-static", "0.8"])
    s.wait_ready()
    bogus = run(sims, site, [*EAGLE_FLAGS, "--no-such-flag", "1"])
    code, errs = bogus.finish()
    assert code == 2 and "unrecognized arguments: --no-such-flag 1" in errs


def test_log_level_above_info_hides_the_info_lines(tmp_path: Path, sims: list[Sim]) -> None:
    """--log-level warning: the dump, "Load weight", the marker and the ready line are INFO records a
    real server's root logger drops; the server still serves. Warnings still show."""
    site = fake_tree(tmp_path, "0.5.9", {"eagle_worker.py": WORKER_WITH.format(cls="EAGLEWorker"),
                                         "eagle_worker_v2.py": WORKER_ELSEWHERE.format(cls="EAGLEWorkerV2")})
    s = run(sims, site, [*EAGLE_FLAGS, "--speculative-disable-batch-threshold", "16", "--log-level", "warning"])

    def up() -> bool:  # no ready line to wait for at this log level: its /health answering 200
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/health", timeout=HANG) as r:
                return r.status == 200
        except OSError:  # not listening yet
            return False

    until(up, "the server's GET /health to answer 200")
    s.proc.send_signal(signal.SIGTERM)
    code, errs = s.finish()
    assert code == 0
    assert MARKER not in errs and READY_LINE not in errs and "server_args=" not in errs
    assert "Overlap scheduler is disabled" in errs and "SIMULATOR" in errs


# --- every release of the table: the simulator's log, read back with fleetctl's parser for that release ---

def test_simulator_log_of_every_release_parses(tmp_path: Path, sims: list[Sim]) -> None:
    """For every release in the table: the simulator starts on a tree of that release, and its log read
    back with fleetctl's own parser gives that release's format: the dump form (`server_args=ServerArgs(`
    through 0.5.18, `server_args={` from 0.5.19) with the launch's values, bare or timestamped startup
    warnings, milliseconds where SGLANG_LOG_MS exists, rank prefixes in the release's order (DP
    attention: the DP rank of every TP rank; 0.5.22+: from attn_dp_size in the dump), the marker on
    every rank and the ready line."""
    from fleetctl.engines.sglang import KNOWN_VERSIONS, expected_ranks, parse_server_args_dump, resolve_worker
    from fleetctl.engines.sglang import releases as R

    flags = [*EAGLE_FLAGS, "--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "2",
             "--speculative-disable-batch-threshold", "8"]
    as_dict = {flags[i]: (flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else True)
               for i in range(len(flags)) if flags[i].startswith("--")}
    pending: list[tuple[str, Sim, R.Release]] = []
    for n, version in enumerate(KNOWN_VERSIONS):
        res = resolve_worker(version, as_dict, {})
        assert res.startup_error is None and res.worker_file and res.worker_class, (version, res.reason)
        site = fake_tree(tmp_path / version, version,
                         {Path(res.worker_file).name: WORKER_WITH.format(cls=res.worker_class)})
        pending.append((version, run(sims, site, flags, {"SGLANG_LOG_MS": "1"}), R.RELEASES[version]))
        if len(pending) == 6 or n == len(KNOWN_VERSIONS) - 1:  # a few at a time on a small machine
            for v, sim, rel in pending:
                _check_release_log(v, rel, sim.wait_for(READY_LINE), expected_ranks, parse_server_args_dump)
                sim.stop()
            pending = []


def _check_release_log(version: str, rel: object, lines: list[str], expected_ranks: object,
                       parse_dump: object) -> None:
    from fleetctl.engines.sglang import releases as R

    assert isinstance(rel, R.Release)
    parsed = [parse_line(x) for x in lines]
    dumps = [p for p in parsed if p.message.startswith("server_args=")]
    assert len(dumps) == 1, version
    opener = "server_args={" if rel.log.dump_form == "dict" else "server_args=ServerArgs("
    assert dumps[0].message.startswith(opener), (version, dumps[0].message[:40])
    dump = parse_dump(dumps[0].message)  # type: ignore[operator]
    assert dump is not None and dump["tp_size"] == 4 and dump["speculative_algorithm"] == "EAGLE3", version
    assert list(dump)[:len(rel.log.dump_fields)] == list(rel.log.dump_fields) or set(rel.log.dump_fields) <= set(dump)
    if "attn_dp_size" in rel.log.dump_fields:  # 0.5.22+: the width moved out of dp_size
        assert (dump["dp_size"], dump["attn_dp_size"], dump["enable_dp_attention"]) == (1, 2, True), version
    else:
        assert (dump["dp_size"], dump["enable_dp_attention"]) == (2, True), version
    warn = next(p for p in parsed if p.message.startswith("Max running requests is reset to 48"))
    assert (warn.timestamp is not None) == rel.log.prelog_timestamped, version
    assert "." not in (warn.timestamp or "")  # the pre-logging basicConfig has a datefmt without msecs
    marks = [p for p in parsed if MARKER in p.message]
    want = expected_ranks(version, dump)  # type: ignore[operator]
    assert [p.ranks for p in marks] == want and len(want) == 4, (version, [p.raw for p in marks])
    assert [m["DP"] for m in want] == [0, 0, 1, 1] and [m["EP"] for m in want] == [0, 0, 1, 1], version
    for p in marks:  # the prefix's own order is the release's
        tokens = p.raw.split("]")[0].split()[2:]
        assert [t.rstrip("0123456789") for t in tokens] == [k for k in rel.log.prefix_order if k in p.ranks]
        assert ("." in (p.timestamp or "")) == rel.log.ms_supported, version
    assert parse_line(lines[-1]).message == READY_LINE, version
