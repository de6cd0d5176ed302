"""The approvals concern of the store (migration 16): actions waiting for a person's
answer, and the classes of action a sponsor approved ahead for a session
(corral/gateway/approvals.py decides; this is only its SQL)."""

from __future__ import annotations

import json
from typing import Any

from corral.core.store.conn import Conn

COLS = ("id, principal, sponsor, session, action, rule, jobs, summary, created, expires, state, decided_by, "
        "decided_at, note, link_hash, args, done_at, outcome")


def _row(r: Any) -> dict[str, Any]:
    out = dict(zip(COLS.split(", "), r))
    out["jobs"] = json.loads(out["jobs"])
    out["args"] = json.loads(out["args"]) if out["args"] else None
    return out


class ApprovalRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def add(self, principal: str, sponsor: str, session: str | None, action: str, rule: str, jobs: list[int],
            summary: str, created: float, expires: float, link_hash: str, args: dict[str, Any] | None = None) -> int:
        row = self.conn.one(
            "INSERT INTO approvals (principal, sponsor, session, action, rule, jobs, summary, created, expires, state, "
            "link_hash, args) VALUES (?,?,?,?,?,?,?,?,?,'pending',?,?) RETURNING id",
            (principal, sponsor, session, action, rule, json.dumps(jobs), summary, created, expires, link_hash,
             json.dumps(args) if args is not None else None))
        return int(row[0])

    def pending_like(self, principal: str, action: str, args: str) -> dict[str, Any] | None:
        """The pending approval of this very action (``args`` as stored), if one waits."""
        r = self.conn.one(f"SELECT {COLS} FROM approvals WHERE state='pending' AND principal=? AND action=? AND args=?",
                          (principal, action, args))
        return _row(r) if r else None

    def claim(self, approval_id: int, at: float) -> bool:
        """An approved action taken to be carried out: by one caller, once (-> whether this one)."""
        return self.conn.execute("UPDATE approvals SET done_at=? WHERE id=? AND state='approved' AND done_at IS NULL "
                                 "AND action != 'submit'", (at, approval_id)).rowcount == 1

    def finish(self, approval_id: int, outcome: str) -> None:
        self.conn.execute("UPDATE approvals SET outcome=? WHERE id=?", (outcome[:500], approval_id))

    def void(self, approval_id: int, outcome: str) -> None:
        """Approved, but not carried out: the agent could no longer act as it asked."""
        self.conn.execute("UPDATE approvals SET state='void', outcome=? WHERE id=?", (outcome[:500], approval_id))

    def interrupted(self, before: float) -> list[dict[str, Any]]:
        """Approved actions taken before ``before`` (this gateway's start) with no outcome:
        the gateway stopped between taking one and recording what came of it."""
        return [_row(r) for r in self.conn.all(
            f"SELECT {COLS} FROM approvals WHERE state='approved' AND done_at IS NOT NULL AND done_at < ? "
            "AND outcome IS NULL AND action != 'submit' ORDER BY id LIMIT 200", (before,))]

    def reclaim(self, approval_id: int, taken: float, at: float) -> bool:
        """An interrupted action taken again, by one caller (-> whether this one)."""
        return self.conn.execute("UPDATE approvals SET done_at=? WHERE id=? AND done_at=? AND outcome IS NULL",
                                 (at, approval_id, taken)).rowcount == 1

    def unclaimed(self) -> list[dict[str, Any]]:
        """Approved actions not yet taken to be carried out (the gateway stopped in between)."""
        return [_row(r) for r in self.conn.all(
            f"SELECT {COLS} FROM approvals WHERE state='approved' AND done_at IS NULL AND action != 'submit' "
            "ORDER BY id LIMIT 200")]

    def get(self, approval_id: int) -> dict[str, Any] | None:
        r = self.conn.one(f"SELECT {COLS} FROM approvals WHERE id=?", (approval_id,))
        return _row(r) if r else None

    def listing(self, names: list[str] | None, state: str | None, limit: int) -> list[dict[str, Any]]:
        """Newest first; of requests by or for ``names`` (None: all)."""
        sql, args = f"SELECT {COLS} FROM approvals WHERE 1=1", []
        if names is not None:
            marks = self.conn.marks(len(names))
            sql += f" AND (principal IN ({marks}) OR sponsor IN ({marks}))"
            args += names * 2
        if state is not None:
            sql += " AND state=?"
            args.append(state)
        return [_row(r) for r in self.conn.all(sql + " ORDER BY id DESC LIMIT ?", [*args, limit])]

    def decide(self, approval_id: int, state: str, by: str, at: float, note: str | None) -> bool:
        """Pending -> ``state``; -> whether this call decided it (a second answer finds it decided)."""
        return self.conn.execute(
            "UPDATE approvals SET state=?, decided_by=?, decided_at=?, note=?, link_hash=NULL "
            "WHERE id=? AND state='pending'", (state, by, at, note, approval_id)).rowcount == 1

    def expired(self, now: float) -> list[dict[str, Any]]:
        return [_row(r) for r in self.conn.all(
            f"SELECT {COLS} FROM approvals WHERE state='pending' AND expires <= ? ORDER BY id LIMIT 200", (now,))]

    def of_action(self, action: str, since: float, limit: int = 2000) -> list[dict[str, Any]]:
        """``action``'s approvals asked since ``since``, newest first (egress: what the proxy is told)."""
        return [_row(r) for r in self.conn.all(
            f"SELECT {COLS} FROM approvals WHERE action=? AND created >= ? ORDER BY id DESC LIMIT ?",
            (action, since, limit))]

    def waiting_for(self, job_id: int) -> dict[str, Any] | None:
        """The pending approval that holds ``job_id``, if one does."""
        for r in self.conn.all(f"SELECT {COLS} FROM approvals WHERE state='pending' AND jobs LIKE ?",
                               (f"%{job_id}%",)):
            row = _row(r)
            if job_id in row["jobs"]:
                return row
        return None

    # -- approved ahead ----------------------------------------------------------------------
    def allow(self, principal: str, session: str, rule: str, by: str, created: float, expires: float) -> None:
        with self.conn.transaction():
            self.conn.execute("DELETE FROM preapprovals WHERE principal=? AND session=? AND rule=?",
                              (principal, session, rule))
            self.conn.execute("INSERT INTO preapprovals (principal, session, rule, by, created, expires) "
                              "VALUES (?,?,?,?,?,?)", (principal, session, rule, by, created, expires))

    def allowed(self, principal: str, session: str | None, rule: str, now: float) -> str | None:
        """Who approved ``rule`` ahead for this principal's session, if someone did and it holds."""
        if session is None:
            return None
        r = self.conn.one("SELECT by FROM preapprovals WHERE principal=? AND session=? AND rule=? AND expires > ?",
                          (principal, session, rule, now))
        return str(r[0]) if r else None
