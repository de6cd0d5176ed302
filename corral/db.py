"""The gateway's state in SQLite: WAL mode, numbered migrations, and the queries
the service core needs. Nothing else in corral writes SQL.

One connection per ``Database``, used from one thread (the gateway's event loop);
statements are short, so the loop is never blocked for long.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable

from .jobs import Job, JobSpec, JobState, TERMINAL_STATES
from .principals import Kind, Principal

MIGRATIONS: list[str] = [
    # 1: principals, tokens, jobs
    """
    CREATE TABLE principals (
        name TEXT PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('human', 'agent', 'service')),
        sponsor TEXT REFERENCES principals(name),
        unix_user TEXT,
        account TEXT,
        is_admin INTEGER NOT NULL DEFAULT 0,
        created REAL NOT NULL
    );
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        principal TEXT NOT NULL REFERENCES principals(name),
        hash TEXT NOT NULL,
        created REAL NOT NULL,
        expires REAL,
        revoked REAL,
        note TEXT
    );
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        principal TEXT NOT NULL REFERENCES principals(name),
        session TEXT,
        idem_key TEXT,
        backend TEXT NOT NULL,
        backend_id TEXT,
        state TEXT NOT NULL,
        exit_code INTEGER,
        reason TEXT,
        submit_time REAL NOT NULL,
        start_time REAL,
        end_time REAL,
        spec TEXT NOT NULL,
        UNIQUE (principal, idem_key)
    );
    CREATE INDEX jobs_active ON jobs(state) WHERE state IN ('PENDING', 'RUNNING', 'UNKNOWN');
    CREATE INDEX jobs_principal ON jobs(principal, id);
    """,
]

_JOB_COLS = (
    "id, principal, session, backend, backend_id, state, exit_code, reason, "
    "submit_time, start_time, end_time, spec"
)


_SPECS: dict[str, JobSpec] = {}


def _parse_spec(text: str) -> JobSpec:
    """Specs never change once stored: parse each distinct one once (a status read is hot)."""
    spec = _SPECS.get(text)
    if spec is None:
        if len(_SPECS) > 50_000:
            _SPECS.clear()
        spec = _SPECS[text] = JobSpec.model_validate(json.loads(text))
    return spec


def _row_to_job(row: sqlite3.Row | tuple[Any, ...]) -> Job:
    (id_, principal, session, backend, backend_id, state, exit_code, reason, st, bt, et, spec) = row
    return Job.model_construct(
        id=id_,
        principal=principal,
        session=session,
        backend=backend,
        backend_id=backend_id,
        state=JobState(state),
        exit_code=exit_code,
        reason=reason,
        submit_time=st,
        start_time=bt,
        end_time=et,
        spec=_parse_spec(spec),
    )


def _row_to_principal(row: tuple[Any, ...]) -> Principal:
    name, kind, sponsor, unix_user, account, is_admin, created = row
    return Principal(name, Kind(kind), sponsor, unix_user, account, bool(is_admin), created)


class Database:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # check_same_thread=False: tests and the CLI's local admin commands may
        # open it from another thread; the gateway itself uses one thread.
        self.conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode is durable against a process crash (kill -9), which is
        # the failure the gateway must survive; only power loss can drop the last commit.
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.conn.execute("PRAGMA busy_timeout=5000")
        self.migrate()

    def close(self) -> None:
        self.conn.close()

    @property
    def version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self) -> None:
        current = self.version
        for number, sql in enumerate(MIGRATIONS, start=1):
            if number <= current:
                continue
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in filter(str.strip, sql.split(";")):
                    self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version={number}")
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    # -- principals and tokens -------------------------------------------------

    def add_principal(self, p: Principal) -> Principal:
        created = p.created or time.time()
        self.conn.execute(
            "INSERT INTO principals (name, kind, sponsor, unix_user, account, is_admin, created) VALUES (?,?,?,?,?,?,?)",
            (p.name, p.kind.value, p.sponsor, p.unix_user, p.account, int(p.is_admin), created),
        )
        return self.get_principal(p.name)  # type: ignore[return-value]

    def get_principal(self, name: str) -> Principal | None:
        row = self.conn.execute(
            "SELECT name, kind, sponsor, unix_user, account, is_admin, created FROM principals WHERE name=?", (name,)
        ).fetchone()
        return _row_to_principal(row) if row else None

    def list_principals(self) -> list[Principal]:
        rows = self.conn.execute(
            "SELECT name, kind, sponsor, unix_user, account, is_admin, created FROM principals ORDER BY name"
        ).fetchall()
        return [_row_to_principal(r) for r in rows]

    def sponsored_by(self, sponsor: str) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT name FROM principals WHERE sponsor=?", (sponsor,))]

    def add_token(self, token_id: str, principal: str, hash_: str, expires: float | None, note: str | None) -> None:
        self.conn.execute(
            "INSERT INTO tokens (id, principal, hash, created, expires, note) VALUES (?,?,?,?,?,?)",
            (token_id, principal, hash_, time.time(), expires, note),
        )

    def get_token(self, token_id: str) -> dict[str, Any] | None:
        row = self.conn.execute(
            "SELECT id, principal, hash, created, expires, revoked, note FROM tokens WHERE id=?", (token_id,)
        ).fetchone()
        if not row:
            return None
        keys = ("id", "principal", "hash", "created", "expires", "revoked", "note")
        return dict(zip(keys, row))

    def list_tokens(self, principals: Iterable[str] | None = None) -> list[dict[str, Any]]:
        sql = "SELECT id, principal, created, expires, revoked, note FROM tokens"
        args: list[Any] = []
        if principals is not None:
            names = list(principals)
            sql += f" WHERE principal IN ({','.join('?' * len(names))})"
            args = names
        keys = ("id", "principal", "created", "expires", "revoked", "note")
        return [dict(zip(keys, r)) for r in self.conn.execute(sql + " ORDER BY created", args)]

    def revoke_token(self, token_id: str) -> bool:
        cur = self.conn.execute("UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL", (time.time(), token_id))
        return cur.rowcount == 1

    # -- jobs ------------------------------------------------------------------

    def insert_job(
        self, principal: str, session: str | None, idem_key: str | None, backend: str, spec: JobSpec
    ) -> tuple[Job, bool]:
        """Insert a PENDING job; with an idempotency key already used, return that job. -> (job, created)."""
        if idem_key is not None:
            existing = self.conn.execute(
                f"SELECT {_JOB_COLS} FROM jobs WHERE principal=? AND idem_key=?", (principal, idem_key)
            ).fetchone()
            if existing:
                return _row_to_job(existing), False
        cur = self.conn.execute(
            "INSERT INTO jobs (principal, session, idem_key, backend, state, submit_time, spec) VALUES (?,?,?,?,?,?,?)",
            (principal, session, idem_key, backend, JobState.PENDING.value, time.time(),
             spec.model_dump_json(by_alias=True, exclude_none=True)),
        )
        return self.get_job(int(cur.lastrowid)), True  # type: ignore[arg-type, return-value]

    def set_backend_id(self, job_id: int, backend_id: str) -> None:
        self.conn.execute("UPDATE jobs SET backend_id=? WHERE id=?", (backend_id, job_id))

    def get_job(self, job_id: int) -> Job | None:
        row = self.conn.execute(f"SELECT {_JOB_COLS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return _row_to_job(row) if row else None

    def active_jobs(self) -> list[Job]:
        rows = self.conn.execute(
            f"SELECT {_JOB_COLS} FROM jobs WHERE state IN ('PENDING', 'RUNNING', 'UNKNOWN') ORDER BY id"
        ).fetchall()
        return [_row_to_job(r) for r in rows]

    def list_jobs(
        self,
        principals: Iterable[str] | None,
        states: Iterable[JobState] | None = None,
        session: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Job]:
        where: list[str] = []
        args: list[Any] = []
        if principals is not None:
            names = list(principals)
            where.append(f"principal IN ({','.join('?' * len(names))})")
            args.extend(names)
        if states:
            vals = [s.value for s in states]
            where.append(f"state IN ({','.join('?' * len(vals))})")
            args.extend(vals)
        if session:
            where.append("session=?")
            args.append(session)
        sql = f"SELECT {_JOB_COLS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ? OFFSET ?"
        args.extend([limit, offset])
        return [_row_to_job(r) for r in self.conn.execute(sql, args)]

    def update_job(
        self,
        job_id: int,
        state: JobState,
        *,
        exit_code: int | None = None,
        reason: str | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
    ) -> None:
        """Record what the backend reported. A terminal state is never overwritten."""
        terminal = tuple(s.value for s in TERMINAL_STATES)
        self.conn.execute(
            f"""UPDATE jobs SET state=?, exit_code=?, reason=?,
                start_time=COALESCE(start_time, ?), end_time=COALESCE(end_time, ?)
                WHERE id=? AND state NOT IN ({','.join('?' * len(terminal))})""",
            (state.value, exit_code, reason, start_time, end_time, job_id, *terminal),
        )

    def usage(self, principals: Iterable[str]) -> dict[str, Any]:
        """Jobs by state and CPU/GPU-hours consumed by finished and running jobs, summed
        by SQLite itself: a principal's history can be long."""
        names = list(principals)
        marks = ",".join("?" * len(names))
        by_state = {s: n for s, n in self.conn.execute(
            f"SELECT state, COUNT(*) FROM jobs WHERE principal IN ({marks}) GROUP BY state", names)}
        cpu_s, gpu_s = self.conn.execute(
            f"""SELECT COALESCE(SUM(json_extract(spec, '$.cpus') * MAX(0, COALESCE(end_time, :now) - start_time)), 0),
                       COALESCE(SUM(json_extract(spec, '$.gpus') * MAX(0, COALESCE(end_time, :now) - start_time)), 0)
                FROM jobs WHERE principal IN ({",".join(f":p{i}" for i in range(len(names)))})
                AND start_time IS NOT NULL""",
            {"now": time.time(), **{f"p{i}": n for i, n in enumerate(names)}},
        ).fetchone()
        return {"jobs_by_state": by_state, "cpu_hours": round(cpu_s / 3600, 4), "gpu_hours": round(gpu_s / 3600, 4)}

    def count_jobs(self) -> dict[str, int]:
        return {s: n for s, n in self.conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")}
