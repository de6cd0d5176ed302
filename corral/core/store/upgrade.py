"""A store's schema against this corral's: what an upgrade would run, a store from a newer
corral refused, and the one repair of a migration once edited after it ran.

``corral migrate --check`` reads ``plan`` without changing anything; the gateway, at
each start, runs ``guard`` (a newer store is refused before any statement writes to it:
this code would write rows that code does not expect) and, on SQLite, ``repair``.

Migration 3 was edited three times on 2026-11-30 after stores had run it (git log -p
corral/db.py: 809042a, 1f6fdf7, 0f1c238, 0988040): a store made between those commits is
at version 3 without ``episodes.cache_key``, ``notes_vocab``, ``facts`` or
``audit_head``, and no later migration would add them. ``repair`` adds what is missing
(each check is one look at sqlite_master); PostgreSQL stores began at version 12 and
never met that edit. tests/fixtures/schemas/ holds a store of every version and variant.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

from corral.core.errors import InvalidRequest
from corral.core.store import migrations
from corral.core.store.conn import Conn
from corral.core.store.migrations import MIGRATIONS, version

_TITLE = re.compile(r"^\s*# (\d+): (.+)$", re.M)

_V3_PARTS: list[tuple[str, str, str]] = [
    # (what is missing, how it is found, what makes it): migration 3 as it reads now
    ("episodes.cache_key", "SELECT 1 FROM pragma_table_info('episodes') WHERE name = 'cache_key'",
     "ALTER TABLE episodes ADD COLUMN cache_key TEXT"),
    ("index episodes_cache", "SELECT 1 FROM sqlite_master WHERE name = 'episodes_cache'",
     "CREATE INDEX episodes_cache ON episodes(cache_key, principal) WHERE cache_key IS NOT NULL"),
    ("table notes_vocab", "SELECT 1 FROM sqlite_master WHERE name = 'notes_vocab'",
     "CREATE VIRTUAL TABLE notes_vocab USING fts5vocab(notes_fts, 'row')"),
    ("table audit_head", "SELECT 1 FROM sqlite_master WHERE name = 'audit_head'",
     "CREATE TABLE audit_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL, mac TEXT NOT NULL)"),
    ("table facts", "SELECT 1 FROM sqlite_master WHERE name = 'facts'",
     "CREATE TABLE facts (version INTEGER PRIMARY KEY, hash TEXT NOT NULL, facts TEXT NOT NULL, "
     "changes TEXT NOT NULL, updated REAL NOT NULL)"),
]


@dataclass
class Plan:
    """What opening this store would do to it."""

    current: int
    latest: int
    pending: list[dict[str, Any]] = field(default_factory=list)
    """The migrations that would run: {"version", "what"}."""
    repairs: list[str] = field(default_factory=list)
    """Parts of an early migration 3 that would be added."""

    @property
    def newer(self) -> bool:
        return self.current > self.latest

    @property
    def needed(self) -> bool:
        return bool(self.pending or self.repairs)

    def to_dict(self) -> dict[str, Any]:
        return {"current": self.current, "latest": self.latest, "needed": self.needed, "newer": self.newer,
                "pending": self.pending, "repairs": self.repairs}


def titles() -> dict[int, str]:
    """Each migration's first comment line, as migrations.py says what it adds."""
    return {int(n): text.strip() for n, text in _TITLE.findall(inspect.getsource(migrations))}


def _missing_v3(conn: Conn) -> list[tuple[str, str, str]]:
    if conn.pg or version(conn) < 3:
        return []
    return [part for part in _V3_PARTS if conn.one(part[1]) is None]


def plan(conn: Conn) -> Plan:
    """What would run, read only."""
    current, named = version(conn), titles()
    return Plan(current, len(MIGRATIONS),
                [{"version": n, "what": named.get(n, "")} for n in range(current + 1, len(MIGRATIONS) + 1)],
                [what for what, _, _ in _missing_v3(conn)])


def guard(conn: Conn) -> None:
    """Refuse a store a newer corral has migrated: its rows mean what this code does not know."""
    current = version(conn)
    if current > len(MIGRATIONS):
        raise InvalidRequest(
            f"the store is at schema version {current}, newer than this corral's {len(MIGRATIONS)}: a newer "
            "corral has used it", hint="install that corral version (or newer); a store is never migrated down")


def repair(conn: Conn) -> list[str]:
    """Bring an early migration 3's store to migration 3 as it reads now. -> what was added."""
    missing = _missing_v3(conn)
    if missing:
        with conn.transaction():
            for _, _, make in missing:
                conn.execute(make)
    return [what for what, _, _ in missing]
