-- as shipped by commit 809042a
-- corral store at schema version 3 (tests/data/schemas/build.py)
PRAGMA user_version=3;
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
        ended REAL NOT NULL
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
        spec TEXT NOT NULL, cpu_s REAL,
        UNIQUE (principal, idem_key)
    );
INSERT INTO "jobs" VALUES(1,'alice-bot','s1','k1','slurm','4242','COMPLETED',0,NULL,1764000010.0,1764000011.0,1764000020.0,'{"command":"echo done","env":{},"cpus":1,"memory":100,"gpus":0,"walltime":60,"labels":{}}',NULL);
INSERT INTO "jobs" VALUES(2,'alice-bot','s1',NULL,'slurm','4243','RUNNING',NULL,NULL,1764000030.0,1764000031.0,NULL,'{"command":"sleep 600","env":{},"cpus":2,"memory":200,"gpus":0,"walltime":900,"labels":{}}',NULL);
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
CREATE INDEX jobs_active ON jobs(state) WHERE state IN ('PENDING', 'RUNNING', 'UNKNOWN');
CREATE INDEX jobs_principal ON jobs(principal, id);
CREATE INDEX jobs_session ON jobs(principal, session);
CREATE INDEX episodes_fp ON episodes(fingerprint, family);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('jobs',2);
INSERT INTO "sqlite_sequence" VALUES('notes',1);
INSERT INTO notes_fts(notes_fts) VALUES('rebuild');
