"""The memory concern of the store: episodes (what became of each job), notes with their
full-text index, the facility's facts, and the notes' vectors (corral/memory/).

Full-text search is FTS5 on SQLite (BM25) and a GIN-indexed tsvector on PostgreSQL
(ts_rank_cd): both rank, and ``match`` returns higher-is-better scores either way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from corral.core.store.conn import Conn

EPISODE_COLS = ("job_id, principal, family, account, fingerprint, resources, memory_mb, state, exit_code, "
                "signature, detail, deterministic, ended, cache_key")
NOTE_COLS = "id, text, scope, author, session, job_id, created, expires, flags"


class Viewer(NamedTuple):
    """Who reads notes, as scopes see them (an admin reads all: no Viewer)."""

    account: str | None
    family: str
    name: str
    session: str | None


class MemoryRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    # -- episodes -------------------------------------------------------------------------

    def record_episodes(self, rows: list[tuple[Any, ...]]) -> None:
        """Rows of ``EPISODE_COLS``; a job already remembered is skipped."""
        self.conn.executemany(self.conn.insert_ignore("episodes", EPISODE_COLS, 14), rows)

    def cached(self, key: str, principal: str) -> int | None:
        r = self.conn.one("""SELECT job_id FROM episodes WHERE cache_key=? AND principal=? AND state='COMPLETED'
                             ORDER BY ended DESC LIMIT 1""", (key, principal))
        return int(r[0]) if r else None

    def episode(self, job_id: int) -> tuple[Any, ...] | None:
        """(signature, detail, deterministic) of a job's episode."""
        r = self.conn.one("SELECT signature, detail, deterministic FROM episodes WHERE job_id=?", (job_id,))
        return tuple(r) if r else None

    def episodes_of(self, job_ids: list[int]) -> dict[int, tuple[str | None, str | None]]:
        """job id -> (signature, detail), for those that have an episode."""
        if not job_ids:
            return {}
        return {r[0]: (r[1], r[2]) for r in self.conn.execute(
            f"SELECT job_id, signature, detail FROM episodes WHERE job_id IN ({self.conn.marks(len(job_ids))})",
            job_ids)}

    def episodes(self, fingerprint: str, family: str, account: str | None) -> list[tuple[Any, ...]]:
        """The newest 50 episodes of a script in a family (or, given ``account``, in its
        account too): job_id, principal, resources, memory_mb, state, exit_code, signature,
        detail, deterministic, ended, and the job's workdir."""
        where, args = "e.fingerprint=? AND e.family=?", [fingerprint, family]
        if account:
            where, args = "e.fingerprint=? AND (e.family=? OR e.account=?)", [fingerprint, family, account]
        return self.conn.all(
            f"""SELECT e.job_id, e.principal, e.resources, e.memory_mb, e.state, e.exit_code, e.signature, e.detail,
                       e.deterministic, e.ended, {self.conn.json('j.spec', 'workdir')}
                FROM episodes e LEFT JOIN jobs j ON j.id = e.job_id
                WHERE {where} ORDER BY e.ended DESC LIMIT 50""", args)

    def runtimes(self, fingerprint: str, family: str, resources: str, n: int) -> list[tuple[int, float]]:
        """(job id, seconds run) of the last ``n`` completed, never requeued runs."""
        rows = self.conn.all(
            """SELECT e.job_id, j.end_time - j.start_time FROM episodes e JOIN jobs j ON j.id = e.job_id
               WHERE e.fingerprint=? AND e.family=? AND e.resources=? AND e.state='COMPLETED'
                 AND j.start_time IS NOT NULL AND j.end_time IS NOT NULL AND j.requeues = 0
               ORDER BY e.ended DESC LIMIT ?""", (fingerprint, family, resources, n))
        return [(int(jid), max(0.0, float(ran))) for jid, ran in rows]

    # -- notes ----------------------------------------------------------------------------

    def add_note(self, text: str, scope: str, author: str, family: str, account: str | None, session: str | None,
                 job_id: int | None, created: float, expires: float | None, flags: str | None) -> int:
        """A note and its words in the full-text index, in one transaction; -> its id."""
        with self.conn.transaction():
            nid = int(self.conn.one(
                """INSERT INTO notes (text, scope, author, family, account, session, job_id, created, expires, flags)
                   VALUES (?,?,?,?,?,?,?,?,?,?) RETURNING id""",
                (text, scope, author, family, account, session, job_id, created, expires, flags))[0])
            self.conn.execute("INSERT INTO notes_fts (rowid, text) VALUES (?, ?)", (nid, text))
        return nid

    def note(self, note_id: int) -> tuple[Any, ...] | None:
        """A note's ``NOTE_COLS``."""
        r = self.conn.one(f"SELECT {NOTE_COLS} FROM notes WHERE id=?", (note_id,))
        return tuple(r) if r else None

    def match(self, terms: list[str], limit: int) -> list[tuple[int, float]]:
        """The best ``limit`` notes holding any of ``terms``: (id, score), best first."""
        if self.conn.pg:
            q = " || ".join(["plainto_tsquery('simple', ?)"] * len(terms))
            rows = self.conn.all(f"""SELECT f.rowid, ts_rank_cd(f.tsv, q.q) FROM notes_fts f, (SELECT {q} AS q) q
                                     WHERE f.tsv @@ q.q ORDER BY 2 DESC, f.rowid LIMIT ?""", [*terms, limit])
            return [(int(i), float(r)) for i, r in rows]
        match = " OR ".join(f'"{t}"' for t in terms)
        rows = self.conn.all("SELECT rowid, rank FROM notes_fts WHERE notes_fts MATCH ? ORDER BY rank LIMIT ?",
                             (match, limit))
        return [(int(i), -float(r)) for i, r in rows]  # FTS5's rank: lower is better

    def phrase(self, phrase: str) -> list[tuple[int, str | None]]:
        """(id, flags) of the notes that hold this phrase."""
        if self.conn.pg:
            return self.conn.all("""SELECT n.id, n.flags FROM notes_fts f JOIN notes n ON n.id = f.rowid
                                    WHERE f.tsv @@ phraseto_tsquery('simple', ?)""", (phrase,))
        return self.conn.all("""SELECT n.id, n.flags FROM notes_fts f JOIN notes n ON n.id = f.rowid
                                WHERE notes_fts MATCH ?""", (f'"{phrase}"',))

    def term_docs(self, terms: list[str]) -> dict[str, int]:
        """How many notes hold each term (terms in no note are absent)."""
        if not terms:
            return {}
        marks = self.conn.marks(len(terms))
        if self.conn.pg:
            return dict(self.conn.all(
                f"SELECT word, ndoc FROM ts_stat('SELECT tsv FROM notes_fts') WHERE word IN ({marks})", terms))
        return dict(self.conn.all(f"SELECT term, doc FROM notes_vocab WHERE term IN ({marks})", terms))

    def newest_note(self) -> int:
        """The highest note id: the number of notes, near enough, in O(1)."""
        return int(self.conn.one("SELECT COALESCE(MAX(id), 0) FROM notes")[0])

    def readable(self, ids: list[int], viewer: Viewer | None, now: float) -> set[int]:
        """Which of these notes ``viewer`` may read now (scope, expiry)."""
        if not ids:
            return set()
        vis, args = "1=1", []
        if viewer is not None:
            vis = ("(n.scope='facility' OR (n.scope='account' AND n.account=?) OR (n.scope='user' AND n.family=?)"
                   " OR (n.scope='agent' AND n.author=?) OR (n.scope='session' AND n.author=? AND n.session=?))")
            args = [viewer.account, viewer.family, viewer.name, viewer.name, viewer.session]
        return {r[0] for r in self.conn.execute(
            f"""SELECT n.id FROM notes n WHERE n.id IN ({self.conn.marks(len(ids))}) AND {vis}
                AND (n.expires IS NULL OR n.expires > ?)""", [*ids, *args, now])}

    def promote(self, note_id: int) -> bool:
        return self.conn.execute("UPDATE notes SET scope='facility' WHERE id=?", (note_id,)).rowcount > 0

    def set_flags(self, note_id: int, flags: str) -> None:
        self.conn.execute("UPDATE notes SET flags=? WHERE id=?", (flags, note_id))

    def session_notes(self, author: str, session: str | None, limit: int = 50) -> list[tuple[Any, ...]]:
        """(id, text, scope, created) of an author's notes in a session (None: none), newest first."""
        return self.conn.all(f"""SELECT id, text, scope, created FROM notes WHERE author = ?
                                 AND {self.conn.is_('session')} ORDER BY id DESC LIMIT ?""", (author, session, limit))

    # -- facts ----------------------------------------------------------------------------

    def facts(self) -> tuple[Any, ...] | None:
        """The newest harvest: (version, hash, facts, changes, updated)."""
        r = self.conn.one("SELECT version, hash, facts, changes, updated FROM facts ORDER BY version DESC LIMIT 1")
        return tuple(r) if r else None

    def add_facts(self, version: int, digest: str, facts: str, changes: str, updated: float) -> None:
        self.conn.execute("INSERT INTO facts (version, hash, facts, changes, updated) VALUES (?,?,?,?,?)",
                          (version, digest, facts, changes, updated))

    # -- vectors --------------------------------------------------------------------------

    def any_note(self) -> bool:
        return self.conn.one("SELECT 1 FROM notes LIMIT 1") is not None

    def forget_vectors(self, but_model: str) -> int:
        """Drop the vectors another model made; -> how many."""
        return int(self.conn.execute("DELETE FROM note_vectors WHERE model != ?", (but_model,)).rowcount)

    def vectors_after(self, note_id: int, limit: int) -> list[tuple[int, bytes]]:
        return [(int(i), bytes(v)) for i, v in self.conn.all(
            "SELECT note_id, vec FROM note_vectors WHERE note_id > ? ORDER BY note_id LIMIT ?", (note_id, limit))]

    def last_embedded(self) -> int:
        return int(self.conn.one("SELECT COALESCE(MAX(note_id), 0) FROM note_vectors")[0])

    def notes_after(self, note_id: int, limit: int) -> list[tuple[int, str]]:
        return [(int(i), str(t)) for i, t in self.conn.all(
            "SELECT id, text FROM notes WHERE id > ? ORDER BY id LIMIT ?", (note_id, limit))]

    def count_notes_after(self, note_id: int) -> int:
        return int(self.conn.one("SELECT COUNT(*) FROM notes WHERE id > ?", (note_id,))[0])

    def put_vectors(self, rows: list[tuple[int, str, bytes]]) -> None:
        """(note id, model, vector bytes) each; a note's older vector is replaced."""
        with self.conn.transaction():
            self.conn.executemany("INSERT INTO note_vectors (note_id, model, vec) VALUES (?,?,?) ON CONFLICT (note_id) "
                                  "DO UPDATE SET model=excluded.model, vec=excluded.vec", rows)
