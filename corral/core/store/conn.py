"""One connection to the store, SQLite or PostgreSQL, and the little SQL that differs.

Every query of corral/core/store/ is written once, with ``?`` placeholders, in the SQL
both servers speak; what they spell differently (JSON fields of a job's spec, the
larger of two values, ``IS`` against a parameter, insert-or-skip) comes from the
methods here. A PostgreSQL statement gets ``%s`` placeholders (psycopg's), rendered
once per distinct text.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (durable against a killed process,
the failure the gateway must survive). PostgreSQL is reached through psycopg 3 in
autocommit mode with client-side parameter binding (``ClientCursor``): a statement's
parameters then need no server-side type inference, as SQLite's never do.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol, Sequence

try:  # the PostgreSQL driver: only a store at a postgresql:// URL needs it
    import psycopg
except ImportError:  # pragma: no cover - pinned in pyproject.toml
    psycopg = None  # type: ignore[assignment]

INTEGRITY_ERRORS: tuple[type[BaseException], ...] = (sqlite3.IntegrityError,) + (
    (psycopg.IntegrityError,) if psycopg is not None else ())
"""What a broken uniqueness or reference raises, on either server."""

LOCK_BUSY: tuple[type[BaseException], ...] = (psycopg.errors.LockNotAvailable,) if psycopg is not None else ()
"""What a row lock asked with ``NOWAIT`` raises when another session holds it (PostgreSQL)."""


class Unreachable(RuntimeError):
    """The PostgreSQL server refused a new connection: at start, the gateway says so and
    stops; later (the server restarting), the request is answered 503 and called again
    (errors.store_unavailable)."""


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


def _pg_text(sql: str) -> str:
    """``?`` -> ``%s`` outside quotes, and a literal ``%`` doubled (psycopg's format)."""
    out: list[str] = []
    quote = ""
    for ch in sql:
        if quote:
            if ch == quote:
                quote = ""
            out.append("%%" if ch == "%" else ch)
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out)


_pg = functools.lru_cache(maxsize=2048)(_pg_text)


def is_postgres(url: str) -> bool:
    """``url`` names a PostgreSQL store (else a SQLite file). Settings.replicated asks the same."""
    return url.startswith(("postgresql://", "postgres://"))


class Conn:
    """One connection: ``execute``/``executemany`` as sqlite3's, ``transaction()`` for
    many writes in one commit, and the dialect's spellings."""

    max_params = 900
    """Bound parameters a statement may carry (SQLite's limit is 999 on old builds)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = "postgresql" if is_postgres(url) else "sqlite"
        self.lock = threading.RLock()
        """One statement at a time. Not held across a transaction: a worker thread's read
        (the dashboard's) goes on while the event loop's transaction is open, as before."""
        self._depth = 0
        if self.dialect == "sqlite":
            path = Path(url.removeprefix("sqlite://"))  # sqlite:///abs/path, or a bare path
            path.parent.mkdir(parents=True, exist_ok=True)
            self.path: Path | None = path
            # check_same_thread=False: tests, the dashboard's worker threads and the CLI's
            # local admin commands use it too; statements are short.
            self.raw: Any = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10)
            self.raw.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode is durable against a process crash (kill -9); only power
            # loss can drop the last commit.
            self.raw.execute("PRAGMA synchronous=NORMAL")
            self.raw.execute("PRAGMA foreign_keys=ON")
            self.raw.execute("PRAGMA busy_timeout=10000")
        else:
            self.path = None
            self.raw = self._connect()

    def _connect(self) -> Any:
        if psycopg is None:
            raise RuntimeError("a postgresql:// store needs psycopg; reinstall corral (make venv)")
        try:
            return psycopg.connect(self.url, autocommit=True, cursor_factory=psycopg.ClientCursor, connect_timeout=10)
        except psycopg.OperationalError as e:
            shown = re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", self.url)
            raise Unreachable(f"cannot reach the PostgreSQL store {shown}: {str(e).strip().splitlines()[0]}; "
                              "check [store] url and that the server is up") from None

    @property
    def pg(self) -> bool:
        return self.dialect == "postgresql"

    def again(self) -> "Conn":
        """Another connection to the same store (storage's worker threads have their own)."""
        return Conn(self.url)

    def close(self) -> None:
        self.raw.close()

    # -- statements ------------------------------------------------------------------------

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        with self.lock:
            if not self.pg:
                return self.raw.execute(sql, args)
            try:
                return self.raw.execute(_pg(sql), args)
            except psycopg.OperationalError:
                # The server restarted or dropped us: outside a transaction, connect again and
                # say it once more; inside one, its earlier statements are gone, so it fails.
                if self._depth or not self.raw.closed:
                    raise
                self.raw = self._connect()
                return self.raw.execute(_pg(sql), args)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        with self.lock:
            if self.pg:
                with self.raw.cursor() as cur:
                    cur.executemany(_pg(sql), rows)
            else:
                self.raw.executemany(sql, rows)

    def one(self, sql: str, args: Sequence[Any] = ()) -> Any:
        with self.lock:  # the whole answer read: no statement left open (an INSERT ... RETURNING)
            rows = self.execute(sql, args).fetchall()
            return rows[0] if rows else None

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self.lock:
            return list(self.execute(sql, args).fetchall())

    @property
    def in_transaction(self) -> bool:
        return self._depth > 0

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Many writes, one commit (a batch of 100 jobs costs one fsync, not 100); nested,
        the outer one commits."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.execute("BEGIN" if self.pg else "BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self.execute("ROLLBACK")
            raise
        self._depth = 0
        self.execute("COMMIT")

    # -- what the two servers spell differently ---------------------------------------------

    def json(self, col: str, *keys: str, num: bool = False) -> str:
        """A field of a JSON text column (a job's spec): a number with ``num``, else text."""
        if not self.pg:
            return f"json_extract({col}, '$.{'.'.join(k if k.isidentifier() else chr(34) + k + chr(34) for k in keys)}')"
        path = "".join(f"->'{k}'" for k in keys[:-1]) + f"->>'{keys[-1]}'"
        return f"CAST(CAST({col} AS jsonb){path} AS DOUBLE PRECISION)" if num else f"(CAST({col} AS jsonb){path})"

    def greatest(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})" if self.pg else f"MAX({a}, {b})"

    def is_(self, expr: str) -> str:
        """``expr`` equal to a parameter that may be NULL."""
        return f"{expr} IS NOT DISTINCT FROM ?" if self.pg else f"{expr} IS ?"

    def insert_ignore(self, table: str, cols: str, n: int) -> str:
        """An insert that skips a row whose key is already there."""
        marks = ",".join("?" * n)
        if self.pg:
            return f"INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING"
        return f"INSERT OR IGNORE INTO {table} ({cols}) VALUES ({marks})"

    def marks(self, n: int) -> str:
        """``n`` placeholders for ``IN (...)``; none is ``NULL``, which matches nothing
        (PostgreSQL refuses an empty list)."""
        return ",".join("?" * n) if n else "NULL"

