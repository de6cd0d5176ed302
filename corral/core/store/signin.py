"""Sign-in's single-use records (corral/gateway/signin.py): each munge credential taken,
and each one-time dashboard link, kept in the store until it expires, so that no
replica takes one twice (munge's own replay cache is per munged: a second replica on
another host, or a restarted one, would not know)."""

from __future__ import annotations

from corral.core.store.conn import Conn


class SigninRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def first_use(self, key: str, principal: str | None, until: float, now: float) -> bool:
        """Record ``key`` as used (a credential's digest): True the first time, False if
        any replica recorded it before. Expired records are dropped on the way."""
        with self.conn.transaction():
            self.conn.execute("DELETE FROM signin_once WHERE until < ?", (now - 60,))
            cur = self.conn.execute(self.conn.insert_ignore("signin_once", "key, principal, until, used", 4),
                                    (key, principal, until, now))
            return cur.rowcount == 1

    def offer(self, key: str, principal: str, until: float, now: float) -> None:
        """A one-time link's digest, not used yet, good until ``until``."""
        with self.conn.transaction():
            self.conn.execute("DELETE FROM signin_once WHERE until < ?", (now - 60,))
            self.conn.execute("INSERT INTO signin_once (key, principal, until, used) VALUES (?,?,?,NULL)",
                              (key, principal, until))

    def peek(self, key: str, now: float) -> str | None:
        """The principal of an offered link still unused and unexpired (nothing changes)."""
        row = self.conn.one("SELECT principal FROM signin_once WHERE key=? AND used IS NULL AND until >= ?",
                            (key, now))
        return row[0] if row else None

    def take(self, key: str, now: float) -> str | None:
        """Use an offered link: its principal, once; None if used, expired or unknown. One
        UPDATE decides, so two browsers racing with one link get it once between them."""
        with self.conn.transaction():
            row = self.conn.one("SELECT principal FROM signin_once WHERE key=? AND used IS NULL AND until >= ?",
                                (key, now))
            if row is None:
                return None
            n = self.conn.execute("UPDATE signin_once SET used=? WHERE key=? AND used IS NULL", (now, key)).rowcount
        return row[0] if n == 1 else None
