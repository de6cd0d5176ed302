-- as shipped by commit 1ceb0c9
-- corral store at schema version 19 (tests/data/schemas/build.py)
PRAGMA user_version=19;
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
CREATE TABLE audit_head (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq INTEGER NOT NULL,
        mac TEXT NOT NULL
    );
CREATE TABLE env_images (
        key TEXT PRIMARY KEY,
        name TEXT,
        record TEXT NOT NULL,
        builder TEXT,
        created REAL NOT NULL,
        last_used REAL
    );
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
CREATE TABLE facts (
        version INTEGER PRIMARY KEY,
        hash TEXT NOT NULL,
        facts TEXT NOT NULL,
        changes TEXT NOT NULL,
        updated REAL NOT NULL
    );
CREATE TABLE job_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL,
        principal TEXT NOT NULL,
        state TEXT NOT NULL,
        exit_code INTEGER,
        at REAL NOT NULL
    );
INSERT INTO "job_events" VALUES(1,1,'alice-bot','COMPLETED',0,1764000050.0);
INSERT INTO "job_events" VALUES(2,2,'alice-bot','RUNNING',NULL,1764000050.0);
CREATE TABLE job_meta (
        job_id INTEGER PRIMARY KEY,
        principal TEXT NOT NULL,
        session TEXT,
        ops INTEGER NOT NULL,
        shared_ops INTEGER NOT NULL,
        by_call TEXT NOT NULL,
        at REAL NOT NULL
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
        spec TEXT NOT NULL, cpu_s REAL, token_path TEXT, idem_digest TEXT, held INTEGER NOT NULL DEFAULT 0, max_rss_mb REAL, requeues INTEGER NOT NULL DEFAULT 0, lost_s REAL, node TEXT,
        UNIQUE (principal, idem_key)
    );
INSERT INTO "jobs" VALUES(1,'alice-bot','s1','k1','slurm','4242','COMPLETED',0,NULL,1764000010.0,1764000011.0,1764000020.0,'{"command":"echo done","env":{},"cpus":1,"memory":100,"gpus":0,"walltime":60,"labels":{}}',NULL,NULL,NULL,0,NULL,0,NULL,NULL);
INSERT INTO "jobs" VALUES(2,'alice-bot','s1',NULL,'slurm','4243','RUNNING',NULL,NULL,1764000030.0,1764000031.0,NULL,'{"command":"sleep 600","env":{},"cpus":2,"memory":200,"gpus":0,"walltime":900,"labels":{}}',NULL,NULL,NULL,0,NULL,0,NULL,NULL);
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
CREATE TABLE moves (
        job_id INTEGER PRIMARY KEY,
        src TEXT NOT NULL,
        src_id TEXT NOT NULL,
        dst TEXT NOT NULL,
        why TEXT NOT NULL,
        at REAL NOT NULL,
        state TEXT NOT NULL DEFAULT 'open'
    );
CREATE TABLE note_vectors (
        note_id INTEGER PRIMARY KEY,
        model TEXT NOT NULL,
        vec BLOB NOT NULL
    );
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
INSERT INTO "notes" VALUES(1,'module load gcc before make','account','alice','build','proj1',NULL,NULL,1764000040.0,NULL,NULL);
CREATE VIRTUAL TABLE notes_fts USING fts5(text, content='notes', content_rowid='id');
INSERT INTO "notes_fts" VALUES('module load gcc before make');
CREATE VIRTUAL TABLE notes_vocab USING fts5vocab(notes_fts, 'row');
CREATE TABLE notify_marks (
        name TEXT PRIMARY KEY,
        value REAL NOT NULL
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
CREATE TABLE notify_prefs (
        principal TEXT PRIMARY KEY,
        prefs TEXT NOT NULL,
        updated REAL NOT NULL
    );
CREATE TABLE preapprovals (
        principal TEXT NOT NULL,
        session TEXT NOT NULL,
        rule TEXT NOT NULL,
        by TEXT NOT NULL,
        created REAL NOT NULL,
        expires REAL NOT NULL,
        PRIMARY KEY (principal, session, rule)
    );
CREATE TABLE principals (
        name TEXT PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('human', 'agent', 'service')),
        sponsor TEXT REFERENCES principals(name),
        unix_user TEXT,
        account TEXT,
        is_admin INTEGER NOT NULL DEFAULT 0,
        created REAL NOT NULL
    );
INSERT INTO "principals" VALUES('alice','human',NULL,'alice','proj1',0,1764000000.0);
INSERT INTO "principals" VALUES('alice-bot','agent','alice',NULL,'proj1',0,1764000001.0);
CREATE TABLE rate_buckets (
        key TEXT PRIMARY KEY,
        tokens REAL NOT NULL,
        stamp REAL NOT NULL
    );
CREATE TABLE refusal_counts (
        principal TEXT NOT NULL,
        rule TEXT NOT NULL,
        day INTEGER NOT NULL,
        n INTEGER NOT NULL,
        last REAL NOT NULL,
        last_reason TEXT,
        PRIMARY KEY (principal, rule, day)
    );
CREATE TABLE revoked (id TEXT PRIMARY KEY, at REAL NOT NULL, by TEXT NOT NULL);
CREATE TABLE taint (
        key TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        at REAL NOT NULL,
        reason TEXT NOT NULL
    );
CREATE TABLE token_blocks (
        id TEXT PRIMARY KEY,
        root TEXT NOT NULL,
        principal TEXT NOT NULL,
        first_seen REAL NOT NULL
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
INSERT INTO "tokens" VALUES('tok1','alice-bot','9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f',1764000002.0,NULL,NULL,'from the fixture');
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
CREATE INDEX jobs_active ON jobs(state) WHERE state IN ('PENDING', 'RUNNING', 'UNKNOWN');
CREATE INDEX jobs_principal ON jobs(principal, id);
CREATE INDEX jobs_session ON jobs(principal, session);
CREATE INDEX episodes_cache ON episodes(cache_key, principal) WHERE cache_key IS NOT NULL;
CREATE INDEX jobs_token ON jobs(token_path) WHERE token_path IS NOT NULL;
CREATE INDEX episodes_fp ON episodes(fingerprint, family, ended);
CREATE INDEX job_events_principal ON job_events(principal, id);
CREATE TRIGGER job_events_submitted AFTER INSERT ON jobs BEGIN
        INSERT INTO job_events (job_id, principal, state, exit_code, at)
        VALUES (NEW.id, NEW.principal, NEW.state, NEW.exit_code, (julianday('now') - 2440587.5) * 86400.0);
    END;
CREATE TRIGGER job_events_changed AFTER UPDATE OF state ON jobs WHEN NEW.state IS NOT OLD.state BEGIN
        INSERT INTO job_events (job_id, principal, state, exit_code, at)
        VALUES (NEW.id, NEW.principal, NEW.state, NEW.exit_code, (julianday('now') - 2440587.5) * 86400.0);
    END;
CREATE INDEX jobs_submitted ON jobs(submit_time);
CREATE INDEX jobs_ended ON jobs(end_time) WHERE end_time IS NOT NULL;
CREATE INDEX env_images_name ON env_images(name);
CREATE INDEX job_meta_session ON job_meta(session);
CREATE INDEX rate_buckets_stamp ON rate_buckets(stamp);
CREATE INDEX notify_outbox_due ON notify_outbox(state, due);
CREATE INDEX notify_outbox_recipient ON notify_outbox(recipient, id);
CREATE INDEX approvals_state ON approvals(state, expires);
CREATE INDEX approvals_sponsor ON approvals(sponsor, id);
CREATE INDEX ledger_unacked ON ledger(principal, acked, id);
CREATE INDEX ledger_at ON ledger(at);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('job_events',2);
INSERT INTO "sqlite_sequence" VALUES('jobs',2);
INSERT INTO "sqlite_sequence" VALUES('notes',1);
INSERT INTO notes_fts(notes_fts) VALUES('rebuild');
