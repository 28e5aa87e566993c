"""The local history of deploys and rollbacks (SQLite, stdlib).

Location: $FLEETCTL_STATE_DIR/ledger.sqlite, else $XDG_STATE_HOME/fleetctl/, else
~/.local/state/fleetctl/. The remote manifests remain the source of truth for rollback; the
ledger is what `fleetctl history` reads.
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
    outcome TEXT
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


def state_dir() -> Path:
    env = os.environ.get("FLEETCTL_STATE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state") / "fleetctl"


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

    def close(self) -> None:
        self.db.close()

    def start(self, op_id: str, kind: str, *, inventory: Path | None, playbook: Path | None,
              args: dict[str, Any]) -> None:
        with self.db:
            self.db.execute(
                "INSERT INTO operations (id, kind, started, user, controller, inventory, inventory_sha256, "
                "playbook, playbook_sha256, args) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (op_id, kind, time.time(), getpass.getuser(), socket.gethostname(),
                 _storable(str(inventory)) if inventory else None, _digest(inventory),
                 _storable(str(playbook)) if playbook else None, _digest(playbook), json.dumps(args, default=str)))

    def finish(self, op_id: str, outcome: str, hosts: list[dict[str, Any]]) -> None:
        with self.db:
            self.db.execute("UPDATE operations SET finished=?, outcome=? WHERE id=?", (time.time(), outcome, op_id))
            self.db.executemany(
                "INSERT OR REPLACE INTO host_results (op_id, host, status, message, detail) VALUES (?,?,?,?,?)",
                [(op_id, _storable(h["host"]), _storable(h["status"]), _storable(h.get("message", "")),
                  json.dumps(h.get("detail"), default=str)) for h in hosts])

    def list(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT o.id, o.kind, o.started, o.finished, o.user, o.outcome, o.playbook, "
            "(SELECT COUNT(*) FROM host_results h WHERE h.op_id=o.id), "
            "(SELECT COUNT(*) FROM host_results h WHERE h.op_id=o.id AND h.status NOT IN ('ok','changed','unchanged'))"
            " FROM operations o ORDER BY o.started DESC LIMIT ?", (limit,)).fetchall()
        keys = ["id", "kind", "started", "finished", "user", "outcome", "playbook", "hosts", "hosts_failed"]
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def get(self, op_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT id, kind, started, finished, user, controller, inventory, inventory_sha256, "
                              "playbook, playbook_sha256, args, outcome FROM operations WHERE id=?",
                              (op_id,)).fetchone()
        if row is None:
            return None
        keys = ["id", "kind", "started", "finished", "user", "controller", "inventory", "inventory_sha256",
                "playbook", "playbook_sha256", "args", "outcome"]
        d = dict(zip(keys, row, strict=True))
        d["args"] = json.loads(d["args"] or "{}")
        d["hosts"] = [
            {"host": h, "status": s, "message": m, "detail": json.loads(dt) if dt else None}
            for h, s, m, dt in self.db.execute(
                "SELECT host, status, message, detail FROM host_results WHERE op_id=? ORDER BY host", (op_id,))
        ]
        return d
