"""The store's schema: numbered migrations, the same on SQLite and PostgreSQL.

Each migration is written once, in SQLite's SQL; ``pg_statements`` renders it for
PostgreSQL (its types, and the few objects that differ: full-text search, the event
stream's triggers). A store records the last migration it ran (SQLite's
``user_version``; PostgreSQL's table ``corral_schema``) and runs the newer ones, all in
one transaction: a store is at one version or the next, never between.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Iterator

from corral.core.store.conn import Conn

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
    # 13: the node a job ran on (its last run's), as its scheduler or lane reports it:
    # what squeue's NODELIST shows an agent, and where a node failure struck
    """
    ALTER TABLE jobs ADD COLUMN node TEXT;
    """,
    # 14: the facility's submission rate buckets, one row per key (a principal, a session,
    # a token block), taken under the principal's admission lock on any replica (decision 0043)
    """
    CREATE TABLE rate_buckets (
        key TEXT PRIMARY KEY,
        tokens REAL NOT NULL,
        stamp REAL NOT NULL
    );
    CREATE INDEX rate_buckets_stamp ON rate_buckets(stamp);
    """,
    # 15: notifications: each person's choices, the outbox of every notification (sent,
    # waiting or given up), the notifier's marks (corral/notify/, corral/core/store/notify.py)
    """
    CREATE TABLE notify_prefs (
        principal TEXT PRIMARY KEY,
        prefs TEXT NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE notify_outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL UNIQUE,
        recipient TEXT NOT NULL,
        about TEXT NOT NULL,
        kind TEXT NOT NULL,
        channel TEXT NOT NULL,
        target TEXT NOT NULL,
        subject TEXT NOT NULL,
        body TEXT NOT NULL,
        created REAL NOT NULL,
        due REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT 'pending',
        sent REAL,
        error TEXT
    );
    CREATE INDEX notify_outbox_due ON notify_outbox(state, due);
    CREATE INDEX notify_outbox_recipient ON notify_outbox(recipient, id);
    CREATE TABLE notify_marks (
        name TEXT PRIMARY KEY,
        value REAL NOT NULL
    );
    """,
    # 16: approvals: actions a policy rule says a person must approve, waiting or decided,
    # and classes of action approved ahead for a session (corral/gateway/approvals.py)
    """
    CREATE TABLE approvals (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        principal TEXT NOT NULL,
        sponsor TEXT NOT NULL,
        session TEXT,
        action TEXT NOT NULL,
        rule TEXT NOT NULL,
        jobs TEXT NOT NULL,
        summary TEXT NOT NULL,
        created REAL NOT NULL,
        expires REAL NOT NULL,
        state TEXT NOT NULL,
        decided_by TEXT,
        decided_at REAL,
        note TEXT,
        link_hash TEXT
    );
    CREATE INDEX approvals_state ON approvals(state, expires);
    CREATE INDEX approvals_sponsor ON approvals(sponsor, id);
    CREATE TABLE preapprovals (
        principal TEXT NOT NULL,
        session TEXT NOT NULL,
        rule TEXT NOT NULL,
        by TEXT NOT NULL,
        created REAL NOT NULL,
        expires REAL NOT NULL,
        PRIMARY KEY (principal, session, rule)
    );
    """,
    # 17: the sponsor's view: each agent's refusals per rule and day, as the audit records
    # them (corral/core/store/sponsor.py)
    """
    CREATE TABLE refusal_counts (
        principal TEXT NOT NULL,
        rule TEXT NOT NULL,
        day INTEGER NOT NULL,
        n INTEGER NOT NULL,
        last REAL NOT NULL,
        last_reason TEXT,
        PRIMARY KEY (principal, rule, day)
    );
    """,
    # 18: the ledger: what each principal was told and has not acknowledged, carried on
    # every MCP answer until it is (corral/core/store/ledger.py)
    """
    CREATE TABLE ledger (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL UNIQUE,
        principal TEXT NOT NULL,
        kind TEXT NOT NULL,
        job_id INTEGER,
        text TEXT NOT NULL,
        at REAL NOT NULL,
        acked REAL
    );
    CREATE INDEX ledger_unacked ON ledger(principal, acked, id);
    CREATE INDEX ledger_at ON ledger(at);
    """,
    # 19: moves of pending jobs between clusters, recorded before the job is touched
    # (corral/core/store/moves.py, corral/control/rebalance.py)
    """
    CREATE TABLE moves (
        job_id INTEGER PRIMARY KEY,
        src TEXT NOT NULL,
        src_id TEXT NOT NULL,
        dst TEXT NOT NULL,
        why TEXT NOT NULL,
        at REAL NOT NULL,
        state TEXT NOT NULL DEFAULT 'open'
    );
    """,
    # 20: approvals of actions other than submissions: what to carry out once approved
    # (the verb's arguments), when it was taken to be, and what came of it
    # (corral/gateway/approvals.py)
    """
    ALTER TABLE approvals ADD COLUMN args TEXT;
    ALTER TABLE approvals ADD COLUMN done_at REAL;
    ALTER TABLE approvals ADD COLUMN outcome TEXT;
    """,
    # 21: sign-in's single-use records: each munge credential taken and each one-time
    # dashboard link, until it expires (corral/core/store/signin.py, decision 0060)
    """
    CREATE TABLE signin_once (
        key TEXT PRIMARY KEY,
        principal TEXT,
        until REAL NOT NULL,
        used REAL
    );
    CREATE INDEX signin_once_until ON signin_once(until);
    """,
]


def _statements(sql: str) -> Iterator[str]:
    """A migration's statements, one by one (a trigger's body holds semicolons of its own)."""
    part = ""
    for piece in sql.split(";"):
        part += piece + ";"
        if sqlite3.complete_statement(part):
            if part.strip(" \n;"):
                yield part
            part = ""


_PG_FTS = [
    # FTS5's external-content table: the note's words as a tsvector, searched through GIN.
    # 'simple': no stemming and no stop words, as FTS5's default tokenizer.
    """CREATE TABLE notes_fts (
        rowid BIGINT PRIMARY KEY,
        text TEXT NOT NULL,
        tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED
    )""",
    "CREATE INDEX notes_fts_tsv ON notes_fts USING GIN (tsv)",
]
_PG_EVENTS = [
    """CREATE FUNCTION job_events_log() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO job_events (job_id, principal, state, exit_code, at)
        VALUES (NEW.id, NEW.principal, NEW.state, NEW.exit_code, EXTRACT(EPOCH FROM clock_timestamp()));
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER job_events_submitted AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION job_events_log()",
    "CREATE TRIGGER job_events_changed AFTER UPDATE OF state ON jobs FOR EACH ROW "
    "WHEN (NEW.state IS DISTINCT FROM OLD.state) EXECUTE FUNCTION job_events_log()",
]
_PG_TYPES = [
    (re.compile(r"INTEGER PRIMARY KEY AUTOINCREMENT"), "BIGSERIAL PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),  # PostgreSQL's REAL is 4 bytes: times need 8
    (re.compile(r"\bBLOB\b"), "BYTEA"),
]


def pg_statements(sql: str) -> Iterator[str]:
    """One migration's statements as PostgreSQL takes them."""
    for statement in _statements(sql):
        text = statement.strip().rstrip(";")
        if text.startswith("CREATE VIRTUAL TABLE notes_fts"):
            yield from _PG_FTS
        elif text.startswith("CREATE VIRTUAL TABLE notes_vocab"):
            continue  # term counts come from ts_stat over notes_fts (store/memory.py)
        elif text.startswith("CREATE TRIGGER job_events_submitted"):
            yield from _PG_EVENTS
        elif text.startswith("CREATE TRIGGER"):
            continue  # both triggers come with the first
        else:
            for pattern, repl in _PG_TYPES:
                text = pattern.sub(repl, text)
            yield text


def version(conn: Conn) -> int:
    if conn.pg:
        conn.execute("CREATE TABLE IF NOT EXISTS corral_schema (version INTEGER NOT NULL)")
        row = conn.one("SELECT MAX(version) FROM corral_schema")
        return int(row[0] or 0)
    return int(conn.one("PRAGMA user_version")[0])


def migrate(conn: Conn) -> None:
    """Run the migrations this store has not run yet, each in one transaction. On
    PostgreSQL an advisory lock makes two gateways starting together take turns. A store
    a newer corral has used is refused; an early migration 3's is repaired (upgrade.py)."""
    from corral.core.store import upgrade  # it reads this module's source for the migrations' titles

    upgrade.guard(conn)
    if version(conn) < len(MIGRATIONS):
        _run(conn)
    upgrade.repair(conn)


def _run(conn: Conn) -> None:
    with conn.transaction():
        if conn.pg:
            conn.execute("SELECT pg_advisory_xact_lock(7262)")  # 'corral's migrations'
        current = version(conn)
        for number, sql in enumerate(MIGRATIONS, start=1):
            if number <= current:
                continue
            for statement in (pg_statements(sql) if conn.pg else _statements(sql)):
                conn.execute(statement)
            if conn.pg:
                conn.execute("INSERT INTO corral_schema (version) VALUES (?)", (number,))
            else:
                conn.execute(f"PRAGMA user_version={number}")
