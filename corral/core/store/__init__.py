"""The store: every SQL statement corral runs, behind one small interface per concern,
on SQLite (the embedded default, a file in HOME) or PostgreSQL (``[store] url =
"postgresql://..."``, for production).

    jobs.py      Jobs          a job's record, idempotency keys, usage sums   (db.get_job ...)
    accounts.py  Accounts      principals and opaque tokens                   (db.get_principal ...)
    events.py    Events        the job_events stream after a cursor           (db.events ...)
    audit.py     Audit         the audit chain's head                          (db.audit_head ...)
    cluster.py   Signals       word of changes to the other replicas; the lead (db.notify; Coordinator)
    safety.py    SafetyRecords token blocks, revocations, taint, budget use   (db.safety)
    memory.py    MemoryRecords episodes, notes and their index, facts, vectors (db.memory)
    storage.py   StorageRecords images, workspaces, metadata counts           (db.storage, own connection)
    read.py      ReadModel     what the dashboard shows                        (db.read)
    notify.py    NotifyRecords notification choices, the outbox, the notifier's marks (db.notifications)
    approvals.py ApprovalRecords actions waiting for a person, approvals ahead  (db.approvals)
    sponsor.py   SponsorRecords  agents' refusals per rule and day, what they ran (db.sponsor)
    ledger.py    LedgerRecords   what a principal was told and has not acknowledged (db.ledger)
    moves.py     MoveRecords     pending jobs moved between clusters, intent first (db.moves)
    migrations.py              the numbered schema, rendered per server
    conn.py      Conn          one connection and the SQL the servers spell differently

The service core's concerns (jobs, accounts, events, audit) are mixed into ``Database``,
the object every part of the gateway is handed; the others hang off it. Nothing outside
this package writes SQL.
"""

from __future__ import annotations

from pathlib import Path

from corral.core.store.accounts import Accounts
from corral.core.store.approvals import ApprovalRecords
from corral.core.store.audit import Audit
from corral.core.store.cluster import Signals
from corral.core.store.conn import INTEGRITY_ERRORS, Conn
from corral.core.store.events import Events
from corral.core.store.jobs import HELD_REASON, Jobs, Run
from corral.core.store.ledger import LedgerRecords
from corral.core.store.memory import MemoryRecords
from corral.core.store.migrations import MIGRATIONS, migrate, version
from corral.core.store.moves import MoveRecords
from corral.core.store.notify import NotifyRecords
from corral.core.store.read import ReadModel
from corral.core.store.safety import SafetyRecords
from corral.core.store.signin import SigninRecords
from corral.core.store.sponsor import SponsorRecords
from corral.core.store.storage import StorageRecords

__all__ = ["Database", "open_store", "Run", "HELD_REASON", "MIGRATIONS", "INTEGRITY_ERRORS", "Conn"]


def store_url(where: Path | str) -> str:
    """A path is a SQLite file (``sqlite:///abs/path`` too); else a PostgreSQL URL."""
    return str(where)


class Database(Jobs, Accounts, Events, Audit, Signals):
    """One store, open: a connection, its schema brought up to date, and each concern."""

    def __init__(self, where: Path | str) -> None:
        self.url = store_url(where)
        self.conn = Conn(self.url)
        self.path = self.conn.path
        """The SQLite file (None on PostgreSQL)."""
        migrate(self.conn)
        self.memory = MemoryRecords(self.conn)
        self.safety = SafetyRecords(self.conn)
        self.read = ReadModel(self.conn)
        self.notifications = NotifyRecords(self.conn)
        self.approvals = ApprovalRecords(self.conn)
        self.sponsor = SponsorRecords(self.conn)
        self.ledger = LedgerRecords(self.conn)
        self.signin = SigninRecords(self.conn)
        self.moves = MoveRecords(self.conn)
        self._storage: StorageRecords | None = None

    @property
    def dialect(self) -> str:
        return self.conn.dialect

    @property
    def storage(self) -> StorageRecords:
        """Storage's records, over a connection of its own (its verbs run in threads)."""
        if self._storage is None:
            self._storage = StorageRecords(self.conn.again())
        return self._storage

    @property
    def version(self) -> int:
        return version(self.conn)

    def migrate(self) -> None:
        migrate(self.conn)

    def close(self) -> None:
        if self._storage is not None:
            self._storage.close()
        self.conn.close()


def open_store(url: Path | str) -> Database:
    """The store at ``url``: ``postgresql://...``, or a SQLite file's path."""
    return Database(url)
