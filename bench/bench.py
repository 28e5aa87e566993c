"""fleetctl against ansible-core, pyinfra and a lean paramiko push, on one sandbox fleet.

Run it through `bash bench/run.sh` (which makes the tools' virtualenvs); directly:

    python bench/bench.py --sizes 8,32,64 --runs 3 [--tools fleetctl,lean,pyinfra,ansible,ansible-default]

One sandbox of max(--sizes) real sshd hosts (mixed SGLang versions) is built once; size N uses its
first N hosts (the other listeners sit idle). Before every timed deploy the N hosts are reset to
pristine (the target files copied back from the wheel trees, backups/temp files and fleetctl's
state dir removed). Tools run in a rotating order from run to run. Each tool process is timed for
wall seconds, and its CPU seconds and peak RSS come from its own rusage (wait4); for ansible the
ControlPersist ssh masters it leaves behind are reaped here and their CPU is added.

Output (--out, default bench/results): results.json (every run and the medians), results.md.
The PNG is drawn by bench/plot.py (matplotlib, in the tools venv).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PLAYBOOK = REPO / "playbooks" / "dynamic-spec-disable"
VENVS = BENCH / ".venvs"
ALL_TOOLS = ("fleetctl", "lean", "pyinfra", "ansible", "ansible-default")


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---- measuring one tool process ------------------------------------------------------------

def listener_cpu(pids: list[int]) -> float:
    """CPU seconds the hosts' sshd listeners and every descendant they reaped have used (utime, stime,
    cutime, cstime of /proc/PID/stat): a connection's sshd, its login shell and what that ran are
    all reaped under the listener once they end. The difference over a run is the hosts' CPU."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                f = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return total / tick


def measure(argv: list[str], *, env: dict[str, str], cwd: Path, log: Path, phases: bool = False,
            host_pids: list[int] | None = None) -> dict[str, Any]:
    """Run argv under bench/launch.py: wall seconds, CPU seconds (user+sys of the tool and its
    reaped descendants, including processes it left behind), peak RSS of the tool's processes.
    phases: argv is `PYTHON TOOL...`, run as `PYTHON bench/phases.py OUT TOOL...` (the per-host
    timeline and the bytes each way; kept under "phases"). host_pids: the hosts' sshd listeners
    (their CPU over the run: "host_cpu")."""
    fd, res = tempfile.mkstemp(prefix="bench-rusage-", suffix=".json")
    os.close(fd)
    ph = None
    if phases:
        fd, ph = tempfile.mkstemp(prefix="bench-phases-", suffix=".json")
        os.close(fd)
        argv = [argv[0], str(BENCH / "phases.py"), ph, *argv[1:]]
    hcpu = listener_cpu(host_pids) if host_pids else None
    try:
        with open(log, "ab") as fh:
            fh.write(("\n$ " + " ".join(argv) + "\n").encode())
            fh.flush()
            start = fh.tell()
            subprocess.run([sys.executable, "-S", str(BENCH / "launch.py"), res, "--", *argv], stdout=fh,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd, check=True)
        r = json.loads(Path(res).read_text())
        if hcpu is not None and host_pids:
            hcpu = round(listener_cpu(host_pids) - hcpu, 2)
        timeline = None
        if ph is not None:
            try:
                timeline = json.loads(Path(ph).read_text())
            except (OSError, ValueError):
                timeline = None
    finally:
        os.unlink(res)
        if ph is not None:
            with contextlib.suppress(OSError):
                os.unlink(ph)
    m = {"wall": round(r["wall"], 3), "cpu": round(r["cpu"], 3), "maxrss_mb": round(r["maxrss_kb"] / 1024, 1),
         "rc": r["rc"]}
    if hcpu is not None:
        m["host_cpu"] = hcpu
    if timeline is not None:
        m["phases"] = phase_summary(timeline)
    if r["orphans_reaped"]:
        m["orphans_reaped"] = r["orphans_reaped"]
    if r["rc"] != 0:
        with open(log, "rb") as fh:
            fh.seek(start)
            m["errors"] = failure_lines(fh.read().decode(errors="replace"))
    return m


def failure_lines(output: str, limit: int = 5) -> list[str]:
    """What a failed tool run said about its failing hosts: from fleetctl's --json document the
    hosts whose status is not ok, else the output's last lines (kept in results.json)."""
    try:
        doc = json.loads(output[output.index("{"):output.rindex("}") + 1])
    except ValueError:
        doc = None
    lines: list[str] = []
    if isinstance(doc, dict):
        for h in doc.get("hosts") or doc.get("results") or []:
            if isinstance(h, dict) and h.get("status") not in ("ok", "changed", "unchanged", "noop"):
                lines.append(f"{h.get('host')}: {h.get('status')}: {h.get('message') or h.get('reason')}")
    if not lines:
        lines = [ln for ln in output.strip().splitlines() if ln.strip()][-limit:]
    return lines[:limit]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def phase_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """bench/phases.py's timeline, per phase: hosts that had it, calls per host, wall ms per host
    (median, p90, max: the sum of a host's calls), controller CPU ms per host (the calling thread and
    the host's transport thread, summed over hosts / hosts); the global steps (wall, process CPU ms);
    bytes controller -> host and back per host (median, max)."""
    per: dict[str, dict[str, list[float]]] = {}
    for host, phase, s, e, cpu in doc.get("records", []):
        d = per.setdefault(phase, {})
        w = d.setdefault(host, [0.0, 0.0, 0])
        w[0] += e - s
        w[1] += cpu
        w[2] += 1
    phases: dict[str, Any] = {}
    for phase, hosts in per.items():
        walls = [v[0] * 1000 for v in hosts.values()]
        phases[phase] = {"hosts": len(hosts), "calls_per_host": round(sum(v[2] for v in hosts.values()) / len(hosts), 2),
                         "wall_ms_median": round(statistics.median(walls), 2), "wall_ms_p90": round(_pct(walls, 0.9), 2),
                         "wall_ms_max": round(max(walls), 2),
                         "cpu_ms_per_host": round(1000 * sum(v[1] for v in hosts.values()) / len(hosts), 3)}
    glob: dict[str, Any] = {}
    for phase, s, e, cpu in doc.get("globals", []):
        g = glob.setdefault(phase, {"calls": 0, "wall_ms": 0.0, "cpu_ms": 0.0, "first_start_ms": round(1000 * s, 1)})
        g["calls"] += 1
        g["wall_ms"] = round(g["wall_ms"] + 1000 * (e - s), 2)
        g["cpu_ms"] = round(g["cpu_ms"] + 1000 * cpu, 2)
    starts = [s for _, phase, s, _, _ in doc.get("records", []) if phase in ("connect", "ssh-connect")]
    sent = list(doc.get("sent", {}).values())
    recv = list(doc.get("recv", {}).values())
    out: dict[str, Any] = {"phases": phases, "globals": glob, "wrapped": len(doc.get("wrapped", [])),
                           "wall_s": doc.get("wall"), "process_cpu_s": doc.get("process_cpu")}
    if starts:
        out["first_connect_ms"] = round(1000 * min(starts), 1)
    if sent:
        out["bytes_to_host"] = {"median": int(statistics.median(sent)), "max": max(sent), "hosts": len(sent)}
        out["bytes_from_host"] = {"median": int(statistics.median(recv)) if recv else 0, "max": max(recv, default=0)}
    return out


# ---- the job ---------------------------------------------------------------------------------

class Job:
    """The intended files per SGLang version (from the playbook, via fleetctl's own payload code),
    written to disk for the other tools, and the pristine bytes to reset hosts with."""

    def __init__(self, work: Path, versions: list[str]) -> None:
        from fleetctl.config.playbook import load_playbook
        from fleetctl.engines import wheels
        from fleetctl.plan.intended import intended_for

        pb = load_playbook(PLAYBOOK)
        self.files: dict[str, list[dict[str, str]]] = {}
        self.pristine: dict[str, dict[str, bytes]] = {}
        self.pristine_names: dict[str, dict[str, set[str]]] = {}
        for v in versions:
            it = intended_for(pb, v)
            if it is None:
                raise SystemExit(f"playbook {PLAYBOOK} has no patch set for SGLang {v}")
            tree = wheels.extracted(v) / "sglang"
            self.files[v] = []
            self.pristine[v] = {}
            self.pristine_names[v] = {}
            for rel, item in sorted(it.items()):
                src = work / "payload" / v / rel
                src.parent.mkdir(parents=True, exist_ok=True)
                src.write_bytes(item.data)
                self.files[v].append({"rel": rel, "src": str(src), "sha256": item.sha_intended,
                                      "sha1": hashlib.sha1(item.data).hexdigest()})
                self.pristine[v][rel] = (tree / rel).read_bytes()
                d = str(Path(rel).parent)
                self.pristine_names[v].setdefault(d, {p.name for p in (tree / d).iterdir()})


def reset_host(job: Job, h: Any) -> None:
    """Put a sandbox host back to pristine: target files, no backups/temps beside them, empty state dir."""
    v = h.version
    for rel, data in job.pristine[v].items():
        p = h.sglang_dir / rel
        tmp = p.with_name(p.name + ".bench-reset")
        tmp.write_bytes(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    for d, names in job.pristine_names[v].items():
        for p in (h.sglang_dir / d).iterdir():
            if p.name not in names:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
    if h.state_dir.exists():
        for p in h.state_dir.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def check_hosts(job: Job, hosts: list[Any], want: str, backup: str | None) -> tuple[int, list[str]]:
    """How many hosts hold exactly the intended (or pristine) bytes, and a backup where asked."""
    ok, bad = 0, []
    for h in hosts:
        v = h.version
        problems = []
        for f in job.files[v]:
            p = h.sglang_dir / f["rel"]
            got = sha256(p.read_bytes()) if p.exists() else None
            exp = f["sha256"] if want == "intended" else sha256(job.pristine[v][f["rel"]])
            if got != exp:
                problems.append(f"{f['rel']} not {want}")
                continue
            if backup == "fleetctl":
                if not list(h.state_dir.glob(f"deploys/*/backup/{f['rel']}")):
                    problems.append(f"{f['rel']}: no backup")
            elif backup == "ansible":
                if not list(p.parent.glob(p.name + ".*~")):
                    problems.append(f"{f['rel']}: no backup")
            elif backup == "bak":
                b = p.with_name(p.name + ".bench-bak")
                if not b.exists() or b.read_bytes() != job.pristine[v][f["rel"]]:
                    problems.append(f"{f['rel']}: no backup")
        if problems:
            bad.append(f"{h.name}: {'; '.join(problems)}")
        else:
            ok += 1
    return ok, bad


# ---- per-tool inputs -------------------------------------------------------------------------

def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Inputs:
    """Inventories and job files for size N (the sandbox's first N hosts)."""

    def __init__(self, sb: Any, job: Job, hosts: list[Any], d: Path, ctl_dir: Path, lean_workers: int = 0) -> None:
        d.mkdir(parents=True, exist_ok=True)
        self.dir = d
        n = len(hosts)
        key, kh = str(sb.client_key), str(sb.known_hosts_path)
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name

        # fleetctl: the sandbox inventory, first N hosts, absolute paths, a free server port each
        doc = yaml.safe_load(sb.inventory_path.read_text())
        base = sb.inventory_path.parent
        doc["ssh_config"] = str(base / doc["ssh_config"])
        for k in ("identity_file", "known_hosts"):
            doc["defaults"][k] = str(base / doc["defaults"][k])
        names = [h.name for h in hosts]
        doc["hosts"] = {name: doc["hosts"][name] for name in names}
        for name, port in zip(names, free_ports(n), strict=True):
            doc["hosts"][name]["flags"] = {"--port": port}
        self.fleetctl_inv = d / "fleetctl-inventory.yaml"
        self.fleetctl_inv.write_text(yaml.safe_dump(doc, sort_keys=False))

        # lean paramiko push
        self.lean_job = d / "lean-job.json"
        self.lean_job.write_text(json.dumps({
            "workers": lean_workers or n, "key": key, "known_hosts": kh, "user": user,
            "hosts": [{"name": h.name, "port": h.port,
                       "files": [{"src": f["src"], "dest": str(h.sglang_dir / f["rel"]), "sha256": f["sha256"]}
                                 for f in job.files[h.version]]} for h in hosts]}, indent=1))

        # pyinfra: a Python inventory with the connection and the job as host data
        lines = [f"# generated by bench/bench.py: the sandbox's first {n} hosts", "hosts = ["]
        for h in hosts:
            data = {"ssh_hostname": "127.0.0.1", "ssh_port": h.port, "ssh_user": user, "ssh_key": key,
                    "ssh_known_hosts_file": kh, "ssh_strict_host_key_checking": "yes",
                    "bench_files": [{"rel": f["rel"], "src": f["src"], "dest": str(h.sglang_dir / f["rel"]),
                                     "sha256": f["sha256"]} for f in job.files[h.version]]}
            lines.append(f"    ({h.name!r}, {data!r}),")
        lines.append("]")
        self.pyinfra_inv = d / "pyinfra_inventory.py"
        self.pyinfra_inv.write_text("\n".join(lines) + "\n")

        # ansible: INI inventory, vars file, a tuned and a default ansible.cfg
        common = f"-o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
        inv = ["[sandbox]"]
        for h in hosts:
            inv.append(f"{h.name} ansible_host=127.0.0.1 ansible_port={h.port} ansible_user={user} "
                       f"ansible_ssh_private_key_file={key} ansible_python_interpreter={h.python} "
                       f"sgl_dir={h.sglang_dir} sgl_version={h.version}")
        inv += ["", "[sandbox:vars]", f"ansible_ssh_common_args='{common}'"]
        self.ansible_inv = d / "ansible-inventory.ini"
        self.ansible_inv.write_text("\n".join(inv) + "\n")
        self.ansible_vars = d / "ansible-vars.json"
        self.ansible_vars.write_text(json.dumps({"bench_files": job.files}))
        remote_tmp = d / "ansible-remote-tmp"
        cfg_common = ("[defaults]\nhost_key_checking = True\nretry_files_enabled = False\n"
                      f"local_tmp = {d / 'ansible-local-tmp'}\nremote_tmp = {remote_tmp}\n"
                      "interpreter_python = auto_silent\n")
        self.ansible_cfg = {
            "ansible": d / "ansible-tuned.cfg",
            "ansible-default": d / "ansible-default.cfg",
        }
        self.ansible_cfg["ansible"].write_text(
            cfg_common + f"forks = {n}\n\n[ssh_connection]\npipelining = True\n"
            "ssh_args = -o ControlMaster=auto -o ControlPersist=60s\n"
            f"control_path_dir = {ctl_dir}\ncontrol_path = %(directory)s/%%C\n")
        self.ansible_cfg["ansible-default"].write_text(
            cfg_common + f"\n[ssh_connection]\ncontrol_path_dir = {ctl_dir}\ncontrol_path = %(directory)s/%%C\n")


# ---- running the tools ----------------------------------------------------------------------

class Runner:
    """The runs on one sandbox (one shell variant); its work dir holds that variant's inputs and ledger."""

    def __init__(self, args: argparse.Namespace, work: Path, sb: Any, job: Job, shell: str = "rc") -> None:
        self.args = args
        self.work = work
        self.shell = shell
        self.sb = sb
        self.job = job
        self.log = work / "tools.log"
        self.env = dict(os.environ)
        self.env["FLEETCTL_STATE_DIR"] = str(work / "fleetctl-ledger")
        self.env["NO_COLOR"] = "1"
        self.env.pop("PYTHONPATH", None)

    def _ok(self, m: dict[str, Any], hosts: list[Any], want: str, backup: str | None) -> dict[str, Any]:
        if m.get("errors"):
            say(f"  ! rc={m['rc']}: {m['errors'][0]}")
        good, bad = check_hosts(self.job, hosts, want, backup)
        m["hosts_correct"] = good
        if bad:
            m["problems"] = bad[:5]
            say(f"  ! {len(bad)} host(s) not {want}: {bad[0]}")
        return m

    def _measure(self, argv: list[str], cwd: Path, phases: bool) -> dict[str, Any]:
        return measure(argv, env=self.env, cwd=cwd, log=self.log, phases=phases and self.args.phases,
                       host_pids=self.host_pids)

    def fleetctl(self, inp: Inputs, hosts: list[Any], first_run: bool) -> dict[str, Any]:
        n = len(hosts)
        base = [sys.executable, "-m", "fleetctl"]
        inv = ["-i", str(inp.fleetctl_inv), "-f", str(min(n, self.args.fleetctl_forks or n)), "--json"]
        pb = str(PLAYBOOK)
        out: dict[str, Any] = {}

        def run(op: str, argv: list[str], want: str | None, backup: str | None = None) -> None:
            m = self._measure(argv, self.work, True)
            if want:
                self._ok(m, hosts, want, backup)
            out[op] = m

        ops = {o.strip() for o in self.args.fleetctl_ops.split(",")}
        if "check" in ops:
            run("check", [*base, "deploy", pb, *inv, "--check"], "pristine")
        run("deploy", [*base, "deploy", pb, *inv], "intended", "fleetctl")
        if "noop" in ops:
            run("noop", [*base, "deploy", pb, *inv], "intended", "fleetctl")
        if "recheck" in ops:  # (opt-in) the no-op without its seal: the agent's facts, one request a host
            run("recheck", [*base, "deploy", pb, *inv, "--recheck"], "intended", "fleetctl")
        if first_run and n <= self.args.verify_logs_max:
            run("launch", [*base, "launch", pb, *inv], None)
            run("verify-logs", [*base, "verify-logs", pb, *inv], None)
            run("stop", [*base, "stop", pb, *inv], None)
        if "rollback" in ops:
            run("rollback", [*base, "rollback", *inv], "pristine")
        return out

    def lean(self, inp: Inputs, hosts: list[Any], first_run: bool) -> dict[str, Any]:
        argv = [self.args.lean_python, str(BENCH / "lean_push.py"), str(inp.lean_job)]
        out = {}
        for op in ("deploy", "noop"):
            out[op] = self._ok(self._measure(argv, self.work, True), hosts, "intended", "bak")
        return out

    def pyinfra(self, inp: Inputs, hosts: list[Any], first_run: bool) -> dict[str, Any]:
        argv = [str(VENVS / "pyinfra" / "bin" / "pyinfra"), str(inp.pyinfra_inv), str(BENCH / "pyinfra_deploy.py"),
                "-y", "--parallel", str(len(hosts))]
        out = {}
        for op in ("deploy", "noop"):
            out[op] = self._ok(self._measure(argv, inp.dir, False), hosts, "intended", "bak")
        return out

    def ansible(self, inp: Inputs, hosts: list[Any], first_run: bool, variant: str = "ansible") -> dict[str, Any]:
        env = dict(self.env)
        env["ANSIBLE_CONFIG"] = str(inp.ansible_cfg[variant])
        env["ANSIBLE_HOME"] = str(self.work / "ansible-home")
        env["ANSIBLE_NOCOLOR"] = "1"
        argv = [str(VENVS / "ansible" / "bin" / "ansible-playbook"), "-i", str(inp.ansible_inv),
                str(BENCH / "ansible" / "deploy.yml"), "-e", f"@{inp.ansible_vars}"]
        out = {}
        for op in ("deploy", "noop"):
            m = measure(argv, env=env, cwd=inp.dir, log=self.log, host_pids=self.host_pids)
            out[op] = self._ok(m, hosts, "intended", "ansible")
        return out

    def runs_for(self, tool: str, n: int) -> int:
        if n > self.args.tool_max.get(tool, n):
            return 0
        if tool == "ansible":
            if n > self.args.ansible_max:
                return 0
            return self.args.runs if n <= 8 else min(self.args.runs, self.args.slow_runs)
        if tool == "ansible-default":
            return min(self.args.runs, self.args.slow_runs) if n <= self.args.ansible_default_max else 0
        if n > 128 and self.args.big_runs:
            return min(self.args.runs, self.args.big_runs)
        return self.args.runs

    def start(self, n: int) -> None:
        """Size n: the sandbox's first n hosts, their inputs, empty run lists."""
        self.n = n
        self.hosts = list(self.sb.hosts.values())[:n]
        self.host_pids = [p for p in (h.pid for h in self.hosts) if p]
        self.inp = Inputs(self.sb, self.job, self.hosts, self.work / f"n{n}", self.ctl_dir, self.args.lean_workers)
        self.tools = [t for t in self.args.tools if self.runs_for(t, n) > 0]
        self.runs: dict[str, list[dict[str, Any]]] = {t: [] for t in self.tools}
        self.loads: list[float] = []

    def one_run(self, r: int) -> None:
        """Run r of every tool at the current size (rotating order, reversed on odd runs when there
        are more than two tools: with two, rotating alone alternates them, and reversing too would
        put the same tool first in every run)."""
        n, hosts, tools = self.n, self.hosts, self.tools
        order = tools[r % len(tools):] + tools[:r % len(tools)] if tools else []
        if r % 2 and len(order) > 2:
            order = order[::-1]
        for tool in order:
            if r >= self.runs_for(tool, n):
                continue
            for h in hosts:
                reset_host(self.job, h)
            load = os.getloadavg()[0]
            self.loads.append(load)
            say(f"N={n} {self.shell} shell run {r + 1}/{self.args.runs}: {tool} (load {load:.1f})")
            if tool.startswith("ansible"):
                res = self.ansible(self.inp, hosts, r == 0, tool)
            else:
                res = getattr(self, tool)(self.inp, hosts, r == 0)
            for m in res.values():
                m["load1"] = round(load, 2)
            say("  " + ", ".join(f"{op} {m['wall']:.2f}s/{m['cpu']:.2f}cpu"
                                 + (f"/host {m['host_cpu']:.2f}cpu" if "host_cpu" in m else "")
                                 + (f" {m['phases']['bytes_to_host']['median']}B->host"
                                    if "bytes_to_host" in m.get("phases", {}) else "")
                                 + (f" {m.get('hosts_correct')}/{n} ok" if "hosts_correct" in m else "")
                                 + (f" rc={m['rc']}" if m["rc"] else "") for op, m in res.items()))
            self.runs[tool].append(res)

    def finish(self) -> dict[str, Any]:
        for h in self.hosts:
            reset_host(self.job, h)
        out = {"n": self.n, "shell": self.shell, "tools": {t: summarize(rs) for t, rs in self.runs.items()}}
        if self.loads:
            out["load1_median"] = round(statistics.median(self.loads), 2)
        return out

    def size(self, n: int) -> dict[str, Any]:
        self.start(n)
        for r in range(self.args.runs):
            self.one_run(r)
        return self.finish()


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ops: dict[str, Any] = {}
    for res in runs:
        for op, m in res.items():
            ops.setdefault(op, {"runs": []})["runs"].append(m)
    for d in ops.values():
        rs = d["runs"]
        d["median"] = {k: round(statistics.median(r[k] for r in rs), 3) for k in ("wall", "cpu", "maxrss_mb")}
        for k in ("host_cpu",):
            if all(k in r for r in rs):
                d["median"][k] = round(statistics.median(r[k] for r in rs), 3)
        sent = [r["phases"]["bytes_to_host"]["median"] for r in rs if "bytes_to_host" in r.get("phases", {})]
        if sent:
            d["bytes_to_host_median"] = int(statistics.median(sent))
        d["peak_rss_mb"] = max(r["maxrss_mb"] for r in rs)
        d["all_rc0"] = all(r["rc"] == 0 for r in rs)
        if any("hosts_correct" in r for r in rs):
            d["hosts_correct_min"] = min(r.get("hosts_correct", 0) for r in rs)
    return ops


# ---- report ----------------------------------------------------------------------------------

LABELS = {"fleetctl": "fleetctl", "lean": "lean paramiko", "pyinfra": "pyinfra",
          "ansible": "ansible-core (tuned)", "ansible-default": "ansible-core (defaults)"}


def ratios(sz: dict[str, Any]) -> dict[str, Any]:
    """fleetctl wall / other wall per op, for the tools run in the same invocation as fleetctl (a
    row kept from an earlier invocation ran under other machine load: no ratio against it)."""
    t = sz["tools"]
    out: dict[str, Any] = {}
    if "fleetctl" not in t or "fleetctl" in sz.get("kept_from_earlier_run", []):
        return out
    for other in t:
        if other == "fleetctl" or other in sz.get("kept_from_earlier_run", []):
            continue
        for op in ("deploy", "noop"):
            a, b = t["fleetctl"].get(op), t[other].get(op)
            if a and b and b["median"]["wall"] > 0:
                out[f"fleetctl/{other} {op}"] = round(a["median"]["wall"] / b["median"]["wall"], 3)
    return out


SHELLS = {"rc": "rc files: the sessions run root's login shell with its ~/.bashrc (pyenv init)",
          "bare": "bare: each host's sessions get their own empty HOME, a login shell with no rc files",
          "rc-own": "rc files, a pyenv per host: each host's HOME holds a copy of root's rc files and a pyenv root of "
                    "its own (its shims and rehash lock; versions, libexec and plugins shared by symlink), as on "
                    "real hosts"}


def targets(sizes: dict[str, Any], shell: str = "rc") -> list[str]:
    lines = []
    s64 = sizes.get("64")
    if s64:
        r = s64.get("ratios", {})

        def line(key: str, goal: float, text: str) -> None:
            if key not in r:
                lines.append(f"- {text}: not measured")
                return
            v = r[key]
            ok = v <= goal
            lines.append(f"- {text}: {v:.2f} ({'met' if ok else 'NOT met'})")

        if shell == "bare":
            line("fleetctl/lean deploy", 1.2, "bare shell, N=64 full deploy within 1.2x of the lean push (issue 34)")
            line("fleetctl/lean noop", 1.0, "bare shell, N=64 no-op at most 1.0x the lean no-op (issue 34)")
        else:
            kind = "rc files" if shell == "rc" else "rc files (a pyenv per host)"
            line("fleetctl/lean deploy", 1.0, f"{kind}, N=64 full deploy ahead of the lean push (< 1)")
            line("fleetctl/lean noop", 1.0, f"{kind}, N=64 no-op ahead of the lean no-op (< 1)")
            line("fleetctl/pyinfra deploy", 0.5, "N=64 >= 2x faster than pyinfra (fleetctl/pyinfra <= 0.5)")
            line("fleetctl/ansible deploy", 0.05,
                 "N=64 >= 20x faster than tuned ansible-core (fleetctl/ansible <= 0.05)")
    for big in ("256", "512", "1000"):
        sz = sizes.get(big)
        if sz and "fleetctl" in sz["tools"]:
            parts = []
            for op, d in sz["tools"]["fleetctl"].items():
                if "hosts_correct_min" in d:
                    parts.append(f"{op} {d.get('hosts_correct_min')}/{big}{'' if d.get('all_rc0') else ' rc!=0'}")
            ok = all(d.get("all_rc0") and d.get("hosts_correct_min") == int(big)
                     for d in sz["tools"]["fleetctl"].values() if "hosts_correct_min" in d)
            lines.append(f"- N={big} completes with every host correct: {'met' if ok else 'NOT met'} "
                         f"(fleetctl {', '.join(parts)})")
            if big == "1000":  # issue 34: deploy < 45 s, no-op < 15 s, rollback < 45 s on this 2-core machine
                for op, goal in (("deploy", 45.0), ("noop", 15.0), ("rollback", 45.0)):
                    d = sz["tools"]["fleetctl"].get(op)
                    if d:
                        w = d["median"]["wall"]
                        lines.append(f"- N=1000 {op} under {goal:g} s: {w:.1f} s ({'met' if w < goal else 'NOT met'})")
    return lines


def size_rows(sizes: dict[str, Any]) -> list[str]:
    out = ["| N | tool | op | runs | wall s | CPU s | CPU ms/host | max RSS MB | hosts' CPU s | bytes -> host | "
           "hosts correct | load1 |",
           "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sorted(sizes, key=int):
        sz = sizes[n]
        for tool, ops in sz["tools"].items():
            for op, d in ops.items():
                md = d["median"]
                hc = d.get("hosts_correct_min")
                loads = [r["load1"] for r in d["runs"] if "load1" in r]
                load = f"{statistics.median(loads):.1f}" if loads else ""
                host_cpu = f"{md['host_cpu']:.2f}" if "host_cpu" in md else ""
                sent = f"{d['bytes_to_host_median']:,}" if "bytes_to_host_median" in d else ""
                out.append(f"| {n} | {LABELS.get(tool, tool)} | {op} | {len(d['runs'])} | {md['wall']:.2f} | "
                           f"{md['cpu']:.2f} | {1000 * md['cpu'] / int(n):.1f} | "
                           f"{d.get('peak_rss_mb', md['maxrss_mb']):.0f} | {host_cpu} | {sent} | "
                           f"{'' if hc is None else f'{hc}/{n}'}{'' if d['all_rc0'] else ' (rc!=0)'} | {load} |")
    for n in sorted(sizes, key=int):
        kept = sizes[n].get("kept_from_earlier_run")
        if kept:
            out += ["", f"N={n}: the rows of {', '.join(LABELS.get(t, t) for t in kept)} come from an earlier "
                        f"invocation than the others at this N (the others were re-run on {sizes[n]['date']})."]
    out += ["", "Ratios (fleetctl wall / other tool wall, medians; < 1 means fleetctl is faster):", "",
            "| N | ratio | value |", "|---:|---|---:|"]
    for n in sorted(sizes, key=int):
        for k, v in sizes[n].get("ratios", {}).items():
            out.append(f"| {n} | {k} | {v:.2f} |")
    return out


PHASE_ORDER = ("connect", "handshake", "auth", "channel", "check", "agent start", "request:facts", "request:deploy",
               "request:rollback", "hash", "exec", "transfer", "re-hash", "close", "ssh-close")


def phase_rows(sizes: dict[str, Any]) -> list[str]:
    """Per N: each phase of fleetctl's and the lean push's deploy and no-op (bench/phases.py), the
    medians over the runs of: hosts' median wall ms in the phase, controller CPU ms per host."""
    out: list[str] = []
    for n in sorted(sizes, key=int):
        cols = [(t, op) for t in ("fleetctl", "lean") for op in ("deploy", "noop")
                if any("phases" in r for r in sizes[n]["tools"].get(t, {}).get(op, {}).get("runs", []))]
        if not cols:
            continue
        names = [p for p in PHASE_ORDER if any(p in r.get("phases", {}).get("phases", {}) for t, op in cols
                                                  for r in sizes[n]["tools"][t][op]["runs"])]
        out += ["", f"Per host and phase at N={n} (bench/phases.py; median over runs of the hosts' median wall ms / "
                    "controller CPU ms per host; x: calls per host):", "",
                "| phase | " + " | ".join(f"{LABELS.get(t, t)} {op}" for t, op in cols) + " |",
                "|---|" + "---:|" * len(cols)]
        for p in names:
            cells = []
            for t, op in cols:
                got = [r["phases"]["phases"][p] for r in sizes[n]["tools"][t][op]["runs"]
                       if p in r.get("phases", {}).get("phases", {})]
                if not got:
                    cells.append("")
                    continue
                w = statistics.median(g["wall_ms_median"] for g in got)
                c = statistics.median(g["cpu_ms_per_host"] for g in got)
                k = statistics.median(g["calls_per_host"] for g in got)
                cells.append(f"{w:.0f} / {c:.1f}" + (f" (x{k:g})" if k != 1 else ""))
            out.append(f"| {p} | " + " | ".join(cells) + " |")
        for label, key in (("first connect at (ms)", "first_connect_ms"),):
            cells = []
            for t, op in cols:
                got = [r["phases"][key] for r in sizes[n]["tools"][t][op]["runs"] if key in r.get("phases", {})]
                cells.append(f"{statistics.median(got):.0f}" if got else "")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        for label, key in (("bytes controller -> host", "bytes_to_host"), ("bytes host -> controller", "bytes_from_host")):
            cells = []
            for t, op in cols:
                got = [r["phases"][key]["median"] for r in sizes[n]["tools"][t][op]["runs"] if key in r.get("phases", {})]
                cells.append(f"{int(statistics.median(got)):,}" if got else "")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        gl = [(g, op) for op in ("deploy", "noop") for g in ("inventory.load_inventory", "playbook_cache.load",
                                                              "playbook.load_playbook", "deploy.gather",
                                                              "deploy.build_plan", "deploy.apply_plan",
                                                              "ledger.Ledger.start", "ledger.Ledger.finish",
                                                              "runner.Fleet.close")]
        rows = []
        for g, op in gl:
            got = [r["phases"]["globals"][g] for r in sizes[n]["tools"].get("fleetctl", {}).get(op, {}).get("runs", [])
                   if g in r.get("phases", {}).get("globals", {})]
            if got:
                rows.append(f"| {op} | {g} | {statistics.median(x['first_start_ms'] for x in got):.0f} | "
                            f"{statistics.median(x['wall_ms'] for x in got):.0f} | {statistics.median(x['cpu_ms'] for x in got):.0f} |")
        if rows:
            out += ["", f"fleetctl's steps at N={n} (once per command; process CPU, all threads):", "",
                    "| op | step | starts at ms | wall ms | CPU ms |", "|---|---|---:|---:|---:|", *rows]
    return out


def markdown(doc: dict[str, Any]) -> str:
    m = doc["meta"]
    out = ["# fleetctl bench results", "",
           f"Generated {m['date']} on {m['machine']} ({m['cpus']} CPUs). SGLang versions {', '.join(m['versions'])}; "
           f"playbook `{m['playbook']}`. Tools: " + ", ".join(f"{k} {v}" for k, v in m["tool_versions"].items()) + ".",
           "",
           "**One machine:** the sshd hosts and their Pythons share the controller's CPUs, so wall time "
           "includes the hosts' work; CPU and memory columns are the controller process only "
           "(rusage of the tool process and its reaped children; ansible's ControlPersist ssh masters are "
           "reaped and counted). CPU ms/host = controller CPU / N. max RSS = the largest peak over the runs. "
           "load1 = the machine's 1-minute load average when the run started (other work shares it). "
           "With two shell variants, their runs are interleaved (A, B, A, B, ...) on two sandboxes.", ""]
    if m.get("note"):
        out += [m["note"], ""]
    variants = doc.get("variants") or {"rc": {"sizes": doc["sizes"]}}
    for shell, v in variants.items():
        out += [f"## Login shell: {SHELLS.get(shell, shell)}", "",
                "Medians over runs (`runs` column). wall/CPU in seconds, RSS in MB.", ""]
        out += size_rows(v["sizes"])
        out += phase_rows(v["sizes"])
        tl = targets(v["sizes"], shell)
        if tl:
            out += ["", "Targets (a benchmark, not a test):", "", *tl]
        out.append("")
    out += ["![wall time vs N](results.png)", ""]
    return "\n".join(out)


def tool_versions(tools: list[str], lean_python: str) -> dict[str, str]:
    v: dict[str, str] = {}

    def q(argv: list[str]) -> str:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            return (p.stdout or p.stderr).strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            return "?"

    import fleetctl

    v["fleetctl"] = getattr(fleetctl, "__version__", "0.1.0")
    if "lean" in tools:
        v["paramiko"] = q([lean_python, "-c", "import paramiko; print(paramiko.__version__)"])
    if "pyinfra" in tools:
        v["pyinfra"] = q([str(VENVS / "pyinfra" / "bin" / "pyinfra"), "--version"]).replace("pyinfra: ", "")
    if any(t.startswith("ansible") for t in tools):
        v["ansible-core"] = q([str(VENVS / "ansible" / "bin" / "python"), "-c",
                               "import ansible.release as r; print(r.__version__)"])
    return v


def own_rc_homes(sb: Any) -> None:
    """rc-own: give each fleet host's HOME (a sandbox up with bare_shell) a copy of this account's rc
    files and, if the account has pyenv, a pyenv root of its own: its `shims` (where `pyenv rehash`,
    run by every .bashrc here, takes its lock) and `version` are the host's, every other entry is a
    symlink to the account's. So each host's rc shell does what the account's does, without the
    64 hosts of one sandbox queueing on one lock as separate machines never would."""
    home = Path.home()
    pyenv = home / ".pyenv"
    for h in sb.hosts.values():
        d = h.home
        if d is None:
            continue
        d.mkdir(parents=True, exist_ok=True)
        for rc in (".bashrc", ".profile", ".bash_profile", ".bash_login"):
            if (home / rc).is_file():
                shutil.copy2(home / rc, d / rc)
        if (home / ".cargo").is_dir() and not (d / ".cargo").exists():
            (d / ".cargo").symlink_to(home / ".cargo")  # (root's .bashrc sources ~/.cargo/env)
        if pyenv.is_dir():
            own = d / ".pyenv"
            (own / "shims").mkdir(parents=True, exist_ok=True)
            for e in pyenv.iterdir():
                if e.name in ("shims", "version"):
                    continue
                if not (own / e.name).is_symlink():
                    (own / e.name).symlink_to(e)
            if (pyenv / "version").is_file():
                shutil.copy2(pyenv / "version", own / "version")


@contextlib.contextmanager
def sandbox(work: Path, n: int, versions: list[str], gpus: int, reuse: bool = False,
            shell: str = "rc", link_above: int = 256) -> Iterator[Any]:
    from fleetctl.sandbox import lifecycle

    d = work / ("sandbox" if shell == "rc" else f"sandbox-{shell}")
    own_home = shell != "rc"  # bare and rc-own: each host's sessions get a HOME of their own
    try:
        if reuse and (d / "sandbox.json").exists():
            sb = lifecycle.load(d)
            if len(sb.hosts) >= n and all(h.alive and h.bare_shell == own_home for h in sb.hosts.values()):
                say(f"reusing the running sandbox of {len(sb.hosts)} hosts in {d}")
                if shell == "rc-own":
                    own_rc_homes(sb)
                yield sb
                return
            lifecycle.down(d)
        t0 = time.monotonic()
        say(f"building a sandbox of {n} hosts ({', '.join(versions)}, {shell} shell) in {d}")
        # above link_above hosts the trees are hard links to one copy per release (38 GB less at
        # 1,000): fleetctl and reset_host only ever rename files into place
        sb = lifecycle.up(d, hosts=n, versions=versions, gpus=gpus, bare_shell=own_home,
                          link_trees=n > link_above)
        if shell == "rc-own":
            own_rc_homes(sb)
        say(f"sandbox up in {time.monotonic() - t0:.0f}s")
        yield sb
    finally:
        rep = lifecycle.down(d, missing_ok=True)
        say(f"sandbox down: {len(rep.stopped)} process(es) stopped, {len(rep.survivors)} survivor(s)")
        if rep.survivors:
            raise SystemExit(f"sandbox processes outlived SIGKILL: {rep.survivors}")


def compile_fleetctl() -> str:
    """Compile fleetctl's own modules before timing, as `pip install` does for an installed package.
    The checkout is an editable install: with PYTHONDONTWRITEBYTECODE set (as in this machine's
    sessions) its .pyc files are never written, and every timed command compiled ~55 modules from
    source (~90 ms of CPU each time) while the other tools load their pip-compiled bytecode."""
    r = subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "fleetctl")],
                       capture_output=True, text=True, check=False)
    state = "compiled before timing" if r.returncode == 0 else f"compileall failed: {r.stdout[-200:]}"
    say(f"fleetctl bytecode: {state}")
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,32,64,128,256")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tools", default=",".join(ALL_TOOLS))
    ap.add_argument("--shells", default="rc-own,bare",
                    help="login-shell variants, one sandbox each, runs interleaved: rc-own (own HOME per host with "
                         "the account's rc files and a pyenv root of its own), bare (own empty HOME per host), rc "
                         "(every host in the account's own HOME: one pyenv, whose rehash lock they queue on)")
    ap.add_argument("--versions", default="0.5.9,0.5.14")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs per sandbox host (stand-in; launch runs one rank each)")
    ap.add_argument("--ansible-max", type=int, default=64, help="largest N for tuned ansible-core")
    ap.add_argument("--ansible-default-max", type=int, default=8, help="largest N for ansible-core with its defaults")
    ap.add_argument("--slow-runs", type=int, default=1,
                    help="runs for ansible-core above N=8 (and for its defaults at any N): it takes minutes")
    ap.add_argument("--tool-max", default="", help="largest N per tool, e.g. pyinfra=128,lean=256")
    ap.add_argument("--reuse-sandbox", action="store_true", help="use a sandbox already running in WORK/sandbox")
    ap.add_argument("--fleetctl-ops", default="check,deploy,noop,rollback",
                    help="fleetctl ops to time (deploy is always run; launch/verify-logs/stop follow --verify-logs-max; "
                         "recheck: deploy --recheck after the no-op, opt-in)")
    ap.add_argument("--big-runs", type=int, default=0, help="runs per tool above N=128 (default: --runs)")
    ap.add_argument("--link-above", type=int, default=256,
                    help="sandboxes larger than this hard-link the hosts' SGLang files to one copy per release")
    ap.add_argument("--verify-logs-max", type=int, default=64,
                    help="largest N where fleetctl launch/verify-logs/stop are timed (first run only)")
    ap.add_argument("--lean-python", default=str(VENVS / "lean" / "bin" / "python"))
    ap.add_argument("--out", default=str(BENCH / "results"))
    ap.add_argument("--work", default=None, help="scratch dir (default: a new temp dir, removed after)")
    ap.add_argument("--fresh", action="store_true", help="do not merge into an existing results.json")
    ap.add_argument("--no-phases", dest="phases", action="store_false",
                    help="run fleetctl and the lean push bare, not under bench/phases.py (no per-phase timeline, "
                         "no bytes per host)")
    ap.add_argument("--fleetctl-forks", type=int, default=0,
                    help="fleetctl's -f (default N: every host at once; the lean push's --lean-workers is its like)")
    ap.add_argument("--lean-workers", type=int, default=0,
                    help="threads of the lean push (default: N, a thread per host)")
    ap.add_argument("--note", default="", help="a line for the report (e.g. what else ran on the machine)")
    ap.add_argument("--report-only", action="store_true",
                    help="recompute the ratios and rewrite results.md from --out's results.json; run nothing")
    args = ap.parse_args(argv)
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    try:
        args.tool_max = {k.strip(): int(v) for k, v in (x.split("=", 1) for x in args.tool_max.split(",") if x.strip())}
    except ValueError:
        ap.error(f"--tool-max {args.tool_max!r}: expected TOOL=N[,TOOL=N]")
    args.lean_python = os.path.abspath(args.lean_python)  # tools run with cwd in the work dir
    unknown = [t for t in args.tools if t not in ALL_TOOLS]
    if unknown:
        ap.error(f"unknown tool(s) {unknown}; known: {', '.join(ALL_TOOLS)}")
    shells = list(dict.fromkeys(x.strip() for x in args.shells.split(",") if x.strip()))
    if not shells or set(shells) - set(SHELLS):
        ap.error(f"--shells {args.shells!r}: expected a comma list of {', '.join(SHELLS)}")
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    doc: dict[str, Any] = {"sizes": {}}
    if results.exists() and not args.fresh:
        doc = json.loads(results.read_text())
    if "variants" not in doc:  # (a results.json from before the shell variants: its rows are rc's)
        doc["variants"] = {"rc": {"sizes": doc["sizes"]}} if doc.get("sizes") else {}

    if args.report_only:
        for v in doc["variants"].values():
            for sz in v["sizes"].values():
                sz["ratios"] = ratios(sz)
        doc["sizes"] = doc["variants"].get("rc", next(iter(doc["variants"].values())))["sizes"]
        results.write_text(json.dumps(doc, indent=1) + "\n")
        (out_dir / "results.md").write_text(markdown(doc))
        return 0
    bytecode = compile_fleetctl()
    own_work = args.work is None
    work = Path(args.work or tempfile.mkdtemp(prefix="fleetctl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    ctl_dir = Path(tempfile.mkdtemp(prefix="bcp-", dir="/tmp"))  # short: ssh ControlPath sockets
    try:
        job = Job(work, versions)
        with contextlib.ExitStack() as stack:
            runners: dict[str, Runner] = {}
            for shell in shells:
                sb = stack.enter_context(sandbox(work, max(sizes), versions, args.gpus, args.reuse_sandbox, shell,
                                                 args.link_above))
                d = work if shell == "rc" else work / f"shell-{shell}"
                d.mkdir(parents=True, exist_ok=True)
                runner = runners[shell] = Runner(args, d, sb, job, shell)
                runner.ctl_dir = ctl_dir
            for n in sizes:
                for runner in runners.values():
                    runner.start(n)
                for r in range(args.runs):  # the variants interleaved: A, B, A, B, ...
                    for runner in runners.values():
                        runner.one_run(r)
                for shell, runner in runners.items():
                    sz = runner.finish()
                    vsizes = doc["variants"].setdefault(shell, {"sizes": {}})["sizes"]
                    old = vsizes.get(str(n), {}).get("tools", {})
                    kept = sorted(t for t in old if t not in sz["tools"])
                    if kept:  # a re-run of some tools keeps the others' rows for this N (measured earlier)
                        sz["tools"] = {**sz["tools"], **{t: old[t] for t in kept}}
                        sz["kept_from_earlier_run"] = kept
                    sz["ratios"] = ratios(sz)
                    sz["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    vsizes[str(n)] = sz
                    say(f"N={n} {shell} shell done; ratios {sz['ratios']}")
                doc["sizes"] = doc["variants"].get("rc", next(iter(doc["variants"].values())))["sizes"]
                doc["meta"] = {
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
                    "cpus": os.cpu_count(),
                    "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                    "versions": versions,
                    "playbook": str(PLAYBOOK.relative_to(REPO)),
                    "tool_versions": {**doc.get("meta", {}).get("tool_versions", {}),
                                      **tool_versions(args.tools, args.lean_python)},
                    "note": args.note or doc.get("meta", {}).get("note", ""),
                    "sandbox_hosts": max(sizes),
                    "fleetctl_bytecode": bytecode,
                    "shells": shells,
                    "order": "shell variants interleaved per run; tools rotating per run, reversed on odd runs with more than two tools; "
                             "hosts reset to pristine before each tool",
                }
                tmp = results.with_suffix(".json.tmp")
                tmp.write_text(json.dumps(doc, indent=1) + "\n")
                os.replace(tmp, results)
                (out_dir / "results.md").write_text(markdown(doc))
    finally:
        shutil.rmtree(ctl_dir, ignore_errors=True)
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
