"""The audit concern of the store: the head of the audit chain (its last sequence
number and MAC), so that a truncated or rewritten log is caught (corral/safety/audit.py)."""

from __future__ import annotations

from corral.core.store.conn import Conn


class Audit:
    """The audit chain's head; mixed into ``Database`` (``db.audit_head``...)."""

    conn: Conn

    def audit_head(self) -> tuple[int, str] | None:
        r = self.conn.execute("SELECT seq, mac FROM audit_head WHERE id=1").fetchone()
        return (int(r[0]), str(r[1])) if r else None

    def set_audit_head(self, seq: int, mac: str) -> None:
        self.conn.execute("INSERT INTO audit_head (id, seq, mac) VALUES (1, ?, ?) "
                          "ON CONFLICT(id) DO UPDATE SET seq=excluded.seq, mac=excluded.mac "
                          # Replicas append to one chain: a head set late never moves it back.
                          "WHERE audit_head.seq < excluded.seq", (seq, mac))
