"""Storage's own connection to the gateway's database (its tables: env_images,
env_requests, workspaces, job_meta; created by db.py's migrations).

The storage verbs run in worker threads (they mount, walk and copy), and a SQLite
connection shared with the event loop would let a thread's write land inside, or commit,
a transaction the loop holds open. So storage has a connection of its own, behind one
lock; SQLite's WAL serializes it with the loop's writes, and each side reads what the
other committed.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence


class Store:
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10)
        self.conn.execute("PRAGMA busy_timeout=10000")
        self.lock = threading.RLock()

    def one(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        with self.lock:
            row: tuple[Any, ...] | None = self.conn.execute(sql, args).fetchone()
            return row

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            return self.conn.execute(sql, args).fetchall()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction, all or nothing."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()
