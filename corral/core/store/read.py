"""The dashboard's read model: what the operator's pages and /metrics show, as plain
rows and dicts, read with the store's SQL (corral/edges/dashboard/ writes none).

"Live or recent" is always two index reads (the live jobs' partial index, then submit or
end time), never a scan of the history.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Iterable

from corral.core.store.conn import Conn, is_postgres
from corral.core.store.jobs import ACTIVE


class ReadModel:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def _in(self, column: str, names: Iterable[str] | None) -> tuple[str, list[Any]]:
        if names is None:
            return "1=1", []
        listed = sorted(names)
        return f"{column} IN ({self.conn.marks(len(listed))})", listed

    def _recent(self, col: str) -> str:
        return f"SELECT id FROM jobs WHERE {ACTIVE} UNION SELECT id FROM jobs WHERE {col} > ?"

    # -- jobs ---------------------------------------------------------------------------------

    def submitted_since(self, after_id: int) -> list[tuple[str, str, int, int]]:
        """(principal, lane, jobs, highest id) of the jobs after ``after_id``: jobs are never
        deleted, so a counter reads only the rows added since it last looked."""
        # NOT INDEXED (SQLite): a rowid range, not an index scan in GROUP BY order.
        hint = "" if self.conn.pg else " NOT INDEXED"
        return [(p, lane, int(n), int(top)) for p, lane, n, top in self.conn.all(
            f"SELECT principal, backend, COUNT(*), MAX(id) FROM jobs{hint} WHERE id > ? GROUP BY principal, backend",
            (after_id,))]

    def sessions(self, since: float, names: Iterable[str] | None, but: str, limit: int = 200) -> list[dict[str, Any]]:
        """Sessions with jobs live or submitted since ``since``, newest first."""
        where, args = self._in("j.principal", names)
        keys = ("principal", "kind", "sponsor", "session", "active", "jobs", "last")
        rows = self.conn.all(
            f"""SELECT j.principal, p.kind, p.sponsor, COALESCE(j.session, '-'),
                       SUM(CASE WHEN j.{ACTIVE} THEN 1 ELSE 0 END), COUNT(*), MAX(j.submit_time)
                FROM jobs j JOIN principals p ON p.name = j.principal
                WHERE j.id IN ({self._recent("submit_time")}) AND {where} AND j.principal != ?
                GROUP BY j.principal, j.session, p.kind, p.sponsor ORDER BY MAX(j.submit_time) DESC LIMIT ?""",
            [since, *args, but, limit])
        return [dict(zip(keys, (a, b, c, d, int(e), int(f), g))) for a, b, c, d, e, f, g in rows]

    def states(self, since: float, names: Iterable[str] | None, but: str) -> list[dict[str, Any]]:
        """Jobs live or ended since ``since``, by state and lane."""
        where, args = self._in("j.principal", names)
        return [{"state": s, "lane": lane, "count": int(n)} for s, lane, n in self.conn.all(
            f"""SELECT j.state, j.backend, COUNT(*) FROM jobs j
                WHERE j.id IN ({self._recent("end_time")}) AND {where} AND j.principal != ?
                GROUP BY j.state, j.backend ORDER BY j.state, j.backend""", [since, *args, but])]

    def submissions_by_kind(self, since: float, names: Iterable[str] | None, but: str) -> dict[str, int]:
        where, args = self._in("j.principal", names)
        return {k: int(n) for k, n in self.conn.all(
            f"""SELECT p.kind, COUNT(*) FROM jobs j JOIN principals p ON p.name = j.principal
                WHERE {where} AND j.principal != ? AND j.submit_time > ? GROUP BY p.kind""", [*args, but, since])}

    def spans(self, since: float, names: Iterable[str] | None, limit: int = 100_000) -> list[tuple[Any, ...]]:
        """(principal, kind, lane, state, submit, start, end, cpus) of the jobs live, submitted
        or ended since ``since``: what the history plots draw."""
        where, args = self._in("j.principal", names)
        return self.conn.all(
            f"""SELECT j.principal, p.kind, j.backend, j.state, j.submit_time, j.start_time, j.end_time,
                       {self.conn.json('j.spec', 'cpus', num=True)}
                FROM jobs j JOIN principals p ON p.name = j.principal
                WHERE j.id IN (SELECT id FROM jobs WHERE {ACTIVE}
                               UNION SELECT id FROM jobs WHERE submit_time > ?
                               UNION SELECT id FROM jobs WHERE end_time > ?) AND {where}
                LIMIT ?""", [since, since, *args, limit])

    def live(self, but: str) -> list[tuple[str, str, int]]:
        """(state, lane, jobs) of the jobs not yet ended."""
        return [(s, lane, int(n)) for s, lane, n in self.conn.all(
            f"SELECT state, backend, COUNT(*) FROM jobs WHERE {ACTIVE} AND principal != ? GROUP BY state, backend",
            (but,))]

    def live_sessions_by_kind(self, but: str) -> list[tuple[str, int]]:
        return [(k, int(n)) for k, n in self.conn.all(
            f"""SELECT p.kind, COUNT(DISTINCT j.principal || '/' || COALESCE(j.session, ''))
                FROM jobs j JOIN principals p ON p.name = j.principal
                WHERE j.{ACTIVE} AND j.principal != ? GROUP BY p.kind""", (but,))]

    # -- principals, tokens, taint ------------------------------------------------------------

    def kinds(self) -> dict[str, str]:
        return dict(self.conn.all("SELECT name, kind FROM principals"))

    def sponsors(self) -> dict[str, str | None]:
        return dict(self.conn.all("SELECT name, sponsor FROM principals"))

    def live_tokens(self, names: Iterable[str] | None, limit: int = 200) -> list[tuple[str, str, str | None, str | None]]:
        """(id, principal, sponsor, note) of unrevoked opaque tokens, newest first."""
        where, args = self._in("t.principal", names)
        return [tuple(r) for r in self.conn.all(
            f"""SELECT t.id, t.principal, p.sponsor, t.note FROM tokens t JOIN principals p ON p.name = t.principal
                WHERE {where} AND t.revoked IS NULL ORDER BY t.created DESC LIMIT ?""", [*args, limit])]

    def tainted(self, names: Iterable[str] | None, limit: int = 100) -> list[dict[str, Any]]:
        where, args = self._in("principal", names)
        return [{"key": k, "principal": p, "at": at, "reason": r} for k, p, at, r in self.conn.all(
            f"SELECT key, principal, at, reason FROM taint WHERE {where} ORDER BY at DESC LIMIT ?", [*args, limit])]

    def taint_count(self) -> int:
        return int(self.conn.one("SELECT COUNT(*) FROM taint")[0])


def report_rows(where: Path | str) -> list[tuple[Any, ...]]:
    """Every job with its principal's Unix user, account and kind, for the analytics
    report (corral/analytics/ingest.py): job id (text), user, account, partition, name,
    submit, start, end, state, exit code, CPUs, GPUs, kind, principal. A SQLite file is
    opened read-only (the report may read a copy, or a live gateway's file)."""
    sql = """SELECT CAST(j.id AS TEXT), COALESCE(p.unix_user, j.principal), p.account,
                    {partition}, {name}, j.submit_time, j.start_time, j.end_time, j.state, j.exit_code,
                    {cpus}, {gpus}, p.kind, j.principal
             FROM jobs j JOIN principals p ON p.name = j.principal ORDER BY j.id"""
    if is_postgres(str(where)):
        conn = Conn(str(where))
        try:
            j = conn.json
            return conn.all(sql.format(partition=j("j.spec", "partition"), name=j("j.spec", "name"),
                                       cpus=j("j.spec", "cpus", num=True), gpus=j("j.spec", "gpus", num=True)))
        finally:
            conn.close()
    con = sqlite3.connect(f"file:{where}?mode=ro", uri=True)
    try:
        return con.execute(sql.format(partition="json_extract(j.spec, '$.partition')",
                                      name="json_extract(j.spec, '$.name')", cpus="json_extract(j.spec, '$.cpus')",
                                      gpus="json_extract(j.spec, '$.gpus')")).fetchall()
    finally:
        con.close()
