"""The safety layer's records in the store: capability-token blocks seen and revoked,
tainted sessions, and the usage that budgets and concurrency caps are checked against
(corral/safety/store.py keeps the rest in memory)."""

from __future__ import annotations

import time
from typing import Any

from corral.core.errors import RateLimited
from corral.core.store.conn import LOCK_BUSY, Conn
from corral.core.store.jobs import ACTIVE


class Busy(RateLimited):
    """Another replica holds this principal's admission lock at this moment: the caller
    (``Admission.record``) tries again shortly, off the event loop; one that cannot wait
    answers 429 with Retry-After."""

    def __init__(self, principal: str) -> None:
        super().__init__(f"submissions of {principal} are being admitted on another replica at this moment",
                         retry_after=1.0, hint="send it again in a second (with the same Idempotency-Key)")


class SafetyRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._used_sql = _used_sql(conn)

    # -- tokens ---------------------------------------------------------------------------

    def revoked(self) -> set[str]:
        ids = {r[0] for r in self.conn.execute("SELECT id FROM revoked")}
        return ids | {r[0] for r in self.conn.execute("SELECT id FROM tokens WHERE revoked IS NOT NULL")}

    def revoke(self, block_id: str, by: str) -> None:
        with self.conn.transaction():
            self.conn.execute(self.conn.insert_ignore("revoked", "id, at, by", 3), (block_id, time.time(), by))
            self.conn.execute("UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL", (time.time(), block_id))

    def seen_blocks(self, root: str, principal: str, block_ids: tuple[str, ...]) -> None:
        self.conn.executemany(self.conn.insert_ignore("token_blocks", "id, root, principal, first_seen", 4),
                              [(b, root, principal, time.time()) for b in block_ids])

    def block_owner(self, block_id: str) -> str | None:
        row = self.conn.one("SELECT principal FROM token_blocks WHERE id=?", (block_id,))
        return row[0] if row else None

    def block_root(self, block_id: str) -> str | None:
        row = self.conn.one("SELECT root FROM token_blocks WHERE id=?", (block_id,))
        return row[0] if row else None

    def blocks_of(self, root: str) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT id FROM token_blocks WHERE root=?", (root,))]

    def blocks(self, principals: list[str] | None) -> list[dict[str, Any]]:
        sql = "SELECT b.id, b.root, b.principal, b.first_seen, r.at FROM token_blocks b LEFT JOIN revoked r ON r.id=b.id"
        args: list[Any] = []
        if principals is not None:
            sql += f" WHERE b.principal IN ({self.conn.marks(len(principals))})"
            args = principals
        keys = ("id", "root", "principal", "first_seen", "revoked")
        return [dict(zip(keys, r)) for r in self.conn.execute(sql, args)]

    # -- taint ----------------------------------------------------------------------------

    def taints(self) -> dict[str, str]:
        return dict(self.conn.all("SELECT key, reason FROM taint"))

    def clear_taint(self, key: str) -> None:
        self.conn.execute("DELETE FROM taint WHERE key=?", (key,))

    def taint(self, key: str, principal: str, reason: str) -> None:
        self.conn.execute(self.conn.insert_ignore("taint", "key, principal, at, reason", 4),
                          (key, principal, time.time(), reason))

    # -- usage ----------------------------------------------------------------------------

    def used(self, block_path: str) -> tuple[float, float, int]:
        """CPU-seconds and GPU-seconds charged to a token subtree, and its active jobs.
        A finished job is charged what it ran; a live one what it may still run (its walltime)."""
        row = self.conn.one(self._used_sql, (block_path, block_path) if self.conn.pg else (block_path,) * 3)
        return float(row[0] or 0), float(row[1] or 0), int(row[2] or 0)

    def used_on(self, backend: str, principals: list[str]) -> tuple[float, float]:
        """CPU- and GPU-seconds of ``principals``' jobs on one cluster (lane), charged as
        ``used`` charges them: what a finished job ran, a live one's walltime."""
        c = self.conn
        ran = c.greatest("0", "COALESCE(end_time, start_time, 0) - COALESCE(start_time, end_time, 0)")
        charge = f"CASE WHEN {ACTIVE} THEN {c.json('spec', 'walltime', num=True)} ELSE {ran} END"
        row = c.one(f"""SELECT SUM({c.json('spec', 'cpus', num=True)} * {charge}),
                               SUM({c.json('spec', 'gpus', num=True)} * {charge})
                        FROM jobs WHERE backend=? AND principal IN ({c.marks(len(principals))})""",
                    (backend, *principals))
        return float(row[0] or 0), float(row[1] or 0)

    def active(self, principal: str) -> int:
        return int(self.conn.one(f"SELECT COUNT(*) FROM jobs WHERE principal=? AND {ACTIVE}", (principal,))[0])

    # -- admission: one principal's at a time, on every replica -----------------------------

    def hold(self, principal: str) -> None:
        """Inside a transaction: until it ends, no other admission of ``principal``, on any
        replica, reads its usage, its active jobs or its rate buckets (decision 0043).
        PostgreSQL: the principal's row locked ``FOR NO KEY UPDATE`` (the jobs' references
        to it take ``FOR KEY SHARE``, which this does not block), ``NOWAIT``: a lock held
        elsewhere raises ``Busy`` at once rather than block this replica's event loop
        (every other principal's requests) while it waits. SQLite: ``BEGIN IMMEDIATE``
        already took the database's one write lock."""
        if not self.conn.in_transaction:
            raise RuntimeError("SafetyRecords.hold outside a transaction holds nothing")
        if self.conn.pg:
            try:
                self.conn.execute("SELECT name FROM principals WHERE name=? FOR NO KEY UPDATE NOWAIT", (principal,))
            except LOCK_BUSY:
                raise Busy(principal) from None

    def buckets(self, keys: list[str]) -> dict[str, tuple[float, float]]:
        """The facility's rate buckets by key -> (tokens, stamp: wall-clock seconds); a
        missing one is full."""
        rows = self.conn.all(f"SELECT key, tokens, stamp FROM rate_buckets WHERE key IN ({self.conn.marks(len(keys))})",
                             keys)
        return {k: (float(t), float(at)) for k, t, at in rows}

    def set_buckets(self, rows: list[tuple[str, float, float]], forget_before: float | None = None) -> None:
        """Buckets (key, tokens, stamp) written; ``forget_before``: rows untouched since then
        dropped too (full again long ago: a missing bucket is a full one)."""
        self.conn.executemany("INSERT INTO rate_buckets (key, tokens, stamp) VALUES (?, ?, ?) ON CONFLICT (key) "
                              "DO UPDATE SET tokens=excluded.tokens, stamp=excluded.stamp", rows)
        if forget_before is not None:
            self.conn.execute("DELETE FROM rate_buckets WHERE stamp < ?", (forget_before,))


def _used_sql(c: Conn) -> str:
    """``used``'s statement in the store's dialect, spelled once (it is asked at every
    admission: building it each time cost more than the query, bench/policy.py)."""
    # '0' follows '/': the subtree as an index range in SQLite's byte order; PostgreSQL's
    # order follows its collation, so there it is a prefix test.
    subtree = ("starts_with(token_path, CAST(? AS TEXT) || '/')" if c.pg else
               "(token_path > CAST(? AS TEXT) || '/' AND token_path < CAST(? AS TEXT) || '0')")
    ran = c.greatest("0", "COALESCE(end_time, start_time, 0) - COALESCE(start_time, end_time, 0)")
    return f"""SELECT
          SUM({c.json('spec', 'cpus', num=True)} * CASE WHEN {ACTIVE} THEN {c.json('spec', 'walltime', num=True)}
              ELSE {ran} END),
          SUM({c.json('spec', 'gpus', num=True)} * CASE WHEN {ACTIVE} THEN {c.json('spec', 'walltime', num=True)}
              ELSE {ran} END),
          SUM(CASE WHEN {ACTIVE} THEN 1 ELSE 0 END)
        FROM jobs WHERE token_path = ? OR {subtree}"""
