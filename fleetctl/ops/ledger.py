"""The local history of deploys and rollbacks (SQLite, stdlib).

Location: $FLEETCTL_STATE_DIR/ledger.sqlite, else $XDG_STATE_HOME/fleetctl/, else
~/.local/state/fleetctl/. The remote manifests remain the source of truth for rollback; the
ledger is what `fleetctl history` reads.

Each operation records who runs it: the controller's host name, boot id, pid and the process's start
time. An operation that never finished and whose process is gone (another boot, no such pid, or a
pid reused by a younger process) is marked `interrupted` the next time the ledger is opened on that
machine; its selected hosts keep the status `pending` (no result was ever recorded for them).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

from fleetctl.config.paths import state_dir

SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    started REAL NOT NULL,
    finished REAL,
    user TEXT NOT NULL,
    controller TEXT NOT NULL,
    inventory TEXT, inventory_sha256 TEXT,
    playbook TEXT, playbook_sha256 TEXT,
    args TEXT,
    outcome TEXT,
    pid INTEGER, boot_id TEXT, proc_start TEXT, interrupted_seen REAL
);
CREATE TABLE IF NOT EXISTS host_results (
    op_id TEXT NOT NULL REFERENCES operations(id),
    host TEXT NOT NULL,
    status TEXT NOT NULL,
    message TEXT,
    detail TEXT,
    PRIMARY KEY (op_id, host)
);
"""


# columns added after the first release: ALTERed into older ledgers on open
_NEW_COLUMNS = {"pid": "INTEGER", "boot_id": "TEXT", "proc_start": "TEXT", "interrupted_seen": "REAL"}
DONE = ("ok", "changed", "unchanged")


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def process_alive(pid: int | None, boot: str | None, start: str | None) -> bool | None:
    """Is the process that wrote an entry on THIS machine still running? None: cannot tell."""
    if pid is None:
        return None
    if boot and boot_id() and boot != boot_id():
        return False  # the machine rebooted since
    if start is not None and Path("/proc").is_dir():
        return proc_start(pid) == start  # gone, or the pid now names a younger process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _digest(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _storable(s: Any) -> Any:
    """Host text may hold lone surrogates (a non-UTF-8 file name sent as JSON): SQLite cannot store
    them, so they are kept as their escape (\\udcff) instead of failing the whole command."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(s, str) else s


class Ledger:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / "ledger.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=30)
        self.db.executescript(SCHEMA)
        have = {r[1] for r in self.db.execute("PRAGMA table_info(operations)")}
        with self.db:
            for col, typ in _NEW_COLUMNS.items():
                if col not in have:
                    self.db.execute(f"ALTER TABLE operations ADD COLUMN {col} {typ}")
        self.mark_interrupted()

    def mark_interrupted(self) -> list[str]:
        """Mark `interrupted` every unfinished operation started on this machine whose process is gone."""
        me = socket.gethostname()
        gone = [op_id for op_id, pid, boot, start in self.db.execute(
                    "SELECT id, pid, boot_id, proc_start FROM operations "
                    "WHERE outcome IS NULL AND finished IS NULL AND controller=?", (me,)).fetchall()
                if process_alive(pid, boot, start) is False]
        if gone:
            with self.db:
                self.db.executemany("UPDATE operations SET outcome='interrupted', interrupted_seen=? "
                                    "WHERE id=? AND outcome IS NULL", [(time.time(), i) for i in gone])
        return gone

    def close(self) -> None:
        self.db.close()

    def start(self, op_id: str, kind: str, *, inventory: Path | None, playbook: Path | None,
              args: dict[str, Any], hosts: list[str] | None = None) -> None:
        """Record an operation before it touches any host; `hosts` (the selection) stay `pending`
        until finish() records their results."""
        pid = os.getpid()
        with self.db:
            self.db.execute(
                "INSERT INTO operations (id, kind, started, user, controller, inventory, inventory_sha256, "
                "playbook, playbook_sha256, args, pid, boot_id, proc_start) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (op_id, kind, time.time(), getpass.getuser(), socket.gethostname(),
                 _storable(str(Path(inventory).absolute())) if inventory else None, _digest(inventory),
                 # absolute: a command suggested from the ledger later runs from any directory
                 _storable(str(Path(playbook).absolute())) if playbook else None, _digest(playbook),
                 json.dumps(args, default=str),
                 pid, boot_id(), proc_start(pid)))
            self.db.executemany(
                "INSERT OR REPLACE INTO host_results (op_id, host, status, message, detail) VALUES (?,?,?,?,?)",
                [(op_id, _storable(h), "pending", "no result recorded", None) for h in hosts or []])

    def finish(self, op_id: str, outcome: str, hosts: list[dict[str, Any]]) -> None:
        with self.db:
            self.db.execute("UPDATE operations SET finished=?, outcome=? WHERE id=?", (time.time(), outcome, op_id))
            self.db.execute("DELETE FROM host_results WHERE op_id=? AND status='pending'", (op_id,))
            self.db.executemany(
                "INSERT OR REPLACE INTO host_results (op_id, host, status, message, detail) VALUES (?,?,?,?,?)",
                [(op_id, _storable(h["host"]), _storable(h["status"]), _storable(h.get("message", "")),
                  json.dumps(h.get("detail"), default=str)) for h in hosts])

    def list(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT o.id, o.kind, o.started, o.finished, o.user, o.outcome, o.playbook, "
            "(SELECT COUNT(*) FROM host_results h WHERE h.op_id=o.id), "
            "(SELECT COUNT(*) FROM host_results h WHERE h.op_id=o.id AND h.status NOT IN ('ok','changed','unchanged',"
            "'skipped','pending','untouched','rolled-back')), "  # (a rollout's hosts kept out of a failed batch)
            "(SELECT COUNT(*) FROM host_results h WHERE h.op_id=o.id AND h.status='pending'), o.controller, o.pid, "
            "(SELECT COUNT(*) FROM host_results h WHERE h.op_id=o.id AND h.status NOT IN ('unchanged','skipped'))"
            " FROM operations o ORDER BY o.started DESC LIMIT ?", (limit,)).fetchall()
        keys = ["id", "kind", "started", "finished", "user", "outcome", "playbook", "hosts", "hosts_failed",
                "hosts_pending", "controller", "pid", "hosts_acted"]
        out = []
        for r in rows:
            d = dict(zip(keys, r, strict=True))
            # a deploy or rollback that changed no host and failed none (every host unchanged/skipped)
            d["noop"] = (d["kind"] in ("deploy", "rollback") and d["outcome"] == "ok" and d["hosts"] > 0
                         and d.pop("hosts_acted") == 0)
            d.pop("hosts_acted", None)
            out.append(d)
        return out

    def last_change(self, host: str) -> tuple[str, str, Any] | None:
        """The newest deploy or rollback that changed `host` (by its inventory name): (op id, kind,
        its recorded detail), or None."""
        row = self.db.execute(
            "SELECT o.id, o.kind, h.detail FROM host_results h JOIN operations o ON o.id = h.op_id "
            "WHERE h.host=? AND h.status='changed' AND o.kind IN ('deploy', 'rollback') "
            "ORDER BY o.started DESC LIMIT 1", (_storable(host),)).fetchone()
        if row is None:
            return None
        try:
            detail = json.loads(row[2]) if row[2] else None
        except ValueError:
            detail = None
        return row[0], row[1], detail

    def get(self, op_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT id, kind, started, finished, user, controller, inventory, inventory_sha256, "
                              "playbook, playbook_sha256, args, outcome, pid, boot_id, proc_start, interrupted_seen "
                              "FROM operations WHERE id=?",
                              (op_id,)).fetchone()
        if row is None:
            return None
        keys = ["id", "kind", "started", "finished", "user", "controller", "inventory", "inventory_sha256",
                "playbook", "playbook_sha256", "args", "outcome", "pid", "boot_id", "proc_start",
                "interrupted_seen"]
        d = dict(zip(keys, row, strict=True))
        d["args"] = json.loads(d["args"] or "{}")
        d["hosts"] = [
            {"host": h, "status": s, "message": m, "detail": json.loads(dt) if dt else None}
            for h, s, m, dt in self.db.execute(
                "SELECT host, status, message, detail FROM host_results WHERE op_id=? ORDER BY host", (op_id,))
        ]
        return d
