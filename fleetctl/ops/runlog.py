"""Run logs and retry files (issue 32.5).

Every command that acts on hosts appends JSON lines to a run log: `<controller state>/runs.jsonl`
(config/paths.py state_dir()), or the file `--log-file` names. One object a line, each with the run's id
(`run`), a sequence number, the time (`t`, epoch seconds) and its `event`:

    start     the command, its arguments (argv), inventory, the selected hosts, who and where
    plan      the plan the command built (deploy, rollback, launch --check), as its --json shows it
    host      a host's step started (`phase: start`, `step`) or ended (`phase: end`, status,
              message, elapsed)
    result    per host: ok, state, message (what the command reports); `op_id` of its ledger entry
    end       exit code, elapsed, the hosts that failed and the retry file written for them, the
              hosts refused (a refusal is not retried: it names its own fix)

`fleetctl history show ID` reads a run's events back (ID: the run id or the ledger's op id).
A run with failed hosts writes them, one a line, to `<controller state>/retry/<command>.retry`
(Ansible's retry file) and says how to rerun on them alone: `--limit @PATH`; refused hosts are not
in it (the same command would be refused again) and get a line of their own. Writing the log never
fails a command: a log that cannot be written is said once on stderr. Secrets never reach it (the
inventory's secret env values, the become password: neither is in any event). Stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

MAX_EVENT = 1 << 20  # bytes of one event line (a larger plan is cut to its summary)


def default_path() -> Path:
    from fleetctl.config.paths import state_dir

    return state_dir() / "runs.jsonl"


def retry_dir() -> Path:
    from fleetctl.config.paths import state_dir

    return state_dir() / "retry"


def new_run_id() -> str:
    import secrets

    return f"x{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class RunLog:
    """The events of one run, appended to `path` (one write per line, O_APPEND: runs of several
    controllers may share the file)."""

    def __init__(self, path: Path, command: str) -> None:
        self.path = path
        self.command = command
        self.run = new_run_id()
        self.started = time.monotonic()
        self._seq = 0
        self._lock = threading.Lock()
        self._broken = False
        self.result_rows: list[dict[str, Any]] | None = None
        self.op_id: str | None = None

    def event(self, event: str, **data: Any) -> None:
        with self._lock:
            if self._broken:
                return
            self._seq += 1
            doc = {"run": self.run, "seq": self._seq, "t": round(time.time(), 3), "event": event,
                   "command": self.command, **data}
            text = json.dumps(doc, default=str, ensure_ascii=True, separators=(",", ":"))
            if len(text) > MAX_EVENT:
                doc = {k: v for k, v in doc.items() if k not in ("plan", "hosts")} | {"truncated": True}
                text = json.dumps(doc, default=str, ensure_ascii=True, separators=(",", ":"))
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, (text + "\n").encode("ascii"))
                finally:
                    os.close(fd)
            except OSError as e:
                self._broken = True
                sys.stderr.write(f"fleetctl: the run log {self.path} cannot be written ({e.strerror or e}); "
                                 "the command goes on without it\n")

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 3)


_current: RunLog | None = None


def current() -> RunLog | None:
    return _current


def begin(command: str, *, log_file: str | None, argv: Sequence[str], inventory: Path, hosts: Iterable[Any]
          ) -> RunLog:
    """Open the run's log and write its start event; it becomes current() until end()."""
    global _current
    path = Path(log_file).expanduser() if log_file else default_path()
    log = RunLog(path, command)
    import getpass
    import socket

    log.event("start", argv=list(argv), inventory=str(inventory), cwd=os.getcwd(), user=getpass.getuser(),
              controller=socket.gethostname(), pid=os.getpid(),
              hosts=[{"host": h.name, "address": h.address, "port": h.port, "user": h.user,
                      "become": h.become_as if h.becomes else None} for h in hosts])
    _current = log
    return log


def plan(data: Any) -> None:
    """The command's plan (what its --json `plan` holds)."""
    if _current is not None:
        _current.event("plan", plan=data)


def result(rows: Iterable[Mapping[str, Any]], *, op_id: str | None = None) -> None:
    """What the command reports per host: each row's host, ok, state and message."""
    log = _current
    if log is None:
        return
    kept = [{"host": str(r.get("host")), "ok": bool(r.get("ok")), "state": str(r.get("state", "")),
             "message": str(r.get("message") or "")} for r in rows]
    log.result_rows = kept
    log.op_id = op_id or log.op_id
    log.event("result", op_id=op_id, hosts=kept)


def host_event(step: str, host: str, phase: str, **data: Any) -> None:
    if _current is not None:
        _current.event("host", step=step, host=host, phase=phase, **data)


def end(exit_code: int, *, fallback_failed: Iterable[str] = (), argv: Sequence[str] = ()) -> str | None:
    """The run's last event; with failed hosts, the retry file. Returns the line that says how to
    rerun on the failed hosts alone and, for refused hosts, the line that says a rerun is not their
    fix (None when neither)."""
    global _current
    log, _current = _current, None
    if log is None:
        return None
    refused: list[str] = []
    if log.result_rows is not None:
        failed = [r["host"] for r in log.result_rows if not r["ok"] and r["state"] not in VERDICTS]
        refused = [r["host"] for r in log.result_rows if not r["ok"] and r["state"] == "refused"]
    else:
        failed = list(dict.fromkeys(fallback_failed))
    retry = None
    said: list[str] = []
    if failed and exit_code != 0:
        retry = write_retry(log.command, failed)
        if retry is not None:
            said.append(f"retry: {len(failed)} host(s) failed; rerun on them alone: "
                        f"{rerun_command(argv, retry)}")
    if refused and exit_code != 0:
        from fleetctl.model.hostnames import hosts_label

        said.append(f"refused: {hosts_label(refused)}: no retry (nothing was changed there; the same command "
                    f"would be refused again): do what each host's refusal says, then run it again")
    log.event("end", exit_code=exit_code, elapsed=log.elapsed(), failed=failed, refused=refused,
              retry_file=str(retry) if retry else None, op_id=log.op_id)
    return "\n".join(said) or None


# a host's state that is a decision about it, not a failure on it: a rerun as it is decides the same
# (a refusal names its own fix; status's problems are listed with theirs), so no retry is offered
VERDICTS = frozenset({"refused", "problems"})


def write_retry(command: str, hosts: list[str]) -> Path | None:
    """`<state>/retry/<command>.retry`: the failed hosts, one a line (what `--limit @FILE` reads)."""
    d = retry_dir()
    path = d / f"{command}.retry"
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(f"{h}\n" for h in hosts))
        os.replace(tmp, path)
    except OSError as e:
        sys.stderr.write(f"fleetctl: the retry file {path} cannot be written ({e.strerror or e})\n")
        return None
    return path


# options whose value is the next word (so both are dropped when the rerun replaces --limit)
_LIMIT = ("--limit", "-l")
_DROP = ("--json",)


def rerun_command(argv: Sequence[str], retry: Path) -> str:
    """The command as it was run, with `--limit @RETRY` in place of its --limit (quoted for a shell)."""
    import shlex

    args: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _LIMIT:
            skip = True
            continue
        if a.startswith("--limit=") or (a.startswith("-l") and not a.startswith("--") and len(a) > 2):
            continue
        if a in _DROP:
            continue
        args.append(a)
    return shlex.join(["fleetctl", *args, "--limit", f"@{retry}"])


def read_events(path: Path, ident: str) -> list[dict[str, Any]]:
    """The events of run `ident` (its run id, or the op id its result or end names) in `path`."""
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for ln in f:
                try:
                    ev = json.loads(ln)
                except ValueError:
                    continue
                if isinstance(ev, dict) and isinstance(ev.get("run"), str):
                    runs.setdefault(ev["run"], []).append(ev)
    except FileNotFoundError:
        return []
    if ident in runs:
        return runs[ident]
    for evs in runs.values():
        if any(e.get("op_id") == ident for e in evs):
            return evs
    return []
