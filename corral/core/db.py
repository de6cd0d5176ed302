"""The gateway's state in SQLite: WAL mode, numbered migrations, and the queries
the service core needs. Not the only writer yet: safety/store.py and memory's store.py,
facts.py and semantic.py write over this connection, and storage over its own
(storage/store.py); docs/architecture.md lists them.

One connection per ``Database``, used from one thread (the gateway's event loop);
statements are short, so the loop is never blocked for long.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

from corral.control.dependencies import Parent
from corral.core.jobs import Job, JobSpec, JobState, TERMINAL_STATES
from corral.core.principals import Kind, Principal

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
    # 2: measured CPU seconds (the fast lane reads them from each task's rusage)
    """
    ALTER TABLE jobs ADD COLUMN cpu_s REAL;
    CREATE INDEX jobs_session ON jobs(principal, session);
    """,
    # 3: memory (corral/memory): what became of each job, and notes with full-text search
    """
    CREATE TABLE episodes (
        job_id INTEGER PRIMARY KEY REFERENCES jobs(id),
        principal TEXT NOT NULL,
        family TEXT NOT NULL,
        account TEXT,
        fingerprint TEXT NOT NULL,
        resources TEXT NOT NULL,
        memory_mb INTEGER NOT NULL,
        state TEXT NOT NULL,
        exit_code INTEGER,
        signature TEXT,
        detail TEXT,
        deterministic INTEGER NOT NULL DEFAULT 0,
        ended REAL NOT NULL,
        cache_key TEXT
    );
    CREATE INDEX episodes_fp ON episodes(fingerprint, family);
    CREATE INDEX episodes_cache ON episodes(cache_key, principal) WHERE cache_key IS NOT NULL;
    CREATE TABLE notes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        text TEXT NOT NULL,
        scope TEXT NOT NULL CHECK (scope IN ('facility', 'account', 'user', 'agent', 'session')),
        author TEXT NOT NULL,
        family TEXT NOT NULL,
        account TEXT,
        session TEXT,
        job_id INTEGER,
        created REAL NOT NULL,
        expires REAL,
        flags TEXT
    );
    CREATE VIRTUAL TABLE notes_fts USING fts5(text, content='notes', content_rowid='id');
    CREATE VIRTUAL TABLE notes_vocab USING fts5vocab(notes_fts, 'row');
    CREATE TABLE audit_head (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq INTEGER NOT NULL,
        mac TEXT NOT NULL
    );
    CREATE TABLE facts (
        version INTEGER PRIMARY KEY,
        hash TEXT NOT NULL,
        facts TEXT NOT NULL,
        changes TEXT NOT NULL,
        updated REAL NOT NULL
    );
    """,
    # 4: safety (corral/safety): capability tokens' blocks and revocations, budgets per
    # token subtree, tainted sessions
    """
    ALTER TABLE jobs ADD COLUMN token_path TEXT;
    CREATE INDEX jobs_token ON jobs(token_path) WHERE token_path IS NOT NULL;
    CREATE TABLE token_blocks (
        id TEXT PRIMARY KEY,
        root TEXT NOT NULL,
        principal TEXT NOT NULL,
        first_seen REAL NOT NULL
    );
    CREATE TABLE revoked (id TEXT PRIMARY KEY, at REAL NOT NULL, by TEXT NOT NULL);
    CREATE TABLE taint (
        key TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        at REAL NOT NULL,
        reason TEXT NOT NULL
    );
    """,
    # 5: the newest episodes of a script straight from the index: advice read every row of
    # a script run thousands of times (a sweep's `true`) and sorted them, on every submit
    """
    DROP INDEX episodes_fp;
    CREATE INDEX episodes_fp ON episodes(fingerprint, family, ended);
    """,
    # 6: an idempotency key remembers the request it was used for: a reuse with another
    # body is a conflict, not a silent replay of the first
    """
    ALTER TABLE jobs ADD COLUMN idem_digest TEXT;
    """,
    # 7: every state change of every job, in commit order, for the event stream
    # (corral/control/events.py); written by triggers, so no path that changes a state
    # can forget to
    """
    CREATE TABLE job_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL,
        principal TEXT NOT NULL,
        state TEXT NOT NULL,
        exit_code INTEGER,
        at REAL NOT NULL
    );
    CREATE INDEX job_events_principal ON job_events(principal, id);
    CREATE TRIGGER job_events_submitted AFTER INSERT ON jobs BEGIN
        INSERT INTO job_events (job_id, principal, state, exit_code, at)
        VALUES (NEW.id, NEW.principal, NEW.state, NEW.exit_code, (julianday('now') - 2440587.5) * 86400.0);
    END;
    CREATE TRIGGER job_events_changed AFTER UPDATE OF state ON jobs WHEN NEW.state IS NOT OLD.state BEGIN
        INSERT INTO job_events (job_id, principal, state, exit_code, at)
        VALUES (NEW.id, NEW.principal, NEW.state, NEW.exit_code, (julianday('now') - 2440587.5) * 86400.0);
    END;
    """,
    # 8: a job held by its owner (job_control) is not sent; what a finished job used
    # (job_usage), where its lane measured it
    """
    ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN max_rss_mb REAL;
    """,
    # 9: the dashboard's "now" from indexes, not a scan of the whole history (1M jobs:
    # 3.9 s a snapshot without them)
    """
    CREATE INDEX jobs_submitted ON jobs(submit_time);
    CREATE INDEX jobs_ended ON jobs(end_time) WHERE end_time IS NOT NULL;
    """,
    # 10: storage (corral/storage/): environment images and the requests that build them,
    # trial workspaces, and jobs' metadata operations on shared paths
    """
    CREATE TABLE env_images (
        key TEXT PRIMARY KEY,
        name TEXT,
        record TEXT NOT NULL,
        builder TEXT,
        created REAL NOT NULL,
        last_used REAL
    );
    CREATE INDEX env_images_name ON env_images(name);
    CREATE TABLE env_requests (
        digest TEXT PRIMARY KEY,
        job_id INTEGER,
        key TEXT,
        name TEXT,
        principal TEXT NOT NULL,
        at REAL NOT NULL,
        state TEXT NOT NULL,
        reason TEXT
    );
    CREATE TABLE workspaces (
        id TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        base TEXT NOT NULL,
        rev TEXT,
        dir TEXT NOT NULL,
        how TEXT NOT NULL,
        created REAL NOT NULL,
        expires REAL NOT NULL,
        state TEXT NOT NULL
    );
    CREATE TABLE job_meta (
        job_id INTEGER PRIMARY KEY,
        principal TEXT NOT NULL,
        session TEXT,
        ops INTEGER NOT NULL,
        shared_ops INTEGER NOT NULL,
        by_call TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX job_meta_session ON job_meta(session);
    """,
    # 11: memory's semantic index: one vector per note (float16, unit length) and the
    # model that made it; a note written before its vector is found by id > max(note_id)
    """
    CREATE TABLE note_vectors (
        note_id INTEGER PRIMARY KEY,
        model TEXT NOT NULL,
        vec BLOB NOT NULL
    );
    """,
    # 12: a job the scheduler requeued (an agent's opportunistic job preempted) stays one
    # job: how many times, and the seconds of work its earlier runs lost (decision 0022)
    """
    ALTER TABLE jobs ADD COLUMN requeues INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN lost_s REAL;
    """,
]

_JOB_COLS = (
    "id, principal, session, backend, backend_id, state, exit_code, reason, "
    "submit_time, start_time, end_time, spec, requeues, lost_s"
)


_TERMINAL = tuple(s.value for s in TERMINAL_STATES)
_ACTIVE = "state IN ('PENDING', 'RUNNING', 'UNKNOWN')"
HELD_REASON = "held by request; release it to let it run"
"""A job held before it was sent (job_control's hold, a held submission)."""
_UPDATE = f"""UPDATE jobs SET state=?, exit_code=?, reason=?,
    start_time=COALESCE(start_time, ?), end_time=COALESCE(end_time, ?),
    cpu_s=COALESCE(?, cpu_s), max_rss_mb=COALESCE(?, max_rss_mb), requeues=MAX(requeues, ?),
    lost_s=COALESCE(?, lost_s) WHERE id=? AND state NOT IN ({','.join('?' * len(_TERMINAL))})"""
"""One job's new facts; a terminal state is never overwritten (a late report cannot undo an end).
A requeued job keeps its first start; its requeue count only grows."""

_SPECS: dict[str, JobSpec] = {}


class Run(NamedTuple):
    """A job as the reconciler compares it with its lane's answer: no spec (a spec may
    be 256 KiB, and every active job is read every tick)."""

    id: int
    backend: str
    backend_id: str
    state: JobState
    exit_code: int | None
    reason: str | None
    start_time: float | None
    requeues: int = 0
    lost_s: float | None = None


def _statements(sql: str) -> Iterator[str]:
    """A migration's statements, one by one (a trigger's body holds semicolons of its own)."""
    part = ""
    for piece in sql.split(";"):
        part += piece + ";"
        if sqlite3.complete_statement(part):
            if part.strip(" \n;"):
                yield part
            part = ""


def _parse_spec(text: str) -> JobSpec:
    """Specs never change once stored: parse each distinct one once (a status read is hot)."""
    spec = _SPECS.get(text)
    if spec is None:
        if len(_SPECS) > 50_000:
            _SPECS.clear()
        spec = _SPECS[text] = JobSpec.model_validate(json.loads(text))
    return spec


def _row_to_job(row: sqlite3.Row | tuple[Any, ...]) -> Job:
    (id_, principal, session, backend, backend_id, state, exit_code, reason, st, bt, et, spec, requeues, lost_s) = row
    return Job.stored(
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
        requeues=requeues,
        lost_s=lost_s,
    )


def _idem_keys(key: str | None, n: int) -> list[str | None]:
    if key is None:
        return [None] * n
    return [key if i == 0 else f"{key}/{i}" for i in range(n)]


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
                for statement in _statements(sql):
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

    # -- jobs ------------------------------------------------------------------

    def insert_job(self, principal: str, session: str | None, backend: str, spec: JobSpec) -> Job:
        """One PENDING job (corral's own, such as a fast-lane allocation)."""
        with self.transaction():
            return self.insert_jobs(principal, session, [(backend, spec)])[0]

    def insert_jobs(self, principal: str, session: str | None, items: list[tuple[str, JobSpec]],
                    token_path: str | None = None, idem_key: str | None = None, digest: str | None = None,
                    held: bool = False) -> list[Job]:
        """PENDING jobs, (lane, spec) each, in one statement per 500. With ``idem_key``
        the jobs take the keys ``KEY``, ``KEY/1``, ``KEY/2`` ... and ``digest`` (see
        ``find_idempotent``). ``held``: recorded held (``set_held``), so that no Sender
        sends them before a release (sbatch -H). Call inside ``transaction()``."""
        now = time.time()
        dumped: dict[int, str] = {}  # a batch's jobs often share one spec object: dump it once
        texts = [dumped.get(id(spec)) or dumped.setdefault(id(spec), spec.model_dump_json(by_alias=True, exclude_none=True))
                 for _, spec in items]
        keys = _idem_keys(idem_key, len(items))
        reason = HELD_REASON if held else None
        jobs: list[Job] = []
        for i in range(0, len(items), 500):  # 11 parameters a row, under SQLite's limit
            chunk = items[i: i + 500]
            rows = ",".join("(?,?,?,?,?,?,?,?,?,?,?)" for _ in chunk)
            args: list[Any] = []
            for k, (backend, _) in enumerate(chunk):
                args += [principal, session, keys[i + k], digest if keys[i + k] else None, backend,
                         JobState.PENDING.value, now, texts[i + k], token_path, int(held), reason]
            ids = [r[0] for r in self.conn.execute(
                f"INSERT INTO jobs (principal, session, idem_key, idem_digest, backend, state, submit_time, spec, "
                f"token_path, held, reason) VALUES {rows} RETURNING id", args).fetchall()]
            # Built from what was written: no read back (a batch of 1,000 inserts is hot).
            jobs += [_row_to_job((jid, principal, session, backend, None, JobState.PENDING.value, None, reason, now,
                                  None, None, text, 0, None)) for jid, (backend, _), text in zip(ids, chunk, texts[i: i + 500])]
        return jobs

    def update_jobs(self, updates: list[tuple[int, JobState, int | None, str | None, float | None, float | None,
                                               float | None, float | None]]) -> None:
        """``update_job`` for many: (id, state, exit code, reason, start, end, cpu s, peak MB); one statement."""
        self.conn.executemany(_UPDATE, [(st.value, code, reason, start, end, cpu, rss, 0, None, jid, *_TERMINAL)
                                        for jid, st, code, reason, start, end, cpu, rss in updates])

    def audit_head(self) -> tuple[int, str] | None:
        r = self.conn.execute("SELECT seq, mac FROM audit_head WHERE id=1").fetchone()
        return (int(r[0]), str(r[1])) if r else None

    def set_audit_head(self, seq: int, mac: str) -> None:
        self.conn.execute("INSERT INTO audit_head (id, seq, mac) VALUES (1, ?, ?) "
                          "ON CONFLICT(id) DO UPDATE SET seq=excluded.seq, mac=excluded.mac", (seq, mac))

    def find_idempotent(self, principal: str, idem_key: str, n: int) -> tuple[list[Job], str | None] | None:
        """The ``n`` jobs a request with this key made, and that request's digest; None if
        the key is new. A request that made a different number of jobs is returned whole
        (its digest then differs from any request of ``n``)."""
        first = self.conn.execute("SELECT id, idem_digest FROM jobs WHERE principal=? AND idem_key=?",
                                  (principal, idem_key)).fetchone()
        if first is None:
            return None
        keys = _idem_keys(idem_key, max(n, 1))
        rows = self.conn.execute(
            f"SELECT {_JOB_COLS} FROM jobs WHERE principal=? AND idem_key IN ({','.join('?' * len(keys))}) ORDER BY id",
            (principal, *keys)).fetchall()
        return [_row_to_job(r) for r in rows], first[1]

    def set_backend_ids(self, pairs: list[tuple[int, str]]) -> None:
        if pairs:
            self.conn.executemany("UPDATE jobs SET backend_id = ? WHERE id = ?", [(b, j) for j, b in pairs])


    def get_job(self, job_id: int) -> Job | None:
        row = self.conn.execute(f"SELECT {_JOB_COLS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return _row_to_job(row) if row else None

    def get_jobs(self, job_ids: list[int]) -> dict[int, Job]:
        """Many jobs in one query -> id: job (missing ids are absent)."""
        out: dict[int, Job] = {}
        for i in range(0, len(job_ids), 900):  # SQLite's bound-parameter limit
            chunk = job_ids[i: i + 900]
            rows = self.conn.execute(
                f"SELECT {_JOB_COLS} FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            out.update((r[0], _row_to_job(r)) for r in rows)
        return out

    def states(self, job_ids: list[int]) -> dict[int, tuple[str, str]]:
        """-> id: (state, principal), without parsing specs: cheap enough to ask often."""
        out: dict[int, tuple[str, str]] = {}
        for i in range(0, len(job_ids), 900):
            chunk = job_ids[i: i + 900]
            out.update((r[0], (r[1], r[2])) for r in self.conn.execute(
                f"SELECT id, state, principal FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk))
        return out

    def active_jobs(self, *, unsent: bool = False) -> list[Job]:
        """Jobs not yet ended; ``unsent``: only those never handed to a lane."""
        where = _ACTIVE + (" AND backend_id IS NULL AND held = 0" if unsent else "")
        rows = self.conn.execute(f"SELECT {_JOB_COLS} FROM jobs WHERE {where} ORDER BY id").fetchall()
        return [_row_to_job(r) for r in rows]

    def parents(self, job_ids: list[int]) -> dict[int, Parent]:
        """-> id: (state, lane, backend id, principal) of the jobs others wait for
        (control/dependencies.py)."""
        out: dict[int, Parent] = {}
        ids = list(dict.fromkeys(job_ids))
        for i in range(0, len(ids), 900):
            chunk = ids[i: i + 900]
            out.update((r[0], Parent(*r[1:])) for r in self.conn.execute(
                f"SELECT id, state, backend, backend_id, principal FROM jobs WHERE id IN ({','.join('?' * len(chunk))})",
                chunk))
        return out

    def queued_on(self, backend: str, but: str, limit: int = 500) -> list[Job]:
        """Jobs sent to ``backend`` that are still PENDING, but ``but``'s, oldest first
        (the fast lane asks which batch jobs wait for cores, each tick)."""
        rows = self.conn.execute(
            f"SELECT {_JOB_COLS} FROM jobs WHERE state='PENDING' AND backend=? AND backend_id IS NOT NULL "
            "AND principal != ? ORDER BY id LIMIT ?", (backend, but, limit)).fetchall()
        return [_row_to_job(r) for r in rows]

    def set_reasons(self, job_ids: list[int], reason: str) -> None:
        """What these jobs wait for, while they are still PENDING (the fast lane's pools)."""
        for i in range(0, len(job_ids), 900):
            chunk = job_ids[i: i + 900]
            self.conn.execute(f"UPDATE jobs SET reason=? WHERE state='PENDING' AND id IN ({','.join('?' * len(chunk))})",
                              [reason, *chunk])

    def set_held(self, job_id: int, held: bool, reason: str) -> bool:
        """Hold (or release) a job not yet sent to a lane; -> whether it was such a job."""
        return self.conn.execute(
            f"UPDATE jobs SET held=?, reason=? WHERE id=? AND backend_id IS NULL AND {_ACTIVE}",
            (int(held), reason, job_id)).rowcount == 1

    def usage_of(self, job_id: int) -> tuple[float | None, float | None]:
        """-> (CPU seconds, peak memory MB) recorded for a job, each None if not measured."""
        r = self.conn.execute("SELECT cpu_s, max_rss_mb FROM jobs WHERE id=?", (job_id,)).fetchone()
        return (r[0], r[1]) if r else (None, None)

    def set_usage(self, job_id: int, cpu_s: float | None, max_rss_mb: float | None) -> None:
        self.conn.execute("UPDATE jobs SET cpu_s=COALESCE(?, cpu_s), max_rss_mb=COALESCE(?, max_rss_mb) WHERE id=?",
                          (cpu_s, max_rss_mb, job_id))

    def guaranteed_cpus(self, partition: str | None) -> int:
        """CPUs of agents' unfinished jobs placed in the guaranteed tier of a partition
        (None: sent without one, to the default). Only read when a guaranteed share is set."""
        rows = self.conn.execute(
            f"""SELECT json_extract(spec, '$.cpus') FROM jobs WHERE {_ACTIVE}
                AND json_extract(spec, '$.labels."corral-tier"') = 'guaranteed'
                AND json_extract(spec, '$.partition') IS ?""", (partition,)).fetchall()
        return sum(int(r[0] or 1) for r in rows)

    def active_runs(self, lanes: Iterable[str]) -> list[Run]:
        """Jobs not yet ended that were sent to these lanes (the ones the reconciler polls)."""
        names = list(lanes)
        rows = self.conn.execute(
            f"SELECT id, backend, backend_id, state, exit_code, reason, start_time, requeues, lost_s FROM jobs "
            f"WHERE {_ACTIVE} AND backend_id IS NOT NULL AND backend IN ({','.join('?' * len(names))}) ORDER BY id",
            names)
        return [Run(i, b, bid, JobState(s), c, r, t, q, lost) for i, b, bid, s, c, r, t, q, lost in rows]

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
        cpu_s: float | None = None,
        requeues: int = 0,
        lost_s: float | None = None,
    ) -> None:
        """Record what the backend reported. A terminal state is never overwritten."""
        self.conn.execute(_UPDATE, (state.value, exit_code, reason, start_time, end_time, cpu_s, None, requeues, lost_s,
                                    job_id, *_TERMINAL))

    def mark_running(self, started: dict[int, float]) -> None:
        """Jobs still PENDING that started (id -> start time): one statement for many."""
        self.conn.executemany("UPDATE jobs SET state='RUNNING', start_time=? WHERE id=? AND state='PENDING'",
                              [(t, jid) for jid, t in started.items()])

    def clear_backend_id(self, job_id: int) -> None:
        """Mark a job as not yet sent: the reconciler sends it again."""
        self.conn.execute("UPDATE jobs SET backend_id=NULL WHERE id=?", (job_id,))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Many writes, one commit: a batch of 100 jobs costs one fsync, not 100."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- the event stream ---------------------------------------------------------------

    def events(self, after: int, principals: Iterable[str] | None, limit: int) -> list[tuple[Any, ...]]:
        """State changes after event ``after``, oldest first: (id, job_id, principal,
        state, exit_code, at); of ``principals`` only, unless None."""
        sql = "SELECT id, job_id, principal, state, exit_code, at FROM job_events WHERE id > ?"
        args: list[Any] = [after]
        if principals is not None:
            names = list(principals)
            sql += f" AND principal IN ({','.join('?' * len(names))})"
            args += names
        return self.conn.execute(sql + " ORDER BY id LIMIT ?", [*args, limit]).fetchall()

    def event_bounds(self) -> tuple[int, int]:
        """(the newest event's id, the id before the oldest kept): 0 where there is none."""
        newest, oldest = self.conn.execute("SELECT MAX(id), MIN(id) FROM job_events").fetchone()
        if newest is None:  # none kept: AUTOINCREMENT still knows the last id given
            row = self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name='job_events'").fetchone()
            return (row[0], row[0]) if row else (0, 0)
        return newest, oldest - 1

    def prune_events(self, before: float) -> int:
        """Forget the events older than ``before`` (a time); -> how many."""
        with self.transaction():
            return self.conn.execute("DELETE FROM job_events WHERE at < ?", (before,)).rowcount

    def usage(self, principals: Iterable[str]) -> dict[str, Any]:
        """Jobs by state and CPU/GPU-hours (allocated CPUs x elapsed) of finished and
        running jobs, in total, by lane and by session; summed by SQLite itself: a
        principal's history can be long. ``measured_cpu_hours`` is what the fast lane
        read from its tasks' rusage."""
        names = list(principals)
        marks = ",".join("?" * len(names))
        by_state = {s: n for s, n in self.conn.execute(
            f"SELECT state, COUNT(*) FROM jobs WHERE principal IN ({marks}) GROUP BY state", names)}
        rows = self.conn.execute(
            f"""SELECT COALESCE(json_extract(spec, '$.lane'), 'batch'), session,
                       SUM(json_extract(spec, '$.cpus') * MAX(0, COALESCE(end_time, ?) - start_time)),
                       SUM(json_extract(spec, '$.gpus') * MAX(0, COALESCE(end_time, ?) - start_time)),
                       SUM(cpu_s), COUNT(*)
                FROM jobs WHERE principal IN ({marks}) AND start_time IS NOT NULL GROUP BY 1, session""",
            (time.time(), time.time(), *names)).fetchall()
        lanes: dict[str, dict[str, float]] = {}
        sessions: dict[str, dict[str, float]] = {}
        total = {"cpu": 0.0, "gpu": 0.0, "measured": 0.0}
        for lane, session, cpu, gpu, measured, n in rows:
            for bucket in (lanes.setdefault(lane, {}),
                           sessions.setdefault(session or "-", {})):
                bucket["cpu_hours"] = bucket.get("cpu_hours", 0.0) + (cpu or 0) / 3600
                bucket["gpu_hours"] = bucket.get("gpu_hours", 0.0) + (gpu or 0) / 3600
                bucket["jobs"] = bucket.get("jobs", 0) + n
            total["cpu"] += cpu or 0
            total["gpu"] += gpu or 0
            total["measured"] += measured or 0

        def r(d: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
            return {k: {m: round(v, 4) for m, v in x.items()} for k, x in sorted(d.items())}

        return {"jobs_by_state": by_state, "cpu_hours": round(total["cpu"] / 3600, 4),
                "gpu_hours": round(total["gpu"] / 3600, 4), "measured_cpu_hours": round(total["measured"] / 3600, 6),
                "by_lane": r(lanes), "by_session": r(sessions)}

    def count_jobs(self) -> dict[str, int]:
        return {s: n for s, n in self.conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")}
