"""The events concern of the store: every state change of every job, in commit order,
as rows of ``job_events`` that triggers write (migration 7), read after a cursor
(corral/control/events.py)."""

from __future__ import annotations

from typing import Any, Iterable

from corral.core.store.conn import Conn


class Events:
    """The event stream's rows; mixed into ``Database`` (``db.events``...)."""

    conn: Conn

    def events(self, after: int, principals: Iterable[str] | None, limit: int) -> list[tuple[Any, ...]]:
        """State changes after event ``after``, oldest first: (id, job_id, principal,
        state, exit_code, at); of ``principals`` only, unless None."""
        sql = "SELECT id, job_id, principal, state, exit_code, at FROM job_events WHERE id > ?"
        args: list[Any] = [after]
        if principals is not None:
            names = list(principals)
            sql += f" AND principal IN ({self.conn.marks(len(names))})"
            args += names
        return self.conn.execute(sql + " ORDER BY id LIMIT ?", [*args, limit]).fetchall()

    def event_bounds(self) -> tuple[int, int]:
        """(the newest event's id, the id before the oldest kept): 0 where there is none."""
        newest, oldest = self.conn.execute("SELECT MAX(id), MIN(id) FROM job_events").fetchone()
        if newest is None:  # none kept: the id sequence still knows the last id given
            if self.conn.pg:
                last, called = self.conn.one("SELECT last_value, is_called FROM job_events_id_seq")
                return (last, last) if called else (0, 0)
            row = self.conn.one("SELECT seq FROM sqlite_sequence WHERE name='job_events'")
            return (row[0], row[0]) if row else (0, 0)
        return newest, oldest - 1

    def prune_events(self, before: float) -> int:
        """Forget the events older than ``before`` (a time); -> how many."""
        with self.conn.transaction():
            return self.conn.execute("DELETE FROM job_events WHERE at < ?", (before,)).rowcount
