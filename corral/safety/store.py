"""What the safety layer keeps in the gateway's database: token blocks seen and revoked,
tainted sessions, and the usage that budgets and concurrency caps are checked against."""

from __future__ import annotations

import time
from typing import Any

from corral.core.db import Database
from corral.core.jobs import TERMINAL_STATES, JobState

# Written as the partial index jobs_active is, so SQLite can use it for the counts.
_ACTIVE = "state IN ('PENDING', 'RUNNING', 'UNKNOWN')"
assert {"PENDING", "RUNNING", "UNKNOWN"} == {s.value for s in JobState} - {s.value for s in TERMINAL_STATES}


class SafetyStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.limits_seen: dict[str, tuple[str, dict[str, int]]] = {}
        """Token subtree path -> (principal, its block's limits), for every limited block
        presented since start: what the dashboard shows budgets against. In memory (the
        limits live in the token, not here); an agent's next call fills it again."""

    def saw_limits(self, principal: str, block_ids: tuple[str, ...], limits: tuple[dict[str, int], ...]) -> None:
        for i, block in enumerate(limits):
            if block:
                path = "/".join(block_ids[: i + 1])
                if path not in self.limits_seen:
                    if len(self.limits_seen) >= 10_000:  # bounded: the oldest go first
                        self.limits_seen.pop(next(iter(self.limits_seen)))
                    self.limits_seen[path] = (principal, dict(block))

    # -- tokens ---------------------------------------------------------------------

    def revoked(self) -> set[str]:
        ids = {r[0] for r in self.db.conn.execute("SELECT id FROM revoked")}
        return ids | {r[0] for r in self.db.conn.execute("SELECT id FROM tokens WHERE revoked IS NOT NULL")}

    def revoke(self, block_id: str, by: str) -> None:
        with self.db.transaction():
            self.db.conn.execute("INSERT OR IGNORE INTO revoked (id, at, by) VALUES (?,?,?)", (block_id, time.time(), by))
            self.db.conn.execute("UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL", (time.time(), block_id))

    def seen_blocks(self, root: str, principal: str, block_ids: tuple[str, ...]) -> None:
        """Remember the blocks a holder added, so their ids can be listed and revoked."""
        self.db.conn.executemany(
            "INSERT OR IGNORE INTO token_blocks (id, root, principal, first_seen) VALUES (?,?,?,?)",
            [(b, root, principal, time.time()) for b in block_ids[1:]])

    def block_owner(self, block_id: str) -> str | None:
        row = self.db.conn.execute("SELECT principal FROM token_blocks WHERE id=?", (block_id,)).fetchone()
        return row[0] if row else None

    def block_root(self, block_id: str) -> str | None:
        row = self.db.conn.execute("SELECT root FROM token_blocks WHERE id=?", (block_id,)).fetchone()
        return row[0] if row else None

    def blocks_of(self, root: str) -> list[str]:
        return [r[0] for r in self.db.conn.execute("SELECT id FROM token_blocks WHERE root=?", (root,))]

    def blocks(self, principals: list[str] | None) -> list[dict[str, Any]]:
        sql = "SELECT b.id, b.root, b.principal, b.first_seen, r.at FROM token_blocks b LEFT JOIN revoked r ON r.id=b.id"
        args: list[Any] = []
        if principals is not None:
            sql += f" WHERE b.principal IN ({','.join('?' * len(principals))})"
            args = principals
        keys = ("id", "root", "principal", "first_seen", "revoked")
        return [dict(zip(keys, r)) for r in self.db.conn.execute(sql, args)]

    # -- taint ------------------------------------------------------------------------

    def taints(self) -> dict[str, str]:
        return dict(self.db.conn.execute("SELECT key, reason FROM taint").fetchall())

    def clear_taint(self, key: str) -> None:
        self.db.conn.execute("DELETE FROM taint WHERE key=?", (key,))

    def taint(self, key: str, principal: str, reason: str) -> None:
        self.db.conn.execute("INSERT OR IGNORE INTO taint (key, principal, at, reason) VALUES (?,?,?,?)",
                             (key, principal, time.time(), reason))

    # -- usage --------------------------------------------------------------------------

    def used(self, block_path: str) -> tuple[float, float, int]:
        """CPU-seconds and GPU-seconds charged to a token subtree, and its active jobs.
        A finished job is charged what it ran; a live one what it may still run (its walltime)."""
        row = self.db.conn.execute(
            f"""SELECT
                  SUM(json_extract(spec, '$.cpus') * CASE WHEN {_ACTIVE} THEN json_extract(spec, '$.walltime')
                      ELSE MAX(0, COALESCE(end_time, start_time, 0) - COALESCE(start_time, end_time, 0)) END),
                  SUM(json_extract(spec, '$.gpus') * CASE WHEN {_ACTIVE} THEN json_extract(spec, '$.walltime')
                      ELSE MAX(0, COALESCE(end_time, start_time, 0) - COALESCE(start_time, end_time, 0)) END),
                  SUM(CASE WHEN {_ACTIVE} THEN 1 ELSE 0 END)
                FROM jobs WHERE token_path = ? OR (token_path > ? || '/' AND token_path < ? || '0')""",
            (block_path, block_path, block_path)).fetchone()  # '0' follows '/': the subtree as an index range
        return float(row[0] or 0), float(row[1] or 0), int(row[2] or 0)

    def active(self, principal: str) -> int:
        return int(self.db.conn.execute(f"SELECT COUNT(*) FROM jobs WHERE principal=? AND {_ACTIVE}",
                                        (principal,)).fetchone()[0])
