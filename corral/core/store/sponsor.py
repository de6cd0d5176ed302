"""The sponsor's view's SQL (migration 17): each agent's refusals counted per rule and
day as the audit records them (the audit itself is a file of every decision, too long to
read for a page), and what each agent ran and used over a window."""

from __future__ import annotations

from typing import Any, Iterable

from corral.core.store.conn import Conn


class SponsorRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def count_refusal(self, principal: str, rule: str, day: int, at: float, reason: str) -> None:
        with self.conn.transaction():
            n = self.conn.execute("UPDATE refusal_counts SET n = n + 1, last = ?, last_reason = ? "
                                  "WHERE principal=? AND rule=? AND day=?",
                                  (at, reason[:300], principal, rule, day)).rowcount
            if n == 0:
                self.conn.execute(self.conn.insert_ignore(
                    "refusal_counts", "principal, rule, day, n, last, last_reason", 6),
                    (principal, rule, day, 1, at, reason[:300]))

    def refusals(self, names: Iterable[str], since_day: int) -> list[dict[str, Any]]:
        listed = sorted(names)
        rows = self.conn.all(
            f"SELECT principal, rule, SUM(n), MAX(last) FROM refusal_counts WHERE principal IN "
            f"({self.conn.marks(len(listed))}) AND day >= ? GROUP BY principal, rule ORDER BY principal, SUM(n) DESC",
            [*listed, since_day])
        out = []
        for who, rule, n, last in rows:
            reason = self.conn.one("SELECT last_reason FROM refusal_counts WHERE principal=? AND rule=? AND last=?",
                                   (who, rule, last))
            out.append({"principal": who, "rule": rule, "count": int(n), "last": last,
                        "last_reason": reason[0] if reason else None})
        return out

    def ran(self, names: Iterable[str], since: float, now: float) -> list[dict[str, Any]]:
        """Per agent and state: jobs submitted since ``since`` and the CPU-hours they held
        (CPUs x time from start to end, or to now)."""
        listed = sorted(names)
        cpus = self.conn.json("spec", "cpus", num=True)
        rows = self.conn.all(
            f"""SELECT principal, state, COUNT(*),
                       SUM(CASE WHEN start_time IS NULL THEN 0
                                ELSE (COALESCE(end_time, ?) - start_time) * COALESCE({cpus}, 1) END)
                FROM jobs WHERE principal IN ({self.conn.marks(len(listed))}) AND submit_time >= ?
                GROUP BY principal, state""", [now, *listed, since])
        return [{"principal": p, "state": s, "jobs": int(n), "cpu_hours": round(float(c or 0) / 3600, 4)}
                for p, s, n, c in rows]
