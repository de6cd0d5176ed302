"""The ledger's SQL (migration 18): what each principal has been told and not yet
acknowledged: its jobs' ends and its budgets' levels, each once (a unique key per event),
kept until the principal acknowledges it (reading the job by id, or an explicit ack) and
then for a week (corral/notify/notifier.py writes; corral/edges/mcp/answers.py reads)."""

from __future__ import annotations

from typing import Any

from corral.core.store.conn import Conn

KEEP_S = 7 * 86400.0


class LedgerRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def add(self, rows: list[tuple[str, str, str, int | None, str, float]]) -> None:
        """(key, principal, kind, job_id, text, at) each, unless its key is there."""
        if rows:
            self.conn.executemany(self.conn.insert_ignore("ledger", "key, principal, kind, job_id, text, at", 6), rows)

    def unacked(self, principal: str, limit: int) -> tuple[list[dict[str, Any]], int]:
        """The oldest entries not acknowledged (at most ``limit``), and how many there are."""
        rows = self.conn.all("SELECT id, kind, job_id, text, at FROM ledger WHERE principal=? AND acked IS NULL "
                             "ORDER BY id LIMIT ?", (principal, limit))
        total = len(rows) if len(rows) < limit else int(self.conn.one(
            "SELECT COUNT(*) FROM ledger WHERE principal=? AND acked IS NULL", (principal,))[0])
        return [dict(zip(("id", "kind", "job_id", "text", "at"), r)) for r in rows], total

    def ack_job(self, principal: str, job_id: int, at: float) -> int:
        return self.conn.execute("UPDATE ledger SET acked=? WHERE principal=? AND job_id=? AND acked IS NULL",
                                 (at, principal, job_id)).rowcount

    def ack(self, principal: str, up_to: int, at: float) -> int:
        return self.conn.execute("UPDATE ledger SET acked=? WHERE principal=? AND id<=? AND acked IS NULL",
                                 (at, principal, up_to)).rowcount

    def prune(self, before: float) -> int:
        return self.conn.execute("DELETE FROM ledger WHERE at < ?", (before,)).rowcount
