"""The moves' SQL (migration 19): a pending job moved to another cluster where Slurm
says it starts sooner (corral/control/rebalance.py, decision 0053). A move is recorded
before anything is done to the job, so a gateway killed in the middle finds it at start
and finishes or undoes it; a finished one stays, so a job moves at most once (one undone
may be tried again)."""

from __future__ import annotations

from typing import NamedTuple

from corral.core.store.conn import Conn


class Move(NamedTuple):
    job_id: int
    src: str
    src_id: str
    dst: str
    why: str
    at: float


class MoveRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def begin(self, move: Move) -> bool:
        """The intent, before the job is touched; False if the job moved before (or is
        moving). A move undone (the job started, or a gateway died before it cancelled
        anything) may be tried again."""
        return self.conn.execute(
            "INSERT INTO moves (job_id, src, src_id, dst, why, at) VALUES (?,?,?,?,?,?) ON CONFLICT (job_id) "
            "DO UPDATE SET src=excluded.src, src_id=excluded.src_id, dst=excluded.dst, why=excluded.why, "
            "at=excluded.at, state='open' WHERE moves.state='undone'", tuple(move)).rowcount == 1

    def open(self) -> list[Move]:
        """Moves begun and neither finished nor undone (a gateway died in them)."""
        return [Move(*r) for r in self.conn.all(
            "SELECT job_id, src, src_id, dst, why, at FROM moves WHERE state='open' ORDER BY job_id")]

    def open_ids(self) -> set[int]:
        return {int(r[0]) for r in self.conn.all("SELECT job_id FROM moves WHERE state='open'")}

    def end(self, job_id: int, state: str) -> None:
        """'done' (the job now waits on its new cluster) or 'undone' (it stayed)."""
        self.conn.execute("UPDATE moves SET state=? WHERE job_id=? AND state='open'", (state, job_id))

    def rehome(self, job_id: int, dst: str, spec_json: str) -> bool:
        """The job's record names its new cluster and is not sent yet (the Sender sends it
        there, idempotently per job id); only while it is still PENDING."""
        return self.conn.execute(
            "UPDATE jobs SET backend=?, backend_id=NULL, spec=? WHERE id=? AND state='PENDING'",
            (dst, spec_json, job_id)).rowcount == 1

    def candidates(self, lanes: list[str], limit: int) -> list[int]:
        """Jobs waiting in a cluster's queue that allowed a move and never moved, the
        longest waiting first."""
        c = self.conn
        rows = c.all(
            f"""SELECT id FROM jobs WHERE state='PENDING' AND backend_id IS NOT NULL
                AND backend IN ({c.marks(len(lanes))})
                AND CAST({c.json('spec', 'movable')} AS TEXT) IN ('true', '1')
                AND id NOT IN (SELECT job_id FROM moves WHERE state != 'undone')
                ORDER BY submit_time, id LIMIT ?""", (*lanes, limit))
        return [int(r[0]) for r in rows]
