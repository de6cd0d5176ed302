"""The event stream: every state change of the caller's jobs since a cursor.

An agent with twenty jobs waits once (``wait``), not twenty times. The changes are rows
of ``job_events``, written by triggers in the same transaction as the change itself
(corral/core/store/migrations.py, migration 7), so a cursor (the last event id seen) resumes exactly after
a reconnect or a gateway restart: nothing is missed, nothing repeated. Events are kept
``KEEP_S``; a cursor older than that is refused with where to resume, never silently
skipped.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from corral.core.db import Database
from corral.core.errors import Conflict, InvalidRequest, Restarting
from corral.core.principals import Caller
from corral.control.watchers import Watchers

KEEP_S = 7 * 86400.0
GATHER_S = 0.2
"""After the first event, how long an answer waits for more: jobs of a sweep end in
bursts, and one answer should carry the burst, not one event each."""
RECHECK_S = 1.0
"""A waiting stream looks again at least this often (a submission wakes no watcher)."""
MAX_LIMIT = 1000


class Events:
    def __init__(self, db: Database, watchers: Watchers, wait_max_s: float) -> None:
        self.db, self.watchers, self.wait_max_s = db, watchers, wait_max_s
        self._pruned = 0.0

    def prune(self, now: float | None = None) -> int:
        """Forget events older than ``KEEP_S``: at most once an hour."""
        now = time.time() if now is None else now
        if now - self._pruned < 3600:
            return 0
        self._pruned = now
        return self.db.prune_events(now - KEEP_S)

    async def wait(self, caller: Caller, cursor: int | None, timeout: float, limit: int = 200) -> dict[str, Any]:
        """Events after ``cursor`` (None: from now on) that the caller may see: at once if
        some are waiting, else ``GATHER_S`` after the first arrives, at most ``timeout``
        seconds; -> {events, cursor, more}. Pass the returned cursor to the next call."""
        if not 0 <= timeout <= self.wait_max_s:
            raise InvalidRequest(f"timeout must be between 0 and {self.wait_max_s:.0f} seconds")
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}")
        newest, before_oldest = self.db.event_bounds()
        if cursor is None:
            cursor = newest
        elif not 0 <= cursor <= newest:
            raise InvalidRequest(f"cursor {cursor} was never given out (the newest event is {newest}); "
                                 "pass a cursor this stream returned, or none to start from now")
        elif cursor < before_oldest:
            raise Conflict(f"events before {before_oldest + 1} are no longer kept (they are kept "
                           f"{KEEP_S / 86400:.0f} days): list your jobs for their states, then resume with "
                           f"cursor={before_oldest}")
        names = None if caller.principal.is_admin else sorted(caller.visible)
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            rows = self.db.events(cursor, names, limit)
            remaining = deadline - time.monotonic()
            # Events found waiting are answered at once; ones that just came, with the
            # rest of their burst.
            if rows and waited and len(rows) < limit and remaining > 0:
                await asyncio.sleep(min(GATHER_S, remaining))
                rows = self.db.events(cursor, names, limit)
            if rows or remaining <= 0:
                break
            if self.watchers.stopping:
                raise Restarting()
            await self.watchers.wait_any(min(RECHECK_S, remaining))
            waited = True
        events = [{"event": e, "job_id": j, "principal": p, "state": s, "exit_code": x, "at": at}
                  for e, j, p, s, x, at in rows]
        return {"events": events, "cursor": events[-1]["event"] if events else cursor, "more": len(rows) == limit}
