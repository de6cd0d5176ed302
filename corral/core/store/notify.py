"""The notifications concern of the store (migration ``notify``): each person's choices,
the outbox of every notification corral decided to send (sent, waiting or given up), and
the marks the notifier keeps (how far it has read the job events; the budget levels it
already told). corral/notify/ decides and delivers; this is only its SQL.

An outbox row's ``key`` is unique: the event it tells of, its recipient and its channel.
The notifier may read an event twice (a crash after enqueueing, before it moved its
mark): the second insert is ignored, so nothing is told twice by corral's own doing.
"""

from __future__ import annotations

import json
from typing import Any

from corral.core.store.conn import Conn

COLUMNS = "id, key, recipient, about, kind, channel, target, subject, body, created, due, attempts, state, sent, error"


class NotifyRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    # -- a person's choices -------------------------------------------------------------
    def prefs(self, principal: str) -> dict[str, Any] | None:
        row = self.conn.one("SELECT prefs FROM notify_prefs WHERE principal=?", (principal,))
        return json.loads(row[0]) if row else None

    def set_prefs(self, principal: str, prefs: dict[str, Any], now: float) -> None:
        with self.conn.transaction():
            self.conn.execute("DELETE FROM notify_prefs WHERE principal=?", (principal,))
            self.conn.execute("INSERT INTO notify_prefs (principal, prefs, updated) VALUES (?,?,?)",
                              (principal, json.dumps(prefs, sort_keys=True), now))

    # -- the notifier's marks -----------------------------------------------------------
    def mark(self, name: str) -> float | None:
        row = self.conn.one("SELECT value FROM notify_marks WHERE name=?", (name,))
        return float(row[0]) if row else None

    def set_mark(self, name: str, value: float) -> None:
        with self.conn.transaction():
            self.conn.execute("DELETE FROM notify_marks WHERE name=?", (name,))
            self.conn.execute("INSERT INTO notify_marks (name, value) VALUES (?,?)", (name, value))

    # -- the outbox ---------------------------------------------------------------------
    def enqueue(self, rows: list[dict[str, Any]]) -> int:
        """Insert each row unless its key is there already; -> how many were new."""
        new = 0
        with self.conn.transaction():
            for r in rows:
                cur = self.conn.execute(self.conn.insert_ignore(
                    "notify_outbox", "key, recipient, about, kind, channel, target, subject, body, created, due", 10),
                    (r["key"], r["recipient"], r["about"], r["kind"], r["channel"], r["target"], r["subject"],
                     r["body"], r["created"], r["due"]))
                new += max(cur.rowcount, 0)
        return new

    def due(self, now: float, limit: int) -> list[dict[str, Any]]:
        """Pending rows whose time has come, oldest first."""
        rows = self.conn.execute(f"SELECT {COLUMNS} FROM notify_outbox WHERE state='pending' AND due <= ? "
                                 "ORDER BY due, id LIMIT ?", (now, limit)).fetchall()
        return [dict(zip(COLUMNS.split(", "), r)) for r in rows]

    def pending_of(self, recipient: str, channel: str, target: str, now: float) -> list[dict[str, Any]]:
        """Every pending row due now for one recipient's channel (a digest gathers them)."""
        rows = self.conn.execute(f"SELECT {COLUMNS} FROM notify_outbox WHERE state='pending' AND due <= ? "
                                 "AND recipient=? AND channel=? AND target=? ORDER BY id LIMIT 500",
                                 (now, recipient, channel, target)).fetchall()
        return [dict(zip(COLUMNS.split(", "), r)) for r in rows]

    def sent(self, ids: list[int], now: float) -> None:
        with self.conn.transaction():
            for i in ids:
                self.conn.execute("UPDATE notify_outbox SET state='sent', sent=?, attempts=attempts+1, error=NULL "
                                  "WHERE id=?", (now, i))

    def failed(self, ids: list[int], error: str, due: float | None) -> None:
        """A try that failed: again at ``due``, or given up (None)."""
        with self.conn.transaction():
            for i in ids:
                if due is None:
                    self.conn.execute("UPDATE notify_outbox SET state='failed', attempts=attempts+1, error=? "
                                      "WHERE id=?", (error[:500], i))
                else:
                    self.conn.execute("UPDATE notify_outbox SET attempts=attempts+1, error=?, due=? WHERE id=?",
                                      (error[:500], due, i))

    def defer(self, ids: list[int], due: float) -> None:
        """Quiet hours: the same rows, later, without counting a try."""
        with self.conn.transaction():
            for i in ids:
                self.conn.execute("UPDATE notify_outbox SET due=? WHERE id=?", (due, i))

    def recent(self, recipient: str | None, limit: int) -> list[dict[str, Any]]:
        """The newest notifications (to ``recipient`` only, unless None), newest first."""
        where, args = ("WHERE recipient=?", [recipient]) if recipient is not None else ("", [])
        rows = self.conn.execute(f"SELECT {COLUMNS} FROM notify_outbox {where} ORDER BY id DESC LIMIT ?",
                                 [*args, limit]).fetchall()
        return [dict(zip(COLUMNS.split(", "), r)) for r in rows]

    def counts(self) -> dict[str, int]:
        rows = self.conn.execute("SELECT state, COUNT(*) FROM notify_outbox GROUP BY state").fetchall()
        return {str(s): int(n) for s, n in rows}
