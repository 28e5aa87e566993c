"""Fault injection on a real sandbox fleet: deploy and rollback cut off at every step.

Each trial runs a real `fleetctl deploy` or `fleetctl rollback` (a separate controller process) on a
fleet of three sshd hosts, and on one or two of them (the victims) the agent is stopped at a chosen
step by the test-only fault points (tests/faulthook.py installs fleetctl/remote/faults.py; key `_fault`):

    agent_exit  the agent dies on the spot (os._exit, no cleanup)
    kill_sshd   the agent waits at the step; the test SIGKILLs the host's sshd listener and every
                session process below it (the agent included), then starts sshd again
    freeze      the agent waits at the step; the test SIGSTOPs the host's session processes and the
                agent, so the controller hits its command_timeout; `status` is read while frozen;
                then the frozen processes are SIGKILLed or SIGCONTed (and run on to their end)

After every trial:
  * the faulted command exited 1 and named the victim;
  * no file is neither original nor intended; a host holding a mix (or a lock, or an open manifest)
    is reported by `status --json` (and a mixed one by `deploy --check --json` as interrupted);
  * the other hosts are exactly as the command should have left them;
  * the next `deploy` or `rollback` (chosen at random) exits 0 and leaves every host uniform, no
    lock, no open manifest, `status` clean, and no temp file in any package dir.

The full suite (`-m faults`, also marked slow) runs FAULT_TRIALS (default 120) seeded random trials;
the seed is printed (FAULT_SEED=... reproduces a run). A reduced fixed set is not marked slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from faulthook import DRIVER
from waiting import until

from fleetctl.cli import main
from fleetctl.engines import wheels
from fleetctl.patching import make_patch
from fleetctl.sandbox import lifecycle as sbx
from fleetctl.sandbox import procs

pytestmark = [pytest.mark.usefixtures("ledger_dir"), pytest.mark.fleet, pytest.mark.faults,
              pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="OpenSSH sshd is not installed")]

VERSION = "0.5.9"
EW2 = "srt/speculative/eagle_worker_v2.py"
EW = "srt/speculative/eagle_worker.py"
SA = "srt/server_args.py"
FILES = (EW2, SA, EW)
COMMAND_TIMEOUT = 15.0  # the faulted command's: small, so frozen hosts time out; not too small for a loaded machine
CHECK_TIMEOUT = 120.0  # status, --check and the repair: a slow machine is not a fault

# ---------------------------------------------------------------------------------------------- helpers
# (imported by test_concurrency.py, test_hostile_input.py and test_bad_inputs.py)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def make_playbook(d: Path, files: tuple[str, ...] = FILES, versions: tuple[str, ...] = (VERSION,),
                  tag: str = "fault") -> Path:
    """A real playbook: each file gets a comment line inserted after its first line."""
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"name: {tag}", "versions:"]
    for v in versions:
        lines += [f'  "{v}":', "    files:"]
        for rel in files:
            old = wheels.pristine_bytes(v, rel)
            first, rest = old.split(b"\n", 1)
            new = first + b"\n" + f"# {tag} - fleetctl test\n".encode() + rest
            pf = d / "patches" / v / (Path(rel).name + ".diff")
            pf.parent.mkdir(parents=True, exist_ok=True)
            pf.write_bytes(make_patch(old, new, rel))
            lines += [f"      - path: {rel}", f"        patch: patches/{v}/{pf.name}", f"        sha256: {sha(old)}"]
    lines += ["launch:", "  flags: {--model-path: m}",  # (launch refuses a playbook with no launch: section)
              "covers: {worker: false}"]  # these tests are about faults: the launch runs no speculative worker
    (d / "playbook.yaml").write_text("\n".join(lines) + "\n")
    return d / "playbook.yaml"


def intended_bytes(pb: Path, version: str = VERSION) -> dict[str, bytes]:
    from fleetctl.config.playbook import load_playbook
    from fleetctl.plan.intended import intended_for

    it = intended_for(load_playbook(pb), version)
    assert it is not None
    return {rel: i.data for rel, i in it.items()}


def write_inventory(sb: sbx.Sandbox, path: Path, hosts: dict[str, dict[str, Any]] | None = None,
                    **defaults: Any) -> Path:
    """The sandbox's inventory with absolute paths, extra `defaults:` (e.g. a small command_timeout)
    and per-host overrides."""
    doc = yaml.safe_load(sb.inventory_path.read_text())
    base = sb.inventory_path.parent
    for k in ("identity_file", "known_hosts"):
        doc["defaults"][k] = str(base / doc["defaults"][k])
    doc["ssh_config"] = str(base / doc["ssh_config"])
    doc["defaults"].update(defaults)
    for name, extra in (hosts or {}).items():
        doc["hosts"][name].update(extra)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    c = capsys.readouterr()
    return code, c.out, c.err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code, out, err = run(capsys, *args, "--json")
    try:
        return code, json.loads(out)
    except ValueError:
        raise AssertionError(f"not JSON (exit {code}): {out!r} {err!r}") from None




def spawn_faulted(faults: dict[str, dict[str, Any]], *args: str, ledger: Path) -> subprocess.Popen[str]:
    """A separate controller process running `fleetctl ARGS` with `_fault` added to the deploy/rollback
    payload of the named hosts."""
    env = dict(os.environ, FLEETCTL_STATE_DIR=str(ledger))
    return subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(faults), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def session_pids(h: sbx.SandboxHost) -> list[int]:
    pid = h.pid
    return sorted(procs.descendants([pid])) if pid else []


def signal_pids(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def wait_gone(pids: list[int]) -> None:
    until(lambda: not any(procs.alive(p) for p in pids), f"processes {pids} to end")


def kill_host(sb: sbx.Sandbox, name: str) -> None:
    """SIGKILL the host's sshd listener and all its session processes (the agent included)."""
    h = sb.hosts[name]
    pid = h.pid
    assert pid is not None
    victims = [pid, *session_pids(h)]
    signal_pids(victims, signal.SIGKILL)
    wait_gone(victims)


def wait_file(path: Path) -> None:
    until(path.exists, f"{path} to appear")


def tree_hashes(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = "link:" + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(root))] = sha(p.read_bytes())
    return out


def temp_files(sb: sbx.Sandbox) -> list[Path]:
    return [p for h in sb.hosts.values() for p in h.sglang_dir.rglob("*") if p.name.endswith(".tmp")]


def reset_host(h: sbx.SandboxHost, files: tuple[str, ...] = FILES) -> None:
    """Pristine package files, empty state dir, no temp file left."""
    import shutil

    for rel in files:
        want = wheels.pristine_bytes(h.version or VERSION, rel)
        p = h.sglang_dir / rel
        if p.is_symlink() or not p.exists() or p.read_bytes() != want:
            p.unlink(missing_ok=True)
            p.write_bytes(want)
    for t in h.sglang_dir.rglob("*.tmp"):
        t.unlink()
    for child in h.state_dir.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()



# ---------------------------------------------------------------------------------------------- the trials

DEPLOY_POINTS = [("locked", None), ("before_backup", None), ("after_backup", None),
                 ("mid_write", 1), ("mid_write", 2), ("mid_write", 3),
                 ("between_renames", 1), ("between_renames", 2),
                 ("before_complete", None), ("after_complete", None)]
ROLLBACK_POINTS = [("locked", None), ("before_restore", None),
                   ("mid_write", 1), ("mid_write", 2), ("mid_write", 3),
                   ("between_restores", 1), ("between_restores", 2),
                   ("before_complete", None), ("after_complete", None)]
HOWS = ("agent_exit", "kill_sshd", "freeze")


@dataclass
class Fault:
    host: str
    at: str
    n: int | None
    how: str
    resolve: str = ""  # freeze: "kill" or "cont"

    def payload(self, marker: Path) -> dict[str, Any]:
        f: dict[str, Any] = {"at": self.at, "marker": str(marker)}
        if self.n is not None:
            f["n"] = self.n
        if self.how == "agent_exit":
            f["how"] = "exit"
        else:
            # kill_sshd: killed long before; freeze: the hold is over by the time it is SIGCONTed
            f["how"] = "wait"
            f["hold"] = 60 if self.how == "kill_sshd" else COMMAND_TIMEOUT + 1.0
        return f

    def label(self) -> str:
        at = f"{self.at}#{self.n}" if self.n else self.at
        return f"{self.host}:{at}:{self.how}" + (f"/{self.resolve}" if self.resolve else "")


@dataclass
class Trial:
    op: str
    faults: list[Fault]
    repair: str
    outcome: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return f"{self.op}[{', '.join(f.label() for f in self.faults)}] then {self.repair}"


def random_trial(rng: random.Random, hosts: list[str]) -> Trial:
    op = rng.choice(["deploy", "rollback"])
    points = DEPLOY_POINTS if op == "deploy" else ROLLBACK_POINTS
    victims = rng.sample(hosts, 2 if rng.random() < 0.25 else 1)
    faults = []
    for v in victims:
        at, n = rng.choice(points)
        how = rng.choice(HOWS)
        faults.append(Fault(v, at, n, how, rng.choice(["kill", "cont"]) if how == "freeze" else ""))
    return Trial(op, faults, rng.choice(["deploy", "rollback"]))


def host_state(h: sbx.SandboxHost, intended: dict[str, bytes]) -> tuple[str, dict[str, str]]:
    per = {}
    for rel in FILES:
        b = (h.sglang_dir / rel).read_bytes()
        per[rel] = ("original" if b == wheels.pristine_bytes(VERSION, rel) else
                    "intended" if b == intended[rel] else "OTHER")
    kinds = set(per.values())
    return (kinds.pop() if len(kinds) == 1 else "mixed"), per


def run_trial(sb: sbx.Sandbox, inv: Path, pb: Path, intended: dict[str, bytes], t: Trial, ledger: Path,
              capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    for h in sb.hosts.values():
        if not h.alive:
            sb.start_host(h.name)
        reset_host(h)
    if t.op == "rollback":  # something to roll back: a clean deploy on every host first
        code, doc = run_json(capsys, "deploy", "-i", str(inv), str(pb))
        assert code == 0, doc
    markers = {f.host: sb.hosts[f.host].state_dir.parent / "fault-reached" for f in t.faults}
    for m in markers.values():
        m.unlink(missing_ok=True)
    args = [t.op, "-i", str(inv.with_name("inventory-fault.yaml")), "--json"] + ([str(pb)] if t.op == "deploy" else [])
    proc = spawn_faulted({f.host: f.payload(markers[f.host]) for f in t.faults}, *args, ledger=ledger)
    frozen: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    unreached: set[str] = set()

    def act(f: Fault) -> None:
        try:
            if f.how == "agent_exit":
                return
            # the agent may reach the point after the controller gave up on it (a loaded machine):
            # act then too, so nothing is left holding the lock; the point was never reached only
            # once the command is over AND no session is left on the host (nothing can reach it
            # then: the marker is looked at once more after that, so no window of time decides)
            m = markers[f.host]

            def reached_or_over() -> str | None:
                if m.exists():
                    return "reached"
                if proc.poll() is not None and not session_pids(sb.hosts[f.host]):
                    return "reached" if m.exists() else "over"
                return None

            if until(reached_or_over, f"{f.host}'s fault point or the command's end") == "over":
                unreached.add(f.host)
                return
            if f.how == "kill_sshd":
                kill_host(sb, f.host)
            else:
                pids = session_pids(sb.hosts[f.host])
                signal_pids(pids, signal.SIGSTOP)
                frozen[f.host] = pids
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=act, args=(f,)) for f in t.faults]
    for th in threads:
        th.start()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        for th in threads:
            th.join(300)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if errors:
        raise errors[0]
    try:
        return _check_trial(sb, inv, pb, intended, t, capsys, proc, out, err, frozen, unreached)
    except BaseException:  # a failed check never leaves frozen processes behind for the next trial
        for pids in frozen.values():
            signal_pids([p for p in pids if procs.alive(p) and procs.has_marker(p, sb.dir)], signal.SIGKILL)
        raise


def _check_trial(sb: sbx.Sandbox, inv: Path, pb: Path, intended: dict[str, bytes], t: Trial,
                 capsys: pytest.CaptureFixture[str], proc: subprocess.Popen[str], out: str, err: str,
                 frozen: dict[str, list[int]], unreached: set[str]) -> dict[str, Any]:
    res: dict[str, Any] = {"trial": t.label(), "rc": proc.returncode}
    doc = json.loads(out)
    by_host = {r["host"]: r for r in doc["hosts"]}
    bad = {n for n, r in by_host.items() if r["status"] not in ("changed", "unchanged", "skipped")}
    for f in t.faults:
        if f.host in unreached:
            continue  # the command ended before the agent got to the point (see below)
        r = by_host[f.host]
        assert r["status"] in ("failed", "unreachable"), (t.label(), r)
        assert r["message"] and not r["message"].startswith(f"{f.host}: "), r  # the entry names the host
    for n in bad:
        assert by_host[n]["message"], by_host[n]
    assert proc.returncode == (1 if bad else 0), (t.label(), out, err)
    for f in t.faults:
        if f.how == "kill_sshd" and f.host not in unreached:
            sb.start_host(f.host)
    # a host that failed although it was not a victim (its command timed out on a loaded machine) is
    # one more fault: it gets the victims' checks; the others must be exactly as the command said
    collateral = bad - {f.host for f in t.faults}
    if collateral or unreached:
        res["load"] = {"timed_out": sorted(collateral), "fault_not_reached": sorted(unreached)}

    # --- right after the fault: nothing silent
    victims = {f.host for f in t.faults} | collateral
    states = {n: host_state(h, intended) for n, h in sb.hosts.items()}
    res["after_fault"] = {n: s for n, (s, _) in states.items() if n in victims}
    res["temp_left_by_fault"] = len(temp_files(sb))
    for n, (s, per) in states.items():
        assert "OTHER" not in per.values(), (t.label(), n, per)
        if n not in victims:
            assert s == ("intended" if t.op == "deploy" else "original"), \
                f"{t.label()}: {n} is {per}; the faulted command said {json.dumps(by_host.get(n))}"

    code, st = run_json(capsys, "status", "-i", str(inv), str(pb))
    rows = {r["host"]: r for r in st["hosts"]}
    for n, h in sb.hosts.items():
        s = states[n][0]
        open_m = [m for m in (h.state_dir / "deploys").glob("*/manifest.json")
                  if json.loads(m.read_text())["state"] in ("preparing", "applying", "rolling-back")]
        lock = (h.state_dir / "lock").exists()
        if s == "mixed" or open_m or lock:
            assert rows[n]["problems"], (t.label(), n, s, rows[n])
            assert code == 1
        if s == "mixed":
            assert any("interrupted" in p or "mixed" in p for p in rows[n]["problems"]), rows[n]
        if n in frozen:
            assert any("lock" in p for p in rows[n]["problems"]), rows[n]
    if any(states[n][0] == "mixed" and n not in frozen for n in sb.hosts):
        code, chk = run_json(capsys, "deploy", "--check", "-i", str(inv), str(pb))
        plans = {hp["host"]: hp for hp in chk["plan"]["hosts"]}
        for n in sb.hosts:
            if states[n][0] == "mixed" and n not in frozen:
                assert plans[n]["interrupted"], (t.label(), n, plans[n])

    # --- frozen hosts: end them (kill) or let them run on (cont)
    for f in t.faults:
        if f.host in frozen:
            pids = frozen[f.host]
            if f.resolve == "kill":
                signal_pids(pids, signal.SIGKILL)
            else:
                signal_pids(pids, signal.SIGCONT)
            wait_gone(pids)
            res.setdefault("after_resolve", {})[f.host] = host_state(sb.hosts[f.host], intended)[0]

    # --- the next deploy / rollback repairs everything
    rargs = [t.repair, "-i", str(inv)] + ([str(pb)] if t.repair == "deploy" else [])
    code, rep = run_json(capsys, *rargs)
    assert code == 0, f"{t.label()}: repair {t.repair} exit {code}: {json.dumps(rep.get('results'))}"
    want = "intended" if t.repair == "deploy" else "original"
    for n, h in sb.hosts.items():
        s, per = host_state(h, intended)
        assert s == want, (t.label(), n, per, rep)
        assert not (h.state_dir / "lock").exists(), (t.label(), n)
    assert temp_files(sb) == [], t.label()
    code, st = run_json(capsys, "status", "-i", str(inv), str(pb))
    assert code == 0 and all(not r["problems"] for r in st["hosts"]), (t.label(), st)
    res["repaired_by"] = t.repair
    res["notes"] = sorted({n.split(":")[0] for r in rep["hosts"] for n in r.get("notes", [])})
    return res


@pytest.fixture(scope="module")
def fault_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sbx.Sandbox, Path, Path, dict]]:
    d = tmp_path_factory.mktemp("faultfleet")
    try:  # down() runs even when up() fails half-way
        sb = sbx.up(d / "sb", hosts=3, versions=[VERSION], gpus=1)
        inv = write_inventory(sb, d / "inventory.yaml", command_timeout=CHECK_TIMEOUT)
        write_inventory(sb, d / "inventory-fault.yaml", command_timeout=COMMAND_TIMEOUT, connect_timeout=5)
        pb = make_playbook(d / "pb")
        yield sb, inv, pb, intended_bytes(pb)
    finally:
        sbx.down(d / "sb", missing_ok=True)


REDUCED = [
    Trial("deploy", [Fault("h01", "between_renames", 1, "agent_exit")], "deploy"),
    Trial("deploy", [Fault("h02", "mid_write", 2, "kill_sshd")], "rollback"),
    Trial("rollback", [Fault("h03", "between_restores", 2, "freeze", "cont")], "rollback"),
]


@pytest.mark.parametrize("trial", REDUCED, ids=[t.label() for t in REDUCED])
def test_fault_reduced(fault_fleet: tuple, trial: Trial, ledger_dir: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb, intended = fault_fleet
    run_trial(sb, inv, pb, intended, trial, ledger_dir, capsys)


@pytest.mark.slow
def test_fault_random_trials(fault_fleet: tuple, ledger_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, inv, pb, intended = fault_fleet
    seed = int(os.environ.get("FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
    count = int(os.environ.get("FAULT_TRIALS", "120"))
    rng = random.Random(seed)
    report = Path(os.environ.get("FAULT_REPORT", str(ledger_dir.parent / "fault-report.jsonl")))
    with capsys.disabled():
        print(f"\nfault trials: seed {seed}, {count} trials (FAULT_SEED={seed} reproduces), report {report}")
    tally: Counter[str] = Counter()
    failures: list[str] = []
    with report.open("a") as fh:
        only = os.environ.get("FAULT_ONLY")
        for i in range(count):
            t = random_trial(rng, list(sb.hosts))
            if only is not None and i != int(only):
                continue
            try:
                res = run_trial(sb, inv, pb, intended, t, ledger_dir, capsys)
            except Exception as e:  # record it, go on with the next trial (each starts from scratch)
                failures.append(f"trial {i}: {t.label()}: {str(e)[:2000]}")
                fh.write(json.dumps({"i": i, "seed": seed, "trial": t.label(), "FAILED": str(e)[:2000]}) + "\n")
                with capsys.disabled():
                    print(f"trial {i} (seed {seed}) FAILED: {t.label()}: {str(e)[:300]}")
                continue
            res["i"] = i
            res["seed"] = seed
            fh.write(json.dumps(res) + "\n")
            fh.flush()
            for f in t.faults:
                tally[f"{t.op}:{f.how}"] += 1
            for s in res["after_fault"].values():
                tally[f"victim left {s}"] += 1
    ran = 1 if only is not None else count
    with capsys.disabled():
        print(f"fault trials: {ran - len(failures)} of {ran} passed (seed {seed}): "
              + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    assert not failures, "\n".join(failures)
