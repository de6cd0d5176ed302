"""The replicas' concern of the store: which gateway leads, and word of changes between
gateways, both through PostgreSQL on one dedicated connection per replica.

Leadership is a session-level advisory lock (``pg_try_advisory_lock``): held for as long
as the session that took it lives, released by the server the moment that session ends (a
replica killed -9 closes its socket; the server drops its locks at once). Each replica
tries it every half second; the one that holds it runs the facility's loops
(corral/gateway/runtime.py). The lock is taken once and never again while held: a session's
advisory locks stack, and one more acquisition would need one more unlock.

Word between replicas is ``NOTIFY corral, 'replica|kind|ids'`` (sent on the store's own
connection, ``Signals.notify``), heard by every replica that ``LISTEN``\\s on its lock's
connection. A notification is delivered only after its transaction commits, and only to
sessions listening then: a replica that was away reads the state itself (its long-polls
re-read the row when they wake or time out), so a lost notification costs latency, never
a wrong answer.

On SQLite there is one gateway: it always leads, and no word is sent.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable

from corral.core.store.conn import Conn

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

CHANNEL = "corral"
LEADER_KEY = 0x636F7272  # "corr": the one advisory lock key of a facility's leader
TRY_EVERY_S = 0.5
"""How often a follower tries the lock and a leader checks its session still lives: a
leader's death is taken over within about this, plus the new leader's start (under load,
seconds: the 5 s bound of issue 37 leaves room for a busy event loop). Each try is one
round trip on an idle session: N replicas cost the store 2N trivial statements a second."""


class Signals:
    """Word of a change to the other replicas (mixed into ``Database``: ``db.notify``)."""

    conn: Conn

    def notify(self, payload: str) -> None:
        """Tell every listening replica (after the current transaction commits, if one is open)."""
        if self.conn.pg:
            self.conn.execute("SELECT pg_notify(?, ?)", (CHANNEL, payload[:7900]))


class Coordinator:
    """One replica's dedicated session: tries the leader's lock, listens for word of
    changes, and says when it gains or loses the lead."""

    def __init__(self, url: str, gained: Callable[[], None], lost: Callable[[], None],
                 heard: Callable[[str], None], every_s: float = TRY_EVERY_S) -> None:
        self.url, self.gained, self.lost, self.heard, self.every_s = url, gained, lost, heard, every_s
        self.leading = False

    async def run(self) -> None:
        """Forever: connect, listen, try the lock each round; a broken session gives the lead
        up at once (the server has released the lock with it) and is made again."""
        import psycopg

        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=5,
                    # A session the network lost is noticed within seconds, not hours.
                    keepalives=1, keepalives_idle=2, keepalives_interval=1, keepalives_count=2)
            except psycopg.OperationalError as e:
                log.warning("replicas: cannot reach the store to lead or listen (%s); trying again",
                            str(e).splitlines()[0] if str(e) else e)
                await asyncio.sleep(self.every_s)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    while True:
                        await self._round(conn)
            except (psycopg.Error, OSError) as e:
                log.warning("replicas: the store's session ended (%s)%s", str(e).splitlines()[0] if str(e) else e,
                            "; leading no more" if self.leading else "")
            finally:
                self._give_up()
            await asyncio.sleep(self.every_s / 4)

    async def _round(self, conn: "psycopg.AsyncConnection[Any]") -> None:
        if not self.leading:
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_KEY,))
            row = await cur.fetchone()
            if row and row[0]:
                self.leading = True
                self.gained()
        else:  # still ours while the session answers; a timeout here is a lost session
            await asyncio.wait_for(conn.execute("SELECT 1"), timeout=self.every_s * 3)
        async for n in conn.notifies(timeout=self.every_s):
            try:
                self.heard(n.payload)
            except Exception:  # a listener's trouble must not end the lead
                log.exception("replicas: a notification was not handled: %r", n.payload[:200])

    def _give_up(self) -> None:
        if self.leading:
            self.leading = False
            self.lost()
